package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gemrecon/gemrecon/sink"
)

// statsCollector is a prometheus.Collector that turns sink.Stats into
// gauges and counters at scrape time, reusing one result for ttl so that
// frequent scrapes cost at most one query per ttl.
type statsCollector struct {
	s   StatsReader
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	at    time.Time // of the last query; zero before the first
	stats sink.Stats
	err   error

	dbUp, keys, oldestPending, latency, dbDuplicates, dbFenced, dbConflicts, firstSource, deadByReason, expiring *prometheus.Desc
	// The pass records of spec §5.5, per scope.
	lastSuccess, lastPassEnd, lastFullScan, unfinished, oldestUnfinished *prometheus.Desc
	descs                                                                []*prometheus.Desc // all of the above
}

func newStatsCollector(s StatsReader) *statsCollector {
	c := &statsCollector{s: s, ttl: DefaultStatsTTL, now: time.Now}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		d := prometheus.NewDesc(name, help, labels, nil)
		c.descs = append(c.descs, d)
		return d
	}
	c.dbUp = desc("gemrecon_db_up", "1 if the last sink.Stats query succeeded, else 0 (the database-wide metrics are then absent).")
	c.keys = desc("gemrecon_keys", "Keys in the database by state (pending, claimed, done, dead), across every process.", "state")
	c.oldestPending = desc("gemrecon_oldest_pending_age_seconds", "Age of the oldest pending key (0 when none): how far behind dispatch is.")
	c.latency = desc("gemrecon_completion_to_done_seconds", "Completion-to-done latency (first sighting to done) over done keys in the database, at quantile 0.5, 0.99 and 1 (the maximum).", "quantile")
	c.dbDuplicates = desc("gemrecon_db_duplicates_suppressed_total", "Sightings of known keys recorded in the database, across every process.")
	c.dbFenced = desc("gemrecon_db_fenced_total", "Fenced Complete/Fail/Renew calls recorded in the database, across every process.")
	c.dbConflicts = desc("gemrecon_db_conflicts_total", "Sightings whose terminal batch state differed from the stored one (spec §9.4; the API's state wins).")
	c.deadByReason = desc("gemrecon_dead_keys", "Dead keys by reason: unknown_to_api (the API does not know the batch: 404, or 403 for another project's; a later listing revives it), results_expired (the API no longer has the results: retry --without-results) or effect (the effect failed permanently or for the last time).", "reason")
	c.expiring = desc("gemrecon_results_expiring_keys", "Keys of succeeded batches not done yet whose results the API deletes within 6 h (48 h after the batch ended).")
	c.unfinished = desc("gemrecon_poll_unfinished_batches", "Batches the last poll pass of the scope listed that had not finished, by state (spec §5.5).", "scope", "state")
	c.oldestUnfinished = desc("gemrecon_poll_oldest_unfinished_created_timestamp_seconds", "Unix time the oldest unfinished batch the last pass of the scope listed was created (absent: none); the API expires it 48 h later.", "scope")
	c.firstSource = desc("gemrecon_keys_by_first_source", "Keys by the source that saw them first; keys first seen by poll are webhooks that were missed.", "source")
	c.lastSuccess = desc("gemrecon_poll_last_success_timestamp_seconds", "Unix time the last poll pass of the scope that listed fully and whose every effect succeeded ended, by any process (absent: never).", "scope")
	c.lastPassEnd = desc("gemrecon_poll_last_pass_end_timestamp_seconds", "Unix time the last poll pass of the scope that listed ended, successful or not, by any process (absent: never).", "scope")
	c.lastFullScan = desc("gemrecon_poll_last_full_scan_timestamp_seconds", "Unix time the last poll pass of the scope that read every page started, by any process (absent: never).", "scope")
	return c
}

// get returns the cached Stats result, querying the sink when it is older
// than ttl (or from the future: a clock that went back). Before the first
// query, at is the zero time, centuries older than any ttl.
func (c *statsCollector) get() (sink.Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if age := now.Sub(c.at); age >= 0 && age < c.ttl {
		return c.stats, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // one query's bound
	defer cancel()
	c.stats, c.err = c.s.Stats(ctx)
	c.at = now
	return c.stats, c.err
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: gemrecon_db_up always, the rest
// only when the Stats query succeeded. (The registry sorts the output.)
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	st, err := c.get()
	if err != nil {
		gauge(c.dbUp, 0)
		return
	}
	gauge(c.dbUp, 1)
	for _, state := range []sink.State{sink.StatePending, sink.StateClaimed, sink.StateDone, sink.StateDead} {
		gauge(c.keys, float64(st.ByState[state]), string(state))
	}
	gauge(c.oldestPending, st.OldestPendingAge.Seconds())
	gauge(c.latency, st.LatencyP50.Seconds(), "0.5")
	gauge(c.latency, st.LatencyP99.Seconds(), "0.99")
	gauge(c.latency, st.LatencyMax.Seconds(), "1")
	counter(c.dbDuplicates, float64(st.DuplicatesSuppressed))
	counter(c.dbFenced, float64(st.Fenced))
	counter(c.dbConflicts, float64(st.Conflicts))
	for src, n := range st.FirstSource {
		gauge(c.firstSource, float64(n), src)
	}
	for _, reason := range []string{sink.DeadUnknownToAPI, sink.DeadResultsExpired, sink.DeadEffect} {
		gauge(c.deadByReason, float64(st.DeadByReason[reason]), reason)
	}
	gauge(c.expiring, float64(st.ResultsExpiring))
	for _, p := range st.Passes {
		timestamp := func(d *prometheus.Desc, t time.Time) {
			if !t.IsZero() {
				gauge(d, float64(t.UnixNano())/1e9, p.Scope)
			}
		}
		timestamp(c.lastSuccess, p.LastSuccess)
		timestamp(c.lastPassEnd, p.LastEnd)
		timestamp(c.lastFullScan, p.LastFullScan)
		timestamp(c.oldestUnfinished, p.OldestUnfinished)
		for state, n := range p.Unfinished {
			gauge(c.unfinished, float64(n), p.Scope, state)
		}
	}
}
