package metrics

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gemrecon/gemrecon/sink"
)

// exposition is one parsed scrape.
type exposition struct {
	raw  string
	fams map[string]*dto.MetricFamily
}

// scrape GETs m.Handler() through a real HTTP server and parses the body
// with the Prometheus text parser.
func scrape(t *testing.T, m *Metrics) exposition {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type = %q, want the text exposition format", ct)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, b)
}

func parse(t *testing.T, b []byte) exposition {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parsing the exposition: %v\n%s", err, b)
	}
	return exposition{raw: string(b), fams: fams}
}

// find returns the series of family name whose labels include every
// name=value pair given.
func (e exposition) find(name string, labels ...string) *dto.Metric {
	mf := e.fams[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		for _, l := range labels {
			n, v, _ := strings.Cut(l, "=")
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == n && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// value is the counter or gauge value of one series; ok is false when the
// series is absent.
func (e exposition) value(name string, labels ...string) (v float64, ok bool) {
	m := e.find(name, labels...)
	switch {
	case m == nil:
		return 0, false
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// check is one expected series value.
type check struct {
	name   string
	labels []string
	want   float64
}

func (e exposition) expect(t *testing.T, checks []check) {
	t.Helper()
	for _, c := range checks {
		got, ok := e.value(c.name, c.labels...)
		if !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s%q = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

func (e exposition) typeOf(name string) dto.MetricType {
	if mf := e.fams[name]; mf != nil {
		return mf.GetType()
	}
	return -1
}

// bucket is the cumulative count of a histogram series at upper bound le.
func (e exposition) bucket(name string, le float64, labels ...string) (uint64, bool) {
	m := e.find(name, labels...)
	if m == nil || m.Histogram == nil {
		return 0, false
	}
	for _, b := range m.Histogram.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount(), true
		}
	}
	return 0, false
}

func TestCountersAndHistograms(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.ObserveDelivery(sink.SourceWebhook, OutcomeAccepted)
	m.ObserveDelivery(sink.SourceWebhook, RecordOutcome(sink.RecordResult{State: sink.StatePending}))
	m.ObserveDelivery(sink.SourceWebhook, RecordOutcome(sink.RecordResult{State: sink.StateDone}))
	m.ObserveDelivery(sink.SourcePoll, RecordOutcome(sink.RecordResult{New: true, State: sink.StatePending}))
	m.ObserveDelivery(sink.SourceWebhook, OutcomeUnverified)
	m.ObserveEffect("done", 30*time.Millisecond)
	m.ObserveEffect("fenced", 2*time.Second)
	m.ObserveEffect("done", 10*time.Millisecond)
	m.ObserveRequest(202, 3*time.Millisecond)
	e := scrape(t, m)

	e.expect(t, []check{
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=accepted"}, 1},
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=duplicate"}, 1},
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=done"}, 1},
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=unverified"}, 1},
		{"gemrecon_deliveries_total", []string{"source=poll", "outcome=accepted"}, 1},
		{"gemrecon_duplicates_suppressed_total", []string{"source=webhook"}, 2},
		{"gemrecon_effects_total", []string{"result=done"}, 2},
		{"gemrecon_effects_total", []string{"result=fenced"}, 1},
		{"gemrecon_fenced_total", nil, 1},
	})
	if _, ok := e.value("gemrecon_duplicates_suppressed_total", "source=poll"); ok {
		t.Errorf("gemrecon_duplicates_suppressed_total{source=poll} present after only an accepted poll sighting")
	}
	// 10ms lands in le=0.01 (bounds are inclusive), 30ms in 0.05.
	for _, tt := range []struct {
		le   float64
		want uint64
	}{{0.005, 0}, {0.01, 1}, {0.025, 1}, {0.05, 2}, {600, 2}} {
		if got, ok := e.bucket("gemrecon_effect_duration_seconds", tt.le, "result=done"); !ok || got != tt.want {
			t.Errorf("effect_duration_seconds_bucket{result=done,le=%v} = %d (present %v), want %d", tt.le, got, ok, tt.want)
		}
	}
	if h := e.find("gemrecon_effect_duration_seconds", "result=done").GetHistogram(); h.GetSampleCount() != 2 || math.Abs(h.GetSampleSum()-0.04) > 1e-9 {
		t.Errorf("effect_duration_seconds{result=done} count, sum = %d, %v, want 2, 0.04", h.GetSampleCount(), h.GetSampleSum())
	}
	// The parser keeps the +Inf bucket the exposition carries.
	if got := len(e.find("gemrecon_effect_duration_seconds", "result=done").GetHistogram().GetBucket()); got != len(effectBuckets)+1 {
		t.Errorf("effect_duration_seconds has %d buckets, want %d and +Inf", got, len(effectBuckets))
	}
	if got, ok := e.bucket("gemrecon_effect_duration_seconds", math.Inf(1), "result=done"); !ok || got != 2 {
		t.Errorf("effect_duration_seconds_bucket{result=done,le=+Inf} = %d (present %v), want 2", got, ok)
	}
	if got, ok := e.bucket("gemrecon_webhook_request_duration_seconds", 0.0025, "code=202"); !ok || got != 0 {
		t.Errorf("request_duration_seconds_bucket{code=202,le=0.0025} = %d (present %v), want 0", got, ok)
	}
	if got, ok := e.bucket("gemrecon_webhook_request_duration_seconds", 0.005, "code=202"); !ok || got != 1 {
		t.Errorf("request_duration_seconds_bucket{code=202,le=0.005} = %d (present %v), want 1", got, ok)
	}
	for name, want := range map[string]dto.MetricType{
		"gemrecon_deliveries_total":                 dto.MetricType_COUNTER,
		"gemrecon_duplicates_suppressed_total":      dto.MetricType_COUNTER,
		"gemrecon_effects_total":                    dto.MetricType_COUNTER,
		"gemrecon_fenced_total":                     dto.MetricType_COUNTER,
		"gemrecon_effect_duration_seconds":          dto.MetricType_HISTOGRAM,
		"gemrecon_webhook_request_duration_seconds": dto.MetricType_HISTOGRAM,
	} {
		if got := e.typeOf(name); got != want {
			t.Errorf("type of %s = %v, want %v", name, got, want)
		}
	}
	for _, line := range []string{
		"# TYPE gemrecon_effect_duration_seconds histogram\n",
		`gemrecon_effect_duration_seconds_bucket{result="done",le="0.01"} 1` + "\n",
		`gemrecon_deliveries_total{outcome="accepted",source="poll"} 1` + "\n",
	} {
		if !strings.Contains(e.raw, line) {
			t.Errorf("scrape lacks the line %q", line)
		}
	}
	for name := range e.fams {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			t.Errorf("NoRuntime scrape has %s", name)
		}
	}
}

func TestFencedStartsAtZero(t *testing.T) {
	e := scrape(t, NewWithOptions(nil, Options{NoRuntime: true}))
	if v, ok := e.value("gemrecon_fenced_total"); !ok || v != 0 {
		t.Errorf("gemrecon_fenced_total on a fresh Metrics = %v (present %v), want 0 present", v, ok)
	}
}

func TestRuntimeMetrics(t *testing.T) {
	e := scrape(t, New(nil))
	for _, name := range []string{
		"go_goroutines", "go_threads", "go_memstats_heap_alloc_bytes", "go_memstats_sys_bytes",
		"go_gc_duration_seconds", "go_info",
		"process_start_time_seconds", "process_cpu_seconds_total", "process_open_fds",
		"process_resident_memory_bytes",
	} {
		if e.fams[name] == nil {
			t.Errorf("scrape lacks %s", name)
		}
	}
	if v, ok := e.value("go_goroutines"); !ok || v < 1 {
		t.Errorf("go_goroutines = %v (present %v), want ≥ 1", v, ok)
	}
	start, ok := e.value("process_start_time_seconds")
	if now := float64(time.Now().Unix()); !ok || start <= 0 || start > now+1 || start < now-24*3600 {
		t.Errorf("process_start_time_seconds = %v (present %v), want a recent Unix time before %v", start, ok, now)
	}
	if m := e.find("go_info"); m == nil || len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "version" || !strings.HasPrefix(m.GetLabel()[0].GetValue(), "go") {
		t.Errorf("go_info = %v, want a version=\"go…\" label", m)
	}
}

// TestPrivateRegistry checks that two Metrics (each with runtime
// collectors) coexist and count apart, and that neither touches the global
// default registry.
func TestPrivateRegistry(t *testing.T) {
	a, b := New(nil), New(nil)
	a.ObserveDelivery(sink.SourcePoll, OutcomeAccepted)
	a.ObserveDelivery(sink.SourcePoll, OutcomeAccepted)
	b.ObserveDelivery(sink.SourcePoll, OutcomeAccepted)
	scrape(t, a).expect(t, []check{{"gemrecon_deliveries_total", []string{"source=poll", "outcome=accepted"}, 2}})
	scrape(t, b).expect(t, []check{{"gemrecon_deliveries_total", []string{"source=poll", "outcome=accepted"}, 1}})
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "gemrecon_") {
			t.Errorf("the default registry has %s", mf.GetName())
		}
	}
}

func TestNilMetricsIsSafe(t *testing.T) {
	var m *Metrics
	m.ObserveDelivery("webhook", OutcomeAccepted)
	m.ObserveEffect("done", time.Second)
	m.ObserveRequest(200, time.Millisecond)
	m.ObserveDelivery("poll", RecordOutcome(sink.RecordResult{New: true}))
}

func TestLabelEscaping(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	src := "we\"ird\\src\n"
	m.ObserveDelivery(src, OutcomeAccepted)
	var b bytes.Buffer
	n, err := m.WriteTo(&b)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(b.Len()) {
		t.Errorf("WriteTo = %d bytes, but wrote %d", n, b.Len())
	}
	want := `gemrecon_deliveries_total{outcome="accepted",source="we\"ird\\src\n"} 1`
	if !strings.Contains(b.String(), want) {
		t.Errorf("WriteTo = %s, want a line %s", b.String(), want)
	}
	parse(t, b.Bytes()).expect(t, []check{{"gemrecon_deliveries_total", []string{"source=" + src, "outcome=accepted"}, 1}})
}

func TestConcurrentObserve(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				m.ObserveDelivery("webhook", OutcomeDuplicate)
				m.ObserveEffect("done", time.Millisecond)
			}
		}()
	}
	wg.Wait()
	e := scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=duplicate"}, 8000},
		{"gemrecon_duplicates_suppressed_total", []string{"source=webhook"}, 8000},
	})
	if got := e.find("gemrecon_effect_duration_seconds", "result=done").GetHistogram().GetSampleCount(); got != 8000 {
		t.Errorf("effect_duration_seconds_count{result=done} = %d, want 8000", got)
	}
}

