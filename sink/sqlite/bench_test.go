package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// perSecond reports n operations over the benchmark's elapsed time.
func perSecond(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit)
}

// BenchmarkRawFdatasync is the disk's own rate: append 128 bytes and
// fdatasync, in the directory where the other benchmarks keep their files.
func BenchmarkRawFdatasync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 128)
	b.ResetTimer()
	for b.Loop() {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "syncs/s")
}

// BenchmarkSink is the backend-agnostic suite (sinktest.Bench), each run
// on a fresh file in its own temporary directory; the SQLite sink counts its
// commits, so ops per commit (= per disk sync) are reported too.
func BenchmarkSink(b *testing.B) {
	sinktest.Bench(b, func(b *testing.B) sink.Sink { return sqlitetest.OpenTemp(b, sink.Options{}) })
}

// BenchmarkDueBacklog lists the 4 oldest due keys of a backlog of 5,000
// pending keys: what each of a dispatcher's batch claims has to find.
func BenchmarkDueBacklog(b *testing.B) {
	ctx := context.Background()
	s := sqlitetest.OpenTemp(b, sink.Options{})
	sightings := make([]sink.Sighting, 5000)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/due-%05d", i), Source: sink.SourcePoll}
	}
	recordAll(b, s, sightings)
	for b.Loop() {
		keys, err := s.Due(ctx, 4, sink.ClaimOptions{})
		if err != nil || len(keys) != 4 {
			b.Fatalf("Due(4) = %d keys, %v", len(keys), err)
		}
	}
	perSecond(b, b.N, "lists/s")
}

// recordAll records sightings with 16 goroutines (sharing commits).
func recordAll(b *testing.B, s *sqlite.Sink, sightings []sink.Sighting) {
	b.Helper()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(sightings); i += 16 {
				if _, err := s.Record(context.Background(), sightings[i]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}
