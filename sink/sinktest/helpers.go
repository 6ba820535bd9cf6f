package sinktest

import (
	"context"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// Helpers for a backend's own tests.

// Claimed records key (from a webhook, payload {}) in s and claims it for
// a minute, as owner "w".
func Claimed(t testing.TB, s sink.Sink, key string) sink.Claim {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Use records key (which must be new), claims, completes and reads it
// back, and reads Stats: a sink that works, end to end. A failure fails
// the test.
func Use(t testing.TB, s sink.Sink, key string) {
	t.Helper()
	ctx := context.Background()
	if r, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil || !r.New {
		t.Fatalf("Record(%s) = %+v, %v", key, r, err)
	}
	c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatalf("Claim(%s): %v", key, err)
	}
	if err := s.Complete(ctx, key, c.Token); err != nil {
		t.Fatalf("Complete(%s): %v", key, err)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateDone {
		t.Fatalf("Get(%s) = %+v, %v", key, e, err)
	}
	if _, err := s.Stats(ctx); err != nil {
		t.Fatalf("Stats: %v", err)
	}
}
