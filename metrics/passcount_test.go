package metrics

import "testing"

// gemrecon_poll_passes_total: a declared scope's series exist at 0, and
// each observed pass counts under its scope and outcome.
func TestPassesCounter(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	m.DeclarePassScope("gemini|a")
	m.ObservePass("gemini|a", PassSkippedHeld)
	m.ObservePass("gemini|a", PassSkippedHeld)
	m.ObservePass("gemini|b", PassForced)
	var nilM *Metrics
	nilM.DeclarePassScope("x")
	nilM.ObservePass("x", PassListed)
	e := scrape(t, m)
	for _, c := range []struct {
		scope, outcome string
		want           float64
	}{
		{"gemini|a", PassListed, 0},
		{"gemini|a", PassSkippedRecent, 0},
		{"gemini|a", PassLeaseLost, 0},
		{"gemini|a", PassError, 0},
		{"gemini|a", PassSkippedHeld, 2},
		{"gemini|b", PassForced, 1},
	} {
		if got, ok := e.value("gemrecon_poll_passes_total", "scope="+c.scope, "outcome="+c.outcome); !ok || got != c.want {
			t.Errorf("gemrecon_poll_passes_total{scope=%s,outcome=%s} = %v (present %v), want %v", c.scope, c.outcome, got, ok, c.want)
		}
	}
	if _, ok := e.value("gemrecon_poll_passes_total", "scope=x"); ok {
		t.Error("a nil *Metrics counted")
	}
}
