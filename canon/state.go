package canon

import "strings"

// NormalizeState returns an operation state in one spelling: upper case, with
// the BATCH_STATE_ / JOB_STATE_ prefix (or a webhook type's "batch." prefix)
// removed, and CANCELED spelled CANCELLED. "BATCH_STATE_SUCCEEDED",
// "JOB_STATE_SUCCEEDED", "succeeded" and "batch.succeeded" all become
// "SUCCEEDED"; "" stays "".
func NormalizeState(s string) string {
	for {
		prev := s
		s = strings.TrimSpace(s)
		s = trimPrefixFold(s, "batch.")
		s = trimPrefixFold(s, "BATCH_STATE_")
		s = trimPrefixFold(s, "JOB_STATE_")
		if s == prev {
			break
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
	switch NormalizeState(state) {
	case "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED":
		return true
	}
	return false
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
	if !IsBatchType(t) {
		return false
	}
	switch NormalizeState(t) {
	case "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "COMPLETED", "PARTIALLY_SUCCEEDED":
		return true
	}
	return false
}

// StateFromType returns the state a webhook event type announces
// ("batch.succeeded" → "SUCCEEDED", "batch.running" → "RUNNING"), or "" when
// the type is not a batch.* type or names no particular state
// ("batch.completed" says the batch ended, not how).
func StateFromType(t string) string {
	if !IsBatchType(t) {
		return ""
	}
	s := NormalizeState(t)
	if s == "COMPLETED" {
		return ""
	}
	return s
}
