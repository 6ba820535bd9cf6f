package dispatch

// The --sql effect (spec §4) against the transactional inbox (docs/design.md
// §1): an invoices table, a ledger with UNIQUE (invoice_id, kind) and an outbox,
// living in the sink's own database (on PostgreSQL, the same search_path
// schema). Every test runs on SQLite (a file in t.TempDir()) and on
// PostgreSQL (pgtest.Schema; skipped without GEMRECON_TEST_POSTGRES).

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx" for the application tables

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// The application schema and the --sql scripts, per dialect.
const (
	sqliteSchema = `
CREATE TABLE invoices (
    id          TEXT PRIMARY KEY,
    status      TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'paid', 'void')),
    amount_due  INTEGER NOT NULL,
    amount_paid INTEGER NOT NULL DEFAULT 0,
    paid_count  INTEGER NOT NULL DEFAULT 0,
    CHECK (amount_paid <= amount_due)
);
CREATE TABLE ledger_entries (
    id         INTEGER PRIMARY KEY,
    invoice_id TEXT NOT NULL,
    kind       TEXT NOT NULL,
    amount     INTEGER NOT NULL,
    key        TEXT NOT NULL,
    token      INTEGER NOT NULL,
    UNIQUE (invoice_id, kind)
);
CREATE TABLE outbox (
    id           INTEGER PRIMARY KEY,
    aggregate_id TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    payload      TEXT NOT NULL
);
CREATE TABLE runs (key TEXT NOT NULL, token INTEGER NOT NULL);`

	postgresSchema = `
CREATE TABLE invoices (
    id          text PRIMARY KEY,
    status      text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'paid', 'void')),
    amount_due  bigint NOT NULL,
    amount_paid bigint NOT NULL DEFAULT 0,
    paid_count  int NOT NULL DEFAULT 0,
    CHECK (amount_paid <= amount_due)
);
CREATE TABLE ledger_entries (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    invoice_id text NOT NULL,
    kind       text NOT NULL,
    amount     bigint NOT NULL,
    key        text NOT NULL,
    token      bigint NOT NULL,
    UNIQUE (invoice_id, kind)
);
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_id text NOT NULL,
    event_type   text NOT NULL,
    payload      jsonb NOT NULL
);
CREATE TABLE runs (key text NOT NULL, token bigint NOT NULL);`

	// The ledger script: book the payment, mark the invoice paid, tell
	// downstream through the outbox. The UPDATE is the second statement:
	// an invoice whose amount_due is too small fails its CHECK there.
	sqliteLedgerScript = `-- the transactional inbox: book the payment once, in the transaction that marks the key done
INSERT INTO ledger_entries (invoice_id, kind, amount, key, token)
VALUES (@name, 'payment', json_extract(@operation, '$.amount'), @key, @token);
UPDATE invoices
   SET status = 'paid',
       amount_paid = amount_paid + json_extract(@operation, '$.amount'),
       paid_count = paid_count + 1
 WHERE id = @name;
INSERT INTO outbox (aggregate_id, event_type, payload)
VALUES (@name, 'InvoicePaymentBooked', json_object('key', @key, 'amount', json_extract(@operation, '$.amount')));
`
	postgresLedgerScript = `-- the transactional inbox: book the payment once, in the transaction that marks the key done
INSERT INTO ledger_entries (invoice_id, kind, amount, key, token)
VALUES (@name, 'payment', (@operation::jsonb ->> 'amount')::bigint, @key, @token);
UPDATE invoices
   SET status = 'paid',
       amount_paid = amount_paid + (@operation::jsonb ->> 'amount')::bigint,
       paid_count = paid_count + 1
 WHERE id = @name;
INSERT INTO outbox (aggregate_id, event_type, payload)
VALUES (@name, 'InvoicePaymentBooked', jsonb_build_object('key', @key::text, 'amount', (@operation::jsonb ->> 'amount')::bigint));
`
	// The slow script of the kill test: a row per run (no constraint: a
	// duplicate would show), then a few milliseconds of work inside the
	// same transaction, where the kills land.
	sqliteSlowScript = `INSERT INTO runs (key, token) VALUES (@key, @token);
SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400) SELECT x FROM c);`
	postgresSlowScript = `INSERT INTO runs (key, token) VALUES (@key, @token);
SELECT pg_sleep(0.02);`
)

