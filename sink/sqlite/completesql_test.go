package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// slowSQL keeps the writer busy for a while (a recursive CTE).
const slowSQL = `SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT x FROM c)`

func TestCompleteSQL(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gemrecon.db")
	s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	app, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.Exec(`CREATE TABLE effects (key TEXT, token INTEGER, name TEXT, n INTEGER NOT NULL CHECK (n < 2))`); err != nil {
		t.Fatal(err)
	}
	// Every statement uses parameters: all of them must be bound.
	const script = `INSERT INTO effects (key, token, name, n) VALUES (@key, @token, json_extract(@operation, '$.name'), 0);
		-- a comment; with a semicolon
		UPDATE effects SET n = n + 1 WHERE key = @key AND token = @token;`
	claim := func(key string) sink.Claim {
		t.Helper()
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, key, "w", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rows := func(key string) (n int, name string) {
		t.Helper()
		if err := app.QueryRow(`SELECT count(*), coalesce(max(name), '') FROM effects WHERE key = ? AND n = 1`, key).Scan(&n, &name); err != nil {
			t.Fatal(err)
		}
		return n, name
	}
	params := func(c sink.Claim) map[string]any {
		return map[string]any{"key": c.Key, "token": c.Token, "name": "x", "operation": json.RawMessage(`{"name":"batches/o'brien"}`)}
	}

	t.Run("done with the script", func(t *testing.T) {
		c := claim("gemini:batches/o'brien")
		if err := s.CompleteSQL(ctx, c.Key, c.Token, script, params(c)); err != nil {
			t.Fatalf("CompleteSQL: %v", err)
		}
		if n, name := rows(c.Key); n != 1 || name != "batches/o'brien" {
			t.Fatalf("effects rows = %d, name %q; want 1, %q", n, name, "batches/o'brien")
		}
		if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateDone {
			t.Fatalf("Get = %+v, %v; want done", e, err)
		}
		// The done cache answers a duplicate sighting.
		if rr, err := s.Record(ctx, sink.Sighting{Key: c.Key, Source: sink.SourcePoll}); err != nil || rr.State != sink.StateDone {
			t.Fatalf("Record after CompleteSQL = %+v, %v; want done", rr, err)
		}
		if err := s.CompleteSQL(ctx, c.Key, c.Token, script, params(c)); !errors.Is(err, sink.ErrFenced) {
			t.Fatalf("second CompleteSQL error = %v, want ErrFenced", err)
		}
		if n, _ := rows(c.Key); n != 1 {
			t.Fatalf("effects rows after a fenced CompleteSQL = %d, want 1", n)
		}
	})

	t.Run("script fails, the group commit's other operations do not", func(t *testing.T) {
		bad := claim("gemini:batches/bad")
		slow := claim("gemini:batches/slow")
		var others []sink.Claim
		for i := range 20 {
			others = append(others, claim(fmt.Sprintf("gemini:batches/other-%d", i)))
		}
		before := s.Commits()
		// The slow script holds the writer; everything below queues up
		// behind it and shares the next group commit.
		slowDone := make(chan error, 1)
		go func() { slowDone <- s.CompleteSQL(ctx, slow.Key, slow.Token, slowSQL, nil) }()
		time.Sleep(20 * time.Millisecond)
		var wg sync.WaitGroup
		errs := make([]error, len(others))
		for i, c := range others {
			wg.Go(func() { errs[i] = s.Complete(ctx, c.Key, c.Token) })
		}
		// The second statement violates the CHECK (n < 2).
		badErr := s.CompleteSQL(ctx, bad.Key, bad.Token, `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1);
			UPDATE effects SET n = n + 1 WHERE key = @key;`, params(bad))
		wg.Wait()
		if err := <-slowDone; err != nil {
			t.Fatalf("slow CompleteSQL: %v", err)
		}
		if badErr == nil || errors.Is(badErr, sink.ErrFenced) {
			t.Fatalf("CompleteSQL with a failing script = %v, want the script's error", badErr)
		}
		var n int
		if err := app.QueryRow(`SELECT count(*) FROM effects WHERE key = ?`, bad.Key).Scan(&n); err != nil || n != 0 {
			t.Fatalf("effects rows of the failed script = %d, %v; want 0 (rolled back)", n, err)
		}
		if e, err := s.Get(ctx, bad.Key); err != nil || e.State != sink.StateClaimed || e.Token != bad.Token {
			t.Fatalf("Get(failed) = %+v, %v; want still claimed with token %d", e, err, bad.Token)
		}
		for i, c := range others {
			if errs[i] != nil {
				t.Fatalf("Complete(%s) in the same group commit: %v", c.Key, errs[i])
			}
			if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateDone {
				t.Fatalf("Get(%s) = %s, %v; want done", c.Key, e.State, err)
			}
		}
		ops := int64(len(others) + 2)
		if got := s.Commits() - before; got >= ops {
			t.Fatalf("commits = %d for %d operations; want them grouped (the test proves nothing otherwise)", got, ops)
		} else {
			t.Logf("%d operations in %d commits", ops, got)
		}
		// The key is still claimed: its holder can record the failure.
		if st, err := s.Fail(ctx, bad.Key, bad.Token, sink.Failure{Cause: badErr.Error()}); err != nil || st != sink.StatePending {
			t.Fatalf("Fail after the failed script = %s, %v; want pending", st, err)
		}
	})

	// A script that rolls back the whole transaction (its own conflict
	// clause) takes its group commit down with it: every operation of the
	// group must then be told it failed, and none may claim success.
	t.Run("script rolls back the whole transaction", func(t *testing.T) {
		bad := claim("gemini:batches/rollback")
		slow := claim("gemini:batches/slow2")
		var others []sink.Claim
		for i := range 10 {
			others = append(others, claim(fmt.Sprintf("gemini:batches/other2-%d", i)))
		}
		slowDone := make(chan error, 1)
		go func() { slowDone <- s.CompleteSQL(ctx, slow.Key, slow.Token, slowSQL, nil) }()
		time.Sleep(20 * time.Millisecond)
		var wg sync.WaitGroup
		errs := make([]error, len(others))
		for i, c := range others {
			wg.Go(func() { errs[i] = s.Complete(ctx, c.Key, c.Token) })
		}
		badErr := s.CompleteSQL(ctx, bad.Key, bad.Token, `INSERT OR ROLLBACK INTO effects (key, token, n) VALUES (@key, @token, 5)`, params(bad))
		wg.Wait()
		<-slowDone
		if badErr == nil {
			t.Fatal("CompleteSQL with OR ROLLBACK violating a CHECK succeeded")
		}
		failed := 0
		for i, c := range others {
			e, err := s.Get(ctx, c.Key)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case errs[i] == nil && e.State != sink.StateDone:
				t.Errorf("Complete(%s) returned nil but the key is %s", c.Key, e.State)
			case errs[i] != nil && e.State != sink.StateClaimed:
				t.Errorf("Complete(%s) returned %v but the key is %s", c.Key, errs[i], e.State)
			case errs[i] != nil:
				failed++
			}
		}
		t.Logf("%d of %d operations of the group commit were told they failed", failed, len(others))
		if e, err := s.Get(ctx, bad.Key); err != nil || e.State != sink.StateClaimed {
			t.Fatalf("Get(rollback) = %s, %v; want claimed", e.State, err)
		}
		// The writer recovers: the next writes succeed.
		for _, c := range append(others, bad) {
			if e, _ := s.Get(ctx, c.Key); e.State == sink.StateClaimed {
				if err := s.Complete(ctx, c.Key, c.Token); err != nil {
					t.Fatalf("Complete(%s) after the rolled-back group: %v", c.Key, err)
				}
			}
		}
	})

	t.Run("unknown key", func(t *testing.T) {
		err := s.CompleteSQL(ctx, "gemini:batches/none", 1, script, map[string]any{"key": "x", "token": 1, "operation": "{}"})
		if !errors.Is(err, sink.ErrNotFound) {
			t.Fatalf("CompleteSQL(unknown) error = %v, want ErrNotFound", err)
		}
	})

	// The fenced counter survives a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.Stats(ctx); err != nil || st.Fenced != 1 {
		t.Fatalf("Stats.Fenced after reopening = %d, %v; want 1", st.Fenced, err)
	}
}
