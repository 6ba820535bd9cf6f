package effect

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestPermanentAndRetryAfter(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		name      string
		err       error
		permanent bool
		after     time.Duration
		hasAfter  bool
	}{
		{"plain", base, false, 0, false},
		{"permanent", Permanent(base), true, 0, false},
		{"wrapped permanent", fmt.Errorf("ctx: %w", Permanent(base)), true, 0, false},
		{"retry-after", WithRetryAfter(base, 2*time.Second), false, 2 * time.Second, true},
		{"wrapped retry-after", fmt.Errorf("x: %w", WithRetryAfter(base, time.Minute)), false, time.Minute, true},
		{"zero retry-after", WithRetryAfter(base, 0), false, 0, false},
		{"nil", nil, false, 0, false},
	}
	for _, tt := range tests {
		if got := IsPermanent(tt.err); got != tt.permanent {
			t.Errorf("IsPermanent(%q) = %v, want %v", tt.name, got, tt.permanent)
		}
		d, ok := RetryAfterOf(tt.err)
		if d != tt.after || ok != tt.hasAfter {
			t.Errorf("RetryAfterOf(%q) = %v, %v, want %v, %v", tt.name, d, ok, tt.after, tt.hasAfter)
		}
		if tt.err != nil && !errors.Is(tt.err, base) {
			t.Errorf("errors.Is(%q, base) = false, want true", tt.name)
		}
		if tt.err != nil && tt.err.Error() == "" {
			t.Errorf("%q: empty message", tt.name)
		}
	}
	if Permanent(nil) != nil || WithRetryAfter(nil, time.Second) != nil {
		t.Errorf("Permanent(nil) or WithRetryAfter(nil) is not nil")
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"2", 2 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, false},
		{"-5", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{"Sun, 29 Nov 2026 08:00:30 GMT", 30 * time.Second, true},
		{"Sun, 29 Nov 2026 07:59:00 GMT", 0, false},
		{"99999999999999", MaxRetryAfter, true},
		// Longer than an int64 of seconds is still "a very long time"
		// (RFC 9111 §1.2.2), not no delay at all.
		{"99999999999999999999", MaxRetryAfter, true},
		{"-99999999999999999999", 0, false},
		// RFC 9110's obsolete date forms, which a recipient must accept.
		{"Sunday, 29-Nov-26 08:00:30 GMT", 30 * time.Second, true},
		{"Sun Nov 29 08:00:30 2026", 30 * time.Second, true},
		{"Sun, 29 Nov 2027 08:00:00 GMT", MaxRetryAfter, true},
	}
	for _, tt := range tests {
		got, ok := parseRetryAfter(tt.in, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v, want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