// sqlWorld is one backend's database: the sink's DSN (or path) and a
// connection for the application tables.
type sqlWorld struct {
	db  string
	pg  bool
	dir string
	app *sql.DB
}

// newSQLWorld returns an empty database of the backend (PostgreSQL: a
// fresh schema) with the application's own connection to it, closed when
// the test ends.
func newSQLWorld(tb testing.TB, pg bool) *sqlWorld {
	tb.Helper()
	w := &sqlWorld{pg: pg, dir: tb.TempDir()}
	var err error
	if pg {
		w.db = pgtest.Schema(tb)
		w.app, err = sql.Open("pgx", w.db)
	} else {
		w.db = filepath.Join(w.dir, "gemrecon.db")
		w.app, err = sql.Open("sqlite", "file:"+w.db+"?_pragma=busy_timeout(30000)&_pragma=journal_mode(wal)")
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { w.app.Close() })
	return w
}

// forEachSQLBackend runs f on SQLite and on PostgreSQL, each with the
// application schema created.
func forEachSQLBackend(t *testing.T, f func(t *testing.T, w *sqlWorld)) {
	for _, pg := range []bool{false, true} {
		name := map[bool]string{false: "sqlite", true: "postgres"}[pg]
		t.Run(name, func(t *testing.T) {
			w := newSQLWorld(t, pg)
			// The sink's own tables first (a migration at open), then the
			// application's, in the same database.
			s := w.open(t, sink.Options{})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			w.exec(t, w.pick(sqliteSchema, postgresSchema))
			f(t, w)
		})
	}
}

func (w *sqlWorld) pick(sqlite, postgres string) string {
	if w.pg {
		return postgres
	}
	return sqlite
}

func (w *sqlWorld) open(t testing.TB, opt sink.Options) sink.Sink {
	t.Helper()
	if opt.BusyTimeout == 0 {
		opt.BusyTimeout = 30 * time.Second
	}
	s, err := dial.Open(context.Background(), w.db, opt, nil)
	if err != nil {
		t.Fatalf("dial.Open(%q): %v", w.db, err)
	}
	return s
}

