package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// slowSQL keeps the writer busy for a while (a recursive CTE).
const slowSQL = `SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT x FROM c)`

// sqliteDB is a fresh SQLite database for sinktest.CompleteSQL, with the
// application's own connection to it.
func sqliteDB(t *testing.T) sinktest.SQLDatabase {
	path := sqlitetest.Path(t)
	app, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)") // connects at its first use
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	return sinktest.SQLDatabase{
		Open: func(t *testing.T, opt sink.Options) sink.Sink { return sqlitetest.Open(t, path, opt) },
		Exec: func(t *testing.T, stmt string) {
			t.Helper()
			if _, err := app.Exec(stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		QueryRow: func(t *testing.T, query string, dest ...any) {
			t.Helper()
			if err := app.QueryRow(query).Scan(dest...); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
		},
		OperationName: `json_extract(@operation, '$.name')`,
	}
}

func TestCompleteSQL(t *testing.T) { sinktest.CompleteSQL(t, sqliteDB(t)) }

// What CompleteSQL is on SQLite alone: a script runs inside the writer's
// group commit, with other operations.
func TestCompleteSQLInAGroupCommit(t *testing.T) {
	ctx := context.Background()
	db := sqliteDB(t)
	s := db.Open(t, sink.Options{}).(*sqlite.Sink)
	db.Exec(t, sinktest.EffectsTable)
	t.Run("script fails, the group commit's other operations do not", func(t *testing.T) {
		// The second statement violates the CHECK (n < 2).
		g := runInAGroupCommit(t, s, "bad", 20, `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1);
			UPDATE effects SET n = n + 1 WHERE key = @key;`)
		bad, badErr, others, errs := g.bad, g.badErr, g.others, g.errs
		if err := g.slowErr; err != nil {
			t.Fatalf("slow CompleteSQL: %v", err)
		}
		if badErr == nil || errors.Is(badErr, sink.ErrFenced) {
			t.Fatalf("CompleteSQL with a failing script = %v, want the script's error", badErr)
		}
		var n int
		if db.QueryRow(t, `SELECT count(*) FROM effects WHERE key = 'gemini:batches/bad'`, &n); n != 0 {
			t.Fatalf("effects rows of the failed script = %d; want 0 (rolled back)", n)
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
		if got := g.commits; got >= ops {
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
		g := runInAGroupCommit(t, s, "rollback", 10, `INSERT OR ROLLBACK INTO effects (key, token, n) VALUES (@key, @token, 5)`)
		bad, badErr, others, errs := g.bad, g.badErr, g.others, g.errs
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

	if st, err := s.Stats(ctx); err != nil || st.Fenced != 0 {
		t.Fatalf("Stats.Fenced = %d, %v; want 0", st.Fenced, err)
	}
}

// groupCommit is what runInAGroupCommit saw.
type groupCommit struct {
	bad     sink.Claim   // the key whose script ran
	badErr  error        // its CompleteSQL's error
	others  []sink.Claim // the keys completed in the same group commit
	errs    []error      // their Complete errors
	slowErr error        // the slow script's error
	commits int64        // the commits all of that took
}

// runInAGroupCommit claims gemini:batches/NAME, a slow key and n others,
// then runs script for NAME while a slow script holds the writer and the
// others are completed: they queue up behind it and share the next group
// commit.
func runInAGroupCommit(t *testing.T, s *sqlite.Sink, name string, n int, script string) groupCommit {
	t.Helper()
	ctx := context.Background()
	g := groupCommit{bad: sinktest.Claimed(t, s, "gemini:batches/"+name)}
	slow := sinktest.Claimed(t, s, "gemini:batches/"+name+"-slow")
	for i := range n {
		g.others = append(g.others, sinktest.Claimed(t, s, fmt.Sprintf("gemini:batches/%s-other-%d", name, i)))
	}
	before := s.Commits()
	slowDone := make(chan error, 1)
	go func() { slowDone <- s.CompleteSQL(ctx, slow.Key, slow.Token, slowSQL, nil) }()
	time.Sleep(20 * time.Millisecond)
	var wg sync.WaitGroup
	g.errs = make([]error, n)
	for i, c := range g.others {
		wg.Go(func() { g.errs[i] = s.Complete(ctx, c.Key, c.Token) })
	}
	g.badErr = s.CompleteSQL(ctx, g.bad.Key, g.bad.Token, script, sinktest.SQLParams(g.bad))
	wg.Wait()
	g.slowErr = <-slowDone
	g.commits = s.Commits() - before
	return g
}
