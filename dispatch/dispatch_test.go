package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// quietLogger keeps expected warnings (failures, fencing) out of the output.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

func record(t testing.TB, s sink.Sink, keys ...string) {
	t.Helper()
	for _, k := range keys {
		name := strings.TrimPrefix(k, "gemini:")
		payload := fmt.Sprintf(`{"name":%q,"done":true,"metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, name)
		if _, err := s.Record(context.Background(), sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(payload),
			State: "SUCCEEDED", FromAPI: true}); err != nil {
			t.Fatalf("Record(%q): %v", k, err)
		}
	}
}

func keys(n int) []string { return keyRange(0, n) }

// keyRange returns n keys numbered from first.
func keyRange(first, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("gemini:batches/k%05d", first+i)
	}
	return ks
}

func newDispatcher(t testing.TB, cfg Config) *Dispatcher {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return d
}

// effectFunc adapts a function to effect.Effect for tests that need to act
// at a precise moment inside an attempt.
type effectFunc func(ctx context.Context, ev effect.Event) error

func (f effectFunc) Run(ctx context.Context, ev effect.Event) error { return f(ctx, ev) }

// lockedBuffer is a buffer for concurrent writers (testkit's) that reads
// back the event documents the print effect wrote.
type lockedBuffer struct{ testkit.Buffer }

func (l *lockedBuffer) events(t *testing.T) []effect.Event {
	var evs []effect.Event
	sc := bufio.NewScanner(bytes.NewReader(l.Bytes()))
	for sc.Scan() {
		var ev effect.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestNewValidates(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	eff := effect.NewPrint(io.Discard, nil)
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" = no error
	}{
		{"defaults", Config{Sink: s, Effect: eff}, ""},
		{"no sink", Config{Effect: eff}, "no sink"},
		{"no effect", Config{Sink: s}, "no effect"},
		{"timeout equals lease", Config{Sink: s, Effect: eff, Lease: time.Minute, EffectTimeout: time.Minute}, "must be shorter than the lease"},
		{"timeout above default lease", Config{Sink: s, Effect: eff, EffectTimeout: time.Hour}, "must be shorter than the lease"},
		{"negative concurrency", Config{Sink: s, Effect: eff, Concurrency: -1}, "negative"},
	}
	for _, tt := range tests {
		d, err := New(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("New(%s) = %v, want no error", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("New(%s) = %v, want an error containing %q", tt.name, err, tt.want)
		case tt.want == "" && (d.cfg.Lease != DefaultLease || d.cfg.EffectTimeout != DefaultEffectTimeout ||
			d.cfg.Concurrency != DefaultConcurrency || d.cfg.Grace != DefaultGrace || d.Owner() == ""):
			t.Errorf("New(%s) config = %+v, want the defaults", tt.name, d.cfg)
		}
	}
	if a, b := DefaultOwner(), DefaultOwner(); a == b || strings.Count(a, ":") < 2 {
		t.Errorf("DefaultOwner() = %q, %q: want host:pid:random, distinct", a, b)
	}
}

func TestDrainRunsEveryDueKeyOnceWithTheEventDocument(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	ks := keys(50)
	record(t, s, ks...)
	// A key with a payload that says nothing of its state, from a webhook.
	if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:operations/x", Source: sink.SourceWebhook}); err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	var obs observerLog
	d := newDispatcher(t, Config{Sink: s, Effect: effect.NewPrint(&out, nil), Concurrency: 4, Observer: &obs})
	sum, err := d.Drain(context.Background())
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	want := Summary{Claimed: 51, OK: 51}
	if sum != want {
		t.Errorf("Drain() = %+v, want %+v", sum, want)
	}
	evs := out.events(t)
	if len(evs) != 51 {
		t.Fatalf("effect ran %d times, want 51", len(evs))
	}
	byKey := map[string]effect.Event{}
	for _, ev := range evs {
		if _, dup := byKey[ev.Key]; dup {
			t.Errorf("key %s ran twice", ev.Key)
		}
		byKey[ev.Key] = ev
	}
	ev := byKey[ks[7]]
	if ev.Name != "batches/k00007" || ev.State != "SUCCEEDED" || ev.BatchState != "SUCCEEDED" || !ev.Confirmed || ev.Source != sink.SourcePoll ||
		ev.Attempt != 1 || ev.Token != 1 || !strings.Contains(string(ev.Operation), `"name":"batches/k00007"`) || ev.Webhook != nil {
		t.Errorf("event document = %+v, want name, normalised state, source, attempt 1, token 1 and the operation", ev)
	}
	if ev := byKey["gemini:operations/x"]; ev.Name != "operations/x" || ev.State != "" || ev.Source != sink.SourceWebhook || string(ev.Operation) != "null" {
		t.Errorf("event document without payload = %+v (operation %s), want empty state and null operation", ev, ev.Operation)
	}
	for _, k := range ks {
		e, err := s.Get(context.Background(), k)
		if err != nil || e.State != sink.StateDone {
			t.Errorf("Get(%q) = %v, %v, want done", k, e.State, err)
		}
	}
	if n := obs.count(OutcomeDone); n != 51 {
		t.Errorf("observer saw %d done, want 51", n)
	}
	// Nothing is due any more: a second Drain claims nothing.
	if sum, err := d.Drain(context.Background()); err != nil || sum != (Summary{}) {
		t.Errorf("second Drain() = %+v, %v, want nothing", sum, err)
	}
}

type observerLog struct {
	mu  sync.Mutex
	out map[Outcome]int
}

func (o *observerLog) ObserveEffect(out string, d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.out == nil {
		o.out = map[Outcome]int{}
	}
	o.out[Outcome(out)]++
}

func (o *observerLog) count(out Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.out[out]
}

// TestDrainDoesNotLoop: failures whose retry is due at once are not run
// again in the same Drain.
func TestDrainDoesNotLoop(t *testing.T) {
	t.Parallel()
	s := sqlitetest.OpenTemp(t, sink.Options{RetryBase: time.Nanosecond, RetryMax: time.Nanosecond, Rand: sinktest.FixedRand(0), MaxAttempts: 100})
	ks := keys(40)
	record(t, s, ks...)
	var mu sync.Mutex
	runs := map[string]int{}
	fail := effectFunc(func(ctx context.Context, ev effect.Event) error {
		mu.Lock()
		runs[ev.Key]++
		mu.Unlock()
		return errors.New("always fails")
	})
	d := newDispatcher(t, Config{Sink: s, Effect: fail, Concurrency: 8})
	sum, err := d.Drain(context.Background())
	if err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if sum != (Summary{Claimed: 40, Failed: 40}) {
		t.Errorf("Drain() = %+v, want 40 claimed and failed", sum)
	}
	for _, k := range ks {
		if runs[k] != 1 {
			t.Errorf("key %s ran %d times in one Drain, want 1", k, runs[k])
		}
	}
	// Each is due again now: the next Drain runs each once more.
	sum, err = d.Drain(context.Background())
	if err != nil || sum.Claimed != 40 {
		t.Errorf("second Drain() = %+v, %v, want 40 claimed", sum, err)
	}
}

// TestDrainConcurrencyBound: never more than Concurrency effects at once.
func TestDrainConcurrencyBound(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	record(t, s, keys(30)...)
	var mu sync.Mutex
	cur, peak := 0, 0
	eff := effectFunc(func(ctx context.Context, ev effect.Event) error {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		cur--
		mu.Unlock()
		return nil
	})
	d := newDispatcher(t, Config{Sink: s, Effect: eff, Concurrency: 3})
	if sum, err := d.Drain(context.Background()); err != nil || sum.OK != 30 {
		t.Fatalf("Drain() = %+v, %v", sum, err)
	}
	if peak > 3 || peak < 2 {
		t.Errorf("peak concurrent effects = %d, want 2..3", peak)
	}
}

// TestDrainShutdownGrace: on cancellation, an effect that finishes within
// Grace completes; one that does not is killed (its exec process group with
// it) and recorded as a retryable failure.
func TestDrainShutdownGrace(t *testing.T) {
	t.Parallel()
	t.Run("finishes within grace", func(t *testing.T) {
		s := sqlitetest.OpenTemp(t, sink.Options{})
		record(t, s, "gemini:batches/slow")
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		eff := effectFunc(func(ectx context.Context, ev effect.Event) error {
			close(started)
			select {
			case <-time.After(300 * time.Millisecond):
				return nil
			case <-ectx.Done():
				return ectx.Err()
			}
		})
		d := newDispatcher(t, Config{Sink: s, Effect: eff, Grace: 10 * time.Second})
		go func() { <-started; cancel() }()
		sum, err := d.Drain(ctx)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Drain() error = %v, want context.Canceled", err)
		}
		if sum.OK != 1 {
			t.Errorf("Drain() = %+v, want the effect to finish within grace", sum)
		}
		if e, _ := s.Get(context.Background(), "gemini:batches/slow"); e.State != sink.StateDone {
			t.Errorf("state = %s, want done", e.State)
		}
	})
	t.Run("killed after grace", func(t *testing.T) {
		s := sqlitetest.OpenTemp(t, sink.Options{})
		// Concurrency 1: one key runs, one is claimed ahead, one waits.
		record(t, s, "gemini:batches/stuck1", "gemini:batches/stuck2", "gemini:batches/stuck3")
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		d := newDispatcher(t, Config{Sink: s, Grace: 200 * time.Millisecond, Concurrency: 1,
			Effect: effect.NewExec(inDir(dir, `touch started; sleep 30`), effect.ExecOutput(nil))})
		go func() {
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
		}()
		start := time.Now()
		sum, err := d.Drain(ctx)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Drain() error = %v, want context.Canceled", err)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("Drain() took %v: the effect was not killed after grace", el)
		}
		if sum != (Summary{Claimed: 2, Failed: 1, HandedBack: 1}) {
			t.Errorf("Drain() = %+v, want two claimed: the killed effect a retryable failure, the claim ahead handed back", sum)
		}
		es, err := s.List(context.Background(), sink.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var killed, givenBack, untouched int
		for _, e := range es {
			switch {
			case e.State != sink.StatePending:
				t.Errorf("%s is %s after the drain, want pending", e.Key, e.State)
			case strings.Contains(e.LastError, "interrupted by shutdown before the effect started"):
				givenBack++
			case strings.Contains(e.LastError, "interrupted by shutdown"):
				killed++
			case e.Attempts == 0:
				untouched++
			}
		}
		if killed != 1 || givenBack != 1 || untouched != 1 {
			t.Errorf("killed %d, given back %d, untouched %d; want 1 each", killed, givenBack, untouched)
		}
	})
}

// TestEndGrace: EndGrace (the CLI's second interrupt) ends a shutdown's
// grace at once — the exec's process group is killed and the attempt
// recorded as a retryable failure, as when Grace runs out — whether it
// comes after the cancellation or before it; without a cancellation it
// stops nothing.
func TestEndGrace(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"cancel", "EndGrace"} {
		t.Run(first+" first", func(t *testing.T) {
			s := sqlitetest.OpenTemp(t, sink.Options{})
			record(t, s, "gemini:batches/stuck")
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			d := newDispatcher(t, Config{Sink: s, Grace: time.Hour, Concurrency: 1,
				Effect: effect.NewExec(inDir(dir, `trap '' TERM; touch started; sleep 30`), effect.ExecOutput(nil))})
			go func() {
				deadline := time.Now().Add(20 * time.Second)
				for time.Now().Before(deadline) {
					if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
						break
					}
					time.Sleep(10 * time.Millisecond)
				}
				if first == "cancel" {
					cancel()
					d.EndGrace()
				} else {
					d.EndGrace()
					cancel()
				}
			}()
			start := time.Now()
			sum, err := d.Drain(ctx)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Drain() error = %v, want context.Canceled", err)
			}
			if el := time.Since(start); el > 15*time.Second {
				t.Errorf("Drain() took %v with Grace 1h: EndGrace did not end it", el)
			}
			if sum != (Summary{Claimed: 1, Failed: 1}) {
				t.Errorf("Drain() = %+v, want the killed effect a retryable failure", sum)
			}
			e, err := s.Get(context.Background(), "gemini:batches/stuck")
			if err != nil {
				t.Fatal(err)
			}
			if e.State != sink.StatePending || !strings.Contains(e.LastError, "interrupted by shutdown") || e.Attempts != 1 {
				t.Errorf("after EndGrace the key is %s, attempts %d, last error %q; want pending after one attempt interrupted by shutdown", e.State, e.Attempts, e.LastError)
			}
		})
	}
	t.Run("without a shutdown", func(t *testing.T) {
		s := sqlitetest.OpenTemp(t, sink.Options{})
		record(t, s, "gemini:batches/runs")
		eff := effectFunc(func(ectx context.Context, ev effect.Event) error {
			select {
			case <-ectx.Done():
				return context.Cause(ectx)
			case <-time.After(200 * time.Millisecond):
				return nil
			}
		})
		d := newDispatcher(t, Config{Sink: s, Effect: eff, Grace: time.Hour})
		d.EndGrace()
		if sum, err := d.Drain(context.Background()); err != nil || sum != (Summary{Claimed: 1, OK: 1}) {
			t.Errorf("Drain() after EndGrace, never cancelled = %+v, %v; want the effect to run to its end", sum, err)
		}
	})
}

func TestRunKeyOutcomes(t *testing.T) {
	clock := sinktest.NewClock(t0)
	s := sqlitetest.OpenTemp(t, sink.Options{Now: clock.Now, Rand: sinktest.FixedRand(1)})
	record(t, s, "gemini:batches/a", "gemini:batches/busy", "gemini:batches/fails")
	var out lockedBuffer
	d := newDispatcher(t, Config{Sink: s, Effect: effect.NewPrint(&out, nil), Now: clock.Now})
	ctx := context.Background()
	if _, err := s.Claim(ctx, "gemini:batches/busy", "someone-else", time.Minute, sink.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		key  string
		want Outcome
	}{
		{"gemini:batches/a", OutcomeDone},
		{"gemini:batches/a", OutcomeSkipped}, // done already
		{"gemini:batches/busy", OutcomeBusy},
		{"gemini:batches/unknown", OutcomeSkipped},
	}
	for _, tt := range tests {
		got, err := d.RunKeyWithin(ctx, tt.key, 0)
		if got != tt.want || err != nil {
			t.Errorf("RunKeyWithin(%q) = %v, %v, want %v, nil", tt.key, got, err, tt.want)
		}
	}
	fd := newDispatcher(t, Config{Sink: s, Effect: effectFunc(func(context.Context, effect.Event) error { return errors.New("nope") }), Now: clock.Now})
	if got, err := fd.RunKeyWithin(ctx, "gemini:batches/fails", 0); got != OutcomeRetry || err != nil {
		t.Errorf("RunKeyWithin(failing) = %v, %v, want retry", got, err)
	}
	if got, err := fd.RunKeyWithin(ctx, "gemini:batches/fails", 0); got != OutcomeSkipped || err != nil {
		t.Errorf("RunKeyWithin(not due) = %v, %v, want skipped", got, err)
	}
	if n := len(out.events(t)); n != 1 {
		t.Errorf("effect ran %d times, want 1", n)
	}
}

// TestRenewExtendsLease: the lease is renewed while the effect runs.
func TestRenewExtendsLease(t *testing.T) {
	t.Parallel()
	s := sqlitetest.OpenTemp(t, sink.Options{})
	record(t, s, "gemini:batches/long")
	const lease = 3 * time.Second // renewed every second
	var first, later time.Time
	eff := effectFunc(func(ctx context.Context, ev effect.Event) error {
		e, err := s.Get(ctx, ev.Key)
		if err != nil {
			return err
		}
		first, later = e.LeaseUntil, e.LeaseUntil
		for !later.After(first) && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			if e, err = s.Get(ctx, ev.Key); err != nil {
				return err
			}
			later = e.LeaseUntil
		}
		return nil
	})
	d := newDispatcher(t, Config{Sink: s, Effect: eff, Lease: lease, EffectTimeout: lease - 500*time.Millisecond})
	if sum, err := d.Drain(context.Background()); err != nil || sum.OK != 1 {
		t.Fatalf("Drain() = %+v, %v", sum, err)
	}
	if !later.After(first) {
		t.Errorf("lease until %v then %v: want it renewed while the effect ran", first, later)
	}
}

// TestFenced: a takeover while the effect runs discards this attempt's
// outcome, whether the renewal or the completion notices it; the backend
// counts exactly one fenced write.
func TestFenced(t *testing.T) {
	t.Parallel()
	for _, viaRenew := range []bool{false, true} {
		t.Run(fmt.Sprintf("via renew %v", viaRenew), func(t *testing.T) {
			clock := sinktest.NewClock(t0)
			path := filepath.Join(t.TempDir(), "gemrecon.db")
			s := sqlitetest.Open(t, path, sink.Options{Now: clock.Now})
			// Another process, an hour later by its clock: our lease has
			// expired for it, not for us.
			other := sqlitetest.Open(t, path, sink.Options{Now: func() time.Time { return t0.Add(time.Hour) }})
			key := "gemini:batches/taken"
			record(t, s, key)
			lease := 3 * time.Second // renewed every second
			var cause error
			eff := effectFunc(func(ctx context.Context, ev effect.Event) error {
				if _, err := other.Claim(context.Background(), ev.Key, "other", time.Hour, sink.ClaimOptions{}); err != nil {
					return fmt.Errorf("takeover: %w", err)
				}
				if !viaRenew {
					return nil
				}
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
					return ctx.Err()
				case <-time.After(5 * time.Second):
					return errors.New("not cancelled")
				}
			})
			var obs observerLog
			d := newDispatcher(t, Config{Sink: s, Effect: eff, Lease: lease, EffectTimeout: lease - 100*time.Millisecond,
				Now: clock.Now, Observer: &obs})
			sum, err := d.Drain(context.Background())
			if err != nil {
				t.Fatalf("Drain: %v", err)
			}
			if sum != (Summary{Claimed: 1, Fenced: 1}) {
				t.Errorf("Drain() = %+v, want one fenced", sum)
			}
			if viaRenew && !errors.Is(cause, sink.ErrFenced) {
				t.Errorf("effect context cause = %v, want ErrFenced", cause)
			}
			st, err := s.Stats(context.Background())
			if err != nil || st.Fenced != 1 {
				t.Errorf("Stats().Fenced = %d, %v, want 1", st.Fenced, err)
			}
			e, _ := s.Get(context.Background(), key)
			if e.State != sink.StateClaimed || e.LeaseOwner != "other" || e.Token != 2 {
				t.Errorf("Get() = %s owner %q token %d, want claimed by other with token 2", e.State, e.LeaseOwner, e.Token)
			}
			if obs.count(OutcomeFenced) != 1 {
				t.Errorf("observer fenced = %d, want 1", obs.count(OutcomeFenced))
			}
		})
	}
}

// TestRunKicks: Run drains on Kick and on its interval and stops with ctx.
func TestRunKicks(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	var out lockedBuffer
	d := newDispatcher(t, Config{Sink: s, Effect: effect.NewPrint(&out, nil), Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	for i, k := range keys(3) {
		record(t, s, k)
		d.Kick()
		deadline := time.Now().Add(10 * time.Second)
		for len(out.events(t)) < i+1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := len(out.events(t)); n != i+1 {
			t.Fatalf("after kick %d: %d effects, want %d", i+1, n, i+1)
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// inDir makes cmd run in dir: an exec command runs where gemrecon does, and
// the tests that look at the files a command leaves run in parallel.
func inDir(dir, cmd string) string { return "cd '" + dir + "' || exit 1\n" + cmd }
