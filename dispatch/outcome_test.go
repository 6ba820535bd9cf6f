package dispatch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/sink"
)

// mustGet returns key's entry.
func mustGet(t *testing.T, s sink.Sink, key string) sink.Entry {
	t.Helper()
	e, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return e
}

// TestOutcomeIsTheEffectsNotTheTimers: the effect's own result decides the
// outcome, never the state of its context after the run (issue 12 item 3).
// Each effect waits until its timeout has fired, then reports: a success
// is done; a failure of its own is recorded as itself, not as a timeout; a
// failure that says the context stopped it is recorded as a timeout.
func TestOutcomeIsTheEffectsNotTheTimers(t *testing.T) {
	tests := []struct {
		name    string
		result  func(ctx context.Context) error
		want    Summary
		state   sink.State
		errHas  string
		errLack string
	}{
		{"success after the timer fired is done", func(context.Context) error { return nil },
			Summary{Claimed: 1, OK: 1}, sink.StateDone, "", ""},
		{"own failure after the timer fired is its own", func(context.Context) error { return errors.New("exec: exit status 3") },
			Summary{Claimed: 1, Failed: 1}, sink.StatePending, "exit status 3", "timed out"},
		{"stopped by the timer is a timeout", func(ctx context.Context) error { return ctx.Err() },
			Summary{Claimed: 1, Failed: 1}, sink.StatePending, "effect timed out after 50ms", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openSink(t, sink.Options{})
			key := "gemini:batches/late"
			record(t, s, key)
			d := newDispatcher(t, Config{Sink: s, EffectTimeout: 50 * time.Millisecond, Lease: time.Minute,
				Effect: effectFunc(func(ctx context.Context, ev effect.Event) error {
					<-ctx.Done() // the timer has fired
					return tt.result(ctx)
				})})
			sum, err := d.Drain(context.Background())
			if err != nil || sum != tt.want {
				t.Fatalf("Drain() = %+v, %v, want %+v", sum, err, tt.want)
			}
			e := mustGet(t, s, key)
			if e.State != tt.state || !strings.Contains(e.LastError, tt.errHas) || tt.errLack != "" && strings.Contains(e.LastError, tt.errLack) {
				t.Errorf("key is %s with last error %q, want %s with %q and without %q", e.State, e.LastError, tt.state, tt.errHas, tt.errLack)
			}
		})
	}
}
