// Package canon turns every way a completion can be named — a webhook event,
// a Pub/Sub push envelope, a listed operation, a name typed on the command
// line — into one idempotency key, "gemini:" + the canonical operation name
// (spec §2). It is pure: no I/O, no clock.
package canon

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Prefix starts every key.
const Prefix = "gemini:"

// Event is what canon reads out of an event document.
type Event struct {
	Key  string // "gemini:batches/x"
	Name string // "batches/x"
	// Type is the event's "type" (e.g. "batch.succeeded"), "" when absent
	// or not a string. FromEvent fills Type and HasType even when it returns
	// an error for a document that was an object, so that a receiver can tell
	// an event it should ignore from one it cannot use (spec §6).
	Type string
	// HasType is true when the document has a "type" that is not null (a
	// string, even an empty one, or any other JSON value). Spec §6: such an
	// event is a batch completion only when Type is a batch.* type.
	HasType bool
	// State is the operation state normalised by NormalizeState ("SUCCEEDED",
	// "RUNNING", …), "" when the event says nothing of its state.
	State string
	// Terminal is false only when the event says it is not a completion: a
	// non-terminal state or metadata.state, "done": false, or a batch.* type
	// that is not a completion (spec §6). An event that says nothing is terminal.
	Terminal bool
	// Operation is the document that describes the operation, as given: the
	// unwrapped payload (Pub/Sub data decoded; a Gemini webhook's whole event).
	Operation json.RawMessage
}

// NoNameError is returned when a document has no name candidate.
type NoNameError struct {
	Fields []string // the top-level (and data.*) field names that were present, sorted
	// Within says where the document without a name was found: "" for the
	// body itself, "Pub/Sub message.data" for a Pub/Sub push payload.
	Within string
}

// Error names the fields that were looked for and the ones that were present,
// so that whoever sent the event can see what shape it had.
func (e *NoNameError) Error() string {
	s := "canon: no operation name in " + cmp.Or(e.Within, "event") +
		" (want one of name, operation, operationName, resourceName, or data.id); "
	if len(e.Fields) == 0 {
		return s + "the event has no fields"
	}
	var listed []string
	for i, f := range e.Fields {
		if len(f) > 64 || strings.ContainsFunc(f, func(r rune) bool { return r <= ' ' || r >= 0x7f || r == ',' }) {
			f = Quote(f) // not short printable ASCII: bounded, control characters escaped
		}
		if i == maxFieldsListed || len(strings.Join(listed, ", "))+len(f) > maxFieldsText {
			listed = append(listed, fmt.Sprintf("… (%d more)", len(e.Fields)-i))
			break
		}
		listed = append(listed, f)
	}
	return s + "fields present: " + strings.Join(listed, ", ")
}

// maxFieldsListed and maxFieldsText bound the field names NoNameError's
// text lists: the body comes from the network and may hold thousands.
const (
	maxFieldsListed = 20
	maxFieldsText   = 600
)

// NormalizeState returns an operation state in one spelling: upper case, with
// the BATCH_STATE_ / JOB_STATE_ prefix (or a webhook type's "batch." prefix)
// removed, and CANCELED spelled CANCELLED. "BATCH_STATE_SUCCEEDED",
// "JOB_STATE_SUCCEEDED", "succeeded" and "batch.succeeded" all become
// "SUCCEEDED"; "" stays "".
func NormalizeState(s string) string {
	for prev := ""; s != prev; {
		prev, s = s, strings.TrimSpace(s)
		for _, p := range [...]string{"batch.", "BATCH_STATE_", "JOB_STATE_"} {
			s = trimPrefixFold(s, p)
		}
	}
	if s = strings.ToUpper(s); s == "CANCELED" {
		return "CANCELLED"
	}
	return s
}

// trimPrefixFold removes prefix from s, ignoring case.
func trimPrefixFold(s, prefix string) string {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):]
	}
	return s
}

// IsTerminal reports whether a state (in any spelling NormalizeState accepts)
// is one an operation never leaves: SUCCEEDED, FAILED, CANCELLED, EXPIRED or
// PARTIALLY_SUCCEEDED. Pending, running, paused and unknown states are not.
func IsTerminal(state string) bool {
	return slices.Contains([]string{"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED"}, NormalizeState(state))
}

// IsBatchType reports whether an event type is a Gemini webhook batch event
// ("batch.succeeded", "batch.running", …), compared case-insensitively.
func IsBatchType(t string) bool {
	return len(t) > len("batch.") && trimPrefixFold(t, "batch.") != t
}

// IsCompletionType reports whether a webhook event type announces that a batch
// finished: batch.succeeded, batch.failed, batch.cancelled (or canceled),
// batch.expired, batch.completed or batch.partially_succeeded.
func IsCompletionType(t string) bool {
	return IsBatchType(t) && (IsTerminal(t) || NormalizeState(t) == "COMPLETED")
}

// StateFromType returns the state a webhook event type announces
// ("batch.succeeded" → "SUCCEEDED", "batch.running" → "RUNNING"), or "" when
// the type is not a batch.* type or names no particular state
// ("batch.completed" says the batch ended, not how).
func StateFromType(t string) string {
	if s := NormalizeState(t); IsBatchType(t) && s != "COMPLETED" {
		return s
	}
	return ""
}
