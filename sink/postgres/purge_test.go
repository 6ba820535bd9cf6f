package postgres

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
)

// TestPurgeMeasuresAgeWithTheDatabaseClock: without an injected clock
// done_at is written with the server's now(), so Purge measures "done for
// longer than D" with the server's clock too, never with the caller's.
// Here the server's clock runs 2h behind this process's (as for a purging
// machine whose clock is 2h ahead of the server's): a key done 30m ago by
// the server's clock, 2h30m ago by this process's, is inside D = 1h and
// stays, though the lookback guard allowed D = 1h; one done 3h ago goes.
// A cutoff taken from the caller's clock (time.Now() - D, what purge did
// before) deleted both: clock skew bypassed the lookback guard.
func TestPurgeMeasuresAgeWithTheDatabaseClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, schema, skew := pgtest.SkewedSchema(t)
	s := openDSN(t, dsn, sink.Options{})
	const old, fresh = "gemini:batches/purge-old", "gemini:batches/purge-fresh"
	complete := func(key string) {
		t.Helper()
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	skew(-5 * time.Hour)
	complete(old)
	skew(-150 * time.Minute)
	complete(fresh)
	skew(-2 * time.Hour) // the server's clock now: fresh done 30m ago, old 3h ago

	// By this process's clock (the real one) fresh was done at least
	// 2h30m ago: were done_at not written with the skewed now(), this test
	// would show nothing.
	var secs float64
	if err := adminConn(t, baseDSN(t)).QueryRow(ctx, `SELECT extract(epoch FROM pg_catalog.now() - done_at)
		FROM `+schema+`.gemrecon_keys WHERE key = $1`, fresh).Scan(&secs); err != nil {
		t.Fatal(err)
	}
	if secs < (150 * time.Minute).Seconds() {
		t.Fatalf("%s was done %.0fs ago by the real clock, want ≥ 2h30m: the sink does not use the schema's now()", fresh, secs)
	}

	if err := s.NoteLookback(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := (sink.PurgeRequest{OlderThan: time.Hour}).Check(ctx, s); err != nil {
		t.Fatalf("lookback guard for D = 1h after a 1h lookback: %v", err)
	}
	keys, err := s.Purge(ctx, time.Hour)
	if err != nil || !slices.Equal(keys, []string{old}) {
		t.Fatalf("PurgeKeys(1h) = %q, %v; want only %s (%s was done 30m ago by the database's clock)", keys, err, old, fresh)
	}
	if e, err := s.Get(ctx, fresh); err != nil || e.State != sink.StateDone {
		t.Fatalf("Get(%s) after the purge: state %q, %v; want done", fresh, e.State, err)
	}

	skew(-150*time.Minute + 61*time.Minute) // fresh done 61m ago by the server's clock
	if n, err := s.Purge(ctx, time.Hour); err != nil || len(n) != 1 {
		t.Fatalf("Purge(1h) of a key done 61m ago by the database's clock = %q, %v; want 1", n, err)
	}
}
