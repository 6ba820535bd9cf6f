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

// What CompleteSQL is on PostgreSQL alone: the token is checked before the
// script without locking the row, so a takeover can happen while a
// (stalled) script runs; the done mark after it then matches nothing and
// everything rolls back.
func TestCompleteSQLTakenOverWhileTheScriptRuns(t *testing.T) {
	ctx := context.Background()
	db, dsn := pgDB(t)
	db.Exec(t, sinktest.EffectsTable)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	ts := openDSN(t, dsn, sink.Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	key := "gemini:batches/stalled"
	c := sinktest.Claimed(t, ts, key)
	started := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		close(started)
		res <- ts.CompleteSQL(ctx, c.Key, c.Token, `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1); SELECT pg_sleep(1);`, sinktest.SQLParams(c))
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
	if db.QueryRow(t, `SELECT count(*) FROM effects WHERE key = 'gemini:batches/stalled'`, &rows); rows != 0 {
		t.Fatalf("effects rows = %d; want 0 (rolled back)", rows)
	}
	if e, err := ts.Get(ctx, key); err != nil || e.State != sink.StateClaimed || e.Token != c2.Token {
		t.Fatalf("Get = %+v, %v; want claimed by the takeover", e, err)
	}
	if st, err := ts.Stats(ctx); err != nil || st.Fenced != 1 {
		t.Fatalf("Stats.Fenced = %d, %v; want 1", st.Fenced, err)
	}
}
