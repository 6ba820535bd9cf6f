package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestPassAcquireTwoSinks: two sinks on one file (two writer connections,
// as two processes have) race for one scope's pass lease: exactly one
// acquisition is granted, whichever writer commits first, and the loser sees
// the winner's record.
func TestPassAcquireTwoSinks(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gemrecon.db")
	var sinks [2]*sqlite.Sink
	for i := range sinks {
		s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		sinks[i] = s
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted []sink.PassLease
		holders []string
		errs    []error
	)
	for i := range 8 {
		wg.Go(func() {
			l, r, err := sinks[i%2].AcquirePass(ctx, "s", fmt.Sprintf("p%d", i), time.Minute, 0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				granted = append(granted, l)
			case errors.Is(err, sink.ErrPassHeld):
				holders = append(holders, r.Holder)
			default:
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(granted) != 1 || granted[0].Token != 1 || len(errs) != 0 {
		t.Fatalf("granted %+v with errors %v, want exactly one lease with token 1", granted, errs)
	}
	for _, h := range holders {
		if h != granted[0].Owner {
			t.Fatalf("a refused acquisition saw holder %q, want %q", h, granted[0].Owner)
		}
	}
	recs, err := sinks[1].PassRecords(ctx)
	if err != nil || len(recs) != 1 || recs[0].Holder != granted[0].Owner {
		t.Fatalf("PassRecords = %+v, %v; want held by %s", recs, err, granted[0].Owner)
	}
}

// TestPassRecordsReadOnly: a read-only open (stats) reads the records, and
// refuses to write them.
func TestPassRecordsReadOnly(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gemrecon.db")
	w, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := w.AcquirePass(ctx, "s", "w", time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.EndPass(ctx, l, sink.PassOutcome{Start: time.Now(), End: time.Now(), FullScan: true}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := sqlite.Open(ctx, path, sink.Options{ReadOnly: true}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st, err := r.Stats(ctx)
	if err != nil || len(st.Passes) != 1 || st.Passes[0].LastHolder != "w" || st.Passes[0].LastFullScan.IsZero() {
		t.Fatalf("read-only Stats.Passes = %+v, %v; want w's full scan", st.Passes, err)
	}
	if _, _, err := r.AcquirePass(ctx, "s", "x", time.Minute, 0); !errors.Is(err, sqlite.ErrReadOnly) {
		t.Fatalf("read-only AcquirePass = %v, want ErrReadOnly", err)
	}
}
