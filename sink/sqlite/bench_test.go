package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// perSecond reports n operations over the benchmark's elapsed time.
func perSecond(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit)
}

func reportCommits(b *testing.B, s *sqlite.Sink, before int64, ops int, unit string) {
	if c := s.Commits() - before; c > 0 {
		b.ReportMetric(float64(ops)/float64(c), unit)
	}
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

// BenchmarkNewCompletion is one new key's path through three calls:
// Record → Claim → Complete, one at a time.
func BenchmarkNewCompletion(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	payload := []byte(`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`)
	i := 0
	before := s.Commits()
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}); err != nil {
			b.Fatal(err)
		}
		c, err := s.Claim(ctx, key, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "completions/s")
	b.ReportMetric(float64(s.Commits()-before)/float64(b.N), "commits/completion")
}

// BenchmarkNewCompletionRecordAndClaim is the same path with the record and
// the claim in one commit (sink.RecordClaimer): two commits per completion.
func BenchmarkNewCompletionRecordAndClaim(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	payload := []byte(`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`)
	i := 0
	before := s.Commits()
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		_, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "completions/s")
	b.ReportMetric(float64(s.Commits()-before)/float64(b.N), "commits/completion")
}

// BenchmarkDuplicateDone is the common case: a poll pass re-seeing a
// completion that is already done.
func BenchmarkDuplicateDone(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	const n = 1000
	sightings := make([]sink.Sighting, n)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/done-%d", i), Source: sink.SourcePoll,
			Payload: []byte(fmt.Sprintf(`{"name":"batches/done-%d","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, i))}
		if _, err := s.Record(ctx, sightings[i]); err != nil {
			b.Fatal(err)
		}
	}
	cs, err := s.ClaimDue(ctx, "bench", time.Minute, 0)
	if err != nil || len(cs) != n {
		b.Fatalf("ClaimDue = %d, %v", len(cs), err)
	}
	for _, c := range cs {
		if err := s.Complete(ctx, c.Key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		r, err := s.Record(ctx, sightings[i%n])
		i++
		if err != nil || r.State != sink.StateDone {
			b.Fatalf("Record(dup) = %+v, %v", r, err)
		}
	}
	perSecond(b, b.N, "records/s")
}

// BenchmarkConcurrentNewRecords: 16 goroutines record new keys; group commit
// lets them share disk syncs.
func BenchmarkConcurrentNewRecords(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	var next atomic.Int64
	before := s.Commits()
	b.SetParallelism((16 + 1) / 2) // × GOMAXPROCS(2) = 16 goroutines here
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("gemini:batches/rec-%d", next.Add(1))
			r, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(key)})
			if err != nil || !r.New {
				b.Errorf("Record = %+v, %v", r, err)
				return
			}
		}
	})
	perSecond(b, b.N, "records/s")
	reportCommits(b, s, before, b.N, "records/commit")
}

// BenchmarkConcurrentComplete: N goroutines complete claimed keys.
func BenchmarkConcurrentComplete(b *testing.B) {
	for _, workers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			s := openTemp(b, sink.Options{})
			// Setup, untimed: b.N claimed keys, recorded by 16 goroutines.
			keys := make(chan string, b.N)
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Go(func() {
					for i := w; i < b.N; i += 16 {
						if _, err := s.Record(ctx, sink.Sighting{Key: fmt.Sprintf("k%08d", i), Source: sink.SourcePoll}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			cs, err := s.ClaimDue(ctx, "bench", time.Hour, 0)
			if err != nil || len(cs) != b.N {
				b.Fatalf("ClaimDue = %d, %v", len(cs), err)
			}
			tokens := make(map[string]int64, len(cs))
			for _, c := range cs {
				tokens[c.Key] = c.Token
				keys <- c.Key
			}
			close(keys)
			before := s.Commits()
			b.ResetTimer()
			for range workers {
				wg.Go(func() {
					for k := range keys {
						if err := s.Complete(ctx, k, tokens[k]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			perSecond(b, b.N, "completions/s")
			reportCommits(b, s, before, b.N, "completions/commit")
		})
	}
}

// BenchmarkDuplicatePending is a webhook retry or a second poll pass seeing a
// completion that is recorded but not done yet: the key is not in the done
// cache, so every Record reads its row on the reader pool.
func BenchmarkDuplicatePending(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	const n = 1000
	sightings := make([]sink.Sighting, n)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/pending-%d", i), Source: sink.SourceWebhook,
			Payload: []byte(fmt.Sprintf(`{"name":"batches/pending-%d","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, i))}
	}
	recordAll(b, s, sightings)
	i := 0
	for b.Loop() {
		r, err := s.Record(ctx, sightings[i%n])
		i++
		if err != nil || r.State != sink.StatePending {
			b.Fatalf("Record(dup) = %+v, %v", r, err)
		}
	}
	perSecond(b, b.N, "records/s")
}

// BenchmarkDueBacklog lists the 4 oldest due keys of a backlog of 5,000
// pending keys: what each of a dispatcher's batch claims has to find.
func BenchmarkDueBacklog(b *testing.B) {
	ctx := context.Background()
	s := openTemp(b, sink.Options{})
	sightings := make([]sink.Sighting, 5000)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/due-%05d", i), Source: sink.SourcePoll}
	}
	recordAll(b, s, sightings)
	for b.Loop() {
		keys, err := s.Due(ctx, 4)
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
