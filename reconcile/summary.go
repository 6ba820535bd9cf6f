package reconcile

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gemrecon/gemrecon/dispatch"
)

// Summary is the pass's summary line of spec §5.4, in its field order. The
// same names are used in the text line and in the JSON object. Invalid (a
// listed name §12 refuses) is gemrecon's addition to the spec's list.
// Terminal = SkippedOld + New + Duplicates + Invalid for a pass that listed
// without an error. Skipped, Holder and Until are present only for a pass
// that did not list (spec §5.5): why (held: another process holds the pass
// lease; recent: a pass of the scope started less than the fleet's interval
// ago), the process that holds the lease or ran the last pass, and when the
// lease ends or the interval lets the next pass list (RFC 3339).
type Summary struct {
	Listed        int    `json:"listed"`
	Terminal      int    `json:"terminal"`
	SkippedOld    int    `json:"skipped_old"`
	New           int    `json:"new"`
	Duplicates    int    `json:"duplicates"`
	Invalid       int    `json:"invalid"`
	EffectsOK     int    `json:"effects_ok"`
	EffectsFailed int    `json:"effects_failed"` // retry scheduled or dead
	Fenced        int    `json:"fenced"`
	APIRequests   int    `json:"api_requests"`
	FullScan      bool   `json:"full_scan"`
	Duration      string `json:"duration"`          // Go's notation, rounded to the millisecond: "1.42s"
	Skipped       string `json:"skipped,omitempty"` // "", "held" or "recent"
	Holder        string `json:"holder,omitempty"`
	Until         string `json:"until,omitempty"`
	// UnknownTypes: recorded operations of a metadata @type gemrecon does
	// not know (poller.PassStats); only when there were some.
	UnknownTypes int `json:"unknown_types,omitempty"`
}

// Summary returns the pass's summary.
func (r Result) Summary() Summary {
	s := Summary{
		Listed:        r.List.Listed,
		Terminal:      r.List.Terminal,
		SkippedOld:    r.List.SkippedOld,
		New:           r.New,
		Duplicates:    r.Duplicates,
		Invalid:       r.Invalid,
		EffectsOK:     r.Effects.OK,
		EffectsFailed: r.Effects.Failed + r.Effects.Dead,
		Fenced:        r.Effects.Fenced,
		APIRequests:   r.List.Requests,
		FullScan:      r.FullScan(),
		Duration:      r.Duration().Round(time.Millisecond).String(),
		UnknownTypes:  r.List.UnknownTypes,
	}
	if r.Skipped() {
		s.Skipped, s.Holder = r.Skip.Reason, r.Skip.Holder
		if !r.Skip.Until.IsZero() {
			s.Until = r.Skip.Until.UTC().Format(time.RFC3339Nano)
		}
	}
	return s
}

// String renders the text line:
//
//	poll: listed=120 terminal=37 skipped_old=3 new=2 duplicates=32 invalid=0 effects_ok=2 effects_failed=0 fenced=0 api_requests=2 full_scan=false duration=1.42s
//
// and for a pass that skipped its listing:
//
//	poll: listed=0 … full_scan=false duration=12ms skipped=held holder=web-2:4242:9f3a0c until=2026-03-01T10:05:00.5Z
func (s Summary) String() string {
	line := fmt.Sprintf("poll: listed=%d terminal=%d skipped_old=%d new=%d duplicates=%d invalid=%d effects_ok=%d effects_failed=%d fenced=%d api_requests=%d full_scan=%t duration=%s",
		s.Listed, s.Terminal, s.SkippedOld, s.New, s.Duplicates, s.Invalid, s.EffectsOK, s.EffectsFailed, s.Fenced, s.APIRequests, s.FullScan, s.Duration)
	if s.Skipped != "" {
		line += " skipped=" + s.Skipped + " holder=" + textValue(s.Holder) + " until=" + textValue(s.Until)
	}
	if s.UnknownTypes > 0 {
		line += " unknown_types=" + strconv.Itoa(s.UnknownTypes)
	}
	return line
}

