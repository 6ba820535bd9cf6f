package floors

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
)

// sightings are what package ingest makes of loadgen's bodies 0 to n-1:
// a webhook's sightings of succeeded batches, each with its body as its
// payload.
func sightings(prefix string, n int) ([]sink.Sighting, error) {
	sgs := make([]sink.Sighting, n)
	for i := range sgs {
		body := loadgen.NewKeys(prefix)(i)
		ev, err := canon.FromEvent(body)
		if err != nil {
			return nil, err
		}
		sgs[i] = sink.Sighting{Key: ev.Key, Source: sink.SourceWebhook, Payload: body, State: ev.State}
	}
	return sgs, nil
}

// parallel runs f(i) for every i < n on workers goroutines, worker w
// taking w, w+workers, …, and returns the first error.
func parallel(n, workers int, f func(i int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := f(i); err != nil {
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
	sgs, err := sightings(fmt.Sprintf("sink%d", workers), n)
	if err != nil {
		return Completions{}, err
	}
	req := sink.ClaimRequest{Owner: "floors:1", Lease: 5 * time.Minute}
	c0 := s.Commits()
	start := time.Now()
	err = parallel(n, workers, func(i int) error {
		_, c, err := s.RecordAndClaim(ctx, sgs[i], req)
		if err == nil && c == nil {
			err = fmt.Errorf("floors: %s was not claimed where it was recorded", sgs[i].Key)
		}
		if err == nil {
			err = s.Complete(ctx, c.Key, c.Token)
		}
		return err
	})
	elapsed := time.Since(start)
	if err != nil {
		return Completions{}, err
	}
	return Completions{N: n, Elapsed: elapsed, Commits: s.Commits() - c0}, nil
}

// Duplicates is one run of duplicate sightings.
type Duplicates struct {
	Done, Pending float64 // per second
}

// DuplicateSightings records n keys on a fresh SQLite file in dir,
// completes half of them (claim and complete, as a finished effect would),
// then times n sightings of the done half and n of the pending half, one
// after another, cycling over the keys: what a redelivery, or a poll pass
// re-seeing finished batches, costs. Nothing dispatches the pending keys
// meanwhile. The sightings go through Sink.Record, the call ingest makes
// for every sighting (what the seed's dup_per_s measures of its own sink),
// or, viaIngest, through ingest's webhook path (the body parsed, then
// Record).
func DuplicateSightings(ctx context.Context, dir string, n int, viaIngest bool) (Duplicates, error) {
	name, prefix := "sink-dups", "s"
	if viaIngest {
		name, prefix = "dups", "dup-"
	}
	s, err := openSQLite(ctx, dir, name)
	if err != nil {
		return Duplicates{}, err
	}
	defer s.Close()
	in := ingest.NewWebhooks(ingest.WebhookConfig{Sink: s, Metrics: metrics.New(s), Logger: quiet})
	record := func(sg sink.Sighting) (sink.RecordResult, error) {
		if !viaIngest {
			return s.Record(ctx, sg)
		}
		a := in.Event(ctx, sg.Payload, ingest.VerifiedStatic)
		if a.Kind != ingest.Recorded {
			return a.Result, fmt.Errorf("floors: %s: %v (%v)", sg.Key, a.Outcome, a.Err)
		}
		return a.Result, nil
	}
	done, err := sightings(prefix+"done", max(n/2, 1))
	if err != nil {
		return Duplicates{}, err
	}
	pending, err := sightings(prefix+"pending", max(n/2, 1))
	if err != nil {
		return Duplicates{}, err
	}
	// Record them all, 16 at a time (untimed: group commit makes it quick).
	all := append(append([]sink.Sighting{}, done...), pending...)
	err = parallel(len(all), 16, func(i int) error {
		_, err := record(all[i])
		return err
	})
	if err != nil {
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
			rr, err := record(sgs[i%len(sgs)])
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
