// Package loadgen sends signed webhook deliveries to a gemrecon receiver on
// loopback, bounded in count and time, and measures what came back: the
// tests' "no loss under shutdown" traffic and the deliveries of
// internal/floors, the benchmark of BENCHMARKS.md.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/webhook"
)

// Config describes one load run. Count or Duration (or both) must bound it.
type Config struct {
	// URL is the receiver's POST URL; its host must be a loopback address.
	URL string
	// Secret signs each request per Standard Webhooks; "" sends unsigned.
	Secret string
	// Workers is how many requests are in flight at once (default 8).
	Workers int
	// Count stops the run after this many requests (0: no count limit).
	Count int
	// Duration stops the run after this long (0: no time limit).
	Duration time.Duration
	// Body returns the i-th request's body (default NewKeys("load")).
	Body func(i int) []byte
	// StopOnTransportError ends a worker at its first transport error
	// (connection refused or reset): the server is gone.
	StopOnTransportError bool
	// Client sends the requests (default: keep-alive, Workers idle
	// connections, 30s timeout).
	Client *http.Client
	// OnAck, when set, is called (from the worker goroutines) for every 2xx
	// as it arrives: tests use it to pull the plug mid-run.
	OnAck func(Ack)
}

// Ack is one request answered 2xx: the receiver promised its key is durable.
type Ack struct {
	Index  int
	Key    string
	Status string
	Code   int
}

// Result is what one run saw.
type Result struct {
	Sent            int         // requests attempted
	ByStatus        map[int]int // responses by HTTP status
	TransportErrors int         // requests without a response
	Elapsed         time.Duration
	Latencies       []time.Duration // of every response, sorted
	Acks            []Ack           // every 2xx, in completion order
	FirstError      error           // the first transport error, if any
}

// Rate is responses per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(len(r.Latencies)) / r.Elapsed.Seconds()
}

// Quantile returns the q-quantile (0..1) of the response latencies.
func (r Result) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Latencies)-1) + 0.5)
	return r.Latencies[min(max(i, 0), len(r.Latencies)-1)]
}

// NewKeys returns bodies naming a distinct batch per request:
// batches/<prefix>-<i>, each a Gemini-shaped batch.succeeded event.
func NewKeys(prefix string) func(i int) []byte {
	return func(i int) []byte {
		return fmt.Appendf(nil, `{"type":"batch.succeeded","version":"v1","data":{"id":"%s-%d"}}`, prefix, i)
	}
}

// SameKey returns bodies that all name batches/<id>: duplicate deliveries.
func SameKey(id string) func(i int) []byte {
	body := fmt.Appendf(nil, `{"type":"batch.succeeded","version":"v1","data":{"id":%q}}`, id)
	return func(int) []byte { return body }
}

// CheckLoopback refuses a URL whose host is not a loopback address, so that
// a mistyped flag cannot aim a load test at someone else's server.
func CheckLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("loadgen: URL: %w", err)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("loadgen: %q is not a loopback address; loadgen only targets this machine", host)
	}
	return nil
}

// Run sends requests until Count is reached, Duration has passed, ctx is
// done, or (with StopOnTransportError) every worker has seen the server go.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := CheckLoopback(cfg.URL); err != nil {
		return Result{}, err
	}
	if cfg.Count <= 0 && cfg.Duration <= 0 {
		return Result{}, errors.New("loadgen: set Count or Duration: a run must be bounded")
	}
	if cfg.Secret != "" {
		if err := webhook.ValidateSecret(cfg.Secret); err != nil {
			return Result{}, fmt.Errorf("loadgen: secret: %w", err)
		}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.Body == nil {
		cfg.Body = NewKeys("load")
	}
	client := cfg.Client
	if client == nil {
		tr := &http.Transport{
			MaxIdleConns:        cfg.Workers,
			MaxIdleConnsPerHost: cfg.Workers,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	}
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}

	var next atomic.Int64
	type workerResult struct {
		byStatus  map[int]int
		lat       []time.Duration
		acks      []Ack
		transport int
		firstErr  error
		sent      int
	}
	results := make([]workerResult, cfg.Workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wr := &results[w]
			wr.byStatus = map[int]int{}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if cfg.Count > 0 && i >= cfg.Count {
					return
				}
				wr.sent++
				code, ack, d, err := send(ctx, client, cfg, i)
				if err != nil {
					if ctx.Err() != nil {
						wr.sent-- // cut off by the run's own end, not the server
						return
					}
					wr.transport++
					if wr.firstErr == nil {
						wr.firstErr = err
					}
					if cfg.StopOnTransportError {
						return
					}
					continue
				}
				wr.byStatus[code]++
				wr.lat = append(wr.lat, d)
				if code >= 200 && code < 300 {
					wr.acks = append(wr.acks, ack)
					if cfg.OnAck != nil {
						cfg.OnAck(ack)
					}
				}
			}
		}()
	}
	wg.Wait()
	res := Result{ByStatus: map[int]int{}, Elapsed: time.Since(start)}
	for _, wr := range results {
		res.Sent += wr.sent
		res.TransportErrors += wr.transport
		for c, n := range wr.byStatus {
			res.ByStatus[c] += n
		}
		res.Latencies = append(res.Latencies, wr.lat...)
		res.Acks = append(res.Acks, wr.acks...)
		if res.FirstError == nil {
			res.FirstError = wr.firstErr
		}
	}
	slices.Sort(res.Latencies)
	return res, nil
}

func send(ctx context.Context, client *http.Client, cfg Config, i int) (int, Ack, time.Duration, error) {
	body := cfg.Body(i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, Ack{}, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if cfg.Secret != "" {
		h, err := testkit.SignWebhook(cfg.Secret, "msg_load_"+strconv.Itoa(i), time.Now(), body)
		if err != nil {
			return 0, Ack{}, 0, err
		}
		for k, v := range h {
			req.Header[k] = v
		}
	}
	t0 := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, Ack{}, 0, err
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(t0)
	if err != nil {
		return 0, Ack{}, 0, err
	}
	ack := Ack{Index: i, Code: resp.StatusCode}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		var r struct {
			Key    string `json:"key"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			return 0, Ack{}, 0, fmt.Errorf("loadgen: 2xx with a body that is not JSON: %q", raw)
		}
		ack.Key, ack.Status = r.Key, r.Status
	}
	return resp.StatusCode, ack, d, nil
}