// textValue renders a value of the text line: as it is when it is one
// plain word, else quoted (Go syntax), so the line stays key=value pairs.
// An empty value is "-".
func textValue(v string) string {
	if v == "" {
		return "-"
	}
	for _, c := range v {
		if c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= 0x7f {
			return strconv.Quote(v)
		}
	}
	return v
}

// Write writes the summary as one line to w: the text line, or with
// asJSON one JSON object with the same field names (for --log-format json).
func (s Summary) Write(w io.Writer, asJSON bool) error { return dispatch.WriteLine(w, s, asJSON) }

// WriteTextfile writes the pass's gauges for node_exporter's textfile
// collector (a cron-run poll has no /metrics), atomically
// (prometheus.WriteToTextfile: a temporary file renamed over path).
//
// gemrecon_poll_last_run_success is 1 only for a pass that exits 0. The
// last success and last full scan come from the scope's pass record in the
// database, so a failed pass never overwrites the time of the last good one
// and every process of the scope reports the same; they carry the scope as
// a label and mean what serve's /metrics says under the same names: absent
// until the scope had one (and when the record could not be read).
func WriteTextfile(path string, r Result) error {
	reg := prometheus.NewRegistry()
	g := func(name, help string, v float64) {
		c := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gemrecon_poll_" + name, Help: help})
		c.Set(v)
		reg.MustRegister(c)
	}
	scoped := func(name, help string, t time.Time) {
		if !r.RecordKnown || t.IsZero() {
			return
		}
		c := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gemrecon_poll_" + name, Help: help}, []string{"scope"})
		c.WithLabelValues(r.Scope).Set(unix(t))
		reg.MustRegister(c)
	}
	s := r.Summary()
	g("last_run_timestamp_seconds", "Unix time the last poll pass of this process ended.", unix(r.End))
	g("last_run_success", "1 if the last pass exited 0: it listed fully (or skipped its listing, see gemrecon_poll_skipped), recorded its pass, and every effect it ran succeeded (none failed, none fenced).", b2f(r.Success()))
	g("last_run_duration_seconds", "Duration of the last pass.", r.Duration().Seconds())
	scoped("last_success_timestamp_seconds", "Unix time the last poll pass of the scope that listed fully and whose every effect succeeded ended, by any process, from the database (absent: never).", r.Record.LastSuccess)
	scoped("last_full_scan_timestamp_seconds", "Unix time the last poll pass of the scope that read every page started, by any process, from the database (absent: never).", r.Record.LastFullScan)
	g("listed", "Operations listed by the last pass.", float64(s.Listed))
	g("terminal", "Terminal operations seen by the last pass.", float64(s.Terminal))
	g("skipped_old", "Terminal operations the last pass skipped as created before the lookback window.", float64(s.SkippedOld))
	g("new", "Keys the last pass recorded for the first time.", float64(s.New))
	g("duplicates", "Terminal operations the last pass had already recorded.", float64(s.Duplicates))
	g("invalid", "Listed operations whose name can never be a key (spec §12), skipped by the last pass.", float64(s.Invalid))
	g("effects_ok", "Effects that succeeded in the last pass.", float64(s.EffectsOK))
	g("effects_failed", "Effects that failed in the last pass (retry scheduled or dead).", float64(s.EffectsFailed))
	g("fenced", "Outcomes discarded as fenced in the last pass.", float64(s.Fenced))
	g("api_requests", "HTTP requests the last pass sent to the API.", float64(s.APIRequests))
	g("full_scan", "1 if the last pass read every page of the listing.", b2f(s.FullScan))
	g("skipped", "1 if the last pass did not list because another process holds the scope's pass lease or listed less than the interval ago (it still ran due effects).", b2f(r.Skipped()))
	if err := prometheus.WriteToTextfile(path, reg); err != nil {
		return fmt.Errorf("writing the metrics textfile %s: %w", path, err)
	}
	return nil
}

func unix(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
