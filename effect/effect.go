// Package effect runs the user's side effect for one completion (spec §4):
// a shell command, an HTTP forward, or an NDJSON line on stdout.
package effect

import (
	"context"
	"encoding/json"
)

// Event is the event document every effect receives (spec §4). Its JSON field
// names are part of the contract.
type Event struct {
	Key       string          `json:"key"`
	Name      string          `json:"name"`
	State     string          `json:"state"`
	Source    string          `json:"source"`
	Attempt   int             `json:"attempt"`
	Token     int64           `json:"token"`
	Operation json.RawMessage `json:"operation"`
}

// Effect runs once per attempt. A nil error is success. Errors are retried
// unless marked with Permanent; RetryAfter sets the earliest next attempt.
type Effect interface {
	Run(ctx context.Context, ev Event) error
}
