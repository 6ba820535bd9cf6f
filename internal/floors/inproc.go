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
	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
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
	// serve's receiver on ln as `gemrecon serve` wires it (serve.Receiver:
	// the webhook path of package ingest, kicking or handing claims to d;
	// serve.Start: d's workers and the HTTP server), so that the product
	// path measured here is whatever serve does.
	h, err := serve.Receiver(webhook.Config{Secrets: []string{secret}, Dispatcher: d, Metrics: m}, s)
	if err != nil {
		ln.Close()
		return Completions{}, err
	}
	srv := serve.Start(ctx, serve.Config{Listener: ln, Handler: h, Dispatcher: d})
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

// observer is the dispatcher's Observer: the metrics, as serve's, and done
// hears each attempt's outcome.
type observer struct {
	m    *metrics.Metrics
	done chan<- string
}

func (o observer) ObserveEffect(outcome string, d time.Duration) {
	o.m.ObserveEffect(outcome, d)
	o.done <- outcome
}
