package canon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/canon"
)

// TestLinearTime feeds Key the inputs that would make a naive
// normalise-until-nothing-changes loop quadratic. A webhook body may be 1 MiB,
// so a quadratic Key is a denial of service. The bound is a thousand times
// what a linear Key needs, so a slow machine does not fail it.
func TestLinearTime(t *testing.T) {
	const n = 1 << 20
	for _, tt := range []struct{ name, in string }{
		{"nested URLs", strings.Repeat("a://b/", n/6)},
		{"URLs then query", strings.Repeat("a://b/", n/12) + "x?" + strings.Repeat("q", n/2)},
		{"prefixes before a scheme-like tail", strings.Repeat("gemini:", n/7) + "a/b://c"},
		{"prefixes and spaces", strings.Repeat("gemini: ", n/8) + "x"},
		{"alternating slashes and spaces", strings.Repeat("a", n/2) + strings.Repeat("/ ", n/4)},
		{"long scheme-like run", strings.Repeat("a", n/2) + "/ x"},
		{"version-like segments", "a://b/" + strings.Repeat("v1", n/2)},
	} {
		start := time.Now()
		_, _ = canon.Key(tt.in)
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("Key(%s, %d bytes) took %v, want linear time", tt.name, len(tt.in), d)
		}
	}
}

// TestLinearTimeFromEvent does the same for whole event bodies of the
// receiver's maximum size.
func TestLinearTimeFromEvent(t *testing.T) {
	const n = 1 << 20
	for _, tt := range []struct{ name, body string }{
		{"nested URLs in a name", `{"name":"` + strings.Repeat("a://b/", n/6) + `"}`},
		{"many fields, no name", `{` + strings.Repeat(`"f":1,`, n/6) + `"g":2}`},
		{"deep data", `{"data":` + strings.Repeat(`[`, 10000) + strings.Repeat(`]`, 10000) + `}`},
		{"long webhook id", `{"type":"batch.succeeded","data":{"id":"` + strings.Repeat("x", n) + `"}}`},
	} {
		start := time.Now()
		_, _ = canon.FromEvent([]byte(tt.body))
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("FromEvent(%s, %d bytes) took %v, want linear time", tt.name, len(tt.body), d)
		}
	}
}
