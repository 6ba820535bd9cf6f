package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

func TestSmokeLifecycle(t *testing.T) {
	clk := testkit.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	s, _ := openTest(t, sink.Options{Now: clk.Now, Rand: func() float64 { return 0.5 }})
	ctx := context.Background()
	key := "gemini:batches/one"

	r, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"a":1}`), State: "SUCCEEDED"})
	if err != nil || !r.New || r.State != sink.StatePending {
		t.Fatalf("Record new = %+v, %v; want New pending", r, err)
	}
	r, err = s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"b":2}`)})
	if err != nil || r.New || r.State != sink.StatePending {
		t.Fatalf("Record dup = %+v, %v; want not new, pending", r, err)
	}
	r, err = s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"c":3}`), State: "FAILED"}) // a conflict
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "w1", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if c.Token != 1 || c.Attempt != 1 || string(c.Payload) != `{"a":1}` || c.FirstSource != sink.SourceWebhook || c.Takeover {
		t.Fatalf("Claim = %+v", c)
	}
	if !c.LeaseUntil.Equal(clk.Now().Add(time.Minute)) {
		t.Errorf("LeaseUntil = %v, want %v", c.LeaseUntil, clk.Now().Add(time.Minute))
	}
	if _, err := s.Claim(ctx, key, "w2", time.Minute, sink.ClaimOptions{}); !errors.Is(err, sink.ErrNotClaimable) {
		t.Fatalf("second Claim err = %v, want ErrNotClaimable", err)
	}
	st, err := s.Fail(ctx, key, c.Token, sink.Failure{Cause: "boom"})
	if err != nil || st != sink.StatePending {
		t.Fatalf("Fail = %v, %v", st, err)
	}
	e, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wantNext := clk.Now().Add(sink.Backoff(1, sink.DefaultRetryBase, sink.DefaultRetryMax, func() float64 { return 0.5 }))
	if !e.NextAttemptAt.Equal(wantNext) || e.LastError != "boom" || e.SeenCount != 3 || e.Conflicts != 1 || len(e.Sources) != 2 {
		t.Fatalf("entry after Fail = %+v; want next %v", e, wantNext)
	}
	if err := s.Complete(ctx, key, c.Token); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("stale Complete err = %v, want ErrFenced", err)
	}
	clk.Advance(time.Hour)
	c2, err := s.Claim(ctx, key, "w2", time.Minute, sink.ClaimOptions{})
	if err != nil || c2.Token != 2 || c2.Attempt != 2 {
		t.Fatalf("Claim 2 = %+v, %v", c2, err)
	}
	if err := s.Complete(ctx, key, c2.Token); err != nil {
		t.Fatal(err)
	}
	r, err = s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"a":1}`)})
	if err != nil || r.State != sink.StateDone {
		t.Fatalf("Record of done = %+v, %v", r, err)
	}
	stats, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats.ByState[sink.StateDone] != 1 || stats.Fenced != 1 || stats.DuplicatesSuppressed != 3 || stats.LatencyMax != time.Hour {
		t.Fatalf("Stats = %+v", stats)
	}
}

func TestClaimDueConcurrent(t *testing.T) {
	s, _ := openTest(t, sink.Options{})
	ctx := context.Background()
	const n = 200
	for i := range n {
		if _, err := s.Record(ctx, sink.Sighting{Key: fmt.Sprintf("gemini:batches/%03d", i), Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for {
				cs, err := s.ClaimDue(ctx, fmt.Sprint("w", w), time.Minute, 7, sink.ClaimOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				if len(cs) == 0 {
					return
				}
				for _, c := range cs {
					if err := s.Complete(ctx, c.Key, c.Token); err != nil {
						t.Error(err)
					}
					mu.Lock()
					seen[c.Key]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("claimed %d keys, want %d", len(seen), n)
	}
	for k, v := range seen {
		if v != 1 {
			t.Errorf("key %s claimed %d times, want 1", k, v)
		}
	}
}
