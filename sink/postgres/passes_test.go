package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestAcquirePassOutcomeUnknown: an acquisition whose reply is lost is
// settled and read back by its nonce: the caller holds the lease it took,
// and can end it.
func TestAcquirePassOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, dsn := lostReplySink(t)
	ctx := context.Background()
	// Prepare the statement on the one connection (see TestCompleteOutcomeUnknown).
	if _, _, err := s.AcquirePass(ctx, "warm-up", "w", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	cctx, dropped := lostCommit(t, s, p)
	l, r, err := s.AcquirePass(cctx, "s", "w", time.Minute, 0)
	if err != nil || l.Token != 1 || l.Owner != "w" || r.Holder != "w" || l.Until.IsZero() {
		t.Fatalf("AcquirePass with a lost reply = %+v, %+v, %v; want the lease, read back", l, r, err)
	}
	dropped()
	other := openDSN(t, dsn, sink.Options{})
	if _, _, err := other.AcquirePass(ctx, "s", "x", time.Minute, 0); !errors.Is(err, sink.ErrPassHeld) {
		t.Fatalf("AcquirePass by another process = %v, want ErrPassHeld", err)
	}
	if err := other.EndPass(ctx, l, sink.PassOutcome{Start: time.Now(), End: time.Now()}); err != nil {
		t.Fatalf("EndPass of the read-back lease: %v", err)
	}
}

// TestEndPassOutcomeUnknown: an EndPass whose reply is lost is read back:
// recorded, so it reports success; the lease is free.
func TestEndPassOutcomeUnknown(t *testing.T) {
	t.Parallel()
	s, p, dsn := lostReplySink(t)
	ctx := context.Background()
	l, _, err := s.AcquirePass(ctx, "s", "w", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Prepare the statement on the one connection.
	stale := l
	stale.Token++
	if err := s.EndPass(ctx, stale, sink.PassOutcome{Start: time.Now(), End: time.Now()}); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("warm-up EndPass = %v, want ErrFenced", err)
	}
	cctx, dropped := lostCommit(t, s, p)
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if err := s.EndPass(cctx, l, sink.PassOutcome{Start: start, End: start.Add(time.Second), Success: true}); err != nil {
		t.Fatalf("EndPass with a lost reply = %v, want nil (read back)", err)
	}
	dropped()
	other := openDSN(t, dsn, sink.Options{})
	recs, err := other.PassRecords(ctx)
	if err != nil || len(recs) != 1 || recs[0].Holder != "" || !recs[0].LastSuccess.Equal(start.Add(time.Second)) {
		t.Fatalf("PassRecords = %+v, %v; want the pass recorded and the lease free", recs, err)
	}
}

// TestPassDatabaseClock: without Options.Now the lease's end comes from
// the database clock, as the key leases' do.
func TestPassDatabaseClock(t *testing.T) {
	t.Parallel()
	dsn, _ := testSchema(t)
	ctx := context.Background()
	s := openDSN(t, dsn, sink.Options{})
	admin := adminConn(t, dsn)
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := admin.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	before := dbNow()
	l, _, err := s.AcquirePass(ctx, "s", "w", time.Hour, 0)
	if err != nil {
		t.Fatal(err)
	}
	after := dbNow()
	if l.Until.Before(before.Add(time.Hour)) || l.Until.After(after.Add(time.Hour)) {
		t.Fatalf("lease until %v, want within [%v, %v] (database clock + 1h)", l.Until, before.Add(time.Hour), after.Add(time.Hour))
	}
}
