package metrics

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestPassGauges: the per-scope pass records (spec §5.5) of the database
// show as timestamps labelled by scope, each absent while it never
// happened, and follow the records once the cache expires.
func TestPassGauges(t *testing.T) {
	ctx := context.Background()
	clk := testkit.NewClock(time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC))
	s := sqlitetest.OpenTemp(t, sink.Options{Now: clk.Now})
	pass := func(scope string, o sink.PassOutcome) {
		t.Helper()
		l, _, err := s.AcquirePass(ctx, scope, "host/1", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EndPass(ctx, l, o); err != nil {
			t.Fatal(err)
		}
	}
	t0 := clk.Now()
	// ok: a full, successful pass; failing: only a failed partial one;
	// starting: a lease, no pass ended yet.
	pass("gemini|https://a|ok", sink.PassOutcome{Start: t0, End: t0.Add(1500 * time.Millisecond), Success: true, FullScan: true})
	pass("gemini|https://a|failing", sink.PassOutcome{Start: t0, End: t0.Add(2 * time.Second)})
	if _, _, err := s.AcquirePass(ctx, "gemini|https://a|starting", "host/2", time.Minute, 0); err != nil {
		t.Fatal(err)
	}

	m := NewWithOptions(s, Options{NoRuntime: true, Now: clk.Now, StatsTTL: 5 * time.Second})
	e := scrape(t, m)
	sec := float64(t0.Unix())
	e.expect(t, []check{
		{"gemrecon_poll_last_success_timestamp_seconds", []string{"scope=gemini|https://a|ok"}, sec + 1.5},
		{"gemrecon_poll_last_pass_end_timestamp_seconds", []string{"scope=gemini|https://a|ok"}, sec + 1.5},
		{"gemrecon_poll_last_full_scan_timestamp_seconds", []string{"scope=gemini|https://a|ok"}, sec},
		{"gemrecon_poll_last_pass_end_timestamp_seconds", []string{"scope=gemini|https://a|failing"}, sec + 2},
	})
	absent := []struct{ name, scope string }{
		{"gemrecon_poll_last_success_timestamp_seconds", "gemini|https://a|failing"},
		{"gemrecon_poll_last_full_scan_timestamp_seconds", "gemini|https://a|failing"},
		{"gemrecon_poll_last_success_timestamp_seconds", "gemini|https://a|starting"},
		{"gemrecon_poll_last_pass_end_timestamp_seconds", "gemini|https://a|starting"},
		{"gemrecon_poll_last_full_scan_timestamp_seconds", "gemini|https://a|starting"},
	}
	for _, a := range absent {
		if v, ok := e.value(a.name, "scope="+a.scope); ok {
			t.Errorf("%s{scope=%q} = %v, want absent (never happened)", a.name, a.scope, v)
		}
	}
	for _, name := range []string{"gemrecon_poll_last_success_timestamp_seconds", "gemrecon_poll_last_pass_end_timestamp_seconds",
		"gemrecon_poll_last_full_scan_timestamp_seconds"} {
		if got := e.typeOf(name); got != dto.MetricType_GAUGE {
			t.Errorf("type of %s = %v, want gauge", name, got)
		}
	}

	// The failing scope succeeds later: shown after the cache's TTL.
	clk.Advance(time.Minute)
	t1 := clk.Now()
	pass("gemini|https://a|failing", sink.PassOutcome{Start: t1, End: t1.Add(time.Second), Success: true})
	clk.Advance(5 * time.Second)
	e = scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_poll_last_success_timestamp_seconds", []string{"scope=gemini|https://a|failing"}, float64(t1.Unix()) + 1},
		{"gemrecon_poll_last_success_timestamp_seconds", []string{"scope=gemini|https://a|ok"}, sec + 1.5},
	})
	if _, ok := e.value("gemrecon_poll_last_full_scan_timestamp_seconds", "scope=gemini|https://a|failing"); ok {
		t.Error("a pass that was not a full scan set gemrecon_poll_last_full_scan_timestamp_seconds")
	}
}
