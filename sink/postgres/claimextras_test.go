package postgres

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestClaimThatWaitedForTheConfirmationGetsTheWebhookBody: a claim of a
// webhook-first key waits behind the transaction of another process that
// confirms the key (the API's operation becomes the payload, the webhook
// body moves to the extras table). The claim then claims the row as that
// transaction left it, confirmed with the API's operation, and must carry
// the webhook body too, as a claim that did not wait does (the effect's
// event has both): the bodies are read after the row is locked, in a
// statement whose snapshot has the extras row.
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
	waitForLockWait(ctx, t, watcher, loadMarker, confirmed)
	// Second: the claim, whose snapshot is taken now.
	type result struct {
		c   sink.Claim
		err error
	}
	claimed := make(chan result, 1)
	go func() {
		c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
		claimed <- result{c, err}
	}()
	waitForLockWaits(ctx, t, watcher, loadMarker, 2, nil)
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