func (w *sqlWorld) exec(t testing.TB, q string) {
	t.Helper()
	if _, err := w.app.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (w *sqlWorld) count(t testing.TB, q string) int64 {
	t.Helper()
	var n int64
	if err := w.app.QueryRow(q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// script writes a --sql file and loads it as the CLI does.
func (w *sqlWorld) script(t testing.TB, sqlite, postgres string) *sqlscript.Script {
	t.Helper()
	path := filepath.Join(w.dir, "effect.sql")
	if err := os.WriteFile(path, []byte(w.pick(sqlite, postgres)), 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := sqlscript.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func invoiceKey(i int) (key, name string, payload []byte) {
	name = fmt.Sprintf("batches/inv-%04d", i)
	return "gemini:" + name, name, []byte(fmt.Sprintf(`{"name":%q,"amount":100}`, name))
}

// outcomeCount is an Observer that counts outcomes.
type outcomeCount struct {
	mu sync.Mutex
	n  map[Outcome]int
}

func (o *outcomeCount) ObserveEffect(out string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[Outcome]int{}
	}
	o.n[Outcome(out)]++
}

func (o *outcomeCount) get(out Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

func TestSQLNeedsCompleter(t *testing.T) {
	q, err := sqlscript.Parse(`SELECT @key`)
	if err != nil {
		t.Fatal(err)
	}
	type plain struct{ sink.Sink } // hides CompleteSQL
	if _, err := New(Config{Sink: plain{sqlitetest.OpenTemp(t, sink.Options{})}, SQL: q}); err == nil || !strings.Contains(err.Error(), "sink.SQLCompleter") {
		t.Fatalf("New(SQL with a sink without CompleteSQL) error = %v, want one naming sink.SQLCompleter", err)
	}
	if _, err := New(Config{Sink: sqlitetest.OpenTemp(t, sink.Options{}), SQL: q, Effect: effect.NewPrint(nil, nil)}); err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("New(SQL and Effect) error = %v, want exclusive", err)
	}
	if _, err := New(Config{Sink: sqlitetest.OpenTemp(t, sink.Options{}), SQL: q}); err != nil {
		t.Fatalf("New(SQL, no Effect) error = %v", err)
	}
}

// (1) The transactional inbox's concurrent deliveries: 8 dispatchers, each with its own
// sink (8 connections, as 8 processes would have), receive every completion
// at once, by webhook and by poll, and run it at once (serve --sync); then
// both paths redeliver everything. Each invoice is booked once: one ledger
// row, one outbox row, paid once.
func TestSQLConcurrentDeliveriesBookOnce(t *testing.T) {
	t.Parallel()
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		const invoices, deliveries = 5, 8
		for i := range invoices {
			_, name, _ := invoiceKey(i)
			w.exec(t, fmt.Sprintf(`INSERT INTO invoices (id, amount_due) VALUES ('%s', 1000)`, name))
		}
		q := w.script(t, sqliteLedgerScript, postgresLedgerScript)
		ctx := context.Background()
		obs := &outcomeCount{}
		ds := make([]*Dispatcher, deliveries)
		sinks := make([]sink.Sink, deliveries)
		for j := range deliveries {
			sinks[j] = w.open(t, sink.Options{})
			t.Cleanup(func() { sinks[j].Close() })
			d, err := New(Config{Sink: sinks[j], SQL: q, Logger: quietLogger(), Observer: obs, Lease: time.Minute, EffectTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ds[j] = d
		}
		deliver := func(round int) {
			var wg sync.WaitGroup
			start := make(chan struct{})
			errs := make(chan error, invoices*deliveries)
			for i := range invoices {
				key, _, payload := invoiceKey(i)
				for j := range deliveries {
					src := []string{sink.SourceWebhook, sink.SourcePoll}[(i+j+round)%2]
					wg.Go(func() {
						<-start
						if _, err := sinks[j].Record(ctx, sink.Sighting{Key: key, Source: src, Payload: payload}); err != nil {
							errs <- err
							return
						}
						if _, err := ds[j].RunKeyWithin(ctx, key, 0); err != nil {
							errs <- err
						}
					})
				}
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("delivery: %v", err)
			}
		}
		deliver(0)
		for _, d := range ds { // whatever a busy RunKeyWithin left
			if _, err := d.Drain(ctx); err != nil {
				t.Fatal(err)
			}
		}
		deliver(1) // redeliveries after done
		for _, d := range ds {
			if sum, err := d.Drain(ctx); err != nil || sum.Claimed != 0 {
				t.Fatalf("Drain after redeliveries = %+v, %v; want nothing claimed", sum, err)
			}
		}
		if got := obs.get(OutcomeDone); got != invoices {
			t.Errorf("done outcomes = %d, want %d (one per completion); all: %v", got, invoices, obs.n)
		}
		for what, want := range map[string]int64{
			`SELECT count(*) FROM ledger_entries`:                                   invoices,
			`SELECT count(DISTINCT invoice_id) FROM ledger_entries`:                 invoices,
			`SELECT count(*) FROM outbox`:                                           invoices,
			`SELECT count(*) FROM invoices WHERE status = 'paid'`:                   invoices,
			`SELECT count(*) FROM invoices WHERE paid_count = 1`:                    invoices,
			`SELECT coalesce(sum(amount_paid), 0) FROM invoices`:                    invoices * 100,
			`SELECT count(*) FROM outbox WHERE event_type = 'InvoicePaymentBooked'`: invoices,
		} {
			if got := w.count(t, what); got != want {
				t.Errorf("%s = %d, want %d", what, got, want)
			}
		}
		for i := range invoices {
			key, _, _ := invoiceKey(i)
			e, err := sinks[0].Get(ctx, key)
			if err != nil || e.State != sink.StateDone || e.Attempts != 1 {
				t.Errorf("Get(%s) = %s attempts %d, %v; want done after 1 attempt", key, e.State, e.Attempts, err)
			}
		}
	})
}

// (2) A failing statement rolls everything back and leaves the key
// retryable: the mark-received-first loss (docs/design.md §1: the failure turns every
// redelivery into a duplicate, the payment is never booked) does not happen.
// Once the data is fixed, the retry books it.
func TestSQLFailureRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		ctx := context.Background()
		var clock atomic.Int64
		clock.Store(time.Now().UnixNano())
		now := func() time.Time { return time.Unix(0, clock.Load()) }
		s := w.open(t, sink.Options{Now: now, RetryBase: time.Minute, RetryMax: time.Minute})
		defer s.Close()
		key, name, payload := invoiceKey(1)
		// amount_due 50 < the payment of 100: the UPDATE (2nd statement)
		// violates CHECK (amount_paid <= amount_due).
		w.exec(t, fmt.Sprintf(`INSERT INTO invoices (id, amount_due) VALUES ('%s', 50)`, name))
		d, err := New(Config{Sink: s, SQL: w.script(t, sqliteLedgerScript, postgresLedgerScript), Logger: quietLogger(), Now: now,
			Lease: time.Minute, EffectTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		if sum, err := d.Drain(ctx); err != nil || sum.Failed != 1 {
			t.Fatalf("Drain = %+v, %v; want one failure", sum, err)
		}
		rolledBack := func() {
			t.Helper()
			for _, q := range []string{`SELECT count(*) FROM ledger_entries`, `SELECT count(*) FROM outbox`, `SELECT coalesce(sum(amount_paid), 0) FROM invoices`} {
				if got := w.count(t, q); got != 0 {
					t.Fatalf("%s = %d after the failed script, want 0 (rolled back)", q, got)
				}
			}
		}
		rolledBack()
		e, err := s.Get(ctx, key)
		if err != nil || e.State != sink.StatePending || e.Attempts != 1 || !strings.Contains(strings.ToLower(e.LastError), "check") {
			t.Fatalf("Get = state %s attempts %d last error %q, %v; want pending, 1, a CHECK violation", e.State, e.Attempts, e.LastError, err)
		}
		// A redelivery now is not a "duplicate" that loses the payment:
		// the key is still pending, and it runs when due.
		if rr, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}); err != nil || rr.State != sink.StatePending {
			t.Fatalf("Record(redelivery) = %+v, %v; want pending", rr, err)
		}
		// Fix the data; the retry (once due) books the payment.
		w.exec(t, fmt.Sprintf(`UPDATE invoices SET amount_due = 100 WHERE id = '%s'`, name))
		clock.Add(int64(2 * time.Minute))
		if sum, err := d.Drain(ctx); err != nil || sum.OK != 1 {
			t.Fatalf("Drain after the fix = %+v, %v; want one done", sum, err)
		}
		for q, want := range map[string]int64{
			`SELECT count(*) FROM ledger_entries`:                 1,
			`SELECT count(*) FROM outbox`:                         1,
			`SELECT count(*) FROM invoices WHERE paid_count = 1`:  1,
			`SELECT count(*) FROM ledger_entries WHERE token = 2`: 1, // the second attempt's
			`SELECT coalesce(sum(amount_paid), 0) FROM invoices`:  100,
		} {
			if got := w.count(t, q); got != want {
				t.Errorf("%s = %d, want %d", q, got, want)
			}
		}
		if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateDone || e.Attempts != 2 {
			t.Fatalf("Get = %s attempts %d, %v; want done after 2 attempts", e.State, e.Attempts, err)
		}
	})
}

// (3) kill -9 of dispatcher processes in the middle of the SQL effect,
// again and again, over 1,000 keys: every key ends done, and every key's
// script committed exactly once (the runs table has no constraint that
// could hide a duplicate). On PostgreSQL each kill waits (bounded) until a
// script is seen running in pg_stat_activity; on SQLite nothing shows a
// running transaction to another process, so the script is made to dominate
// a child's time instead (≈ 6.5 ms of ≈ 12 ms per key under -race): ten
// kills all missing a transaction has odds of about 2^-10.
func TestSQLKillNemesis(t *testing.T) {
	testkit.ParallelUnlessRace(t)
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		const n, kills = 1000, 10
		ctx := context.Background()
		s := w.open(t, sink.Options{})
		defer s.Close()
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				for i := g; i < n; i += 16 {
					key, _, payload := invoiceKey(i)
					if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		// A marker in the script lets the PostgreSQL run see it running.
		marker := fmt.Sprintf("nemesis-%d", rand.Int64())
		q := w.script(t, sqliteSlowScript+"\n-- "+marker, postgresSlowScript+"\n-- "+marker)
		env := sqlChildEnv{Role: "drain", DB: w.db, File: q.Path(), Lease: 2 * time.Second, Timeout: time.Second, Conc: 4}
		start := time.Now()
		midScript := 0
		for k := range kills {
			c := startSQLChild(t, env)
			c.waitFor(t, "READY", 30*time.Second)
			time.Sleep(time.Duration(150+rand.IntN(250)) * time.Millisecond)
			if w.pg {
				// Kill while a script is running (bounded wait): the
				// server sees the connection drop mid-transaction.
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
					if w.count(t, `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%`+marker+`%' AND pid <> pg_backend_pid()`) > 0 {
						midScript++
						break
					}
				}
			}
			c.kill9(t)
			t.Logf("kill %d: runs so far %d", k+1, w.count(t, `SELECT count(*) FROM runs`))
		}
		if w.pg && midScript < kills/2 {
			t.Errorf("only %d of %d kills were seen to land while a script ran", midScript, kills)
		}
		c := startSQLChild(t, env)
		c.waitFor(t, "DONE", 60*time.Second)
		t.Logf("%d kills (%d seen mid-script on PostgreSQL) and the final run took %v", kills, midScript, time.Since(start).Round(time.Millisecond))
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.ByState[sink.StateDone] != n {
			t.Fatalf("done keys = %d, want %d (by state: %v)", st.ByState[sink.StateDone], n, st.ByState)
		}
		if got := w.count(t, `SELECT count(*) FROM runs`); got != n {
			t.Errorf("runs rows = %d, want exactly %d", got, n)
		}
		if got := w.count(t, `SELECT count(DISTINCT key) FROM runs`); got != n {
			t.Errorf("distinct keys in runs = %d, want %d", got, n)
		}
		// Each key's committed run is the attempt that marked it done.
		es, err := s.List(ctx, sink.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		retried := 0
		tokens := map[string]int64{}
		for _, e := range es {
			tokens[e.Key] = e.Token
			if e.Attempts > 1 {
				retried++
			}
		}
		rows, err := w.app.Query(`SELECT key, token FROM runs`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var token int64
			if err := rows.Scan(&key, &token); err != nil {
				t.Fatal(err)
			}
			if tokens[key] != token {
				t.Errorf("runs row of %s has token %d; the key was done with token %d", key, token, tokens[key])
			}
		}
		if retried == 0 {
			t.Errorf("no key needed a second attempt: the kills never hit a claim, the test proved nothing")
		}
		t.Logf("%d keys needed more than one attempt (a kill hit their claim)", retried)
	})
}

