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
// never be stored or run: invalid UTF-8, a control character, longer than
// MaxKeyLen, or only a collection word (spec §12). It is the sender's fault,
// never a reason to retry.
var ErrInvalidKey = errors.New("invalid operation name")

// CheckKey reports whether key, a canonical key such as Key returns, may be
// recorded for a new sighting (spec §12). Keys already stored are not checked
// again: inspection and upkeep accept any stored key exactly.
func CheckKey(key string) error {
	switch {
	case !utf8.ValidString(key):
		return fmt.Errorf("canon: %w: not valid UTF-8: %s", ErrInvalidKey, Quote(key))
	case len(key) > MaxKeyLen:
		return fmt.Errorf("canon: %w: %d bytes, over the limit of %d: %s", ErrInvalidKey, len(key), MaxKeyLen, Quote(key))
	}
	if i := strings.IndexFunc(key, unicode.IsControl); i >= 0 {
		return fmt.Errorf("canon: %w: control character %U at byte %d: %s", ErrInvalidKey, []rune(key[i:])[0], i, Quote(key))
	}
	name := strings.TrimPrefix(key, Prefix)
	last := name[strings.LastIndexByte(name, '/')+1:]
	if collection(last) != "" {
		return fmt.Errorf("canon: %w: %s names a collection, not an operation", ErrInvalidKey, Quote(name))
	}
	return nil
}

// Quote renders s for an error text or a log line: at most MaxQuoted bytes
// (cut at a character boundary, the full length said), quoted with control
// characters and invalid bytes escaped.
func Quote(s string) string {
	if len(s) <= MaxQuoted {
		return strconv.Quote(s)
	}
	cut := MaxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}
