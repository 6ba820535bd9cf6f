package metrics

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

func scrape(t *testing.T, m *Metrics) string {
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
	return string(b)
}

func TestCountersAndHistograms(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.ObserveDelivery(sink.SourceWebhook, OutcomeAccepted)
	m.ObserveRecord(sink.SourceWebhook, sink.RecordResult{State: sink.StatePending})
	m.ObserveRecord(sink.SourceWebhook, sink.RecordResult{State: sink.StateDone})
	m.ObserveRecord(sink.SourcePoll, sink.RecordResult{New: true, State: sink.StatePending})
	m.ObserveDelivery(sink.SourceWebhook, OutcomeUnverified)
	m.ObserveEffect("done", 30*time.Millisecond)
	m.ObserveEffect("fenced", 2*time.Second)
	m.ObserveEffect("done", 10*time.Millisecond)
	m.ObserveRequest(202, 3*time.Millisecond)
	out := scrape(t, m)

	for _, want := range []string{
		`gemrecon_deliveries_total{source="webhook",outcome="accepted"} 1`,
		`gemrecon_deliveries_total{source="webhook",outcome="duplicate"} 1`,
		`gemrecon_deliveries_total{source="webhook",outcome="done"} 1`,
		`gemrecon_deliveries_total{source="webhook",outcome="unverified"} 1`,
		`gemrecon_deliveries_total{source="poll",outcome="accepted"} 1`,
		`gemrecon_duplicates_suppressed_total{source="webhook"} 2`,
		`gemrecon_effects_total{result="done"} 2`,
		`gemrecon_effects_total{result="fenced"} 1`,
		"\ngemrecon_fenced_total 1\n",
		// 10ms lands in le=0.01 (bounds are inclusive), 30ms in 0.05.
		`gemrecon_effect_duration_seconds_bucket{result="done",le="0.005"} 0`,
		`gemrecon_effect_duration_seconds_bucket{result="done",le="0.01"} 1`,
		`gemrecon_effect_duration_seconds_bucket{result="done",le="0.025"} 1`,
		`gemrecon_effect_duration_seconds_bucket{result="done",le="0.05"} 2`,
		`gemrecon_effect_duration_seconds_bucket{result="done",le="+Inf"} 2`,
		`gemrecon_effect_duration_seconds_sum{result="done"} 0.04`,
		`gemrecon_effect_duration_seconds_count{result="done"} 2`,
		`gemrecon_webhook_request_duration_seconds_bucket{code="202",le="0.005"} 1`,
		"# TYPE gemrecon_effect_duration_seconds histogram\n",
		"# TYPE gemrecon_deliveries_total counter\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q; got:\n%s", want, out)
		}
	}
	if strings.Contains(out, "go_goroutines") {
		t.Errorf("NoRuntime scrape has go_goroutines")
	}
}

func TestRuntimeMetrics(t *testing.T) {
	out := scrape(t, New(nil))
	for _, want := range []string{"go_goroutines ", "process_start_time_seconds ", "process_cpu_seconds_total ", "go_info{version=\"go"} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestNilMetricsIsSafe(t *testing.T) {
	var m *Metrics
	m.ObserveDelivery("webhook", OutcomeAccepted)
	m.ObserveEffect("done", time.Second)
	m.ObserveRequest(200, time.Millisecond)
	m.ObserveRecord("poll", sink.RecordResult{New: true})
}

func TestLabelEscaping(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.ObserveDelivery("we\"ird\\src\n", OutcomeAccepted)
	var b bytes.Buffer
	if _, err := m.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := `gemrecon_deliveries_total{source="we\"ird\\src\n",outcome="accepted"} 1`
	if !strings.Contains(b.String(), want) {
		t.Errorf("WriteTo = %s, want a line %s", b.String(), want)
	}
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
	out := scrape(t, m)
	for _, want := range []string{
		`gemrecon_deliveries_total{source="webhook",outcome="duplicate"} 8000`,
		`gemrecon_effect_duration_seconds_count{result="done"} 8000`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
}

func TestWriteTextfile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gemrecon.prom")
	if err := os.WriteFile(path, []byte("old contents\n"), 0o644); err != nil {
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
	if !strings.Contains(string(b), `gemrecon_deliveries_total{source="poll",outcome="accepted"} 1`) || strings.Contains(string(b), "old contents") {
		t.Errorf("textfile = %q, want the new metrics only", b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after WriteTextfile, want 1 (no temporary left)", len(entries))
	}
	if err := m.WriteTextfile(filepath.Join(dir, "missing-dir", "x.prom")); err == nil {
		t.Errorf("WriteTextfile into a missing directory = nil, want an error")
	}
}

func TestMetricsRejectsPost(t *testing.T) {
	rec := httptest.NewRecorder()
	New(nil).Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/metrics", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics = %d, want 405", rec.Code)
	}
}

func TestObserver(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	o := m.Observer()
	o.EffectFinished("gemini:batches/a", "done", 20*time.Millisecond)
	o.EffectFinished("gemini:batches/b", "fenced", time.Second)
	out := scrape(t, m)
	for _, want := range []string{
		`gemrecon_effects_total{result="done"} 1`,
		`gemrecon_effects_total{result="fenced"} 1`,
		"\ngemrecon_fenced_total 1\n",
		`gemrecon_effect_duration_seconds_count{result="fenced"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	var nilM *Metrics
	nilM.Observer().EffectFinished("k", "done", time.Second) // must not panic
}
