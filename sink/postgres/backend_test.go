package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// TestConcurrentOpenMigratesOnce opens one empty schema from several
// goroutines at once: the advisory lock makes them take turns, so every
// Open succeeds and each migration is applied exactly once.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dsn, schema := testSchema(t)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			s, err := Open(context.Background(), dsn, sink.Options{})
			errs[i] = err
			if err == nil {
				errs[i] = s.Close()
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open #%d: %v", i, err)
		}
	}
	admin := adminConn(t, baseDSN(t))
	var rows, distinct, max int
	err := admin.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT version), coalesce(max(version), 0) FROM `+schema+`.gemrecon_schema_version`).
		Scan(&rows, &distinct, &max)
	if err != nil {
		t.Fatal(err)
	}
	if want := SchemaVersion(); rows != want || distinct != want || max != want {
		t.Fatalf("schema_version: %d rows, %d distinct, max %d; want %d of each", rows, distinct, max, want)
	}
}

func TestReadOnlyEmptySchema(t *testing.T) {
	dsn, schema := testSchema(t)
	_, err := Open(context.Background(), dsn, sink.Options{ReadOnly: true})
	if !errors.Is(err, sink.ErrNoDatabase) {
		t.Fatalf("Open(read-only, empty schema) error = %v, want ErrNoDatabase", err)
	}
	admin := adminConn(t, baseDSN(t))
	var tables int
	if err := admin.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("read-only Open created %d tables, want 0", tables)
	}

	// Once a writer created the tables, a read-only open reads them and
	// refuses to write.
	w := openDSN(t, dsn, sink.Options{})
	if _, err := w.Record(context.Background(), sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	ro := openDSN(t, dsn, sink.Options{ReadOnly: true})
	if e, err := ro.Get(context.Background(), "gemini:batches/a"); err != nil || e.State != sink.StatePending {
		t.Fatalf("read-only Get = %+v, %v; want pending", e, err)
	}
	if _, err := ro.Record(context.Background(), sink.Sighting{Key: "gemini:batches/b", Source: sink.SourcePoll}); err == nil {
		t.Fatal("read-only Record succeeded, want an error")
	}
}

func TestSchemaTooNew(t *testing.T) {
	dsn, schema := testSchema(t)
	s := openDSN(t, dsn, sink.Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	admin := adminConn(t, baseDSN(t))
	if _, err := admin.Exec(context.Background(),
		`INSERT INTO `+schema+`.gemrecon_schema_version (version, name) VALUES ($1, 'from the future')`, SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	for _, minReader := range []string{
		`UPDATE ` + schema + `.gemrecon_counters SET value = ` + fmt.Sprint(SchemaVersion()+1) + ` WHERE name = 'min_reader'`,
		`DELETE FROM ` + schema + `.gemrecon_counters WHERE name = 'min_reader'`,
	} {
		if _, err := admin.Exec(context.Background(), minReader); err != nil {
			t.Fatal(err)
		}
		for _, ro := range []bool{false, true} {
			_, err := Open(context.Background(), dsn, sink.Options{ReadOnly: ro})
			if !errors.Is(err, sink.ErrSchemaTooNew) {
				t.Errorf("%s; Open(ReadOnly=%v) error = %v, want ErrSchemaTooNew", minReader, ro, err)
			}
		}
	}
}

// TestDatabaseClock: without an injected Now, time decisions follow the
// database's now(), and a sink with an injected clock on the same rows
// decides by its own.
func TestDatabaseClock(t *testing.T) {
	dsn, _ := testSchema(t)
	ctx := context.Background()
	db := openDSN(t, dsn, sink.Options{})
	future := sinktest.NewClock(time.Now().Add(10 * 365 * 24 * time.Hour))
	inj := openDSN(t, dsn, sink.Options{Now: future.Now})
	admin := adminConn(t, baseDSN(t))
	dbNow := func() time.Time {
		var t0 time.Time
		if err := admin.QueryRow(ctx, `SELECT now()`).Scan(&t0); err != nil {
			t.Fatal(err)
		}
		return t0
	}

	before := dbNow()
	if _, err := db.Record(ctx, sink.Sighting{Key: "gemini:batches/db", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	after := dbNow()
	e, err := db.Get(ctx, "gemini:batches/db")
	if err != nil {
		t.Fatal(err)
	}
	if e.FirstSeenAt.Before(before) || e.FirstSeenAt.After(after) {
		t.Fatalf("FirstSeenAt = %v, want within the database's [%v, %v]", e.FirstSeenAt, before, after)
	}

	// A claim by the injected clock ten years ahead leases until then: the
	// database-clock sink sees a live lease, the injected one an expired one.
	if _, err := inj.Claim(ctx, "gemini:batches/db", "future", time.Hour, sink.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Claim(ctx, "gemini:batches/db", "now", time.Hour, sink.ClaimOptions{}); !errors.Is(err, sink.ErrNotClaimable) {
		t.Fatalf("database-clock Claim error = %v, want ErrNotClaimable (lease is live by now())", err)
	}
	future.Advance(2 * time.Hour)
	if keys, err := inj.Due(ctx, 0, sink.ClaimOptions{}); err != nil || len(keys) != 1 {
		t.Fatalf("injected-clock Due = %v, %v; want the expired lease", keys, err)
	}
	if keys, err := db.Due(ctx, 0, sink.ClaimOptions{}); err != nil || len(keys) != 0 {
		t.Fatalf("database-clock Due = %v, %v; want none", keys, err)
	}
}

// TestCompleteOutcomeUnknown: the Complete statement commits but its reply
// never arrives and the context ends; Complete reads the row back and
// reports the truth (done) instead of an error.
func TestCompleteOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, _ := lostReplySink(t)
	ctx := context.Background()
	key := "gemini:batches/unknown"
	c := claimedForComplete(ctx, t, s, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{}`)})
	cctx, dropped := lostCommit(t, s, p)
	if err := s.Complete(cctx, key, c.Token); err != nil {
		t.Fatalf("Complete with a lost reply = %v, want nil (read back: done)", err)
	}
	dropped()
	e, err := s.Get(ctx, key)
	if err != nil || e.State != sink.StateDone || e.Token != c.Token {
		t.Fatalf("Get = %+v, %v; want done with token %d", e, err, c.Token)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Fenced != 1 {
		t.Fatalf("Stats.Fenced = %d, %v; want 1 (the warm-up)", st.Fenced, err)
	}
}

