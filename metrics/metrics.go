// Package metrics owns gemrecon's Prometheus metrics: counters and
// histograms that the webhook receiver, the poller and the dispatcher update
// as they work, and a collector that reads the sink's Stats on scrape, so
// that database-wide gauges (pending, dead, oldest pending age, latency) are
// true across every process sharing the database.
//
// It is built on github.com/prometheus/client_golang. Every Metrics value
// owns a private prometheus.Registry: nothing is registered with the global
// default registry, and there is no package-level state, so several Metrics
// (one per test, say) never collide.
package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"

	"github.com/gemrecon/gemrecon/sink"
)

// Delivery outcomes recorded by ObserveDelivery (the outcome label of
// gemrecon_deliveries_total). Other strings are allowed.
const (
	OutcomeAccepted    = "accepted"    // a new key, durably pending
	OutcomeDuplicate   = "duplicate"   // a known key that is not done
	OutcomeDone        = "done"        // a known key that is already done
	OutcomeIgnored     = "ignored"     // not a batch event, or not a completion: 200, nothing recorded
	OutcomeInvalid     = "invalid"     // a verified body, or a listed name, that cannot be a key (spec §12): 200, logged, never recorded
	OutcomeBadRequest  = "bad_request" // the body could not be read (400)
	OutcomeTooLarge    = "too_large"   // body over the limit (413)
	OutcomeUnverified  = "unverified"  // signature missing, wrong or stale (401)
	OutcomeUnavailable = "unavailable" // the database refused the write (503)
	// OutcomeJWKSUnavailable: a dynamically signed webhook could not be
	// judged because the Gemini API's key set could not be fetched (503;
	// the sender retries). Apart from unavailable, which is the database.
	OutcomeJWKSUnavailable = "jwks_unavailable"
	// OutcomeOverloaded: a webhook answered 503 before its body was read,
	// over the receiver's cap of unverified bytes or of connections; the
	// sender retries.
	OutcomeOverloaded = "overloaded"
)

// DefaultStatsTTL is how long one sink.Stats result serves scrapes.
const DefaultStatsTTL = 2 * time.Second

// MinStatsTTL is the shortest cache allowed: Stats scans the database, and a
// scrape storm must not turn into a query storm.
const MinStatsTTL = time.Second

// Options tune NewWithOptions.
type Options struct {
	// StatsTTL is how long a Stats result is reused (default DefaultStatsTTL,
	// at least MinStatsTTL).
	StatsTTL time.Duration
	// StatsTimeout bounds one Stats query (default 5s).
	StatsTimeout time.Duration
	// Now is the clock for the cache; nil means time.Now.
	Now func() time.Time
	// NoRuntime leaves out the go_* and process_* metrics.
	NoRuntime bool
}

// Metrics is one registry of gemrecon metrics. Its methods are safe for
// concurrent use; a nil *Metrics accepts every Observe call and does nothing,
// so callers need not check.
type Metrics struct {
	reg            *prometheus.Registry
	deliveries     *prometheus.CounterVec
	duplicates     *prometheus.CounterVec
	effects        *prometheus.CounterVec
	fenced         prometheus.Counter
	effectDuration *prometheus.HistogramVec
	requests       *prometheus.HistogramVec
	webhook        webhookCounters        // webhook.go
	passes         *prometheus.CounterVec // gemrecon_poll_passes_total (ObservePass, passes.go)
	stats          *statsCollector        // nil without a sink
}

// Bucket upper bounds (inclusive, as in client_golang) of the two histograms.
var (
	effectBuckets  = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	requestBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
)

// StatsReader is what Metrics needs of the sink: its Stats, read on
// scrape.
type StatsReader interface {
	Stats(ctx context.Context) (sink.Stats, error)
}

// New returns Metrics with a collector that reads s's Stats on scrape (none
// when s is nil), plus Go runtime and process metrics.
func New(s StatsReader) *Metrics {
	return NewWithOptions(s, Options{})
}

