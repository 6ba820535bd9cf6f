package canon

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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
