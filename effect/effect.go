// Package effect runs the user's side effect for one completion (spec §4):
// a shell command, an HTTP forward, or an NDJSON line on stdout.
package effect

import (
	"context"
	"encoding/json"
)

// Event is the event document every effect receives (spec §4, §9.3). Its
// JSON field names are part of the contract.
type Event struct {
	Key     string `json:"key"`
	Name    string `json:"name"`
	State   string `json:"state"` // the batch's state, as batch_state (kept for effects written before it)
	Source  string `json:"source"`
	Attempt int    `json:"attempt"`
	Token   int64  `json:"token"`
	// Operation is the API's operation once the key is confirmed; for a key
	// that is not (no credentials, --confirm never, an operations/… name),
	// the first webhook body.
	Operation json.RawMessage `json:"operation"`
	// Confirmed: Operation and BatchState are the API's (spec §9.2).
	Confirmed bool `json:"confirmed"`
	// BatchState is the batch's own state: SUCCEEDED, FAILED, CANCELLED,
	// EXPIRED, PARTIALLY_SUCCEEDED ("" when unknown).
	BatchState string `json:"batch_state"`
	// ResultsFile is the batch's results on this machine (--results-dir,
	// a succeeded Gemini API batch); ResultsLocation where Vertex AI wrote
	// them (nothing is fetched). At most one is set.
	ResultsFile     string `json:"results_file,omitempty"`
	ResultsLocation string `json:"results_location,omitempty"`
	// Webhook is the first webhook body, when a webhook saw the key.
	Webhook json.RawMessage `json:"webhook,omitempty"`
	// Rerun: the key was done and an operator sent it back (gemrecon rerun):
	// this run repeats an effect that succeeded (design §1).
	Rerun bool `json:"rerun"`
	// WithoutResults: the operator asked for this run without the batch's
	// results (retry --without-results: they expired, §9.5).
	WithoutResults bool `json:"without_results,omitempty"`
}

// Effect runs once per attempt. A nil error is success. Errors are retried
// unless marked with Permanent; RetryAfter sets the earliest next attempt.
type Effect interface {
	Run(ctx context.Context, ev Event) error
}
