package dispatch

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/disksync"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// rawSyncRate measures append+fdatasync per second in dir: the disk's own
// bound on durable commits, for comparison with completions per second.
func rawSyncRate(tb testing.TB, dir string, n int) float64 {
	tb.Helper()
	r, err := disksync.Rate(dir, 0, n)
	if err != nil {
		tb.Fatal(err)
	}
	return r.Rate()
}

// BenchmarkDispatch measures Drain over b.N pre-recorded keys with the
// Print effect into io.Discard, so the sink's commits are the cost, on each
// backend: a fresh SQLite file, and a fresh schema on the PostgreSQL server
// named by GEMRECON_TEST_POSTGRES (skipped without it), opened as the CLI
// opens --db (sink/dial; default pool of postgres.DefaultMaxConns). Right
// after each run it measures the raw append+fdatasync rate in the run's
// temporary directory and reports completions per raw sync. Run with a
// fixed N, e.g. -benchtime 2000x.
func BenchmarkDispatch(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres"} {
		for _, conc := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("backend=%s/concurrency=%d", backend, conc), func(b *testing.B) {
				benchDispatch(b, backend == "postgres", conc)
			})
		}
	}
}

func benchDispatch(b *testing.B, pg bool, conc int) {
	dir := b.TempDir()
	db := filepath.Join(dir, "gemrecon.db")
	if pg {
		db = pgtest.Schema(b)
	}
	s, err := dial.Open(context.Background(), db, sink.Options{}, quietLogger())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	recordMany(b, s, keys(b.N))
	d, err := New(Config{Sink: s, Effect: effect.NewPrint(io.Discard, nil), Concurrency: conc, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	sum, err := d.Drain(context.Background())
	elapsed := time.Since(start)
	b.StopTimer()
	if err != nil || sum.OK != b.N {
		b.Fatalf("Drain() = %+v, %v, want %d done", sum, err, b.N)
	}
	perSec := float64(sum.OK) / elapsed.Seconds()
	// The disk is shared: measure it right after the run. (PostgreSQL's WAL
	// is on the server's disk, the same one when the server is local.)
	raw := rawSyncRate(b, dir, 1000)
	b.ReportMetric(perSec, "completions/s")
	b.ReportMetric(raw, "rawsyncs/s")
	b.ReportMetric(perSec/raw, "completions/sync")
}
