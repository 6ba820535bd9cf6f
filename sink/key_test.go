package sink_test

import (
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// TestKeyText: a key spec §12 accepts and that prints as itself is written
// as it is; any other is quoted, escaped, and cut at canon.MaxQuoted bytes.
func TestKeyText(t *testing.T) {
	long := "gemini:batches/" + strings.Repeat("x", 600)
	for _, tc := range []struct{ key, want string }{
		{"gemini:batches/abc-123", "gemini:batches/abc-123"},
		{"gemini:batches/é", "gemini:batches/é"},
		{"gemini:batches/a\x1b[31m", `"gemini:batches/a\x1b[31m"`},
		{"gemini:batches/nul\x00", `"gemini:batches/nul\x00"`},
		{"gemini:batches/bad\xff", `"gemini:batches/bad\xff"`},
		{"gemini:batches/rtl\u202e", `"gemini:batches/rtl\u202e"`}, // valid, but does not print as itself
		{long, `"` + long[:120] + `"… (615 bytes)`},
	} {
		if got := sink.KeyText(tc.key); got != tc.want {
			t.Errorf("KeyText(%.40q) = %.200s, want %.200s", tc.key, got, tc.want)
		}
	}
}