// (4) A stale holder cannot commit its SQL: process A claims the key and
// stops (SIGSTOP) past its lease, B takes the key over and completes it,
// and after SIGCONT A's CompleteSQL is fenced and writes nothing. A stops
// itself between the claim and CompleteSQL (stoppingSink), before its
// transaction begins: on SQLite a stopped process holding the write lock
// would block everyone, the takeover included.
func TestSQLStaleHolderIsFenced(t *testing.T) {
	t.Parallel()
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		ctx := context.Background()
		key, name, payload := invoiceKey(7)
		w.exec(t, fmt.Sprintf(`INSERT INTO invoices (id, amount_due) VALUES ('%s', 1000)`, name))
		q := w.script(t, sqliteLedgerScript, postgresLedgerScript)
		s := w.open(t, sink.Options{})
		defer s.Close()
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		const lease = time.Second
		a := startSQLChild(t, sqlChildEnv{Role: "stale", DB: w.db, File: q.Path(), Lease: lease, Timeout: lease / 2, Conc: 1, Key: key})
		a.waitFor(t, "STOPPING", 30*time.Second)
		for deadline := time.Now().Add(10 * time.Second); !a.stopped(); {
			if time.Now().After(deadline) {
				t.Fatal("child A did not stop")
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Wait (bounded) until A's lease has run out.
		e, err := s.Get(ctx, key)
		if err != nil || e.State != sink.StateClaimed {
			t.Fatalf("Get while A is stopped = %s, %v; want claimed", e.State, err)
		}
		time.Sleep(time.Until(e.LeaseUntil) + 100*time.Millisecond)
		b, err := New(Config{Sink: s, SQL: q, Logger: quietLogger(), Lease: time.Minute, EffectTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := b.RunKeyWithin(ctx, key, 0); err != nil || out != OutcomeDone {
			t.Fatalf("B.RunKeyWithin = %s, %v; want done (a takeover)", out, err)
		}
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if l := a.waitFor(t, "COMPLETESQL", 30*time.Second); !strings.Contains(l, sink.ErrFenced.Error()) {
			t.Fatalf("A's CompleteSQL after SIGCONT: %q, want ErrFenced", l)
		}
		if l := a.waitFor(t, "OUTCOME", 30*time.Second); !strings.HasPrefix(l, "OUTCOME fenced") {
			t.Fatalf("A's outcome: %q, want fenced", l)
		}
		for q, want := range map[string]int64{
			`SELECT count(*) FROM ledger_entries`:                 1,
			`SELECT count(*) FROM outbox`:                         1,
			`SELECT count(*) FROM invoices WHERE paid_count = 1`:  1,
			`SELECT count(*) FROM ledger_entries WHERE token = 2`: 1, // B's
		} {
			if got := w.count(t, q); got != want {
				t.Errorf("%s = %d, want %d", q, got, want)
			}
		}
		if st, err := s.Stats(ctx); err != nil || st.Fenced < 1 {
			t.Errorf("Stats.Fenced = %d, %v; want at least 1", st.Fenced, err)
		}
	})
}

// TestSQLScriptWithAByteOrderMark: an editor may save the --sql file with a
// UTF-8 byte order mark. SQLite skips one, PostgreSQL does not ("syntax
// error at or near") — so a script that passed the start-up check would
// fail every attempt there until each key went dead. The BOM is not part
// of the script.
func TestSQLScriptWithAByteOrderMark(t *testing.T) {
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		ctx := context.Background()
		s := w.open(t, sink.Options{})
		defer s.Close()
		const script = "\ufeffINSERT INTO runs (key, token) VALUES (@key, @token);\n"
		d, err := New(Config{Sink: s, SQL: w.script(t, script, script), Logger: quietLogger(),
			Lease: time.Minute, EffectTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		key, _, payload := invoiceKey(1)
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: payload}); err != nil {
			t.Fatal(err)
		}
		if sum, err := d.Drain(ctx); err != nil || sum.OK != 1 {
			e, _ := s.Get(ctx, key)
			t.Fatalf("Drain = %+v, %v (last error %q); want one done", sum, err, e.LastError)
		}
		if got := w.count(t, `SELECT count(*) FROM runs`); got != 1 {
			t.Errorf("runs = %d, want 1", got)
		}
	})
}

