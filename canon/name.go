package canon

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrEmptyName is wrapped by Key when a name is empty once normalised (blank,
// only slashes, a bare "gemini:", a URL with no path).
var ErrEmptyName = errors.New("empty operation name")

// Key returns the idempotency key for an operation name: Prefix followed by the
// canonical name (spec §2). It accepts a bare name, a full resource name, a
// URL, or an existing key, and Key(Key(x)) == Key(x). Key does not apply
// the limits of spec §12 (CheckKey does), so that a key stored before them
// can still be named.
func Key(name string) (string, error) {
	c := canonName(name)
	if c == "" {
		// A name comes from the network: a megabyte of it does not belong
		// in an error text.
		return "", fmt.Errorf("canon: %w: %s", ErrEmptyName, Quote(name))
	}
	return Prefix + c, nil
}

// Name returns the canonical operation name of a key or a name: the key
// without its prefix, normalised. It returns "" when nothing is left.
func Name(key string) string { return canonName(key) }

// BareIDKeys returns, for a key whose name is a bare id ("gemini:demo-quota":
// no collection, as someone types the last part of batches/demo-quota), the
// keys that id has in each collection an operation name may end in:
// batches (the Gemini API's), batchPredictionJobs (Vertex AI's jobs) and
// operations, in that order. For any other key it returns nil. Inspection
// uses it to say which recorded key a bare id may have meant; Key itself
// never guesses a collection, since the same id may exist in several.
func BareIDKeys(key string) []string {
	name := canonName(key)
	if name == "" || strings.ContainsRune(name, '/') || collection(name) != "" {
		return nil
	}
	return []string{Prefix + "batches/" + name, Prefix + "batchPredictionJobs/" + name, Prefix + "operations/" + name}
}

// collection returns the canonical spelling of a collection path segment
// whose "<collection>/<id>" pair ends a canonical name, or "" for any other
// segment. Matching ignores case; batchJobs is an alias of batches.
func collection(seg string) string {
	for _, c := range collections {
		if strings.EqualFold(seg, c.spelling) {
			return c.canonical
		}
	}
	return ""
}

// collections are the spellings collection knows, each with its canonical
// one.
var collections = [...]struct{ spelling, canonical string }{
	{"operations", "operations"}, {"batches", "batches"}, {"batchPredictionJobs", "batchPredictionJobs"}, {"batchJobs", "batches"},
}

// canonName normalises s. It runs in time linear in len(s): each step either
// removes what it looked at or ends its loop, and the one search that looks
// further (for a URL's query) runs at most once. The result is a fixed point
// of every step: it neither starts with white space, a key prefix or
// "scheme://", nor ends with white space or "/", which is what makes
// canonName idempotent.
func canonName(s string) string {
	s = strings.TrimRightFunc(s, isSpaceOrSlash)
	queryCut := false
	for {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		if rest := trimPrefixFold(s, Prefix); len(rest) < len(s) {
			s = rest // "GEMINI:x" is a key typed in capitals, not a name
			continue
		}
		if !urlScheme.MatchString(s) {
			break
		}
		// A URL loses its scheme, host and leading API version
		// ("https://host/v1beta/batches/x" → "batches/x"); the first one
		// also its query and fragment and the white space and slashes
		// before them, after which no '?' or '#' is left to search for.
		s = s[strings.Index(s, "://")+len("://"):] // a scheme holds no ':'
		if !queryCut {
			if q := strings.IndexAny(s, "?#"); q >= 0 {
				s = strings.TrimRightFunc(s[:q], isSpaceOrSlash)
			}
			queryCut = true
		}
		_, path, found := strings.Cut(s, "/")
		if !found {
			return "" // a host and nothing else names no operation
		}
		s = strings.TrimLeft(path, "/")
		if seg, after, _ := strings.Cut(s, "/"); apiVersion.MatchString(seg) {
			s = after
		}
	}
	if s == "" {
		return ""
	}
	return lastPair(s)
}

func isSpaceOrSlash(r rune) bool { return r == '/' || unicode.IsSpace(r) }

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

// urlScheme matches a URL's scheme (RFC 3986 §3.1) and "://"; apiVersion an
// API version path segment: v1, v1beta, v1alpha, v1beta1, v2alpha3 and the
// like. Go's regexp runs in time linear in the input.
var (
	urlScheme  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)
	apiVersion = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]*)?$`)
)

// MaxKeyLen bounds a new key in bytes, prefix included (spec §12): long
// enough for any operation name the APIs give (a Vertex job's full resource
// name is about 100 bytes), short enough for every backend's index and for an
// effect's environment and argument list.
const MaxKeyLen = 512

// MaxQuoted bounds how much of a bad name an error text or a log line quotes
// (spec §12).
const MaxQuoted = 120

// ErrInvalidKey is wrapped by CheckKey (and by FromEvent) when a name can
// never be stored or run: invalid UTF-8 (in JSON, an unpaired surrogate
// escape too), a control character, longer than MaxKeyLen, empty, or only a
// collection word (spec §12). It is the sender's fault, never a reason to
// retry.
var ErrInvalidKey = errors.New("invalid operation name")

// CheckKey reports whether key, a canonical key such as Key returns, may be
// recorded for a new sighting (spec §12). Keys already stored are not checked
// again: inspection and upkeep accept any stored key exactly. The error wraps
// ErrInvalidKey, names the limit that was broken and quotes at most
// MaxQuoted bytes of key (Quote).
func CheckKey(key string) error {
	err := checkBytes(key)
	switch name := trimPrefixFold(key, Prefix); {
	case err != nil:
	case strings.TrimRight(name, "/") == "":
		err = fmt.Errorf("%w: %w: %s", ErrInvalidKey, ErrEmptyName, Quote(key))
	case collectionOnly(name):
		err = fmt.Errorf("%w: %s names a collection, not an operation", ErrInvalidKey, Quote(name))
	default:
		return nil
	}
	return fmt.Errorf("canon: %w", err)
}

// checkBytes is the part of CheckKey that looks at every byte: the length,
// the encoding and control characters. FromEvent calls it alone, having
// tested the name for emptiness and a collection word before the key was
// built.
func checkBytes(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, over the limit of %d bytes: %s", ErrInvalidKey, len(key), MaxKeyLen, Quote(key))
	}
	if i, r := badChar(key); i >= 0 {
		if r == utf8.RuneError {
			return fmt.Errorf("%w: not valid UTF-8 (byte %#02x at offset %d): %s", ErrInvalidKey, key[i], i, Quote(key))
		}
		return fmt.Errorf("%w: control character %U at offset %d: %s", ErrInvalidKey, r, i, Quote(key))
	}
	return nil
}

// badChar returns the offset of the first byte of s that starts an invalid
// UTF-8 sequence (r is then utf8.RuneError) or a Unicode control character
// (category Cc: U+0000–U+001F, U+007F–U+009F; r is that character), and -1
// when there is none.
func badChar(s string) (int, rune) {
	for i, r := range s {
		if unicode.IsControl(r) || r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD") {
			return i, r
		}
	}
	return -1, 0
}

// collectionOnly reports whether name (without the key prefix) names a
// collection rather than an operation: a collection word alone ("batches",
// "batches/", "BatchJobs"), or one that ends a path whose previous segment is
// not a collection ("projects/p/locations/l/batchPredictionJobs"). Such names
// would merge every event that lacks its id into one key. "batches/batches"
// is the batch whose id is "batches", a name.
func collectionOnly(name string) bool {
	name = strings.TrimRight(name, "/")
	j := strings.LastIndexByte(name, '/')
	if collection(name[j+1:]) == "" {
		return false
	}
	if j < 0 {
		return true
	}
	prev := name[:j]
	return collection(prev[strings.LastIndexByte(prev, '/')+1:]) == ""
}

// Quote renders s for an error text or a log line: at most MaxQuoted bytes
// of it (cut at a character boundary, the full length then said), quoted,
// with control characters and invalid bytes escaped (strconv.Quote).
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	cut := MaxQuoted
	// Back up to the start of the character that straddles the cut, but
	// never more than a character's length: a run of stray continuation
	// bytes is invalid anyway and is shown as \x escapes.
	for back := 0; back < utf8.UTFMax-1 && !utf8.RuneStart(s[cut]); back++ {
		cut--
	}
	if !utf8.RuneStart(s[cut]) {
		cut = MaxQuoted
	}
	return strconv.Quote(s[:cut]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
}
