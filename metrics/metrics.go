// Package metrics owns gemrecon's Prometheus metrics: counters and
// histograms that the webhook receiver, the poller and the dispatcher update
// as they work, and a collector that reads the sink's Stats on scrape, so
// that database-wide gauges (pending, dead, oldest pending age, latency) are
// true across every process sharing the database. Everything lives in one
// Metrics value: there is no package-level state.
//
// It writes the Prometheus text exposition format (version 0.0.4) itself,
// because the dependencies of prometheus/client_golang (client_model, common,
// procfs, perks, xxhash) are not in this module's go.sum; the API (New,
// Handler, Observe*, WriteTextfile) does not depend on that choice.
package metrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// Delivery outcomes recorded by ObserveDelivery (the outcome label of
// gemrecon_deliveries_total). Other strings are allowed.
const (
	OutcomeAccepted    = "accepted"    // a new key, durably pending
	OutcomeDuplicate   = "duplicate"   // a known key that is not done
	OutcomeDone        = "done"        // a known key that is already done
	OutcomeIgnored     = "ignored"     // a non-terminal event, nothing recorded
	OutcomeBadRequest  = "bad_request" // unparsable JSON or no operation name (400)
	OutcomeTooLarge    = "too_large"   // body over the limit (413)
	OutcomeUnverified  = "unverified"  // signature missing, wrong or stale (401)
	OutcomeUnavailable = "unavailable" // the database refused the write (503)
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
	deliveries     *counterVec
	duplicates     *counterVec
	effects        *counterVec
	fenced         *counterVec
	effectDuration *histogramVec
	requests       *histogramVec
	stats          *statsCollector // nil without a sink
	runtime        bool
	start          time.Time
}

var effectBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
var requestBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// New returns Metrics with a collector that reads s's Stats on scrape (none
// when s is nil), plus Go runtime and process metrics.
func New(s sink.Sink) *Metrics {
	return NewWithOptions(s, Options{})
}

// NewWithOptions is New with tuning.
func NewWithOptions(s sink.Sink, opt Options) *Metrics {
	m := &Metrics{
		deliveries: newCounterVec("gemrecon_deliveries_total",
			"Sightings handled by this process, by source (webhook, poll) and outcome (accepted, duplicate, done, ignored, bad_request, too_large, unverified, unavailable).",
			"source", "outcome"),
		duplicates: newCounterVec("gemrecon_duplicates_suppressed_total",
			"Sightings of an already known key that this process recorded without starting anything, by source.",
			"source"),
		effects: newCounterVec("gemrecon_effects_total",
			"Dispatch attempts finished by this process, by result (done, retry, dead, fenced, busy, skipped).",
			"result"),
		fenced: newCounterVec("gemrecon_fenced_total",
			"Effect outcomes this process discarded because the claim's fencing token was no longer current."),
		effectDuration: newHistogramVec("gemrecon_effect_duration_seconds",
			"Wall time of one effect attempt in this process, by result.", effectBuckets, "result"),
		requests: newHistogramVec("gemrecon_webhook_request_duration_seconds",
			"Time from reading a webhook request to writing its response, by status code.", requestBuckets, "code"),
		runtime: !opt.NoRuntime,
		start:   time.Now(),
	}
	m.fenced.add(0) // a zero-valued series, so that rate() and alerts see it from the start
	if s != nil {
		m.stats = newStatsCollector(s, opt)
	}
	return m
}

// Handler serves every metric in the Prometheus text exposition format.
func (m *Metrics) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		var buf bytes.Buffer
		m.WriteTo(&buf)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		if r.Method == http.MethodGet {
			_, _ = w.Write(buf.Bytes())
		}
	})
}

// WriteTo writes every metric in the text exposition format.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	var b bytes.Buffer
	m.deliveries.write(&b)
	m.duplicates.write(&b)
	m.effects.write(&b)
	m.fenced.write(&b)
	m.effectDuration.write(&b)
	m.requests.write(&b)
	if m.stats != nil {
		m.stats.write(&b)
	}
	if m.runtime {
		writeRuntime(&b, m.start)
	}
	n, err := w.Write(b.Bytes())
	return int64(n), err
}

