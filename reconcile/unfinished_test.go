package reconcile

import (
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Spec §5.5: each pass counts the batches it listed that had not finished,
// by state, and the creation of the oldest, and stores them with the
// scope's pass record (stats reads them in any process); a batch pending
// or running for over a day is warned of at most once per hour of its
// age, whichever pass lists it; the pass's figures replace the last ones.
func TestUnfinishedBatchesCountedAndWarned(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, pg bool) {
		e := newEnv(t, envOptions{postgres: pg})
		stuck := t0.Add(-30 * time.Hour)
		e.api.Add(
			geminifake.Batch{Name: geminifake.GeminiName("stuck"), State: "PENDING", CreateTime: stuck},
			geminifake.Batch{Name: geminifake.GeminiName("young"), State: "RUNNING", CreateTime: t0.Add(-time.Hour)},
			geminifake.Batch{Name: geminifake.GeminiName("young2"), State: "RUNNING", CreateTime: t0.Add(-2 * time.Hour)},
			geminifake.Batch{Name: geminifake.GeminiName("done"), State: "SUCCEEDED", CreateTime: t0.Add(-3 * time.Hour), EndTime: t0.Add(-2 * time.Hour)},
		)
		warnings := func() int { return strings.Count(e.logs.String(), "has not finished for over a day") }
		if err := e.pass(t).Err(); err != nil {
			t.Fatal(err)
		}
		st, err := e.sink.Stats(t.Context())
		if err != nil || len(st.Passes) != 1 {
			t.Fatalf("Stats = %+v, %v", st.Passes, err)
		}
		p := st.Passes[0]
		if p.Unfinished["PENDING"] != 1 || p.Unfinished["RUNNING"] != 2 || len(p.Unfinished) != 2 || !p.OldestUnfinished.Equal(stuck) {
			t.Fatalf("pass record: unfinished %v, oldest %v; want PENDING 1, RUNNING 2, oldest %v", p.Unfinished, p.OldestUnfinished, stuck)
		}
		if n := warnings(); n != 1 || !strings.Contains(e.logs.String(), "expires_in=18h0m0s") {
			t.Fatalf("%d warnings after the first pass, want 1 saying it expires in 18h:\n%s", n, e.logs)
		}
		// Ten minutes later: the same hour of its age, no new warning.
		e.clock.Advance(10 * time.Minute)
		e.pass(t)
		if n := warnings(); n != 1 {
			t.Fatalf("%d warnings after a pass in the same hour, want 1", n)
		}
		// An hour of its age ended since the last pass: warned again.
		e.clock.Advance(55 * time.Minute)
		e.pass(t)
		if n := warnings(); n != 2 {
			t.Fatalf("%d warnings after a pass in the next hour, want 2", n)
		}
		// It finished: nothing unfinished is left, and the figures say so.
		e.api.Add(geminifake.Batch{Name: geminifake.GeminiName("stuck"), State: "EXPIRED", CreateTime: stuck, EndTime: e.clock.Now()},
			geminifake.Batch{Name: geminifake.GeminiName("young"), State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: e.clock.Now()},
			geminifake.Batch{Name: geminifake.GeminiName("young2"), State: "SUCCEEDED", CreateTime: t0.Add(-2 * time.Hour), EndTime: e.clock.Now()})
		e.clock.Advance(time.Hour)
		e.pass(t)
		recs, err := e.sink.PassRecords(t.Context())
		if err != nil || len(recs) != 1 || len(recs[0].Unfinished) != 0 || !recs[0].OldestUnfinished.IsZero() {
			t.Fatalf("pass records after every batch finished = %+v, %v", recs, err)
		}
	})
}
