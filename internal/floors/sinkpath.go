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
	in, err := ingest.NewWebhooks(ingest.WebhookConfig{Sink: s, Metrics: metrics.New(s), Logger: quiet})
	if err != nil {
		return Duplicates{}, err
	}
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
	half := max(n/2, 1)
	done, pending := make([]sink.Sighting, half), make([]sink.Sighting, half)
	for i := range half {
		if done[i], err = sighting(prefix+"done", i); err == nil {
			pending[i], err = sighting(prefix+"pending", i)
		}
		if err != nil {
			return Duplicates{}, err
		}
	}
	// Record them all, 16 at a time (untimed: group commit makes it quick).
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	all := append(append([]sink.Sighting{}, done...), pending...)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(all); i += 16 {
				if _, err := record(all[i]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return Duplicates{}, err
	}
	for _, sg := range done {
		c, err := s.Claim(ctx, sg.Key, "floors", time.Minute)
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
