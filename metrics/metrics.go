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
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
	ignored        *prometheus.CounterVec // gemrecon_webhook_ignored_total (ObserveIgnored, webhook.go)
	invalid        *prometheus.CounterVec // gemrecon_webhook_invalid_total (ObserveInvalid, webhook.go)
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
	m := &Metrics{reg: prometheus.NewRegistry()}
	r := promauto.With(m.reg)
	counters := func(name, help string, labels ...string) *prometheus.CounterVec {
		return r.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	histograms := func(name, help string, buckets []float64, label string) *prometheus.HistogramVec {
		return r.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{label})
	}
	m.deliveries = counters("gemrecon_deliveries_total", "Sightings handled by this process, by source (webhook, poll) and outcome (accepted, duplicate, done, ignored, invalid, bad_request, too_large, unverified, unavailable).", "source", "outcome")
	m.duplicates = counters("gemrecon_duplicates_suppressed_total", "Sightings of an already known key that this process recorded without starting anything, by source.", "source")
	m.effects = counters("gemrecon_effects_total", "Dispatch attempts finished by this process, by result (done, retry, dead, fenced, busy, skipped).", "result")
	// A plain counter is exposed as 0 from the start, so rate() and
	// alerts see the series before the first increase.
	m.fenced = r.NewCounter(prometheus.CounterOpts{Name: "gemrecon_fenced_total", Help: "Effect outcomes this process discarded because the claim's fencing token was no longer current."})
	m.effectDuration = histograms("gemrecon_effect_duration_seconds", "Wall time of one effect attempt in this process, by result.", effectBuckets, "result")
	m.requests = histograms("gemrecon_webhook_request_duration_seconds", "Time from reading a webhook request to writing its response, by status code.", requestBuckets, "code")
	m.passes = counters("gemrecon_poll_passes_total", "Poll passes this process began, by scope and outcome (listed, forced, skipped_held, skipped_recent, lease_lost, error). Replicas sharing a database list one at a time: sum listed over processes for the fleet's passes.", "scope", "outcome")
	m.ignored = counters("gemrecon_webhook_ignored_total", "Webhook events answered 200 ignored and not recorded (not a batch event, or not a completion), by type (known types by name, none, other).", "type")
	m.invalid = counters("gemrecon_webhook_invalid_total", "Verified webhook bodies that could not be used, answered 200 invalid and not recorded, by reason (bad_json, bad_envelope, no_name, bad_field, bad_name, other).", "reason")
	// A fixed set of reasons: expose each as 0 from the start, so that an
	// alert on any increase sees the series before the first one.
	for _, reason := range invalidReasons {
		m.invalid.WithLabelValues(reason)
	}
	if s != nil {
		m.stats = newStatsCollector(s)
		m.reg.MustRegister(m.stats)
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
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
