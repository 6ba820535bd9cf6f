package dispatch

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/tcpproxy"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// TestNoSecondRunAfterAPostgresReset (issue 12 item 4): a real PostgreSQL
// behind a TCP proxy that resets every connection, open or new, from the
// moment four running effects finish until 20s later (by the injected
// clock, which the dispatcher's pauses advance); the lease is 1m. Every
// effect that finished during the outage records done once it ends, the
// other keys run after it, and no key's effect runs twice — also not after
// the clock has passed every lease (the old dispatcher gave up after ~0.6s
// and the takeovers ran those effects again).
func TestNoSecondRunAfterAPostgresReset(t *testing.T) {
	t.Parallel()
	proxy, dsn := tcpproxy.ForDSN(t, pgtest.Schema(t))
	clock := sinktest.NewClock(t0)
	ctx := context.Background()
	s, err := postgres.Open(ctx, dsn, sink.Options{Now: clock.Now}, postgres.WithLogger(quietLogger()))
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ks := keys(8)
	record(t, s, ks...)

	var mu sync.Mutex
	runs := map[string]int{}
	var outageStart time.Time // by clock; zero until the outage begins
	first4 := make(chan struct{})
	arrived := 0
	d := newDispatcher(t, Config{Sink: s, Lease: time.Minute, EffectTimeout: 30 * time.Second, Concurrency: 4, Now: clock.Now,
		Sleep: func(ctx context.Context, d time.Duration) error {
			clock.Advance(d)
			mu.Lock()
			defer mu.Unlock()
			if !outageStart.IsZero() && clock.Now().Sub(outageStart) >= 20*time.Second {
				proxy.SetResetting(false)
			}
			return ctx.Err()
		},
		Effect: effectFunc(func(ctx context.Context, ev effect.Event) error {
			mu.Lock()
			runs[ev.Key]++
			arrived++
			n := arrived
			if n == 4 {
				// All four slots run an effect: the database goes away
				// as they finish.
				outageStart = clock.Now()
				proxy.SetResetting(true)
				close(first4)
			}
			mu.Unlock()
			if n <= 4 {
				select {
				case <-first4:
				case <-time.After(30 * time.Second):
					t.Error("the first four effects did not run at once")
				}
			}
			return nil
		})})

	for i := 0; i < 5; i++ {
		sum, err := d.Drain(ctx)
		t.Logf("drain %d: %+v, %v", i+1, sum, err)
		proxy.SetResetting(false) // whatever happened, the outage is over now
		clock.Advance(time.Minute + time.Second)
		if sum.Claimed == 0 && err == nil {
			break
		}
	}
	if proxy.Resets() == 0 {
		t.Fatal("the proxy reset no connection: the test did not make an outage")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, k := range ks {
		if runs[k] != 1 {
			t.Errorf("%s: the effect ran %d times, want 1", k, runs[k])
		}
		if e := mustGet(t, s, k); e.State != sink.StateDone || e.Token != 1 {
			t.Errorf("%s is %s with token %d, want done with token 1", k, e.State, e.Token)
		}
	}
}
