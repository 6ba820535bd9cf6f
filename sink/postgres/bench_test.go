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

// completeOne runs one new completion: Record → Claim → Complete.
func completeOne(ctx context.Context, s *Sink, key string) error {
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"done":true}`)}); err != nil {
		return err
	}
	c, err := s.Claim(ctx, key, "bench", time.Minute)
	if err != nil {
		return err
	}
	return s.Complete(ctx, key, c.Token)
}

// BenchmarkNewCompletion: one new key through Record → Claim → Complete
// (three durable commits; database clock).
func BenchmarkNewCompletion(b *testing.B) {
	s, _ := openTest(b, sink.Options{})
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		if err := completeOne(ctx, s, fmt.Sprintf("gemini:batches/new-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewCompletionRecordAndClaim: the same through RecordAndClaim →
// Complete (two durable commits).
func BenchmarkNewCompletionRecordAndClaim(b *testing.B) {
	s, _ := openTest(b, sink.Options{})
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		_, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{}`)}, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDuplicateDone: a duplicate Record of a done key (answered from
// the done cache; statistics buffered).
func BenchmarkDuplicateDone(b *testing.B) {
	s, _ := openTest(b, sink.Options{})
	ctx := context.Background()
	key := "gemini:batches/done"
	if err := completeOne(ctx, s, key); err != nil {
		b.Fatal(err)
	}
	sg := sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"done":true}`)}
	for b.Loop() {
		r, err := s.Record(ctx, sg)
		if err != nil || r.State != sink.StateDone {
			b.Fatalf("Record = %+v, %v", r, err)
		}
	}
	b.StopTimer()
	if err := s.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDuplicatePending: a duplicate Record of a key that is not done
// (one read round-trip, no commit; statistics buffered).
func BenchmarkDuplicatePending(b *testing.B) {
	s, _ := openTest(b, sink.Options{})
	ctx := context.Background()
	sg := sink.Sighting{Key: "gemini:batches/pending", Source: sink.SourcePoll, Payload: []byte(`{}`)}
	if _, err := s.Record(ctx, sg); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r, err := s.Record(ctx, sg)
		if err != nil || r.State != sink.StatePending {
			b.Fatalf("Record = %+v, %v", r, err)
		}
	}
	b.StopTimer()
	if err := s.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkConcurrentComplete: new completions from 4 and 16 goroutines
// sharing one Sink (pool of DefaultMaxConns connections).
func BenchmarkConcurrentComplete(b *testing.B) {
	for _, workers := range []int{4, 16} {
		b.Run(fmt.Sprint(workers), func(b *testing.B) {
			s, _ := openTest(b, sink.Options{})
			ctx := context.Background()
			var next atomic.Int64
			n := int64(b.N)
			b.ResetTimer()
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > n {
							return
						}
						if err := completeOne(ctx, s, fmt.Sprintf("gemini:batches/c-%d", i)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "completions/s")
		})
	}
}
