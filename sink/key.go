package sink

import (
	"strconv"

	"github.com/gemrecon/gemrecon/canon"
)

// CheckKey refuses a key that may not be recorded for a new sighting (spec
// §12: invalid UTF-8, a control character, over canon.MaxKeyLen bytes, empty,
// or only a collection word) with an error wrapping canon.ErrInvalidKey that
// quotes at most canon.MaxQuoted bytes of it. Every backend's Record and
// RecordAndClaim call it first, so that such a key is refused the same way on
// every backend and never reaches a database that would store it (SQLite: a
// key no effect can be run with) or fail on it (PostgreSQL: a database error,
// which a receiver would answer with a 503 forever). Keys already stored are
// not checked: Get, List, Retry and Purge take any stored key exactly.
func CheckKey(key string) error { return canon.CheckKey(key) }

// KeyText renders a key for an error text: as it is when spec §12 accepts
// it and every character of it prints as itself (strconv.IsPrint), and
// otherwise canon.Quote'd — at most canon.MaxQuoted bytes, control
// characters and invalid bytes escaped — so that a key stored before §12 (an
// escape sequence, a NUL, 100 KB of it) cannot rewrite the terminal or flood
// the log of whoever reads the error (status, retry, drain).
func KeyText(key string) string {
	if canon.CheckKey(key) != nil {
		return canon.Quote(key)
	}
	for _, r := range key { // valid UTF-8: CheckKey said so
		if !strconv.IsPrint(r) {
			return canon.Quote(key)
		}
	}
	return key
}
