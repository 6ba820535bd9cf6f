package sink

import (
	"context"
	"errors"
	"time"

	"github.com/gemrecon/gemrecon/internal/field"
)

// ErrPurgeRefused is wrapped by the error of a purge that the lookback guard
// refuses (spec §7).
var ErrPurgeRefused = errors.New("refusing to purge")

// PurgeRequest is one purge of done rows (spec §7): those done for longer
// than OlderThan; Force skips the lookback guard.
type PurgeRequest struct {
	OlderThan time.Duration
	Force     bool
}

// Validate checks the request before anything is opened.
func (r PurgeRequest) Validate() error {
	if r.OlderThan <= 0 {
		return field.Errorf("sink: ", "{the age|OlderThan} is required and must be positive (e.g. 720h)")
	}
	return nil
}

// LookbackReader is what the purge guard reads of the sink.
type LookbackReader interface {
	MaxLookback(ctx context.Context) (d time.Duration, forever bool, ok bool, err error)
}

// Check is the lookback guard of spec §7: a purged key that a poll pass sees
// again would run its effect again, so a purge of rows younger than the
// longest lookback any poll recorded in the database (NoteLookback) is
// refused, and every purge once a poll read every page (lookback 0), unless
// Force. The refusal wraps ErrPurgeRefused.
func (r PurgeRequest) Check(ctx context.Context, s LookbackReader) error {
	if r.Force {
		return nil
	}
	lb, forever, ok, err := s.MaxLookback(ctx)
	switch {
	case err != nil:
		return err
	case ok && forever:
		return field.Errorf("sink: ", "%w: a poll in this database used {a lookback|Lookback} 0 (every page, forever), so any purged key could be re-seen and run again; pass {Force} if you are sure", ErrPurgeRefused)
	case ok && r.OlderThan < lb:
		return field.Errorf("sink: ", "%w: {the age|OlderThan} %v is shorter than the longest poll {lookback|Lookback} %v recorded here; a purged key re-seen by the poller would run again (use {an age|OlderThan} ≥ %v, or {Force})", ErrPurgeRefused, r.OlderThan, lb, lb)
	}
	return nil
}
