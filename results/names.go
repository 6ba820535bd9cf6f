package results

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// maxName bounds an encoded name, so that the longest temporary name
// (".<name>.<token>.tmp", a token of up to 19 digits) stays well under the
// 255-byte file name limit of common file systems.
const maxName = 200

// hashedKeep is how much of a too-long encoding a hashed name keeps.
const hashedKeep = maxName - 1 - hashHex

// hashHex is the length of the SHA-256 prefix (160 bits) in hashed names.
const hashHex = 40

// FileName returns the file name stem for an id (the results file is
// FileName(id) + ".jsonl"), safe on any file system whatever the id — spec
// §12 allows up to 512 bytes of any printable UTF-8, while batch ids are
// normally [a-z0-9-]:
//
//   - the bytes a-z, 0-9, '-' and '_' stand for themselves;
//   - every other byte is written "%xx", two lower-case hex digits (so
//     "batch.A/b" is "batch%2e%41%2fb"). The result never starts with '.',
//     holds no '/', no upper case (two ids never meet on a case-insensitive
//     file system) and decodes back to the id exactly (the tests' IDOf);
//   - an encoding longer than 200 bytes is cut to its first 159 bytes (at a
//     whole escape), followed by '~' and the first 40 hex digits of the id's
//     SHA-256: still unique, no longer reversible.
//
// An empty id, or one that is not valid UTF-8, is an error.
func FileName(id string) (string, error) {
	switch {
	case id == "":
		return "", errors.New("results: an empty id")
	case !utf8.ValidString(id):
		return "", fmt.Errorf("results: id %q is not valid UTF-8", truncate(id))
	}
	var b strings.Builder
	for i := 0; i < len(id); i++ {
		c := id[i]
		if plain(c) {
			b.WriteByte(c)
			continue
		}
		const hexdigits = "0123456789abcdef"
		b.WriteByte('%')
		b.WriteByte(hexdigits[c>>4])
		b.WriteByte(hexdigits[c&15])
	}
	s := b.String()
	if len(s) <= maxName {
		return s, nil
	}
	keep := hashedKeep
	// Never cut inside an escape.
	if i := strings.LastIndexByte(s[:keep], '%'); i >= keep-2 {
		keep = i
	}
	sum := sha256.Sum256([]byte(id))
	return s[:keep] + "~" + hex.EncodeToString(sum[:])[:hashHex], nil
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// validName reports whether s has the shape of a FileName result: plain
// bytes and well-formed lower-case escapes, then possibly '~' and 40 hex
// digits after a cut encoding.
func validName(s string) bool {
	m := nameShape.FindStringSubmatch(s)
	return m != nil && s != "" && len(s) <= maxName && (m[2] == "" || len(m[1]) <= hashedKeep)
}

var nameShape = regexp.MustCompile(`^((?:[a-z0-9_-]|%[0-9a-f]{2})*)(~[0-9a-f]{40})?$`)

func truncate(s string) string {
	if len(s) <= 120 {
		return s
	}
	return s[:120] + "…"
}
