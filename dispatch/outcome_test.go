package dispatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
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
	t.Parallel()
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
			s := sqlitetest.OpenTemp(t, sink.Options{})
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

// outage is a SQLite database that refuses writes for a while after an
// effect ran: the effect starts a process that holds the write lock (beyond
// the sink's 50ms busy timeout) and returns success; the dispatcher's pauses
// advance a fake clock, and onPause decides when the outage ends.
type outage struct {
	t      *testing.T
	path   string
	clock  *sinktest.Clock
	s      sink.Sink
	runs   atomic.Int32
	holder func() // lets the lock holder (sqlitetest.HoldLock) go
	// onPause is called after each pause (the clock already advanced),
	// with the runCtx the pause was given.
	onPause func(o *outage, ctx context.Context)
	// result is what the effect returns (nil: success).
	result error
}

func newOutage(t *testing.T) *outage {
	o := &outage{t: t, path: filepath.Join(t.TempDir(), "gemrecon.db"), clock: sinktest.NewClock(t0)}
	o.s = sqlitetest.Open(t, o.path, sink.Options{Now: o.clock.Now, BusyTimeout: 50 * time.Millisecond})
	record(t, o.s, "gemini:batches/outage")
	return o
}

func (o *outage) config(lease time.Duration) Config {
	return Config{Sink: o.s, Lease: lease, EffectTimeout: lease / 2, Now: o.clock.Now,
		Sleep: func(ctx context.Context, d time.Duration) error {
			o.clock.Advance(d)
			if o.onPause != nil {
				o.onPause(o, ctx)
			}
			return ctx.Err()
		},
		Effect: effectFunc(func(ctx context.Context, ev effect.Event) error {
			o.runs.Add(1)
			if o.holder == nil {
				o.holder = sqlitetest.HoldLock(o.t, o.path) // the database goes away right after the effect
			}
			return o.result
		})}
}

// TestDoneSurvivesAShortOutage (issue 12 item 4): the database refuses
// writes from just after the effect until 12s later (a held write lock from
// another process); the lease is 30s, so recording done is tried until 25s
// after the claim: done is recorded once the outage ends, and no later run
// finds the key to run again. (The old dispatcher gave up after ~0.6s, and
// the takeover after the lease ran the effect a second time.)
func TestDoneSurvivesAShortOutage(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	o.onPause = func(o *outage, _ context.Context) {
		if o.clock.Now().Sub(t0) >= 12*time.Second {
			o.holder()
		}
	}
	d := newDispatcher(t, o.config(30*time.Second))
	out, err := d.RunKey(context.Background(), "gemini:batches/outage")
	if out != OutcomeDone || err != nil {
		t.Errorf("RunKey = %s, %v; want done once the outage ended", out, err)
	}
	if o.holder != nil {
		o.holder()
	}
	if e := mustGet(t, o.s, "gemini:batches/outage"); e.State != sink.StateDone || e.Token != 1 {
		t.Errorf("key is %s with token %d, want done with token 1", e.State, e.Token)
	}
	// Long after the lease, nothing runs it again.
	o.clock.Advance(time.Hour)
	if sum, err := d.Drain(context.Background()); err != nil || sum.Claimed != 0 {
		t.Errorf("Drain an hour later = %+v, %v; want nothing to do", sum, err)
	}
	if n := o.runs.Load(); n != 1 {
		t.Errorf("the effect ran %d times, want 1", n)
	}
}

// TestFailureSurvivesAShortOutage: the same for recording a failure that
// matters: a permanent one, whose key must go dead rather than stay claimed
// for the rest of its lease and be run again by the takeover.
func TestFailureSurvivesAShortOutage(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	o.result = effect.Permanent(errors.New("HTTP 400: unknown batch"))
	o.onPause = func(o *outage, _ context.Context) {
		if o.clock.Now().Sub(t0) >= 12*time.Second {
			o.holder()
		}
	}
	d := newDispatcher(t, o.config(30*time.Second))
	if out, err := d.RunKey(context.Background(), "gemini:batches/outage"); out != OutcomeDead || err != nil {
		t.Errorf("RunKey = %s, %v; want dead once the outage ended", out, err)
	}
	if o.holder != nil {
		o.holder()
	}
	if e := mustGet(t, o.s, "gemini:batches/outage"); e.State != sink.StateDead || e.Attempts != 1 {
		t.Errorf("key is %s after %d attempts, want dead after 1", e.State, e.Attempts)
	}
}

