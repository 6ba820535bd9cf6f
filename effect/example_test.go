package effect_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gemrecon/gemrecon/effect"
)

// The default effect prints each event document as one NDJSON line.
func ExampleNewPrint() {
	p := effect.NewPrint(os.Stdout, nil)
	_ = p.Run(context.Background(), effect.Event{
		Key:        "gemini:batches/abc",
		Name:       "batches/abc",
		State:      "SUCCEEDED",
		Source:     "webhook",
		Attempt:    1,
		Token:      7,
		Operation:  json.RawMessage(`{"name": "batches/abc", "done": true}`),
		Confirmed:  true,
		BatchState: "SUCCEEDED",
		Webhook:    json.RawMessage(`{"type":"batch.succeeded","data":{"id":"abc"}}`),
	})
	// Output:
	// {"key":"gemini:batches/abc","name":"batches/abc","state":"SUCCEEDED","source":"webhook","attempt":1,"token":7,"operation":{"name":"batches/abc","done":true},"confirmed":true,"batch_state":"SUCCEEDED","webhook":{"type":"batch.succeeded","data":{"id":"abc"}},"rerun":false}
}

// An effect tells the dispatcher how to treat a failure: retry with backoff
// (any error), not before a delay (WithRetryAfter), or never (Permanent).
func ExamplePermanent() {
	errs := []error{
		errors.New("connection reset"),
		effect.WithRetryAfter(errors.New("HTTP 503"), 2*time.Second),
		effect.Permanent(errors.New("HTTP 400")),
	}
	for _, err := range errs {
		after, ok := effect.RetryAfterOf(err)
		fmt.Printf("%s: permanent=%v retry-after=%v,%v\n", err, effect.IsPermanent(err), after, ok)
	}
	// Output:
	// connection reset: permanent=false retry-after=0s,false
	// HTTP 503: permanent=false retry-after=2s,true
	// HTTP 400: permanent=true retry-after=0s,false
}
