package reconcile

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A pass during which Watch's context ends is its last one. When that pass
// took longer than the interval (a slow drain, a shutdown's grace), the next
// pass's timer has fired too by the time it ends; Watch must not pick the
// timer and run one more pass on the ended context — that pass fails at its
// first database call and reaches `each` as a failed, empty pass (a
// spurious summary line, a textfile saying the last run failed, a pass
// counted as an error). With an interval of 1 ns every pass outlasts it, so
// each run below meets that moment.
func TestWatchRunsNoPassAfterItsContextEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{interval: time.Nanosecond})
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		var got []Result
		err := e.poll.Watch(ctx, func(r Result) {
			got = append(got, r)
			cancel() // SIGTERM while the pass ran
		})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("run %d: Watch returned %v, want context.Canceled", i, err)
		}
		if len(got) != 1 {
			t.Fatalf("run %d: Watch handed over %d passes after the context ended during the first, want 1; the last: %+v",
				i, len(got), got[len(got)-1])
		}
	}
}
