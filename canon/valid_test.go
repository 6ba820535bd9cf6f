package canon_test

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/canon"
)

func TestCheckKey(t *testing.T) {
	max := canon.Prefix + "batches/" + strings.Repeat("x", canon.MaxKeyLen-len("gemini:batches/"))
	tests := []struct {
		key     string
		wantErr string // "" = valid; else a substring of the error
	}{
		{"gemini:batches/aaa111", ""},
		{"gemini:operations/abc-123", ""},
		{"gemini:batchPredictionJobs/111", ""},
		{"gemini:abc", ""},
		{"gemini:batches/batches", ""}, // the batch whose id is "batches"
		{"gemini:operations/batches", ""},
		{"gemini:foobatches", ""},
		{"gemini:batches/é😀", ""},
		{"gemini:batches/\uFFFD", ""}, // a real U+FFFD is a character like any other
		{"gemini:batches/a b", ""},
		{"gemini:batches/a\u2028b", ""}, // a line separator is not Cc (Quote escapes it)
		{max, ""},
		{max + "x", "513 bytes, over the limit of 512 bytes"},
		{canon.Prefix + strings.Repeat("é", 300), "over the limit of 512 bytes"},
		{"gemini:batches/a\x00", "control character U+0000 at offset 16"},
		{"gemini:batches/a\tb", "control character U+0009"},
		{"gemini:batches/a\nb", "control character U+000A"},
		{"gemini:batches/\x1f", "control character U+001F"},
		{"gemini:batches/\x7f", "control character U+007F"},
		{"gemini:batches/\u0080", "control character U+0080"},
		{"gemini:batches/\u009f", "control character U+009F"},
		{"gemini:batches/a\xff", "not valid UTF-8 (byte 0xff at offset 16)"},
		{"gemini:batches/\xc3", "not valid UTF-8"},                 // truncated sequence
		{"gemini:batches/\xed\xa0\x80", "not valid UTF-8"},         // a surrogate encoded in UTF-8
		{"gemini:batches/\xc0\xaf", "not valid UTF-8"},             // overlong
		{"gemini:batches", "names a collection, not an operation"}, // spec §12
		{"gemini:batches/", "names a collection"},
		{"gemini:BATCHES", "names a collection"},
		{"gemini:batchJobs/", "names a collection"},
		{"gemini:operations", "names a collection"},
		{"gemini:batchPredictionJobs", "names a collection"},
		{"gemini:projects/p/locations/l/batchPredictionJobs", "names a collection"},
		{"gemini:operations/x/batches", "names a collection"},
		{"batches", "names a collection"}, // without the prefix too
		{"gemini:", "empty operation name"},
		{"gemini:/", "empty operation name"},
		{"", "empty operation name"},
	}
	for _, tt := range tests {
		err := canon.CheckKey(tt.key)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("CheckKey(%q) = %v, want nil", tt.key, err)
			}
			continue
		}
		if err == nil || !errors.Is(err, canon.ErrInvalidKey) || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("CheckKey(%q) = %v, want an ErrInvalidKey error containing %q", tt.key, err, tt.wantErr)
			continue
		}
		if !strings.HasPrefix(err.Error(), "canon: invalid operation name: ") {
			t.Errorf("CheckKey(%q) = %q, want it to start with %q", tt.key, err, "canon: invalid operation name: ")
		}
		if msg := err.Error(); !utf8.ValidString(msg) || strings.ContainsFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) }) {
			t.Errorf("CheckKey(%q) error %q holds a control character or invalid UTF-8", tt.key, msg)
		}
	}
}

// TestCheckKeyQuotesLittle: a bad name of 100 KB costs an error text of a
// few hundred bytes, not 100 KB (spec §12).
func TestCheckKeyQuotesLittle(t *testing.T) {
	for _, key := range []string{
		canon.Prefix + strings.Repeat("a", 100_000),
		canon.Prefix + strings.Repeat("\x00", 100_000),
		canon.Prefix + strings.Repeat("\xff", 100),
		canon.Prefix + strings.Repeat("\x00", 100),
	} {
		err := canon.CheckKey(key)
		if err == nil {
			t.Fatalf("CheckKey(%d bytes) = nil, want an error", len(key))
		}
		if n := len(err.Error()); n > 4*canon.MaxQuoted+120 {
			t.Errorf("CheckKey(%d bytes) error is %d bytes long, want at most %d", len(key), n, 4*canon.MaxQuoted+120)
		}
	}
}

