package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
)

// TestFailNotBeforeWithASkewedServerClock: a failure's NotBefore (the
// caller's now plus a Retry-After or a recheck delay) delays the next
// attempt by that much by the server's clock, which next_attempt_at is
// compared with, whatever the difference between the clocks. Handed over
// as an absolute time, it made a key wait 2h10m instead of 10m when the
// server's clock ran 2h behind this process's, and not at all — a
// downstream's Retry-After ignored — when it ran 2h ahead.
func TestFailNotBeforeWithASkewedServerClock(t *testing.T) {
	for _, off := range []time.Duration{-2 * time.Hour, 2 * time.Hour} {
		t.Run(fmt.Sprintf("server %v", off), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			dsn, _, skew := pgtest.SkewedSchema(t)
			skew(off)
			// A backoff of ~0 (Rand 0): the next attempt is NotBefore's.
			s := openDSN(t, dsn, sink.Options{Rand: func() float64 { return 0 }})
			for _, noAttempt := range []bool{false, true} {
				key := fmt.Sprintf("gemini:batches/nb-%v", noAttempt)
				if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
					t.Fatal(err)
				}
				c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.Fail(ctx, key, c.Token, sink.Failure{Cause: "503", NotBefore: time.Now().Add(10 * time.Minute), NoAttempt: noAttempt}); err != nil {
					t.Fatal(err)
				}
				server, err := s.Now(ctx)
				if err != nil {
					t.Fatal(err)
				}
				e, err := s.Get(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if wait := e.NextAttemptAt.Sub(server); wait < 9*time.Minute || wait > 10*time.Minute {
					t.Errorf("NoAttempt %v: next attempt %v after the server's now, want 10m (NotBefore 10m from now)", noAttempt, wait.Round(time.Second))
				}
			}
		})
	}
}
