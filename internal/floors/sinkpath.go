package floors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// sighting is what package ingest makes of loadgen's body i: a webhook's
// sighting of a succeeded batch, with the body as its payload.
func sighting(prefix string, i int) (sink.Sighting, error) {
	body := loadgen.NewKeys(prefix)(i)
	ev, err := canon.FromEvent(body)
	if err != nil {
		return sink.Sighting{}, err
	}
	return sink.Sighting{Key: ev.Key, Source: sink.SourceWebhook, Payload: body, State: ev.State}, nil
}

// SinkPath runs n new completions through the sink calls that serve makes
// for a completion that comes alone, in its order: RecordAndClaim with the
// dispatcher's claim request (the record-time claim, one commit), then
// Complete (the second). workers goroutines share the n. It measures the
// sink as the seed's own script measures its sink: the same calls a
// completion costs, without HTTP or the effect around them.
func SinkPath(ctx context.Context, dir string, n, workers int) (Completions, error) {
	s, err := openSQLite(ctx, dir, fmt.Sprintf("sink-%d", workers))
	if err != nil {
		return Completions{}, err
	}
	defer s.Close()
	sgs := make([]sink.Sighting, n)
	for i := range sgs {
		if sgs[i], err = sighting(fmt.Sprintf("sink%d", workers), i); err != nil {
			return Completions{}, err
		}
	}
	req := sink.ClaimRequest{Owner: "floors:1", Lease: 5 * time.Minute}
	errs := make(chan error, workers)
	c0 := s.Commits()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				_, c, err := s.RecordAndClaim(ctx, sgs[i], req)
				if err == nil && c == nil {
					err = fmt.Errorf("floors: %s was not claimed where it was recorded", sgs[i].Key)
				}
				if err == nil {
					err = s.Complete(ctx, c.Key, c.Token)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return Completions{}, err
	}
	return Completions{N: n, Elapsed: elapsed, Commits: s.Commits() - c0}, nil
}

// SinkDuplicates records n keys, completes half of them, then times n
// sightings of the done half and n of the pending half through Sink.Record,
// the call ingest makes for every sighting: what the seed's dup_per_s
// measures of its own sink.
func SinkDuplicates(ctx context.Context, dir string, n int) (Duplicates, error) {
	s, err := openSQLite(ctx, dir, "sink-dups")
	if err != nil {
		return Duplicates{}, err
	}
	defer s.Close()
	half := max(n/2, 1)
	done, pending := make([]sink.Sighting, half), make([]sink.Sighting, half)
	for i := range half {
		if done[i], err = sighting("sdone", i); err == nil {
			pending[i], err = sighting("spending", i)
		}
		if err != nil {
			return Duplicates{}, err
		}
	}
	if err := recordAll(ctx, s, append(append([]sink.Sighting{}, done...), pending...)); err != nil {
		return Duplicates{}, err
	}
	for _, sg := range done {
		c, err := s.Claim(ctx, sg.Key, "floors", time.Minute, sink.ClaimOptions{})
		if err == nil {
			err = s.Complete(ctx, sg.Key, c.Token)
		}
		if err != nil {
			return Duplicates{}, err
		}
	}
	timed := func(sgs []sink.Sighting, want sink.State) (float64, error) {
		start := time.Now()
		for i := range n {
			rr, err := s.Record(ctx, sgs[i%len(sgs)])
			if err != nil || rr.New || rr.State != want {
				return 0, fmt.Errorf("floors: duplicate of %s: %+v, %v; want state %s", sgs[i%len(sgs)].Key, rr, err, want)
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}
	var r Duplicates
	if r.Done, err = timed(done, sink.StateDone); err != nil {
		return r, err
	}
	r.Pending, err = timed(pending, sink.StatePending)
	return r, err
}

// recordAll records sgs, 16 at a time (untimed).
func recordAll(ctx context.Context, s *sqlite.Sink, sgs []sink.Sighting) error {
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(sgs); i += 16 {
				if _, err := s.Record(ctx, sgs[i]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