// TestDoneGivesUpWhenTheLeaseRunsShort: an outage that outlasts the lease's
// safe part ends the tries exactly at the last claim + lease − margin (by
// the injected clock), while the lease is still this claim's; the key stays
// claimed until the lease expires (the documented case in which the effect
// runs again).
func TestDoneGivesUpWhenTheLeaseRunsShort(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	lease := 20 * time.Second
	d := newDispatcher(t, o.config(lease))
	out, err := d.RunKey(context.Background(), "gemini:batches/outage")
	gaveUp := o.clock.Now()
	if out != OutcomeRetry || err == nil || !strings.Contains(err.Error(), "until the lease ran short") {
		t.Errorf("RunKey = %s, %v; want a retry outcome and an error saying the lease ran short", out, err)
	}
	if want := t0.Add(lease - OutcomeMargin(lease)); !gaveUp.Equal(want) {
		t.Errorf("gave up at claim+%v, want claim+%v (lease %v − margin %v)", gaveUp.Sub(t0), want.Sub(t0), lease, OutcomeMargin(lease))
	}
	o.holder()
	if e := mustGet(t, o.s, "gemini:batches/outage"); e.State != sink.StateClaimed || !e.LeaseUntil.After(gaveUp) {
		t.Errorf("key is %s with lease until claim+%v, want still claimed past claim+%v", e.State, e.LeaseUntil.Sub(t0), gaveUp.Sub(t0))
	}
}

// TestDoneRetriesOnShutdownForAtMostGrace: on shutdown the tries go on for
// at most --grace: an outage that ends within it loses nothing; one that
// outlasts it ends the tries (one last try when the grace runs out), long
// before the lease would have.
func TestDoneRetriesOnShutdownForAtMostGrace(t *testing.T) {
	t.Parallel()
	t.Run("outage ends within the grace", func(t *testing.T) {
		o := newOutage(t)
		ctx, shutdown := context.WithCancel(context.Background())
		defer shutdown()
		pauses := 0
		o.onPause = func(o *outage, _ context.Context) {
			pauses++
			switch pauses {
			case 1:
				shutdown() // SIGTERM while done cannot be written
			case 3:
				o.holder()
			}
		}
		cfg := o.config(time.Minute)
		cfg.Grace = time.Hour // real time: never runs out in this test
		d := newDispatcher(t, cfg)
		if out, err := d.RunKey(ctx, "gemini:batches/outage"); out != OutcomeDone || err != nil {
			t.Errorf("RunKey = %s, %v; want done: the outage ended within the grace", out, err)
		}
	})
	t.Run("outage outlasts the grace", func(t *testing.T) {
		o := newOutage(t)
		ctx, shutdown := context.WithCancel(context.Background())
		defer shutdown()
		var stopped time.Time
		o.onPause = func(o *outage, runCtx context.Context) {
			if stopped.IsZero() {
				stopped = time.Now()
				shutdown()
				<-runCtx.Done() // the grace (real time) runs out
			}
		}
		cfg := o.config(time.Minute)
		cfg.Grace = 100 * time.Millisecond
		d := newDispatcher(t, cfg)
		out, err := d.RunKey(ctx, "gemini:batches/outage")
		if out != OutcomeRetry || err == nil || !strings.Contains(err.Error(), "grace ran out") {
			t.Errorf("RunKey = %s, %v; want a retry outcome and an error saying the grace ran out", out, err)
		}
		if el := time.Since(stopped); el > 10*time.Second {
			t.Errorf("RunKey returned %v after the shutdown, want about the 100ms grace", el)
		}
		if o.clock.Now().Sub(t0) >= time.Minute-OutcomeMargin(time.Minute) {
			t.Errorf("the tries went on to claim+%v: the lease, not the grace, ended them", o.clock.Now().Sub(t0))
		}
	})
}

// completeRefuser is a real sink whose Complete fails while refuse says so:
// the one fault a held lock cannot make (other writes, renewals, succeed).
type completeRefuser struct {
	sink.Sink
	refuse func() bool
}

func (c *completeRefuser) Complete(ctx context.Context, key string, token int64) error {
	if c.refuse() {
		return errors.New("injected: connection reset by peer")
	}
	return c.Sink.Complete(ctx, key, token)
}

