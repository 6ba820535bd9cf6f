package dispatch

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestR4FailingEffects: failures are retried with backoff, permanent ones go
// dead at once, Retry-After is honoured, and a timed-out exec dies with its
// grandchildren. The sink's and the dispatcher's clock is injected.
func TestR4FailingEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drain := func(t *testing.T, d *Dispatcher, want Summary) {
		t.Helper()
		sum, err := d.Drain(ctx)
		if err != nil || sum != want {
			t.Fatalf("Drain() = %+v, %v, want %+v", sum, err, want)
		}
	}
	get := func(t *testing.T, s sink.Sink, key string) sink.Entry {
		t.Helper()
		e, err := s.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get(%q): %v", key, err)
		}
		return e
	}

	t.Run("exit status retried with backoff until it succeeds", func(t *testing.T) {
		clock := sinktest.NewClock(t0)
		s := sqlitetest.OpenTemp(t, sink.Options{Now: clock.Now, Rand: sinktest.FixedRand(0.5), RetryBase: 10 * time.Second})
		key := "gemini:batches/flaky"
		record(t, s, key)
		dir := t.TempDir()
		// Fails twice, with a message on stderr, then succeeds.
		cmd := `n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count
[ "$n" -ge 3 ] || { echo "attempt $n failed" >&2; exit 7; }`
		d := newDispatcher(t, Config{Sink: s, Now: clock.Now,
			Effect: effect.NewExec(inDir(dir, cmd), effect.ExecOutput(nil))})

		drain(t, d, Summary{Claimed: 1, Failed: 1})
		e := get(t, s, key)
		if e.State != sink.StatePending || e.Attempts != 1 || !strings.Contains(e.LastError, "exit status 7") ||
			!strings.Contains(e.LastError, "attempt 1 failed") {
			t.Errorf("after attempt 1: %s attempts %d error %q, want pending, 1, exit status 7 and the stderr tail", e.State, e.Attempts, e.LastError)
		}
		// Full jitter at 0.5 of the 10s ceiling.
		if want := t0.Add(5 * time.Second); !e.NextAttemptAt.Equal(want) {
			t.Errorf("next attempt at %v, want %v", e.NextAttemptAt, want)
		}
		drain(t, d, Summary{}) // not due yet

		clock.Advance(5 * time.Second)
		drain(t, d, Summary{Claimed: 1, Failed: 1})
		e = get(t, s, key)
		if e.Attempts != 2 || !strings.Contains(e.LastError, "attempt 2 failed") {
			t.Errorf("after attempt 2: attempts %d error %q, want 2 and \"attempt 2 failed\"", e.Attempts, e.LastError)
		}
		if want := clock.Now().Add(10 * time.Second); !e.NextAttemptAt.Equal(want) {
			t.Errorf("next attempt at %v, want %v (the ceiling doubled)", e.NextAttemptAt, want)
		}
		clock.Advance(9 * time.Second)
		drain(t, d, Summary{})
		clock.Advance(time.Second)
		drain(t, d, Summary{Claimed: 1, OK: 1})
		if e := get(t, s, key); e.State != sink.StateDone || e.Attempts != 3 {
			t.Errorf("finally: %s after %d attempts, want done after 3", e.State, e.Attempts)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "count")); strings.TrimSpace(string(b)) != "3" {
			t.Errorf("the command ran %q times, want 3", b)
		}
	})

	t.Run("forward answered 400 goes dead at once", func(t *testing.T) {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"unknown batch"}`)
		}))
		defer srv.Close()
		clock := sinktest.NewClock(t0)
		s := sqlitetest.OpenTemp(t, sink.Options{Now: clock.Now})
		key := "gemini:batches/rejected"
		record(t, s, key)
		fw, err := effect.NewForward(srv.URL, "", srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		d := newDispatcher(t, Config{Sink: s, Effect: fw, Now: clock.Now})
		drain(t, d, Summary{Claimed: 1, Dead: 1})
		e := get(t, s, key)
		if e.State != sink.StateDead || e.Attempts != 1 || !strings.Contains(e.LastError, "400") || !strings.Contains(e.LastError, "unknown batch") {
			t.Errorf("Get() = %s attempts %d error %q, want dead after 1 with the status and body", e.State, e.Attempts, e.LastError)
		}
		clock.Advance(24 * time.Hour)
		drain(t, d, Summary{})
		if hits.Load() != 1 {
			t.Errorf("target hit %d times, want 1", hits.Load())
		}
	})

	t.Run("503 with Retry-After 2 is not retried sooner", func(t *testing.T) {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1) == 1 {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
		}))
		defer srv.Close()
		clock := sinktest.NewClock(t0)
		// Backoff alone would allow the next attempt at once.
		s := sqlitetest.OpenTemp(t, sink.Options{Now: clock.Now, Rand: sinktest.FixedRand(0)})
		key := "gemini:batches/overloaded"
		record(t, s, key)
		fw, err := effect.NewForward(srv.URL, "", srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		d := newDispatcher(t, Config{Sink: s, Effect: fw, Now: clock.Now})
		failedAt := clock.Now()
		drain(t, d, Summary{Claimed: 1, Failed: 1})
		e := get(t, s, key)
		if e.NextAttemptAt.Before(failedAt.Add(2*time.Second)) || !strings.Contains(e.LastError, "503") {
			t.Errorf("next attempt at %v (error %q), want >= %v", e.NextAttemptAt, e.LastError, failedAt.Add(2*time.Second))
		}
		clock.Advance(1999 * time.Millisecond)
		drain(t, d, Summary{})
		clock.Advance(time.Millisecond)
		drain(t, d, Summary{Claimed: 1, OK: 1})
		if hits.Load() != 2 {
			t.Errorf("target hit %d times, want 2", hits.Load())
		}
	})

	t.Run("timed-out exec is killed with its grandchildren", func(t *testing.T) {
		s := sqlitetest.OpenTemp(t, sink.Options{})
		key := "gemini:batches/hangs"
		record(t, s, key)
		dir := t.TempDir()
		cmd := `sh -c 'sleep 2; echo late > late' & sleep 30`
		d := newDispatcher(t, Config{Sink: s, EffectTimeout: 300 * time.Millisecond, Lease: 10 * time.Second,
			Effect: effect.NewExec(inDir(dir, cmd), effect.ExecOutput(nil))})
		start := time.Now()
		drain(t, d, Summary{Claimed: 1, Failed: 1})
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("Drain took %v, want about the 300ms effect timeout", el)
		}
		if e := get(t, s, key); e.State != sink.StatePending || !strings.Contains(e.LastError, "effect timed out after 300ms") {
			t.Errorf("Get() = %s %q, want pending with \"effect timed out after 300ms\"", e.State, e.LastError)
		}
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(dir, "late")); err == nil {
				t.Fatal("the grandchild outlived the timeout and wrote its file")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}