// TestSQLWebhookBodyNotUTF8: a verified webhook body may carry bytes that
// are not UTF-8 inside a JSON string other than the name (nothing promises
// otherwise; the receiver records it as sent). Handed on verbatim as
// @operation and @webhook, PostgreSQL refused the text ("invalid byte
// sequence for encoding UTF8") at every attempt until the key went dead;
// an --exec effect got an event document that is not UTF-8 JSON. The
// effect gets the body with each invalid sequence replaced by U+FFFD, as
// encoding/json reads it.
func TestSQLWebhookBodyNotUTF8(t *testing.T) {
	forEachSQLBackend(t, func(t *testing.T, w *sqlWorld) {
		ctx := context.Background()
		s := w.open(t, sink.Options{})
		defer s.Close()
		w.exec(t, `CREATE TABLE seen (op TEXT NOT NULL, hook TEXT NOT NULL)`)
		d, err := New(Config{Sink: s, SQL: w.script(t, `INSERT INTO seen (op, hook) VALUES (@operation, @webhook);`,
			`INSERT INTO seen (op, hook) VALUES (@operation, @webhook);`), Logger: quietLogger(),
			Lease: time.Minute, EffectTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		body := []byte("{\"type\":\"batch.succeeded\",\"data\":{\"id\":\"latin1\",\"note\":\"caf\xe9\"}}")
		if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/latin1", Source: sink.SourceWebhook, Payload: body}); err != nil {
			t.Fatal(err)
		}
		if sum, err := d.Drain(ctx); err != nil || sum.OK != 1 {
			e, _ := s.Get(ctx, "gemini:batches/latin1")
			t.Fatalf("Drain = %+v, %v (last error %q); want one done", sum, err, e.LastError)
		}
		if got := w.count(t, `SELECT count(*) FROM seen WHERE op LIKE '%caf`+"\ufffd"+`%' AND hook = op`); got != 1 {
			t.Errorf("rows with the body, U+FFFD for the bad byte = %d, want 1", got)
		}
	})
}
