package metrics

import (
	"slices"
	"strings"

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
	m.ignored.WithLabelValues(EventTypeLabel(eventType, hasType)).Inc()
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
	m.invalid.WithLabelValues(reason).Inc()
	m.ObserveDelivery(sink.SourceWebhook, OutcomeInvalid)
}
