package postgres

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
)

// TestClaimThatWaitedForTheConfirmationGetsTheWebhookBody: a claim of a
// webhook-first key waits behind the transaction of another process that
// confirms the key (the API's operation becomes the payload, the webhook
// body moves to the extras table). The claim then updates the row as that
// transaction left it, confirmed with the API's operation, but its
// statement's snapshot predates the extras row: the claim must still carry
// the webhook body, as a claim that did not wait does (the effect's event
// has both). Before: the body was missing.
func TestClaimThatWaitedForTheConfirmationGetsTheWebhookBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, dsn := openTest(t, sink.Options{})
	other := openDSN(t, dsn, sink.Options{}) // another process on the same database
	const key = "gemini:batches/cw"
	webhook := []byte(`{"type":"batch.succeeded","data":{"id":"cw"}}`)
	api := []byte(`{"name":"batches/cw","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}`)
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: webhook}); err != nil {
		t.Fatal(err)
	}

	tx, watcher := lockRow(ctx, t, dsn, key)
	// First in the row's queue: the confirming sighting.
	confirmed := make(chan error, 1)
	go func() {
		_, err := other.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: api, State: "SUCCEEDED", FromAPI: true})
		confirmed <- err
	}()
	waitForLockWait(ctx, t, watcher, "NOT confirmed FOR NO KEY UPDATE", confirmed)
	// Second: the claim, whose snapshot is taken now.
	type result struct {
		c   sink.Claim
		err error
	}
	claimed := make(chan result, 1)
	go func() {
		c, err := s.Claim(ctx, key, "w", time.Minute)
		claimed <- result{c, err}
	}()
	waitForLockWait(ctx, t, watcher, "AS takeover", nil)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-confirmed; err != nil {
		t.Fatalf("confirming Record: %v", err)
	}
	r := <-claimed
	if r.err != nil {
		t.Fatalf("Claim: %v", r.err)
	}
	if !r.c.Confirmed || !bytes.Equal(r.c.Payload, api) {
		t.Fatalf("claim: confirmed %v, payload %s; want the confirmed row with the API's operation (the claim did wait)", r.c.Confirmed, r.c.Payload)
	}
	if !bytes.Equal(r.c.Webhook, webhook) {
		t.Errorf("claim's webhook body = %q, want %q", r.c.Webhook, webhook)
	}
}

// TestClaimDueAfterAConfirmationCommittedMidStatementGetsTheWebhookBody:
// ClaimDue skips locked rows, yet it can claim a row version newer than
// its snapshot without waiting: when the transaction that confirms a
// webhook-first key commits after the claim statement took its snapshot
// and before it locks the row, READ COMMITTED locks and updates the newest
// version (the confirmed row, the API's operation as the payload) while the
// extras table is still read from the older snapshot, which has no webhook
// body. The claim must carry the webhook body all the same. The statement
// is held between its snapshot and its row locks by the schema's now(),
// made to wait for an advisory lock on the claiming sink's sessions only
// (VOLATILE, so that the planner never calls it: only the executor does,
// once the snapshot is taken).
func TestClaimDueAfterAConfirmationCommittedMidStatementGetsTheWebhookBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, schema, _ := pgtest.SkewedSchema(t)
	admin := adminConn(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE OR REPLACE FUNCTION `+schema+`.now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
		BEGIN
			IF current_setting('gemrecon_test.hold', true) = 'on' THEN
				PERFORM pg_advisory_xact_lock_shared(724301);
			END IF;
			RETURN pg_catalog.now();
		END $$`); err != nil {
		t.Fatal(err)
	}
	s := openDSN(t, dsn, sink.Options{})
	other := openDSN(t, dsn, sink.Options{})                                          // the confirming process
	claimer := openDSN(t, withParam(dsn, "gemrecon_test.hold", "on"), sink.Options{}) // the claiming one
	const key = "gemini:batches/cdw"
	webhook := []byte(`{"type":"batch.succeeded","data":{"id":"cdw"}}`)
	api := []byte(`{"name":"batches/cdw","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}`)
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: webhook}); err != nil {
		t.Fatal(err)
	}

	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(724301)`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		cs  []sink.Claim
		err error
	}
	claimed := make(chan result, 1)
	go func() {
		cs, err := claimer.ClaimDue(ctx, "w", time.Minute, 4)
		claimed <- result{cs, err}
	}()
	watcher := adminConn(t, dsn)
	waitForLockWait(ctx, t, watcher, "FOR UPDATE SKIP LOCKED", nil) // its snapshot is taken
	if _, err := other.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: api, State: "SUCCEEDED", FromAPI: true}); err != nil {
		t.Fatalf("confirming Record: %v", err)
	}
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_unlock(724301)`); err != nil {
		t.Fatal(err)
	}
	r := <-claimed
	if r.err != nil || len(r.cs) != 1 {
		t.Fatalf("ClaimDue = %d claims, %v; want the key", len(r.cs), r.err)
	}
	c := r.cs[0]
	if !c.Confirmed || !bytes.Equal(c.Payload, api) {
		t.Fatalf("claim: confirmed %v, payload %s; want the confirmed row with the API's operation (the confirmation committed before the row was locked)", c.Confirmed, c.Payload)
	}
	if !bytes.Equal(c.Webhook, webhook) {
		t.Errorf("claim's webhook body = %q, want %q", c.Webhook, webhook)
	}
}
