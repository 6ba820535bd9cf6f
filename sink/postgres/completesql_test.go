package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// pgDB is a fresh schema for sinktest.CompleteSQL, with the application's
// own connection to it.
func pgDB(t *testing.T) (sinktest.SQLDatabase, string) {
	dsn, _ := testSchema(t)
	app := adminConn(t, dsn) // its search_path is the schema
	return sinktest.SQLDatabase{
		Open: func(t *testing.T, opt sink.Options) sink.Sink { return openDSN(t, dsn, opt) },
		Exec: func(t *testing.T, stmt string) {
			t.Helper()
			if _, err := app.Exec(context.Background(), stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		},
		QueryRow: func(t *testing.T, query string, dest ...any) {
			t.Helper()
			if err := app.QueryRow(context.Background(), query).Scan(dest...); err != nil {
				t.Fatalf("%s: %v", query, err)
			}
		},
		OperationName: `(@operation::jsonb)->>'name'`,
	}, dsn
}

func TestCompleteSQL(t *testing.T) {
	db, _ := pgDB(t)
	sinktest.CompleteSQL(t, db)
}

// What CompleteSQL is on PostgreSQL alone: the key's row is locked from
// the token's check to the done mark, so a takeover tried after the lease
// ran out while a (stalled) script runs waits for the script's transaction,
// and then finds the key done: the script's writes and the done mark
// committed once, and nothing was fenced.
func TestCompleteSQLTakenOverWhileTheScriptRuns(t *testing.T) {
	ctx := context.Background()
	db, dsn := pgDB(t)
	db.Exec(t, sinktest.EffectsTable)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	ts := openDSN(t, dsn, sink.Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	key := "gemini:batches/stalled"
	c := sinktest.Claimed(t, ts, key)
	res := make(chan error, 1)
	go func() {
		res <- ts.CompleteSQL(ctx, c.Key, c.Token, `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1); SELECT pg_sleep(1);`, sinktest.SQLParams(c))
	}()
	watcher := adminConn(t, dsn)
	for running := false; !running; time.Sleep(10 * time.Millisecond) { // the script has begun
		if err := watcher.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND strpos(query, 'pg_sleep(1)') > 0
				AND pid <> pg_backend_pid())`).Scan(&running); err != nil {
			t.Fatal(err)
		}
	}
	clock.Add(int64(2 * time.Minute))
	claimed := make(chan error, 1)
	go func() {
		_, err := ts.Claim(ctx, key, "b", time.Minute, sink.ClaimOptions{})
		claimed <- err
	}()
	waitForLockWait(ctx, t, watcher, loadMarker, claimed)
	if err := <-res; err != nil {
		t.Fatalf("CompleteSQL = %v, want nil", err)
	}
	if err := <-claimed; !errors.Is(err, sink.ErrNotClaimable) {
		t.Fatalf("takeover tried while the script ran = %v, want ErrNotClaimable (done)", err)
	}
	var rows int
	if db.QueryRow(t, `SELECT count(*) FROM effects WHERE key = 'gemini:batches/stalled'`, &rows); rows != 1 {
		t.Fatalf("effects rows = %d; want 1", rows)
	}
	if e, err := ts.Get(ctx, key); err != nil || e.State != sink.StateDone || e.Token != c.Token {
		t.Fatalf("Get = %+v, %v; want done with the first claim's token", e, err)
	}
	if st, err := ts.Stats(ctx); err != nil || st.Fenced != 0 {
		t.Fatalf("Stats.Fenced = %d, %v; want 0", st.Fenced, err)
	}
}