// NewWithOptions is New with tuning.
func NewWithOptions(s StatsReader, opt Options) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	r := promauto.With(m.reg)
	m.deliveries = r.NewCounterVec(prometheus.CounterOpts{
		Name: "gemrecon_deliveries_total",
		Help: "Sightings handled by this process, by source (webhook, poll) and outcome (accepted, duplicate, done, ignored, invalid, bad_request, too_large, unverified, unavailable).",
	}, []string{"source", "outcome"})
	m.duplicates = r.NewCounterVec(prometheus.CounterOpts{
		Name: "gemrecon_duplicates_suppressed_total",
		Help: "Sightings of an already known key that this process recorded without starting anything, by source.",
	}, []string{"source"})
	m.effects = r.NewCounterVec(prometheus.CounterOpts{
		Name: "gemrecon_effects_total",
		Help: "Dispatch attempts finished by this process, by result (done, retry, dead, fenced, busy, skipped).",
	}, []string{"result"})
	// A plain counter is exposed as 0 from the start, so rate() and
	// alerts see the series before the first increase.
	m.fenced = r.NewCounter(prometheus.CounterOpts{
		Name: "gemrecon_fenced_total",
		Help: "Effect outcomes this process discarded because the claim's fencing token was no longer current.",
	})
	m.effectDuration = r.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gemrecon_effect_duration_seconds",
		Help:    "Wall time of one effect attempt in this process, by result.",
		Buckets: effectBuckets,
	}, []string{"result"})
	m.requests = r.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gemrecon_webhook_request_duration_seconds",
		Help:    "Time from reading a webhook request to writing its response, by status code.",
		Buckets: requestBuckets,
	}, []string{"code"})
	m.passes = r.NewCounterVec(prometheus.CounterOpts{
		Name: "gemrecon_poll_passes_total",
		Help: "Poll passes this process began, by scope and outcome (listed, forced, skipped_held, skipped_recent, lease_lost, error). Replicas sharing a database list one at a time: sum listed over processes for the fleet's passes.",
	}, []string{"scope", "outcome"})
	m.webhook = newWebhookCounters(r)
	if s != nil {
		m.stats = newStatsCollector(s, opt)
		m.reg.MustRegister(m.stats)
	}
	if !opt.NoRuntime {
		m.reg.MustRegister(
			collectors.NewGoCollector(),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		)
	}
	return m
}

// Handler serves every metric for GET and HEAD (promhttp: the text
// exposition format unless the scraper negotiates another); other methods get
// 405.
func (m *Metrics) Handler() http.Handler {
	h := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// WriteTo writes every metric in the text exposition format (version
// 0.0.4). If gathering fails partly, what was gathered is still written and
// the error is returned.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	mfs, gatherErr := m.reg.Gather()
	var n int64
	for _, mf := range mfs {
		k, err := expfmt.MetricFamilyToText(w, mf)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, gatherErr
}

// WriteTextfile writes every metric to path atomically (a temporary file in
// the same directory, renamed over path: prometheus.WriteToTextfile), in the
// format node_exporter's textfile collector reads: the way a cron-run
// `gemrecon poll` exposes its metrics.
func (m *Metrics) WriteTextfile(path string) error {
	if err := prometheus.WriteToTextfile(path, m.reg); err != nil {
		return fmt.Errorf("metrics textfile: %w", err)
	}
	return nil
}

// ObserveDelivery counts one sighting handled with the given outcome (one of
// the Outcome constants). A duplicate or done outcome also counts as a
// suppressed duplicate.
func (m *Metrics) ObserveDelivery(source, outcome string) {
	if m == nil {
		return
	}
	m.deliveries.WithLabelValues(source, outcome).Inc()
	if outcome == OutcomeDuplicate || outcome == OutcomeDone {
		m.duplicates.WithLabelValues(source).Inc()
	}
}

// RecordOutcome names what a Record found: accepted, duplicate or done.
func RecordOutcome(r sink.RecordResult) string {
	switch {
	case r.New:
		return OutcomeAccepted
	case r.State == sink.StateDone:
		return OutcomeDone
	default:
		return OutcomeDuplicate
	}
}

// ObserveEffect counts one finished dispatch attempt and its duration
// under its outcome (a dispatch.Outcome's name), which makes m a
// dispatch.Observer. A fenced result also counts in gemrecon_fenced_total.
func (m *Metrics) ObserveEffect(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.effects.WithLabelValues(result).Inc()
	m.effectDuration.WithLabelValues(result).Observe(d.Seconds())
	if result == "fenced" { // dispatch.OutcomeFenced
		m.fenced.Inc()
	}
}

// ObserveRequest records one webhook request's duration under its status code.
func (m *Metrics) ObserveRequest(code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(strconv.Itoa(code)).Observe(d.Seconds())
}