// WriteTextfile writes every metric to path atomically (a temporary file in
// the same directory, synced, then renamed over path), in the format
// node_exporter's textfile collector reads: the way a cron-run
// `gemrecon poll` exposes its metrics.
func (m *Metrics) WriteTextfile(path string) error {
	var b bytes.Buffer
	if _, err := m.WriteTo(&b); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("metrics textfile: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(b.Bytes()); err != nil {
		tmp.Close()
		return fmt.Errorf("metrics textfile: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("metrics textfile: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("metrics textfile: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("metrics textfile: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
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
	m.deliveries.add(1, source, outcome)
	if outcome == OutcomeDuplicate || outcome == OutcomeDone {
		m.duplicates.add(1, source)
	}
}

// ObserveRecord counts the result of one sink.Record by source: accepted for
// a new key, done for a done one, duplicate otherwise.
func (m *Metrics) ObserveRecord(source string, r sink.RecordResult) {
	m.ObserveDelivery(source, RecordOutcome(r))
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

// ObserveEffect counts one finished dispatch attempt and its duration. A
// "fenced" result also counts in gemrecon_fenced_total.
func (m *Metrics) ObserveEffect(result string, d time.Duration) {
	if m == nil {
		return
	}
	m.effects.add(1, result)
	m.effectDuration.observe(d.Seconds(), result)
	if result == "fenced" {
		m.fenced.add(1)
	}
}

// ObserveRequest records one webhook request's duration under its status code.
func (m *Metrics) ObserveRequest(code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.observe(d.Seconds(), strconv.Itoa(code))
}

// --- exposition primitives ---

type series struct {
	labels []string
	value  float64
}

// counterVec is a counter family keyed by label values.
type counterVec struct {
	name, help string
	labelNames []string
	mu         sync.Mutex
	series     map[string]*series
}

func newCounterVec(name, help string, labels ...string) *counterVec {
	return &counterVec{name: name, help: help, labelNames: labels, series: map[string]*series{}}
}

func (c *counterVec) add(v float64, labels ...string) {
	k := strings.Join(labels, "\xff")
	c.mu.Lock()
	s := c.series[k]
	if s == nil {
		s = &series{labels: slices.Clone(labels)}
		c.series[k] = s
	}
	s.value += v
	c.mu.Unlock()
}

func (c *counterVec) write(b *bytes.Buffer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	header(b, c.name, c.help, "counter")
	for _, k := range sortedKeys(c.series) {
		s := c.series[k]
		sample(b, c.name, c.labelNames, s.labels, "", "", s.value)
	}
}

type histSeries struct {
	labels []string
	counts []uint64 // per bucket, not cumulative
	count  uint64
	sum    float64
}

// histogramVec is a histogram family keyed by label values.
type histogramVec struct {
	name, help string
	labelNames []string
	buckets    []float64
	mu         sync.Mutex
	series     map[string]*histSeries
}

func newHistogramVec(name, help string, buckets []float64, labels ...string) *histogramVec {
	return &histogramVec{name: name, help: help, labelNames: labels, buckets: buckets, series: map[string]*histSeries{}}
}

func (h *histogramVec) observe(v float64, labels ...string) {
	k := strings.Join(labels, "\xff")
	i, _ := slices.BinarySearch(h.buckets, v) // first bucket with upper bound >= v
	h.mu.Lock()
	s := h.series[k]
	if s == nil {
		s = &histSeries{labels: slices.Clone(labels), counts: make([]uint64, len(h.buckets))}
		h.series[k] = s
	}
	if i < len(h.buckets) {
		s.counts[i]++
	}
	s.count++
	s.sum += v
	h.mu.Unlock()
}

func (h *histogramVec) write(b *bytes.Buffer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	header(b, h.name, h.help, "histogram")
	for _, k := range sortedKeys(h.series) {
		s := h.series[k]
		var cum uint64
		for i, ub := range h.buckets {
			cum += s.counts[i]
			sample(b, h.name+"_bucket", h.labelNames, s.labels, "le", formatFloat(ub), float64(cum))
		}
		sample(b, h.name+"_bucket", h.labelNames, s.labels, "le", "+Inf", float64(s.count))
		sample(b, h.name+"_sum", h.labelNames, s.labels, "", "", s.sum)
		sample(b, h.name+"_count", h.labelNames, s.labels, "", "", float64(s.count))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func header(b *bytes.Buffer, name, help, typ string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, escapeHelp(help), name, typ)
}

// sample writes one line; extraName/extraValue is an additional label (le,
// quantile) placed last.
func sample(b *bytes.Buffer, name string, labelNames, labelValues []string, extraName, extraValue string, v float64) {
	b.WriteString(name)
	if len(labelNames) > 0 || extraName != "" {
		b.WriteByte('{')
		sep := ""
		for i, ln := range labelNames {
			fmt.Fprintf(b, `%s%s="%s"`, sep, ln, escapeLabel(labelValues[i]))
			sep = ","
		}
		if extraName != "" {
			fmt.Fprintf(b, `%s%s="%s"`, sep, extraName, escapeLabel(extraValue))
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(formatFloat(v))
	b.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

// --- the sink.Stats collector ---

// statsCollector turns sink.Stats into gauges at scrape time, reusing one
// result for ttl so that frequent scrapes cost at most one query per ttl.
type statsCollector struct {
	s       sink.Sink
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time

	mu      sync.Mutex
	at      time.Time
	stats   sink.Stats
	err     error
	fetched bool
	queries int // Stats calls made (tests)
}

func newStatsCollector(s sink.Sink, opt Options) *statsCollector {
	if opt.StatsTTL <= 0 {
		opt.StatsTTL = DefaultStatsTTL
	}
	if opt.StatsTTL < MinStatsTTL {
		opt.StatsTTL = MinStatsTTL
	}
	if opt.StatsTimeout <= 0 {
		opt.StatsTimeout = 5 * time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &statsCollector{s: s, ttl: opt.StatsTTL, timeout: opt.StatsTimeout, now: opt.Now}
}

func (c *statsCollector) get() (sink.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if age := now.Sub(c.at); c.fetched && age >= 0 && age < c.ttl {
		return c.stats, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	c.stats, c.err = c.s.Stats(ctx)
	c.queries++
	c.at, c.fetched = now, true
	return c.stats, c.err
}

func (c *statsCollector) write(b *bytes.Buffer) {
	st, err := c.get()
	header(b, "gemrecon_db_up", "1 if the last sink.Stats query succeeded, else 0 (the database-wide metrics are then absent).", "gauge")
	if err != nil {
		sample(b, "gemrecon_db_up", nil, nil, "", "", 0)
		return
	}
	sample(b, "gemrecon_db_up", nil, nil, "", "", 1)

	header(b, "gemrecon_keys", "Keys in the database by state (pending, claimed, done, dead), across every process.", "gauge")
	for _, state := range []sink.State{sink.StateClaimed, sink.StateDead, sink.StateDone, sink.StatePending} {
		sample(b, "gemrecon_keys", []string{"state"}, []string{string(state)}, "", "", float64(st.ByState[state]))
	}
	header(b, "gemrecon_oldest_pending_age_seconds", "Age of the oldest pending key (0 when none): how far behind dispatch is.", "gauge")
	sample(b, "gemrecon_oldest_pending_age_seconds", nil, nil, "", "", st.OldestPendingAge.Seconds())

	header(b, "gemrecon_completion_to_done_seconds", "Completion-to-done latency (first sighting to done) over done keys in the database, at quantile 0.5, 0.99 and 1 (the maximum).", "gauge")
	sample(b, "gemrecon_completion_to_done_seconds", nil, nil, "quantile", "0.5", st.LatencyP50.Seconds())
	sample(b, "gemrecon_completion_to_done_seconds", nil, nil, "quantile", "0.99", st.LatencyP99.Seconds())
	sample(b, "gemrecon_completion_to_done_seconds", nil, nil, "quantile", "1", st.LatencyMax.Seconds())

	header(b, "gemrecon_db_duplicates_suppressed_total", "Sightings of known keys recorded in the database, across every process.", "counter")
	sample(b, "gemrecon_db_duplicates_suppressed_total", nil, nil, "", "", float64(st.DuplicatesSuppressed))
	header(b, "gemrecon_db_fenced_total", "Fenced Complete/Fail/Renew calls recorded in the database, across every process.", "counter")
	sample(b, "gemrecon_db_fenced_total", nil, nil, "", "", float64(st.Fenced))
	header(b, "gemrecon_db_conflicts_total", "Sightings whose payload differed from the stored first payload.", "counter")
	sample(b, "gemrecon_db_conflicts_total", nil, nil, "", "", float64(st.Conflicts))

	header(b, "gemrecon_keys_by_first_source", "Keys by the source that saw them first; keys first seen by poll are webhooks that were missed.", "gauge")
	for _, src := range sortedKeys(st.FirstSource) {
		sample(b, "gemrecon_keys_by_first_source", []string{"source"}, []string{src}, "", "", float64(st.FirstSource[src]))
	}
}

// --- Go runtime and process metrics (the names client_golang uses) ---

func writeRuntime(b *bytes.Buffer, start time.Time) {
	header(b, "go_goroutines", "Number of goroutines that currently exist.", "gauge")
	sample(b, "go_goroutines", nil, nil, "", "", float64(runtime.NumGoroutine()))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	header(b, "go_memstats_heap_alloc_bytes", "Number of heap bytes allocated and currently in use.", "gauge")
	sample(b, "go_memstats_heap_alloc_bytes", nil, nil, "", "", float64(ms.HeapAlloc))
	header(b, "go_memstats_sys_bytes", "Number of bytes obtained from the system.", "gauge")
	sample(b, "go_memstats_sys_bytes", nil, nil, "", "", float64(ms.Sys))
	header(b, "go_gc_cycles_total", "Completed GC cycles.", "counter")
	sample(b, "go_gc_cycles_total", nil, nil, "", "", float64(ms.NumGC))
	header(b, "go_info", "Information about the Go environment.", "gauge")
	sample(b, "go_info", []string{"version"}, []string{runtime.Version()}, "", "", 1)

	header(b, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge")
	sample(b, "process_start_time_seconds", nil, nil, "", "", float64(start.Unix()))
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		header(b, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter")
		sample(b, "process_cpu_seconds_total", nil, nil, "", "", cpu.Seconds())
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		header(b, "process_open_fds", "Number of open file descriptors.", "gauge")
		sample(b, "process_open_fds", nil, nil, "", "", float64(len(fds)))
	}
	if statm, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(statm)); len(f) > 1 {
			if pages, err := strconv.ParseFloat(f[1], 64); err == nil {
				header(b, "process_resident_memory_bytes", "Resident memory size in bytes.", "gauge")
				sample(b, "process_resident_memory_bytes", nil, nil, "", "", pages*float64(os.Getpagesize()))
			}
		}
	}
}
