package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
)

// TestPurgePostgresMeasuresAgeWithServerClock: purge --older-than D
// measures D with the clock that wrote the done times. The PostgreSQL
// server's clock here runs 2h behind this machine's, the purging one's
// (pgtest.SkewedSchema): a key done 30m ago by the server's clock, which
// this machine's clock would call 2h30m, is inside D = 1h and stays, though
// the lookback guard allows D = 1h after a 1h lookback; a key done 3h ago
// goes. When purge computed the cutoff as its own time.Now() - D, both went:
// a purged key inside a poll's window would run again.
func TestPurgePostgresMeasuresAgeWithServerClock(t *testing.T) {
	dsn, _, skew := pgtest.SkewedSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, dsn, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const old, fresh = "gemini:batches/skew-old", "gemini:batches/skew-fresh"
	for _, k := range []struct {
		key  string
		skew time.Duration
	}{{old, -5 * time.Hour}, {fresh, -150 * time.Minute}} {
		skew(k.skew)
		if _, err := s.Record(ctx, sink.Sighting{Key: k.key, Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, k.key, "w", time.Minute, sink.ClaimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, k.key, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.NoteLookback(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	skew(-2 * time.Hour) // now by the server's clock: fresh done 30m ago, old 3h ago

	r := gemrecon(t, "--db", dsn, "purge", "--older-than", "1h")
	wantCode(t, r, exitOK)
	if want := "purged 1 done key(s) older than 1h0m0s by the PostgreSQL server's clock\n"; r.stdout != want {
		t.Errorf("purge stdout = %q, want %q", r.stdout, want)
	}
	if e, err := s.Get(ctx, fresh); err != nil || e.State != sink.StateDone {
		t.Errorf("%s, done 30m ago by the server's clock, after purge --older-than 1h: state %q, %v; want it kept, done", fresh, e.State, err)
	}
	if _, err := s.Get(ctx, old); !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("%s, done 3h ago by the server's clock, after purge --older-than 1h: %v; want it purged", old, err)
	}
}

// TestStatusPostgresJudgesLeasesByServerClock: status says that a lease
// has expired, or that a pending key is due, by the clock that wrote those
// times. The PostgreSQL server's clock here runs 2h behind this machine's:
// a key claimed for 10 minutes, and one backing off for an hour, are
// neither expired nor due by the server's clock, the one claims are
// granted by. Judged by this machine's clock, status called the lease
// expired ("the next drain, poll or serve takes the key over") and the
// other key due now.
func TestStatusPostgresJudgesLeasesByServerClock(t *testing.T) {
	dsn, _, skew := pgtest.SkewedSchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Backoff: the whole hour (Rand 1 → the top of [0, ceiling)).
	s, err := postgres.Open(ctx, dsn, sink.Options{RetryBase: time.Hour, RetryMax: time.Hour, Rand: func() float64 { return 0.999 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	skew(-2 * time.Hour)
	const held, backing = "gemini:batches/skew-held", "gemini:batches/skew-backing"
	for _, k := range []string{held, backing} {
		if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Claim(ctx, held, "w", 10*time.Minute, sink.ClaimOptions{}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, backing, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := s.Fail(ctx, backing, c.Token, sink.Failure{Cause: "boom"}); err != nil || st != sink.StatePending {
		t.Fatalf("Fail = %s, %v; want pending", st, err)
	}

	r := gemrecon(t, "--db", dsn, "status", held)
	wantCode(t, r, exitNotDone)
	if strings.Contains(r.stdout, "expired") || !strings.Contains(r.stdout, "held by w until") {
		t.Errorf("status of a key claimed 10 minutes ago by the server's clock:\n%s\nwant a live lease, not expired", r.stdout)
	}
	r = gemrecon(t, "--db", dsn, "status", backing)
	wantCode(t, r, exitNotDone)
	if strings.Contains(r.stdout, "due now") || !strings.Contains(r.stdout, "next attempt") {
		t.Errorf("status of a key backing off by the server's clock:\n%s\nwant a next attempt that is not due now", r.stdout)
	}
}
