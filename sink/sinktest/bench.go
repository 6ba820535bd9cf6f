package sinktest

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// BenchOpener opens a fresh, empty sink with default sink.Options (the
// backend's own clock) for one benchmark and arranges for it to be closed
// when the benchmark ends. It is called once per run of a sub-benchmark.
type BenchOpener func(b *testing.B) sink.Sink

// Committer is an optional capability of a sink: the number of write
// transactions it has committed so far (on SQLite, one disk sync each).
// Bench reports operations per commit for sinks that have it.
type Committer interface {
	// Commits returns the committed write transactions since Open.
	Commits() int64
}

// benchPayload is the payload of a new completion's sighting.
var benchPayload = []byte(`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`)

// Bench is the one benchmark suite every backend runs, so that their
// numbers can be read side by side; the same work, the same names, the
// same metrics. Sub-benchmarks:
//
//   - NewCompletion: Record → Claim → Complete of a new key, sequential.
//   - NewCompletionRecordAndClaim: RecordAndClaim → Complete .
//   - DuplicateDone: Record of a key that is already done.
//   - DuplicatePending: Record of a key that is recorded but not done.
//   - ConcurrentNewRecords: 16 goroutines record new keys.
//   - ConcurrentComplete/goroutines={1,4,16}: N goroutines complete claimed
//     keys.
//
// Each reports operations per second (completions/s, records/s) and, when
// the sink is a Committer, operations per commit.
func Bench(b *testing.B, open BenchOpener) {
	b.Run("NewCompletion", func(b *testing.B) { benchNewCompletion(b, open) })
	b.Run("NewCompletionRecordAndClaim", func(b *testing.B) { benchNewCompletionRecordAndClaim(b, open) })
	b.Run("DuplicateDone", func(b *testing.B) { benchDuplicateDone(b, open) })
	b.Run("DuplicatePending", func(b *testing.B) { benchDuplicatePending(b, open) })
	b.Run("ConcurrentNewRecords", func(b *testing.B) { benchConcurrentNewRecords(b, open) })
	b.Run("ConcurrentComplete", func(b *testing.B) {
		for _, workers := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("goroutines=%d", workers), func(b *testing.B) { benchConcurrentComplete(b, open, workers) })
		}
	})
}

// perSecond reports n operations over the benchmark's elapsed time.
func perSecond(b *testing.B, n int, unit string) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), unit)
}

// commits returns s's commit count, or -1 when s does not count commits.
func commits(s sink.Sink) int64 {
	if c, ok := s.(Committer); ok {
		return c.Commits()
	}
	return -1
}

// reportOpsPerCommit reports ops per commit since before (a commits value),
// when s counts commits and committed at least once.
func reportOpsPerCommit(b *testing.B, s sink.Sink, before int64, ops int, unit string) {
	if before < 0 {
		return
	}
	if c := commits(s) - before; c > 0 {
		b.ReportMetric(float64(ops)/float64(c), unit)
	}
}

// reportCommitsPerOp reports commits per op since before (a commits value),
// when s counts commits.
func reportCommitsPerOp(b *testing.B, s sink.Sink, before int64, ops int, unit string) {
	if before < 0 || ops == 0 {
		return
	}
	b.ReportMetric(float64(commits(s)-before)/float64(ops), unit)
}

// benchNewCompletion is one new key's path through three calls:
// Record → Claim → Complete, one at a time (three commits).
func benchNewCompletion(b *testing.B, open BenchOpener) {
	ctx := context.Background()
	s := open(b)
	i := 0
	before := commits(s)
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: benchPayload}); err != nil {
			b.Fatal(err)
		}
		c, err := s.Claim(ctx, key, "bench", time.Minute, sink.ClaimOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "completions/s")
	reportCommitsPerOp(b, s, before, b.N, "commits/completion")
}

// benchNewCompletionRecordAndClaim is the same path with the record and the
// claim in one commit (sink.RecordClaimer): two commits per completion.
func benchNewCompletionRecordAndClaim(b *testing.B, open BenchOpener) {
	ctx := context.Background()
	s := open(b)
	i := 0
	before := commits(s)
	for b.Loop() {
		key := fmt.Sprintf("gemini:batches/new-%d", i)
		i++
		_, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: benchPayload}, sink.ClaimRequest{Owner: "bench", Lease: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			b.Fatal(err)
		}
	}
	perSecond(b, b.N, "completions/s")
	reportCommitsPerOp(b, s, before, b.N, "commits/completion")
}

