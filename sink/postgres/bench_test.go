package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The benchmarks mirror sink/sqlite's (same names, same work) so that the
// two backends can be read side by side; the database clock is in use.

// perSecond reports n operations over the benchmark's elapsed time.
func perSecond(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit)
}

var benchPayload = []byte(`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`)

// BenchmarkNewCompletion is one new key's path through three calls:
// Record → Claim → Complete, one at a time (three commits).
func BenchmarkNewCompletion(b *testing.B) {
	ctx := context.Background()
	s, _ := openTest(b, sink.Options{})
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: benchPayload}); err != nil {
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
}

// BenchmarkNewCompletionRecordAndClaim is the same path with the record and
// the claim in one statement (sink.RecordClaimer): two commits.
func BenchmarkNewCompletionRecordAndClaim(b *testing.B) {
	ctx := context.Background()
	s, _ := openTest(b, sink.Options{})
	i := 0
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		_, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: benchPayload}, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "completions/s")
}

// BenchmarkDuplicateDone is the common case: a poll pass re-seeing a
// completion that is already done (answered from the done cache; its
// statistics are buffered).
func BenchmarkDuplicateDone(b *testing.B) {
	ctx := context.Background()
	s, _ := openTest(b, sink.Options{})
	const n = 1000
	sightings := make([]sink.Sighting, n)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/done-%d", i), Source: sink.SourcePoll,
			Payload: fmt.Appendf(nil, `{"name":"batches/done-%d","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, i)}
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

// BenchmarkDuplicatePending: a duplicate Record of a key that is not done
// (one read round-trip, no commit; statistics buffered).
func BenchmarkDuplicatePending(b *testing.B) {
	ctx := context.Background()
	s, _ := openTest(b, sink.Options{})
	sg := sink.Sighting{Key: "gemini:batches/pending", Source: sink.SourcePoll, Payload: benchPayload}
	if _, err := s.Record(ctx, sg); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r, err := s.Record(ctx, sg)
		if err != nil || r.State != sink.StatePending {
			b.Fatalf("Record = %+v, %v", r, err)
		}
	}
	perSecond(b, b.N, "records/s")
}

// BenchmarkConcurrentNewRecords: 16 goroutines record new keys (one commit
// each; PostgreSQL's commit_delay/group commit is the server's business).
func BenchmarkConcurrentNewRecords(b *testing.B) {
	ctx := context.Background()
	s, _ := openTest(b, sink.Options{}, WithMaxConns(16))
	var next atomic.Int64
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
}

// BenchmarkConcurrentComplete: N goroutines complete claimed keys, each
// with its own connection (WithMaxConns(N)).
func BenchmarkConcurrentComplete(b *testing.B) {
	for _, workers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			s, _ := openTest(b, sink.Options{}, WithMaxConns(max(workers, DefaultMaxConns)))
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
		})
	}
}
