package metrics

import (
	"strings"
	"testing"
)

func TestEventTypeLabel(t *testing.T) {
	tests := []struct {
		typ     string
		hasType bool
		want    string
	}{
		{"interaction.completed", true, "interaction.completed"},
		{"Interaction.Completed", true, "interaction.completed"},
		{"video.generated", true, "video.generated"},
		{"batch.succeeded", true, "batch.succeeded"},
		{"batch.running", true, IgnoredTypeOther},
		{"ping", true, "ping"},
		{"webhook.ping", true, "webhook.ping"},
		{"something.new", true, IgnoredTypeOther},
		{"", true, IgnoredTypeOther},
		{strings.Repeat("x", 10_000), true, IgnoredTypeOther},
		{"", false, IgnoredTypeNone},
	}
	for _, tt := range tests {
		if got := EventTypeLabel(tt.typ, tt.hasType); got != tt.want {
			t.Errorf("EventTypeLabel(%.40q, %v) = %q, want %q", tt.typ, tt.hasType, got, tt.want)
		}
	}
}

// TestWebhookCounters: the two counters of bodies answered 200 without a
// record, their bounded labels, and the deliveries they also count.
func TestWebhookCounters(t *testing.T) {
	m := NewWithOptions(nil, Options{NoRuntime: true})
	for i := range 50 {
		m.ObserveIgnored("sender.invented."+strings.Repeat("x", i), true)
	}
	m.ObserveIgnored("interaction.completed", true)
	m.ObserveIgnored("", false)
	m.ObserveInvalid(InvalidName)
	m.ObserveInvalid("a reason nobody listed")
	e := scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_webhook_ignored_total", []string{"type=other"}, 50},
		{"gemrecon_webhook_ignored_total", []string{"type=interaction.completed"}, 1},
		{"gemrecon_webhook_ignored_total", []string{"type=none"}, 1},
		{"gemrecon_webhook_invalid_total", []string{"reason=bad_name"}, 1},
		{"gemrecon_webhook_invalid_total", []string{"reason=other"}, 1},
		{"gemrecon_webhook_invalid_total", []string{"reason=bad_json"}, 0}, // exposed from the start
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=ignored"}, 52},
		{"gemrecon_deliveries_total", []string{"source=webhook", "outcome=invalid"}, 2},
	})
	if n := len(e.fams["gemrecon_webhook_ignored_total"].GetMetric()); n != 3 {
		t.Errorf("gemrecon_webhook_ignored_total has %d series, want 3", n)
	}
	if n := len(e.fams["gemrecon_webhook_invalid_total"].GetMetric()); n != len(invalidReasons) {
		t.Errorf("gemrecon_webhook_invalid_total has %d series, want %d", n, len(invalidReasons))
	}
	var nilM *Metrics
	nilM.ObserveIgnored("x", true)
	nilM.ObserveInvalid(InvalidJSON)
}