func TestQuote(t *testing.T) {
	long := strings.Repeat("a", 119) + "é" + strings.Repeat("b", 10) // é straddles byte 120
	tests := []struct {
		in, want string
	}{
		{"batches/x", `"batches/x"`},
		{"", `""`},
		{"a\x00b", `"a\x00b"`},
		{"a\nb\tc", `"a\nb\tc"`},
		{"a\u0085b", `"a\u0085b"`},
		{"a\u2028b", `"a\u2028b"`},
		{"a\xffb", `"a\xffb"`},
		{`a"b\c`, `"a\"b\\c"`},
		{strings.Repeat("x", canon.MaxQuoted), `"` + strings.Repeat("x", canon.MaxQuoted) + `"`},
		{strings.Repeat("x", canon.MaxQuoted+1), `"` + strings.Repeat("x", canon.MaxQuoted) + `"… (121 bytes)`},
		{long, `"` + strings.Repeat("a", 119) + `"… (131 bytes)`},
		// A run of stray continuation bytes is cut where it stands, not
		// walked back to nothing.
		{strings.Repeat("\x80", 200), `"` + strings.Repeat(`\x80`, canon.MaxQuoted) + `"… (200 bytes)`},
		{strings.Repeat("\x00", 1000), `"` + strings.Repeat(`\x00`, canon.MaxQuoted) + `"… (1000 bytes)`},
	}
	for _, tt := range tests {
		if got := canon.Quote(tt.in); got != tt.want {
			t.Errorf("Quote(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestFromEventRefusesInvalidNames: every name spec §12 refuses is an error
// wrapping ErrInvalidKey, whatever the envelope, and two different invalid
// names never become one key.
func TestFromEventRefusesInvalidNames(t *testing.T) {
	pubsub := func(doc string) string {
		return `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(doc)) + `"}}`
	}
	long := strings.Repeat("n", 100_000)
	for _, body := range []string{
		"{\"name\":\"batches/a\xff\"}", // invalid UTF-8 in the raw bytes
		"{\"name\":\"batches/a\xfe\"}",
		"{\"name\":\"batches/a\xff\\n\"}", // with an escape: the slow path
		"{\"type\":\"batch.succeeded\",\"data\":{\"id\":\"a\xff\"}}",
		pubsub("{\"name\":\"batches/a\xff\"}"),
		`{"name":"batches/a\ud800"}`, // encoding/json would give U+FFFD for both
		`{"name":"batches/a\udfff"}`,
		`{"name":"batches/a\ud800\ud800"}`,
		`{"name":"batches/a\ud800x"}`,
		`{"operation":{"name":"batches/\uDBFF"}}`,
		`{"data":{"resourceName":"batches/\u0000"}}`,
		`{"name":"batches/` + long + `"}`,
		`{"name":"batches/a\u001b[31m"}`,
		`{"name":"batches/"}`,
		`{"name":"BATCHES"}`,
		`{"type":"batch.failed","data":{"id":"batches"}}`,
	} {
		ev, err := canon.FromEvent([]byte(body))
		if !errors.Is(err, canon.ErrInvalidKey) || ev.Key != "" {
			t.Errorf("FromEvent(%.80q) = %q, %v, want an ErrInvalidKey error", body, ev.Key, err)
			continue
		}
		if n := len(err.Error()); n > 4*canon.MaxQuoted+200 {
			t.Errorf("FromEvent(%.80q) error is %d bytes, want a short one", body, n)
		}
		if strings.ContainsAny(err.Error(), "\x00\x1b\xff") {
			t.Errorf("FromEvent(%.80q) error %q holds raw control or invalid bytes", body, err)
		}
	}
}

func TestFromEventKeepsTypeOnError(t *testing.T) {
	tests := []struct {
		body     string
		typ      string
		hasType  bool
		class    error
		noName   bool
		wantsErr bool
	}{
		{body: `{"type":"ping"}`, typ: "ping", hasType: true, noName: true},
		{body: `{"type":"interaction.completed","data":{"id":"int_1"}}`, typ: "interaction.completed", hasType: true},
		{body: `{"type":"video.generated","name":"batches/\ud800"}`, typ: "video.generated", hasType: true, class: canon.ErrInvalidKey},
		{body: `{"type":7,"data":{"x":1}}`, hasType: true, noName: true},
		{body: `{"type":"","name":"batches/x"}`, hasType: true},
		{body: `{"type":null,"name":"batches/x"}`},
		{body: `{"name":"batches/x"}`},
		{body: `{"type":"batch.succeeded","name":42}`, typ: "batch.succeeded", hasType: true, class: canon.ErrFieldType},
		{body: `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(`{"type":"ping"}`)) + `"}}`, typ: "ping", hasType: true, noName: true},
		{body: `[1]`, class: canon.ErrNotObject},
		{body: `{"type":"ping"`, class: canon.ErrNotJSON},
		{body: ``, class: canon.ErrNotJSON},
		{body: `{"message":{"data":"@@"}}`, class: canon.ErrEnvelope},
		{body: `{"message":{"data":{}}}`, class: canon.ErrEnvelope},
	}
	for _, tt := range tests {
		ev, err := canon.FromEvent([]byte(tt.body))
		if ev.Type != tt.typ || ev.HasType != tt.hasType {
			t.Errorf("FromEvent(%s) Type, HasType = %q, %v, want %q, %v", tt.body, ev.Type, ev.HasType, tt.typ, tt.hasType)
		}
		var nn *canon.NoNameError
		if errors.As(err, &nn) != tt.noName {
			t.Errorf("FromEvent(%s) error = %v, want a *NoNameError: %v", tt.body, err, tt.noName)
		}
		if tt.class != nil && !errors.Is(err, tt.class) {
			t.Errorf("FromEvent(%s) error = %v, want one wrapping %v", tt.body, err, tt.class)
		}
		if err != nil && (ev.Key != "" || ev.Operation != nil) {
			t.Errorf("FromEvent(%s) = %+v with error %v, want only Type and HasType", tt.body, ev, err)
		}
	}
}

// TestNoNameErrorIsBounded: a body of many odd field names gives an error of
// bounded size, its names escaped.
func TestNoNameErrorIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{`)
	for i := range 5000 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"f\u0000` + strings.Repeat("x", i%300) + `":1`)
	}
	b.WriteString(`}`)
	_, err := canon.FromEvent([]byte(b.String()))
	var nn *canon.NoNameError
	if !errors.As(err, &nn) {
		t.Fatalf("FromEvent = %v, want a *NoNameError", err)
	}
	msg := err.Error()
	if len(msg) > 4000 || strings.Contains(msg, "\x00") || !strings.Contains(msg, "more)") {
		t.Errorf("NoNameError text is %d bytes (%.200q…), want at most 4000, escaped, with a count of the rest", len(msg), msg)
	}
}