// TestDoneRetriesRenewTheLease: while recording done keeps failing, the
// lease is renewed, so the tries go on past the first lease's end and the
// lease never lapses; done is recorded 40s after the claim of a 20s lease.
func TestDoneRetriesRenewTheLease(t *testing.T) {
	t.Parallel()
	o := newOutage(t)
	key := "gemini:batches/outage"
	refusals := 0
	cfg := o.config(20 * time.Second)
	cfg.Effect = effectFunc(func(context.Context, effect.Event) error { o.runs.Add(1); return nil })
	cfg.Sink = &completeRefuser{Sink: o.s, refuse: func() bool {
		if e := mustGet(t, o.s, key); !e.LeaseUntil.After(o.clock.Now()) {
			t.Errorf("at claim+%v the lease had lapsed (until claim+%v)", o.clock.Now().Sub(t0), e.LeaseUntil.Sub(t0))
		}
		refusals++
		return o.clock.Now().Sub(t0) < 40*time.Second
	}}
	d := newDispatcher(t, cfg)
	if out, err := d.RunKey(context.Background(), key); out != OutcomeDone || err != nil {
		t.Errorf("RunKey = %s, %v; want done", out, err)
	}
	if e := mustGet(t, o.s, key); e.State != sink.StateDone || e.Token != 1 || refusals < 2 || o.runs.Load() != 1 {
		t.Errorf("key is %s with token %d after %d refusals and %d runs, want done with token 1, once", e.State, e.Token, refusals, o.runs.Load())
	}
}

// TestBrokenEffectStopsClaiming (issue 12 item 6): once the print effect's
// pipe has no reader, the attempt fails without using an attempt, nothing
// more is claimed, the claims granted ahead are handed back the same way,
// and Drain, Run and RunKey say the effect broke.
func TestBrokenEffectStopsClaiming(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	ks := keys(10)
	record(t, s, ks...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r.Close() // the reader went away
	d := newDispatcher(t, Config{Sink: s, Concurrency: 2, Effect: effect.NewPrint(w)})
	sum, err := d.Drain(context.Background())
	if !errors.Is(err, ErrEffectBroken) || !strings.Contains(err.Error(), "broken pipe") {
		t.Fatalf("Drain() = %+v, %v; want an error wrapping ErrEffectBroken that says broken pipe", sum, err)
	}
	if sum.Claimed > 4 || sum.OK != 0 {
		t.Errorf("Drain() = %+v: want at most the running and the ahead claims (2+2) attempted, none done", sum)
	}
	// The effects that ran broke (failed, no attempt used); the claims
	// ahead never ran one: handed back, not failed.
	if sum.Failed > 2 || sum.Failed+sum.HandedBack != sum.Claimed {
		t.Errorf("Drain() = %+v: want at most the 2 running effects failed and the rest handed back", sum)
	}
	for _, k := range ks {
		if e := mustGet(t, s, k); e.State != sink.StatePending || e.Attempts != 0 {
			t.Errorf("%s is %s after %d attempts, want pending with no attempt used", k, e.State, e.Attempts)
		}
	}
	if err := d.Run(context.Background()); !errors.Is(err, ErrEffectBroken) {
		t.Errorf("Run() = %v, want ErrEffectBroken at once", err)
	}
	if out, err := d.RunKey(context.Background(), ks[0]); out != OutcomeSkipped || !errors.Is(err, ErrEffectBroken) {
		t.Errorf("RunKey() = %s, %v; want skipped with ErrEffectBroken", out, err)
	}
}

// lostCommitAnswer is a real SQLite sink whose CompleteSQL commits and then
// reports an error, as when the context ends during the commit.
type lostCommitAnswer struct{ *sqlite.Sink }

func (l lostCommitAnswer) CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error {
	if err := l.Sink.CompleteSQL(ctx, key, token, script, params); err != nil {
		return err
	}
	return fmt.Errorf("commit: %w", context.DeadlineExceeded)
}

// TestSQLCommitThatReportedAnErrorIsDone: a --sql transaction that committed
// is done, even if its answer was an error (the same class as issue 12
// item 3: the commit decides, not what the context said afterwards); it was
// reported as fenced ("may have run twice").
func TestSQLCommitThatReportedAnErrorIsDone(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	key := "gemini:batches/committed"
	record(t, s, key)
	q, err := sqlscript.Parse(`SELECT @key`)
	if err != nil {
		t.Fatal(err)
	}
	d := newDispatcher(t, Config{Sink: lostCommitAnswer{s}, SQL: q})
	if out, err := d.RunKey(context.Background(), key); out != OutcomeDone || err != nil {
		t.Errorf("RunKey = %s, %v; want done", out, err)
	}
	if e := mustGet(t, s, key); e.State != sink.StateDone || e.Token != 1 {
		t.Errorf("key is %s with token %d, want done with token 1", e.State, e.Token)
	}
}