func TestWriteTextfile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gemrecon.prom")
	if err := os.WriteFile(path, []byte("old contents\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.ObserveDelivery(sink.SourcePoll, OutcomeAccepted)
	if err := m.WriteTextfile(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "old contents") {
		t.Errorf("textfile = %q, want the new metrics only", b)
	}
	parse(t, b).expect(t, []check{{"gemrecon_deliveries_total", []string{"source=poll", "outcome=accepted"}, 1}})
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("textfile mode = %v, %v; want 0644 (node_exporter must read it)", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after WriteTextfile, want 1 (no temporary left)", len(entries))
	}
	if err := m.WriteTextfile(filepath.Join(dir, "missing-dir", "x.prom")); err == nil {
		t.Errorf("WriteTextfile into a missing directory = nil, want an error")
	}
}

func TestHandlerMethods(t *testing.T) {
	h := NewWithOptions(nil, Options{NoRuntime: true}).Handler()
	for _, tt := range []struct {
		method string
		want   int
	}{{http.MethodGet, 200}, {http.MethodHead, 200}, {http.MethodPost, 405}, {http.MethodPut, 405}} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, "/metrics", nil))
		if rec.Code != tt.want {
			t.Errorf("%s /metrics = %d, want %d", tt.method, rec.Code, tt.want)
		}
		if tt.want == 405 && rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /metrics Allow = %q, want %q", tt.method, rec.Header().Get("Allow"), "GET, HEAD")
		}
	}
}

// ObserveEffect is what dispatch calls as its Observer, with an outcome's
// name.
func TestObserveEffect(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.ObserveEffect("done", 20*time.Millisecond)
	m.ObserveEffect("fenced", time.Second)
	e := scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_effects_total", []string{"result=done"}, 1},
		{"gemrecon_effects_total", []string{"result=fenced"}, 1},
		{"gemrecon_fenced_total", nil, 1},
	})
	if got := e.find("gemrecon_effect_duration_seconds", "result=fenced").GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("effect_duration_seconds_count{result=fenced} = %d, want 1", got)
	}
	var nilM *Metrics
	nilM.ObserveEffect("done", time.Second) // must not panic
}
