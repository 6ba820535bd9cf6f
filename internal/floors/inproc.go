package floors

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// secret signs the deliveries (it guards nothing).
const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

var quiet = slog.New(slog.DiscardHandler)

// openSQLite opens a fresh sink file in dir, as serve opens --db.
func openSQLite(ctx context.Context, dir, name string) (*sqlite.Sink, error) {
	return sqlite.Open(ctx, filepath.Join(dir, name+".db"), sink.Options{}, sqlite.WithLogger(quiet))
}

// Completions is one run of the product path.
type Completions struct {
	N       int
	Elapsed time.Duration
	Commits int64 // the sink's commits while they ran
}

// Rate is completions per second.
func (c Completions) Rate() float64 { return float64(c.N) / c.Elapsed.Seconds() }

// PerCompletion is commits per completion.
func (c Completions) PerCompletion() float64 { return float64(c.Commits) / float64(c.N) }

// ProductPath runs n new completions through serve's receiver in this
// process, on a fresh SQLite file in dir: a signed delivery over loopback
// HTTP, verified and recorded through package ingest, its key claimed and
// its effect (NDJSON into io.Discard) run by package dispatch, its outcome
// recorded. senders deliveries are in flight at once, each sender sending
// its next only once a completion has ended (its outcome is recorded); the
// dispatcher runs up to senders effects at once, at least serve's default
// --concurrency. With one sender each completion comes alone.
func ProductPath(ctx context.Context, dir string, n, senders int) (Completions, error) {
	s, err := openSQLite(ctx, dir, fmt.Sprintf("product-%d", senders))
	if err != nil {
		return Completions{}, err
	}
	defer s.Close()
	m := metrics.New(s)
	outcomes := make(chan string, n+1)
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: effect.NewPrint(io.Discard, nil), Concurrency: max(senders, dispatch.DefaultConcurrency),
		Logger: quiet, Observer: observer{m: m, done: outcomes}})
	if err != nil {
		return Completions{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Completions{}, err
	}
	srv, err := startReceiver(ctx, ln, s, d, m, secret)
	if err != nil {
		ln.Close()
		return Completions{}, err
	}
	defer srv.Stop()
	url := "http://" + ln.Addr().String() + "/webhook"
	var mu sync.Mutex
	var bad error
	// Each ack waits for one completion's end: at most senders are in
	// flight, and the run ends once all n have ended.
	run := func(count int, prefix string) (time.Duration, error) {
		start := time.Now()
		res, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: secret, Workers: senders, Count: count,
			Body: loadgen.NewKeys(prefix), StopOnTransportError: true,
			OnAck: func(a loadgen.Ack) {
				select {
				case out := <-outcomes:
					if out != string(dispatch.OutcomeDone) {
						mu.Lock()
						bad = fmt.Errorf("floors: an effect ended %s, want done", out)
						mu.Unlock()
					}
				case <-time.After(time.Minute):
					mu.Lock()
					bad = fmt.Errorf("floors: no completion within a minute of %s's 2xx", a.Key)
					mu.Unlock()
				}
			}})
		elapsed := time.Since(start)
		if err == nil && len(res.Acks) != count {
			err = fmt.Errorf("floors: %d of %d deliveries answered 2xx (statuses %v, first error %v)", len(res.Acks), count, res.ByStatus, res.FirstError)
		}
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			err = bad
		}
		return elapsed, err
	}
	if _, err := run(senders, "warm"); err != nil { // connections, pages, the first drain
		return Completions{}, err
	}
	c0 := s.Commits()
	elapsed, err := run(n, "new")
	if err != nil {
		return Completions{}, err
	}
	return Completions{N: n, Elapsed: elapsed, Commits: s.Commits() - c0}, nil
}

// Duplicates is one run of duplicate sightings.
type Duplicates struct {
	Done, Pending float64 // per second
}

// DuplicateSightings records n keys through ingest's webhook path (a
// fresh SQLite file in dir), completes half of them (claim and complete, as
// a finished effect would), then times n sightings of the done half and n
// of the pending half, one after another, cycling over the keys, through
// the same path: what a redelivery, or a poll pass re-seeing finished
// batches, costs. Nothing dispatches the pending keys meanwhile.
func DuplicateSightings(ctx context.Context, dir string, n int) (Duplicates, error) {
	s, err := openSQLite(ctx, dir, "dups")
	if err != nil {
		return Duplicates{}, err
	}
	defer s.Close()
	in := ingest.NewWebhooks(ingest.WebhookConfig{Sink: s, Metrics: metrics.New(s), Logger: quiet})
	half := max(n/2, 1)
	bodies := func(kind string) [][]byte {
		b := make([][]byte, half)
		for i := range b {
			b[i] = loadgen.NewKeys("dup-" + kind)(i)
		}
		return b
	}
	done, pending := bodies("done"), bodies("pending")
	// Record them all, 16 at a time (untimed: group commit makes it quick).
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	all := append(append([][]byte{}, done...), pending...)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(all); i += 16 {
				if a := in.Event(ctx, all[i], ingest.VerifiedStatic); a.Kind != ingest.Recorded {
					errs <- fmt.Errorf("floors: recording a new key: %v (%v)", a.Outcome, a.Err)
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
	for i := range done {
		key := "gemini:batches/dup-done-" + fmt.Sprint(i)
		c, err := s.Claim(ctx, key, "floors", time.Minute)
		if err != nil {
			return Duplicates{}, err
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			return Duplicates{}, err
		}
	}
	timed := func(bs [][]byte, want sink.State) (float64, error) {
		start := time.Now()
		for i := range n {
			a := in.Event(ctx, bs[i%len(bs)], ingest.VerifiedStatic)
			if a.Kind != ingest.Recorded || a.Result.State != want {
				return 0, fmt.Errorf("floors: duplicate of %s: %v, state %s, want %s (%v)", a.Key, a.Outcome, a.Result.State, want, a.Err)
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