// benchDuplicateDone is the common case: a poll pass re-seeing a completion
// that is already done, cycling over 1,000 done keys.
func benchDuplicateDone(b *testing.B, open BenchOpener) {
	ctx := context.Background()
	s := open(b)
	const n = 1000
	sightings := make([]sink.Sighting, n)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/done-%d", i), Source: sink.SourcePoll,
			Payload: fmt.Appendf(nil, `{"name":"batches/done-%d","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, i),
			State:   "SUCCEEDED", FromAPI: true} // as a poll pass records it
	}
	recordAll(b, s, sightings)
	cs, err := s.ClaimDue(ctx, "bench", time.Minute, 0, sink.ClaimOptions{})
	if err != nil || len(cs) != n {
		b.Fatalf("ClaimDue = %d claims, %v; want %d", len(cs), err, n)
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
			b.Fatalf("Record(dup) = %+v, %v; want state done", r, err)
		}
	}
	perSecond(b, b.N, "records/s")
}

// benchDuplicatePending is a webhook retry or a second poll pass seeing a
// completion that is recorded but not done yet, cycling over 1,000 pending
// keys: Record must read the key's state (no done cache answers it), but
// commits nothing.
func benchDuplicatePending(b *testing.B, open BenchOpener) {
	ctx := context.Background()
	s := open(b)
	const n = 1000
	sightings := make([]sink.Sighting, n)
	for i := range sightings {
		sightings[i] = sink.Sighting{Key: fmt.Sprintf("gemini:batches/pending-%d", i), Source: sink.SourceWebhook,
			Payload: fmt.Appendf(nil, `{"name":"batches/pending-%d","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, i),
			State:   "SUCCEEDED"} // as a webhook redelivery records it
	}
	recordAll(b, s, sightings)
	i := 0
	for b.Loop() {
		r, err := s.Record(ctx, sightings[i%n])
		i++
		if err != nil || r.State != sink.StatePending {
			b.Fatalf("Record(dup) = %+v, %v; want state pending", r, err)
		}
	}
	perSecond(b, b.N, "records/s")
}

// benchConcurrentNewRecords: 16 goroutines record new keys, so that the
// backend can group their commits.
func benchConcurrentNewRecords(b *testing.B, open BenchOpener) {
	ctx := context.Background()
	s := open(b)
	var next atomic.Int64
	before := commits(s)
	// RunParallel starts parallelism × GOMAXPROCS goroutines: 16 (or the
	// next multiple of GOMAXPROCS).
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((16 + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("gemini:batches/rec-%d", next.Add(1))
			r, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(key)})
			if err != nil || !r.New {
				b.Errorf("Record(%q) = %+v, %v; want a new key", key, r, err)
				return
			}
		}
	})
	perSecond(b, b.N, "records/s")
	reportOpsPerCommit(b, s, before, b.N, "records/commit")
}

// benchConcurrentComplete: workers goroutines complete b.N claimed keys.
func benchConcurrentComplete(b *testing.B, open BenchOpener, workers int) {
	ctx := context.Background()
	s := open(b)
	// Setup, untimed: b.N keys recorded by 16 goroutines, then claimed.
	ks := make([]sink.Sighting, b.N)
	for i := range ks {
		ks[i] = sink.Sighting{Key: fmt.Sprintf("k%08d", i), Source: sink.SourcePoll}
	}
	recordAll(b, s, ks)
	cs, err := s.ClaimDue(ctx, "bench", time.Hour, 0, sink.ClaimOptions{})
	if err != nil || len(cs) != b.N {
		b.Fatalf("ClaimDue = %d claims, %v; want %d", len(cs), err, b.N)
	}
	keys := make(chan sink.Claim, len(cs))
	for _, c := range cs {
		keys <- c
	}
	close(keys)
	before := commits(s)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c := range keys {
				if err := s.Complete(ctx, c.Key, c.Token); err != nil {
					b.Errorf("Complete(%q) error: %v", c.Key, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	perSecond(b, b.N, "completions/s")
	reportOpsPerCommit(b, s, before, b.N, "completions/commit")
}

// recordAll records sightings with 16 goroutines (so that a backend with
// group commit shares commits among them), untimed setup.
func recordAll(b *testing.B, s sink.Sink, sightings []sink.Sighting) {
	b.Helper()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(sightings); i += 16 {
				if _, err := s.Record(context.Background(), sightings[i]); err != nil {
					b.Errorf("Record(%q) error: %v", sightings[i].Key, err)
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
