package metrics

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/gemrecon/gemrecon/sink"
)

// Reasons of gemrecon_webhook_invalid_total: why a verified webhook body
// could not be used (spec §6). The set is fixed; ObserveInvalid counts any
// other string as InvalidOther.
const (
	InvalidJSON      = "bad_json"     // empty, not JSON, or not a JSON object
	InvalidEnvelope  = "bad_envelope" // a Pub/Sub envelope without usable base64 message.data
	InvalidNoName    = "no_name"      // no operation name candidate
	InvalidFieldType = "bad_field"    // a name candidate of the wrong JSON type
	InvalidName      = "bad_name"     // a name spec §12 refuses (encoding, control character, length, a collection word)
	InvalidOther     = "other"
)

var invalidReasons = []string{InvalidJSON, InvalidEnvelope, InvalidNoName, InvalidFieldType, InvalidName, InvalidOther}

// Type labels of gemrecon_webhook_ignored_total besides the known types.
const (
	IgnoredTypeNone  = "none"  // an event without a type (a non-terminal one)
	IgnoredTypeOther = "other" // any type not in KnownEventTypes
)

// KnownEventTypes are the Gemini API webhook event types that
// gemrecon_webhook_ignored_total names; every other type counts as
// IgnoredTypeOther, so that a sender cannot grow the series without bound.
// Only batch.* completions are ever recorded; these are listed because
// their counts tell an operator what the endpoint receives. "ping" and
// "webhook.ping" are guesses (the second is what the local emulator sends):
// the real ping's type string is not documented.
var KnownEventTypes = []string{
	"batch.succeeded", "batch.failed", "batch.cancelled", "batch.expired",
	"interaction.completed", "interaction.failed", "interaction.requires_action",
	"video.generated", "ping", "webhook.ping",
}

// webhookCounters are the receiver's counters of bodies it answered 200
// without recording anything.
type webhookCounters struct {
	ignored *prometheus.CounterVec
	invalid *prometheus.CounterVec
}

func newWebhookCounters(r promauto.Factory) webhookCounters {
	c := webhookCounters{
		ignored: r.NewCounterVec(prometheus.CounterOpts{
			Name: "gemrecon_webhook_ignored_total",
			Help: "Webhook events answered 200 ignored and not recorded (not a batch event, or not a completion), by type (known types by name, none, other).",
		}, []string{"type"}),
		invalid: r.NewCounterVec(prometheus.CounterOpts{
			Name: "gemrecon_webhook_invalid_total",
			Help: "Verified webhook bodies that could not be used, answered 200 invalid and not recorded, by reason (bad_json, bad_envelope, no_name, bad_field, bad_name, other).",
		}, []string{"reason"}),
	}
	// A fixed set of reasons: expose each as 0 from the start, so that an
	// alert on any increase sees the series before the first one.
	for _, r := range invalidReasons {
		c.invalid.WithLabelValues(r)
	}
	return c
}

// EventTypeLabel returns the type label of gemrecon_webhook_ignored_total
// for an event type: the known type's spelling (matched ignoring case),
// IgnoredTypeNone for an event without a type, IgnoredTypeOther otherwise.
func EventTypeLabel(eventType string, hasType bool) string {
	if !hasType {
		return IgnoredTypeNone
	}
	if i := slices.IndexFunc(KnownEventTypes, func(k string) bool { return strings.EqualFold(eventType, k) }); i >= 0 {
		return KnownEventTypes[i]
	}
	return IgnoredTypeOther
}

// ObserveIgnored counts one webhook event answered 200 ignored: in
// gemrecon_webhook_ignored_total under its type label (EventTypeLabel) and
// as a delivery with outcome ignored.
func (m *Metrics) ObserveIgnored(eventType string, hasType bool) {
	if m == nil {
		return
	}
	m.webhook.ignored.WithLabelValues(EventTypeLabel(eventType, hasType)).Inc()
	m.ObserveDelivery(sink.SourceWebhook, OutcomeIgnored)
}

// ObserveInvalid counts one verified webhook body answered 200 invalid: in
// gemrecon_webhook_invalid_total under reason (one of the Invalid*
// constants; any other string counts as InvalidOther) and as a delivery
// with outcome invalid.
func (m *Metrics) ObserveInvalid(reason string) {
	if m == nil {
		return
	}
	if !slices.Contains(invalidReasons, reason) {
		reason = InvalidOther
	}
	m.webhook.invalid.WithLabelValues(reason).Inc()
	m.ObserveDelivery(sink.SourceWebhook, OutcomeInvalid)
}
