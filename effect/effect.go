// Package effect runs the user's side effect for one completion (spec §4):
// a shell command, an HTTP forward, or an NDJSON line on stdout.
package effect

import (
	"context"
	"encoding/json"
	"errors"
	"time"
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

// marked is an error marked as one of the kinds below (K tells them apart
// for errors.As, so that marks on one chain never hide each other).
type marked[K any] struct {
	err   error
	after time.Duration // retryAfter's delay
}

func (e *marked[K]) Error() string { return e.err.Error() }
func (e *marked[K]) Unwrap() error { return e.err }

// The kinds of marks.
type (
	// permanent: an error that retrying cannot fix (spec §4: a 4xx from
	// the forward target other than 408, 409, 425 and 429).
	permanent struct{}
	// retryAfter: the earliest delay before the next attempt that the
	// downstream asked for (an HTTP Retry-After).
	retryAfter struct{}
	// broken: the effect cannot run any attempt in this process, its
	// output is gone or stalled (the NDJSON stdout).
	broken struct{}
)

func mark[K any](err error, after time.Duration) error {
	if err == nil {
		return nil
	}
	return &marked[K]{err: err, after: after}
}

// Permanent marks err as permanent: the dispatcher sends the key to dead at
// once instead of scheduling a retry. Permanent(nil) is nil.
func Permanent(err error) error { return mark[permanent](err, 0) }

// IsPermanent reports whether err, or any error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	_, ok := errors.AsType[*marked[permanent]](err)
	return ok
}

// WithRetryAfter attaches the earliest delay d before the next attempt to a
// retryable err. WithRetryAfter(nil, d) is nil; d <= 0 returns err unchanged.
func WithRetryAfter(err error, d time.Duration) error {
	if d <= 0 {
		return err
	}
	return mark[retryAfter](err, d)
}

// RetryAfterOf returns the delay attached with WithRetryAfter anywhere in
// err's chain; ok is false when there is none.
func RetryAfterOf(err error) (time.Duration, bool) {
	if m, ok := errors.AsType[*marked[retryAfter]](err); ok {
		return m.after, true
	}
	return 0, false
}

// Broken marks err as the effect being unusable in this process (it was not
// the key's fault: gemrecon's stdout went away or stopped taking data). The
// dispatcher records the attempt as a failure that uses up no attempt
// (sink.Failure.NoAttempt), claims nothing more, and returns an error that
// ends the command. Broken(nil) is nil.
func Broken(err error) error { return mark[broken](err, 0) }

// IsBroken reports whether err, or any error it wraps, was marked with
// Broken.
func IsBroken(err error) bool {
	_, ok := errors.AsType[*marked[broken]](err)
	return ok
}
