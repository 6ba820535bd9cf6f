package effect

import (
	"errors"
	"time"
)

// permanentError marks an error that retrying cannot fix (spec §4: a 4xx
// from the forward target other than 408, 409, 425 and 429).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as permanent: the dispatcher sends the key to dead at
// once instead of scheduling a retry. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// retryAfterError carries the earliest delay before the next attempt that the
// downstream asked for (an HTTP Retry-After).
type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// WithRetryAfter attaches the earliest delay d before the next attempt to a
// retryable err. WithRetryAfter(nil, d) is nil; d <= 0 returns err unchanged.
func WithRetryAfter(err error, d time.Duration) error {
	if err == nil || d <= 0 {
		return err
	}
	return &retryAfterError{err: err, after: d}
}

// RetryAfterOf returns the delay attached with WithRetryAfter anywhere in
// err's chain; ok is false when there is none.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}

// brokenError marks an error after which the effect cannot run any attempt
// in this process: its output is gone or stalled (the NDJSON stdout).
type brokenError struct{ err error }

func (e *brokenError) Error() string { return e.err.Error() }
func (e *brokenError) Unwrap() error { return e.err }

// Broken marks err as the effect being unusable in this process (it was not
// the key's fault: gemrecon's stdout went away or stopped taking data). The
// dispatcher records the attempt as a failure that uses up no attempt
// (sink.Failure.NoAttempt), claims nothing more, and returns an error that
// ends the command. Broken(nil) is nil.
func Broken(err error) error {
	if err == nil {
		return nil
	}
	return &brokenError{err: err}
}

// IsBroken reports whether err, or any error it wraps, was marked with
// Broken.
func IsBroken(err error) bool {
	var b *brokenError
	return errors.As(err, &b)
}
