package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// An insert into gemrecon_key_extras (NoteResults, the first time a key
// gets a row there) takes FOR KEY SHARE on the key's row when its foreign
// key is checked, at the end of the statement, after its own row is in
// the unique index. A statement that locks the key row FOR UPDATE and then
// inserts the same key's extras row (a flush carrying a webhook body, a
// sighting from the API confirming a webhook-first key) would then wait
// for the insert while the insert waits for it: a deadlock. The key rows
// must be locked FOR NO KEY UPDATE (what an UPDATE that does not change the
// key takes), which a foreign-key check does not wait for.

// waitForLockWait waits until a statement whose text contains like waits
// for a lock; it fails the test if done reports first.
func waitForLockWait(ctx context.Context, t *testing.T, watcher *pgx.Conn, like string, done <-chan error) {
	t.Helper()
	waitForLockWaits(ctx, t, watcher, like, 1, done)
}

// loadMarker is in the text of the statement that loads and locks a key's
// row in every write (pgTx.Load).
const loadMarker = "FROM gemrecon_keys WHERE key = $1 FOR UPDATE"

// waitForLockWaits is waitForLockWait for n statements.
func waitForLockWaits(ctx context.Context, t *testing.T, watcher *pgx.Conn, like string, n int, done <-chan error) {
	t.Helper()
	for waiting := 0; waiting < n; {
		select {
		case err := <-done:
			t.Fatalf("the statement returned (%v) while a row it must change was locked", err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, like).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoteResultsDuringAFlushOfItsKey: a flush that has locked key K (it
// carries K's first webhook body) waits for a later key L held by another
// transaction; meanwhile K's holder notes its results. NoteResults waits
// for K's row, holding nothing the flush needs: once L is free, the flush
// writes K's extras row and commits, and NoteResults follows (before, when
// NoteResults inserted the extras row first and then waited for K, the two
// deadlocked).
func TestNoteResultsDuringAFlushOfItsKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, dsn := openTest(t, sink.Options{})
	k, l := orderKey(1), orderKey(2) // k sorts first: the flush locks it before l
	for _, key := range []string{k, l} {
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.Claim(ctx, k, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"batch.succeeded"}`)
	// Buffered: k's first webhook body (k is poll-first), a duplicate of l.
	if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: body}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: l, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}

	tx, err := adminConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT key FROM gemrecon_keys WHERE key = $1 FOR UPDATE`, l); err != nil {
		t.Fatal(err)
	}
	watcher := adminConn(t, dsn)
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush(ctx) }()
	waitForLockWait(ctx, t, watcher, "jsonb_to_recordset", flushed)
	noted := make(chan error, 1)
	go func() { noted <- s.NoteResults(ctx, k, c.Token, "results.jsonl") }()
	waitForLockWait(ctx, t, watcher, loadMarker, noted)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if err := <-noted; err != nil {
		t.Fatalf("NoteResults: %v", err)
	}
	e, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if e.ResultsFile != "results.jsonl" || !bytes.Equal(e.Webhook, body) || e.SeenCount != 2 {
		t.Fatalf("after both: results file %q, webhook %q, seen %d; want %q, %q, 2", e.ResultsFile, e.Webhook, e.SeenCount,
			"results.jsonl", body)
	}
}

// TestConfirmingSightingBesideAForeignKeyCheck: another transaction holds
// FOR KEY SHARE on a claimed webhook-first key's row (the foreign-key check
// of an insert into its extras row, as an older gemrecon's NoteResults
// makes) and inserts that extras row. A sighting from the API that confirms
// the key waits for the key's row, holding nothing the other needs, and
// then moves the webhook body into the same extras row: no cycle.
func TestConfirmingSightingBesideAForeignKeyCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, dsn := openTest(t, sink.Options{})
	k := orderKey(1)
	body := []byte(`{"type":"batch.succeeded"}`)
	if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: body}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, k, "w", time.Minute, sink.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	tx, err := adminConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT key FROM gemrecon_keys WHERE key = $1 FOR KEY SHARE`, k); err != nil {
		t.Fatal(err)
	}
	op := []byte(`{"name":"batches/order-0001","done":true}`)
	type result struct {
		r   sink.RecordResult
		err error
	}
	recorded := make(chan result, 1)
	go func() {
		r, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: op, FromAPI: true, State: "SUCCEEDED"})
		recorded <- result{r, err}
	}()
	waitForLockWait(ctx, t, adminConn(t, dsn), loadMarker, nil)
	if _, err := tx.Exec(ctx, `INSERT INTO gemrecon_key_extras (key, results_file) VALUES ($1, 'r.jsonl')
		ON CONFLICT (key) DO UPDATE SET results_file = excluded.results_file`, k); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-recorded; r.err != nil || !r.r.Confirmed {
		t.Fatalf("a confirming sighting beside a FOR KEY SHARE lock: %+v, %v; want confirmed", r.r, r.err)
	}
	e, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Confirmed || !bytes.Equal(e.Webhook, body) || !bytes.Equal(e.Payload, op) || e.ResultsFile != "r.jsonl" {
		t.Fatalf("confirmed %v, webhook %q, payload %q, results %q; want true, %q, %q, r.jsonl", e.Confirmed, e.Webhook, e.Payload, e.ResultsFile, body, op)
	}
}

// TestConfirmedMeanwhileIsNoUnknownOutcome: a sighting from the API whose
// confirming statement finds the key confirmed by another process
// meanwhile (it waited for that process's row lock) got a whole reply with
// no row. That outcome is known: nothing was written. It must not be
// settled as a lost reply, which logged a false alarm and ran settle: it
// terminates the backend that ran the statement, by then an idle pooled
// connection of the sink itself whenever settle's own connection is
// another one (the next statement on it then fails).
func TestConfirmedMeanwhileIsNoUnknownOutcome(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, _ := testSchema(t)
	app := "gemrecon/test-" + rand.Text()[:8] // to find the sink's backends
	var logs testkit.Buffer
	s := openDSN(t, withParam(dsn, "application_name", app), sink.Options{},
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	k := orderKey(1)
	if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	admin := adminConn(t, dsn)

	tx, err := adminConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `UPDATE gemrecon_keys SET confirmed = true WHERE key = $1`, k); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   sink.RecordResult
		err error
	}
	recorded := make(chan result, 1)
	go func() {
		r, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(`{"name":"x"}`), FromAPI: true})
		recorded <- result{r, err}
	}()
	for waiting := false; !waiting; {
		select {
		case r := <-recorded:
			t.Fatalf("Record returned (%+v, %v) while the key's row was locked", r.r, r.err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock')`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-recorded
	if r.err != nil || r.r.Confirmed || r.r.State != sink.StatePending {
		t.Fatalf("Record: %+v, %v; want a plain duplicate of the pending key", r.r, r.err)
	}
	if strings.Contains(logs.String(), "outcome is unknown") {
		t.Errorf("a whole reply with no row was settled as a lost one:\n%s", logs.String())
	}
}
