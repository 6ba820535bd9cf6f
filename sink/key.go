package sink

import "github.com/gemrecon/gemrecon/canon"

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