// TestClaimOutcomeUnknown: a claim whose reply is lost is found again by its
// nonce, so the caller holds the claim the database granted.
func TestClaimOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, _ := lostReplySink(t)
	ctx := context.Background()
	key := "gemini:batches/claim-unknown"
	for _, k := range []string{key, key + "-warm-up"} {
		if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	// Prepare the statement on the one connection (see above).
	if _, err := s.Claim(ctx, key+"-warm-up", "w", time.Minute, sink.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	cctx, dropped := lostCommit(t, s, p)
	c, err := s.Claim(cctx, key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatalf("Claim with a lost reply = %v, want the claim read back", err)
	}
	dropped()
	e, err := s.Get(ctx, key)
	if err != nil || e.State != sink.StateClaimed || e.Token != c.Token || c.Token != 1 || c.Owner != "w" {
		t.Fatalf("Claim = %+v; Get = %+v, %v; want claimed with token 1", c, e, err)
	}
}

// TestCompleteCancelledWhileBlocked: Complete waits on a row lock, its
// context ends, the server cancels the statement: a definite "not applied",
// the key is still claimed under the same token and completes later.
func TestCompleteCancelledWhileBlocked(t *testing.T) {
	dsn, schema := testSchema(t)
	ctx := context.Background()
	s := openDSN(t, dsn, sink.Options{})
	key := "gemini:batches/blocked"
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin := adminConn(t, baseDSN(t))
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+schema+`.gemrecon_keys WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = s.Complete(cctx, key, c.Token)
	if err == nil || errors.Is(err, sink.ErrFenced) {
		t.Fatalf("Complete blocked then cancelled = %v, want a non-fenced error", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Complete error = %v, want it to wrap context.DeadlineExceeded", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateClaimed || e.Token != c.Token {
		t.Fatalf("after cancel Get = %+v, %v; want still claimed, token %d", e, err, c.Token)
	}
	if err := s.Complete(ctx, key, c.Token); err != nil {
		t.Fatalf("Complete after the lock is gone: %v", err)
	}
}

// TestClaimDueOutcomeUnknown: a ClaimDue whose reply is lost returns the
// claims the database granted, found by the statement's nonce.
func TestClaimDueOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, _ := lostReplySink(t)
	ctx := context.Background()
	for i := range 4 {
		if _, err := s.Record(ctx, sink.Sighting{Key: fmt.Sprintf("gemini:batches/due-%d", i), Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	// Prepare the statement on the one connection (see TestCompleteOutcomeUnknown).
	if cs, err := s.ClaimDue(ctx, "w", time.Minute, 1, sink.ClaimOptions{}); err != nil || len(cs) != 1 {
		t.Fatalf("warm-up ClaimDue = %v, %v", cs, err)
	}
	cctx, dropped := lostCommit(t, s, p)
	cs, err := s.ClaimDue(cctx, "w", time.Minute, 10, sink.ClaimOptions{})
	if err != nil || len(cs) != 3 {
		t.Fatalf("ClaimDue with a lost reply = %d claims, %v; want 3 read back", len(cs), err)
	}
	dropped()
	for _, c := range cs {
		if err := s.Complete(ctx, c.Key, c.Token); err != nil {
			t.Errorf("Complete(%s, %d): %v", c.Key, c.Token, err)
		}
	}
}

// TestDSNSchemes: both URL schemes work, and the DSN's search_path decides
// where the tables live.
func TestDSNSchemes(t *testing.T) {
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		t.Run(scheme, func(t *testing.T) {
			dsn, schema := testSchema(t)
			_, rest, ok := strings.Cut(dsn, "://")
			if !ok {
				t.Skipf("DSN %q is not a URL", dsn)
			}
			s := openDSN(t, scheme+rest, sink.Options{})
			if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll}); err != nil {
				t.Fatal(err)
			}
			var n int
			admin := adminConn(t, baseDSN(t))
			if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM `+schema+`.gemrecon_keys`).Scan(&n); err != nil {
				t.Fatalf("Open(%q) did not use search_path %s: %v", scheme, schema, err)
			}
			if n != 1 {
				t.Fatalf("Open(%q): %s.gemrecon_keys has %d rows, want 1", scheme, schema, n)
			}
		})
	}
}

