package postgres

import (
	"bytes"
	"context"
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
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("the statement returned (%v) while a row it must change was locked", err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := watcher.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0)`, like).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoteResultsDuringAFlushOfItsKey: a flush that has locked key K (it
// carries K's first webhook body) waits for a later key L held by another
// transaction; meanwhile K's holder notes its results. NoteResults must
// not wait for the flush: when it did, the flush, once L was free, waited
// for NoteResults' extras row while NoteResults waited for K (a deadlock),
// or NoteResults failed after lock_timeout behind a flush stuck elsewhere.
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
	c, err := s.Claim(ctx, k, "w", time.Minute)
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
	flushed := make(chan error, 1)
	go func() { flushed <- s.Flush(ctx) }()
	waitForLockWait(ctx, t, adminConn(t, dsn), "jsonb_to_recordset", flushed)

	nctx, ncancel := context.WithTimeout(ctx, 2*time.Second) // well below lock_timeout (5 s)
	defer ncancel()
	start := time.Now()
	if err := s.NoteResults(nctx, k, c.Token, "results.jsonl"); err != nil {
		t.Errorf("NoteResults while a flush holds the key's row: %v after %v; want it not to wait for the flush",
			err, time.Since(start).Round(time.Millisecond))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("Flush: %v", err)
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

// TestConfirmingSightingBesideAForeignKeyCheck: while another transaction
// holds FOR KEY SHARE on a claimed webhook-first key's row (as NoteResults'
// insert of its extras row does, at the end of its statement), a sighting
// from the API that confirms the key must not wait for it: it then inserts
// the same extras row, so waiting would close a cycle with that insert.
func TestConfirmingSightingBesideAForeignKeyCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, dsn := openTest(t, sink.Options{})
	k := orderKey(1)
	body := []byte(`{"type":"batch.succeeded"}`)
	if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: body}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, k, "w", time.Minute); err != nil {
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
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	defer rcancel()
	op := []byte(`{"name":"batches/order-0001","done":true}`)
	start := time.Now()
	r, err := s.Record(rctx, sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: op, FromAPI: true, State: "SUCCEEDED"})
	if err != nil || !r.Confirmed {
		t.Fatalf("a confirming sighting beside a FOR KEY SHARE lock: %+v, %v after %v; want confirmed without waiting",
			r, err, time.Since(start).Round(time.Millisecond))
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if !e.Confirmed || !bytes.Equal(e.Webhook, body) || !bytes.Equal(e.Payload, op) {
		t.Fatalf("confirmed %v, webhook %q, payload %q; want true, %q, %q", e.Confirmed, e.Webhook, e.Payload, body, op)
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
	app := "gemrecon/test-" + randomHex(4) // to find the sink's backends
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
