package sink

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxPassName bounds a pass record's scope or owner (both are short: a
// backend, a base URL and a hash prefix; a host name and a process id).
const MaxPassName = 1024

// CheckPassName refuses what a pass record (spec §5.5) cannot hold the same
// way on every backend: an empty kind ("scope", "owner"), one longer than
// MaxPassName bytes, invalid UTF-8 or a NUL.
func CheckPassName(kind, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty %s", kind)
	case len(v) > MaxPassName:
		return fmt.Errorf("%s of %d bytes, longer than %d", kind, len(v), MaxPassName)
	case !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%s %q is not valid UTF-8 text without NUL", kind, v)
	}
	return nil
}