// TestSessionSettings: every connection carries the timeouts, READ
// TestSearchPathSchema: a schema the DSN's search_path names first is
// created, and gemrecon's tables are kept there.
func TestSearchPathSchema(t *testing.T) {
	_, schema := testSchema(t)
	named := schema + "_named"
	admin := adminConn(t, baseDSN(t))
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+named+" CASCADE") })
	s := openDSN(t, withParam(baseDSN(t), "search_path", named), sink.Options{})
	if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := admin.QueryRow(context.Background(), `SELECT count(*) FROM `+named+`.gemrecon_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%s.gemrecon_keys has %d rows, want 1", named, n)
	}
}

// COMMITTED and synchronous commits; a DSN setting wins over the default.
func TestSessionSettings(t *testing.T) {
	dsn, _ := testSchema(t)
	tests := []struct {
		name string
		dsn  string
		opt  sink.Options
		opts []Option
		want map[string]string
	}{
		{"defaults", dsn, sink.Options{}, nil, map[string]string{
			"lock_timeout": "5s", "statement_timeout": "30s",
			"default_transaction_isolation": "read committed", "synchronous_commit": "on"}},
		{"options", dsn, sink.Options{BusyTimeout: 1500 * time.Millisecond}, nil,
			map[string]string{"lock_timeout": "1500ms"}},
		{"dsn wins", withParam(dsn, "lock_timeout", "2500"), sink.Options{BusyTimeout: time.Second}, nil,
			map[string]string{"lock_timeout": "2500ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openDSN(t, tt.dsn, tt.opt, tt.opts...)
			for name, want := range tt.want {
				var got string
				err := s.pg.withConn(context.Background(), func(c *pgx.Conn) error {
					return c.QueryRow(context.Background(), `SELECT current_setting($1)`, name).Scan(&got)
				})
				if err != nil || got != want {
					t.Errorf("current_setting(%q) = %q, %v; want %q", name, got, err, want)
				}
			}
		})
	}
}

// TestMaxConns: the pool's bound is DefaultMaxConns, or the DSN's
// pool_max_conns; other pool_* parameters are the pool's, not
// sent to the server (which would refuse an unknown setting).
func TestMaxConns(t *testing.T) {
	dsn, _ := testSchema(t)
	tests := []struct {
		name string
		dsn  string
		opts []Option
		want int32
	}{
		{"default", dsn, nil, DefaultMaxConns},
		{"dsn", withParam(dsn, "pool_max_conns", "5"), nil, 5},
		{"other pool params", withParam(dsn, "pool_max_conn_lifetime", "10m"), nil, DefaultMaxConns},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openDSN(t, tt.dsn, sink.Options{}, tt.opts...)
			if got := s.pg.pool.Stat().MaxConns(); got != tt.want {
				t.Errorf("Open(%q) MaxConns = %d, want %d", tt.dsn, got, tt.want)
			}
			if _, err := s.Get(context.Background(), "gemini:batches/none"); !errors.Is(err, sink.ErrNotFound) {
				t.Errorf("Get on a fresh sink = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestDroppedIdleConnection: a pooled connection the server terminated is
// replaced before use, so the next call succeeds.
func TestDroppedIdleConnection(t *testing.T) {
	for _, check := range []bool{true, false} {
		t.Run(fmt.Sprint("check=", check), func(t *testing.T) {
			dsn, _ := testSchema(t)
			ctx := context.Background()
			pingAfter := time.Hour
			if check {
				pingAfter = 0
			}
			s := openDSN(t, oneConn(dsn), sink.Options{}, withPingIdleAfter(pingAfter))
			if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll}); err != nil {
				t.Fatal(err)
			}
			admin := adminConn(t, baseDSN(t))
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
				WHERE application_name = $1`, s.pg.appName).Scan(&n); err != nil || n != 1 {
				t.Fatalf("terminated %d backends, %v; want 1", n, err)
			}
			_, err := s.Get(ctx, "gemini:batches/a")
			if check && err != nil {
				t.Fatalf("Get after the idle connection was dropped: %v", err)
			}
			if !check && err == nil {
				t.Fatal("Get without the idle check succeeded on a dropped connection; the test no longer shows what the check is for")
			}
		})
	}
}

