package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

func TestCompleteSQL(t *testing.T) {
	dsn, schema := testSchema(t)
	ctx := context.Background()
	s := openDSN(t, dsn, sink.Options{})
	admin := adminConn(t, baseDSN(t))
	if _, err := admin.Exec(ctx, `CREATE TABLE `+schema+`.effects (key text, token bigint, op jsonb, n int)`); err != nil {
		t.Fatal(err)
	}
	const script = `INSERT INTO effects (key, token, op, n) VALUES (@key, @token, @operation::jsonb, 0);
		UPDATE effects SET n = n + 1 WHERE key = @key;`
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
	effects := func(key string) (rows int, name string) {
		t.Helper()
		if err := admin.QueryRow(ctx, `SELECT count(*), coalesce(max(op->>'name'), '') FROM `+schema+`.effects
			WHERE key = $1 AND n = 1`, key).Scan(&rows, &name); err != nil {
			t.Fatal(err)
		}
		return rows, name
	}
	params := func(c sink.Claim) map[string]any {
		return map[string]any{"key": c.Key, "token": c.Token, "operation": json.RawMessage(`{"name":"batches/o'brien"}`)}
	}

	t.Run("done with the script", func(t *testing.T) {
		c := claim("gemini:batches/o'brien")
		if err := s.CompleteSQL(ctx, c.Key, c.Token, script, params(c)); err != nil {
			t.Fatalf("CompleteSQL: %v", err)
		}
		if n, name := effects(c.Key); n != 1 || name != "batches/o'brien" {
			t.Fatalf("effects rows = %d, name %q; want 1, %q", n, name, "batches/o'brien")
		}
		if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateDone {
			t.Fatalf("Get = %+v, %v; want done", e, err)
		}
		if err := s.CompleteSQL(ctx, c.Key, c.Token, script, params(c)); !errors.Is(err, sink.ErrFenced) {
			t.Fatalf("second CompleteSQL error = %v, want ErrFenced", err)
		}
		if n, _ := effects(c.Key); n != 1 {
			t.Fatalf("effects rows after a fenced CompleteSQL = %d, want 1", n)
		}
	})
	t.Run("script fails", func(t *testing.T) {
		c := claim("gemini:batches/bad")
		err := s.CompleteSQL(ctx, c.Key, c.Token, `INSERT INTO effects (key) VALUES (@key); INSERT INTO no_such_table VALUES (1);`, params(c))
		if err == nil || errors.Is(err, sink.ErrFenced) {
			t.Fatalf("CompleteSQL with a failing script = %v, want the script's error", err)
		}
		var rows int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.effects WHERE key = $1`, c.Key).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("effects rows = %d, %v; want 0 (rolled back)", rows, err)
		}
		if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateClaimed || e.Token != c.Token {
			t.Fatalf("Get = %+v, %v; want still claimed with token %d", e, err, c.Token)
		}
	})
	t.Run("taken over while the script runs", func(t *testing.T) {
		// The token is checked before the script without locking the row,
		// so a takeover can happen while a (stalled) script runs; the done
		// mark after it then matches nothing and everything rolls back.
		var clock atomic.Int64
		clock.Store(time.Now().UnixNano())
		ts := openDSN(t, dsn, sink.Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
		key := "gemini:batches/stalled"
		if _, err := ts.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		c, err := ts.Claim(ctx, key, "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		res := make(chan error, 1)
		go func() {
			close(started)
			res <- ts.CompleteSQL(ctx, c.Key, c.Token, `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1); SELECT pg_sleep(1);`, params(c))
		}()
		<-started
		time.Sleep(200 * time.Millisecond) // inside pg_sleep
		clock.Add(int64(2 * time.Minute))
		c2, err := ts.Claim(ctx, key, "b", time.Minute)
		if err != nil || !c2.Takeover {
			t.Fatalf("takeover while the script runs = %+v, %v; want a takeover", c2, err)
		}
		if err := <-res; !errors.Is(err, sink.ErrFenced) {
			t.Fatalf("CompleteSQL overtaken by a takeover = %v, want ErrFenced", err)
		}
		var rows int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.effects WHERE key = $1`, key).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("effects rows = %d, %v; want 0 (rolled back)", rows, err)
		}
		if e, err := ts.Get(ctx, key); err != nil || e.State != sink.StateClaimed || e.Token != c2.Token {
			t.Fatalf("Get = %+v, %v; want claimed by the takeover", e, err)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		err := s.CompleteSQL(ctx, "gemini:batches/none", 1, script, map[string]any{"key": "x", "token": 1, "operation": "{}"})
		if !errors.Is(err, sink.ErrNotFound) {
			t.Fatalf("CompleteSQL(unknown) error = %v, want ErrNotFound", err)
		}
	})
	if st, err := s.Stats(ctx); err != nil || st.Fenced != 2 {
		t.Fatalf("Stats.Fenced = %d, %v; want 2", st.Fenced, err)
	}
}
