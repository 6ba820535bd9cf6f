package results

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// FileName keeps batch ids as they are, escapes everything else
// reversibly, hashes what would be too long, and never makes a name a file
// system could refuse or confuse.
func TestFileName(t *testing.T) {
	long := strings.Repeat("é", 256) // 512 bytes of printable UTF-8: the longest key spec §12 allows
	for _, tc := range []struct{ id, want string }{
		{"abc123-x_y", "abc123-x_y"},
		{"batch.1", "batch%2e1"},
		{"A", "%41"},
		{"a/b", "a%2fb"},
		{".", "%2e"},
		{"..", "%2e%2e"},
		{"50%", "50%25"},
		{"~", "%7e"},
		{"a b", "a%20b"},
		{"é", "%c3%a9"},
	} {
		got, err := FileName(tc.id)
		if err != nil || got != tc.want {
			t.Errorf("FileName(%q) = %q, %v; want %q", tc.id, got, err, tc.want)
		}
		if back, ok := IDOf(got); !ok || back != tc.id {
			t.Errorf("IDOf(%q) = %q, %v; want %q", got, back, ok, tc.id)
		}
	}
	ids := []string{"a", "A", "a.", "a%2e", long, long + "x", long[:len(long)-2] + "e", strings.Repeat("a", 200),
		strings.Repeat("a", 201), strings.Repeat("a", 201) + "b", strings.Repeat("Z", 300), "gemini:batches/x"}
	seen := map[string]string{}
	dir := t.TempDir()
	for _, id := range ids {
		n, err := FileName(id)
		if err != nil {
			t.Fatalf("FileName(%q): %v", id, err)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("%q and %q share the name %q", prev, id, n)
		}
		seen[n] = id
		if len(n) > maxName || strings.HasPrefix(n, ".") || strings.ContainsAny(n, "/\x00") || n != strings.ToLower(n) {
			t.Errorf("FileName(%q) = %q: unsafe", id, n)
		}
		// The longest names this package makes are real file names.
		tmp := filepath.Join(dir, "."+n+".9223372036854775807.tmp")
		if err := os.WriteFile(tmp, nil, 0o600); err != nil {
			t.Errorf("a temporary file for %q: %v", id, err)
		}
		if !isTempName(filepath.Base(tmp)) {
			t.Errorf("isTempName(%q) = false", filepath.Base(tmp))
		}
		back, ok := IDOf(n)
		hashed := strings.Contains(n, "~")
		switch {
		case hashed && ok:
			t.Errorf("IDOf(%q) decoded a hashed name", n)
		case !hashed && (!ok || back != id):
			t.Errorf("IDOf(%q) = %q, %v; want %q", n, back, ok, id)
		}
		enc := 0
		for i := 0; i < len(id); i++ {
			enc += 3
			if plain(id[i]) {
				enc -= 2
			}
		}
		if hashed != (enc > maxName) {
			t.Errorf("FileName(%q) = %q: hashed %v", id, n, hashed)
		}
	}
	for _, bad := range []string{"", "a\xffb"} {
		if _, err := FileName(bad); err == nil {
			t.Errorf("FileName(%q): no error", bad)
		}
	}
	for _, stem := range []string{"", "%41%", "%4", "%4G", "%61" /* plain, never escaped */, "A", "a.b", "a~b", "~" + strings.Repeat("0", 40) + "x"} {
		if _, ok := IDOf(stem); ok {
			t.Errorf("IDOf(%q) accepted a stem FileName never makes", stem)
		}
	}
}

// IDOf, the inverse of FileName that proves it reversible, returns the id a file name stem (without ".jsonl") stands for, and
// false when the stem is not one FileName makes or is a hashed (too long)
// one, which cannot be decoded.
func IDOf(stem string) (string, bool) {
	if !validName(stem) || strings.ContainsRune(stem, '~') {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(stem); i++ {
		c := stem[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		v := unhex(stem[i+1])<<4 | unhex(stem[i+2])
		if plain(v) { // FileName never escapes these: not one of its names
			return "", false
		}
		b.WriteByte(v)
		i += 2
	}
	id := b.String()
	if !utf8.ValidString(id) {
		return "", false
	}
	return id, true
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}