// TestFailOutcomeUnknown: a Fail whose reply is lost is read back: the key
// is pending under the same token with this failure's cause.
func TestFailOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, _ := lostReplySink(t)
	ctx := context.Background()
	key := "gemini:batches/fail-unknown"
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Prepare the statement on the one connection (see TestCompleteOutcomeUnknown).
	if _, err := s.Fail(ctx, key, c.Token+100, sink.Failure{Cause: "warm-up"}); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("warm-up Fail = %v, want ErrFenced", err)
	}
	cctx, dropped := lostCommit(t, s, p)
	st, err := s.Fail(cctx, key, c.Token, sink.Failure{Cause: "exit status 3"})
	if err != nil || st != sink.StatePending {
		t.Fatalf("Fail with a lost reply = %v, %v; want pending (read back)", st, err)
	}
	dropped()
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StatePending || e.LastError != "exit status 3" {
		t.Fatalf("Get = %+v, %v; want pending with the cause", e, err)
	}
}

// TestRecordAndClaimOutcomeUnknown: a new key inserted already claimed,
// whose reply is lost, is found by the statement's nonce.
func TestRecordAndClaimOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, _ := lostReplySink(t)
	ctx := context.Background()
	sg := sink.Sighting{Key: "gemini:batches/rc-unknown", Source: sink.SourceWebhook, Payload: []byte(`{"a":1}`)}
	// Prepare the statement on the one connection (see TestCompleteOutcomeUnknown).
	if _, _, err := s.RecordAndClaim(ctx, sink.Sighting{Key: sg.Key + "-warm-up", Source: sg.Source}, sink.ClaimRequest{Owner: "w", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	cctx, dropped := lostCommit(t, s, p)
	r, c, err := s.RecordAndClaim(cctx, sg, sink.ClaimRequest{Owner: "w", Lease: time.Minute})
	if err != nil || !r.New || r.State != sink.StateClaimed || c == nil || c.Token != 1 || string(c.Payload) != `{"a":1}` {
		t.Fatalf("RecordAndClaim with a lost reply = %+v, %+v, %v; want new and claimed, read back", r, c, err)
	}
	dropped()
}
