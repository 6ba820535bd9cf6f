package canon

import (
	"errors"
	"fmt"
	"strings"
)

// ErrEmptyName is wrapped by Key when a name is empty once normalised (blank,
// only slashes, a bare "gemini:", a URL with no path).
var ErrEmptyName = errors.New("empty operation name")

// Key returns the idempotency key for an operation name: Prefix followed by the
// canonical name (spec §2). It accepts a bare name, a full resource name, a
// URL, or an existing key, and Key(Key(x)) == Key(x).
func Key(name string) (string, error) {
	c := canonName(name)
	if c == "" {
		return "", fmt.Errorf("canon: %w: %q", ErrEmptyName, name)
	}
	return Prefix + c, nil
}

// Name returns the canonical operation name of a key or a name: the key
// without its prefix, normalised. It returns "" when nothing is left.
func Name(key string) string { return canonName(key) }

// collection returns the canonical spelling of a collection path segment
// whose "<collection>/<id>" pair ends a canonical name, or "" for any other
// segment. Matching ignores case; batchJobs is an alias of batches.
func collection(seg string) string {
	switch {
	case strings.EqualFold(seg, "operations"):
		return "operations"
	case strings.EqualFold(seg, "batches"), strings.EqualFold(seg, "batchJobs"):
		return "batches"
	case strings.EqualFold(seg, "batchPredictionJobs"):
		return "batchPredictionJobs"
	}
	return ""
}

// canonName normalises s. Every step of the loop only removes text, so the
// loop ends, and it runs until nothing more is removed: its result is a
// fixed point, which is what makes canonName idempotent by construction.
func canonName(s string) string {
	for {
		prev := s
		s = strings.TrimSpace(s)
		s = trimPrefixFold(s, Prefix) // "GEMINI:x" is a key typed in capitals, not a name
		s = stripURL(s)
		s = strings.TrimRight(s, "/")
		if s == prev {
			break
		}
	}
	if s == "" {
		return ""
	}
	return lastPair(s)
}

// lastPair keeps the trailing "<collection>/<id>" of s, dropping parents such
// as projects/*/locations/*/ or models/*/, and writes the collection in its
// canonical spelling. The id keeps its case. A name of no known shape is
// returned unchanged.
func lastPair(s string) string {
	j := strings.LastIndexByte(s, '/')
	if j < 0 || j == len(s)-1 {
		return s
	}
	k := strings.LastIndexByte(s[:j], '/') // -1 when the collection starts s
	seg := s[k+1 : j]
	switch c := collection(seg); c {
	case "":
		return s
	case seg:
		return s[k+1:] // already canonical: a substring, no allocation
	default:
		return c + s[j:]
	}
}

// stripURL removes a URL's scheme, host, query, fragment and leading API
// version segment ("https://host/v1beta/batches/x?alt=json" → "batches/x").
// Anything that does not start with "scheme://" is returned unchanged.
func stripURL(s string) string {
	i := strings.Index(s, "://")
	if i <= 0 || !isScheme(s[:i]) {
		return s
	}
	rest := s[i+3:]
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		rest = rest[:q]
	}
	slash := strings.IndexByte(rest, '/')
	if slash < 0 {
		return "" // a host and nothing else names no operation
	}
	path := strings.TrimLeft(rest[slash:], "/")
	seg, after, found := strings.Cut(path, "/")
	if isAPIVersion(seg) {
		if !found {
			return ""
		}
		return after
	}
	return path
}

// isScheme reports whether s is a URL scheme (RFC 3986 §3.1).
func isScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// isAPIVersion reports whether seg is an API version path segment: v1, v1beta,
// v1alpha, v1beta1, v2alpha3 and the like.
func isAPIVersion(seg string) bool {
	if len(seg) < 2 || seg[0] != 'v' {
		return false
	}
	i := 1
	for i < len(seg) && '0' <= seg[i] && seg[i] <= '9' {
		i++
	}
	if i == 1 {
		return false
	}
	rest := seg[i:]
	for _, stage := range [...]string{"alpha", "beta"} {
		if strings.HasPrefix(rest, stage) {
			rest = rest[len(stage):]
			break
		}
	}
	for j := 0; j < len(rest); j++ {
		if rest[j] < '0' || rest[j] > '9' {
			return false
		}
	}
	return true
}
