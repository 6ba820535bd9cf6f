package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// storeRaw writes a key straight into the SQLite file with SQL, as a
// gemrecon from before spec §12 (or an older canon) could have stored it.
func storeRaw(t *testing.T, db, key, state, lastError string) {
	t.Helper()
	sqlitetest.StoreRaw(t, db, key, state, lastError, time.Now())
}

// TestStatusRefusesNamesThatCouldNeverBeRecorded: status of an unknown name
// that spec §12 refuses says so, naming the limit (exit 2), instead of
// "unknown" (exit 3), and quotes little of it.
func TestStatusRefusesNamesThatCouldNeverBeRecorded(t *testing.T) {
	db := newDB(t)
	long := "batches/" + strings.Repeat("x", 100_000)
	for _, tc := range []struct {
		name, want string
	}{
		{long, "over the limit of 512 bytes"},
		{"batches/" + strings.Repeat("x", 498), "513 bytes, over the limit of 512 bytes"},
		{"batches/", "names a collection"},
		{"gemini:operations", "names a collection"},
		{"batches/a\x1b[31mred", "control character U+001B"},
		{"batches/bad\xff", "not valid UTF-8"},
	} {
		r := gemrecon(t, "--db", db, "status", tc.name)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "none could be") {
			t.Errorf("status %.60q = %v; want exit 2 and %q in stderr", tc.name, r, tc.want)
		}
		if len(r.stderr) > 1000 || strings.ContainsAny(r.stderr, "\x1b\xff") {
			t.Errorf("status %.60q: stderr of %d bytes %.200q, want a short one with control characters escaped", tc.name, len(r.stderr), r.stderr)
		}
	}
	// A name of exactly the limit, and any valid one, is unknown as before.
	r := gemrecon(t, "--db", db, "status", "batches/"+strings.Repeat("x", 497))
	wantCode(t, r, exitUnknownKey)
	// A name that is no name at all stays a usage error, quoted briefly.
	r = gemrecon(t, "--db", db, "status", strings.Repeat(" ", 10_000))
	if r.code != exitUsage || len(r.stderr) > 1000 {
		t.Errorf("status of 10,000 spaces = %v, want exit 2 with a short message", r)
	}
}

// TestStoredKeysStayReadable: keys stored before spec §12 (here written with
// SQL) are found by status and retry exactly as typed, even where today's
// canon would spell them differently, and list and status escape control
// characters in what they print.
func TestStoredKeysStayReadable(t *testing.T) {
	db := newDB(t)
	esc := "gemini:batches/t\x1b[31mred"
	long := "gemini:batches/" + strings.Repeat("l", 600)
	storeRaw(t, db, esc, "pending", "boom\x1b[2J\x07 cleared your screen")
	storeRaw(t, db, "gemini:batches/nul\x00x", "pending", "")
	storeRaw(t, db, "gemini:batches/bad\xff", "pending", "")
	storeRaw(t, db, long, "dead", "gone")
	storeRaw(t, db, "gemini:BATCHES/old", "dead", "an older canon kept the case") // Key() would give gemini:batches/old

	r := gemrecon(t, "--db", db, "list")
	wantCode(t, r, exitOK)
	if strings.ContainsAny(r.stdout, "\x1b\x00\x07\xff") {
		t.Errorf("list printed raw control characters or invalid UTF-8:\n%q", r.stdout)
	}
	for _, want := range []string{`"gemini:batches/t\x1b[31mred"`, `"gemini:batches/nul\x00x"`, `"gemini:batches/bad\xff"`, long, "gemini:BATCHES/old", `"boom\x1b[2J\a cleared your screen"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list lacks %q:\n%s", want, r.stdout)
		}
	}

	r = gemrecon(t, "--db", db, "status", esc)
	wantCode(t, r, exitNotDone)
	if strings.ContainsAny(r.stdout, "\x1b\x07") || !strings.Contains(r.stdout, `"gemini:batches/t\x1b[31mred"`) || !strings.Contains(r.stdout, `"boom\x1b[2J\a cleared your screen"`) {
		t.Errorf("status of a key with ESC printed:\n%q\nwant the key and the error escaped", r.stdout)
	}
	r = gemrecon(t, "--db", db, "status", "--json", esc)
	wantCode(t, r, exitNotDone)
	if strings.ContainsAny(r.stdout, "\x1b\x07") || !strings.Contains(r.stdout, `\u001b[31mred`) {
		t.Errorf("status --json printed %q, want JSON escapes", r.stdout)
	}
	// Over today's limit, but stored: found, not refused.
	r = gemrecon(t, "--db", db, "status", long)
	wantCode(t, r, exitDead)
	// Stored under a spelling today's canon changes: found exactly as typed.
	r = gemrecon(t, "--db", db, "status", "gemini:BATCHES/old")
	wantCode(t, r, exitDead)
	if !strings.Contains(r.stdout, "gemini:BATCHES/old") {
		t.Errorf("status gemini:BATCHES/old printed %q, want the stored key", r.stdout)
	}

	r = gemrecon(t, "--db", db, "retry", long, "gemini:BATCHES/old")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "gemini:BATCHES/old: pending, due now") || !strings.Contains(r.stdout, long+": pending, due now") {
		t.Errorf("retry of stored keys printed %q, want both pending", r.stdout)
	}
	r = gemrecon(t, "--db", db, "retry", "batches/"+strings.Repeat("n", 600))
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "none could be") {
		t.Errorf("retry of an unknown over-long name: stderr %q, want it to say no such key could be recorded", r.stderr)
	}
}

// TestRetryEscapesStoredKeysInErrors: retry's refusals quote a stored key
// with a control character (spec §12: error texts escape them) — the
// sink's error text included, which names the key again — and quote at most
// canon.MaxQuoted bytes of a name over the limit, instead of printing it
// whole, twice.
func TestRetryEscapesStoredKeysInErrors(t *testing.T) {
	db := newDB(t)
	esc := "gemini:batches/t\x1b[31mred"
	storeRaw(t, db, esc, "pending", "")
	nul := "gemini:batches/nul\x00x"
	storeRaw(t, db, nul, "done", "")

	r := gemrecon(t, "--db", db, "retry", esc, nul, "batches/un\x07known")
	wantCode(t, r, exitUsage) // the last could never be a key (spec §12)
	if strings.ContainsAny(r.stderr, "\x1b\x00\x07") {
		t.Errorf("retry printed raw control characters:\n%q", r.stderr)
	}
	for _, want := range []string{
		`sqlite sink: retry "gemini:batches/t\x1b[31mred": state is pending: key is not dead`,
		`sqlite sink: retry "gemini:batches/nul\x00x": state is done: key is not dead`,
		`sqlite sink: retry "gemini:batches/un\aknown": key not found`,
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("retry's stderr lacks %q:\n%s", want, r.stderr)
		}
	}

	r = gemrecon(t, "--db", db, "retry", "batches/"+strings.Repeat("n", 100_000))
	wantCode(t, r, exitUsage)
	if len(r.stderr) > 1000 || !strings.Contains(r.stderr, "none could be") {
		t.Errorf("retry of an unknown 100 KB name: stderr of %d bytes %.300q…, want a short one that says no such key could be recorded", len(r.stderr), r.stderr)
	}
}

// TestRetryOfANameNoKeyCanBeIsAUsageError: retry of a name that spec §12
// refuses and that no stored key has is exit 2, as status of it is (it can
// never be retried: no sighting can record it); the other keys given are
// still retried. An unknown name that could be a key stays exit 1.
func TestRetryOfANameNoKeyCanBeIsAUsageError(t *testing.T) {
	db := newDB(t)
	storeRaw(t, db, "gemini:batches/d1", "dead", "")
	r := gemrecon(t, "--db", db, "retry", "batches/d1", "batches/")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stdout, "gemini:batches/d1: pending, due now") {
		t.Errorf("retry printed %q, want batches/d1 sent back to pending", r.stdout)
	}
	if !strings.Contains(r.stderr, "names a collection") || !strings.Contains(r.stderr, "1 of 2 key(s) could not be retried (1 of them names that no key can have)") {
		t.Errorf("retry's stderr = %q, want the refused name and the count", r.stderr)
	}
	r = gemrecon(t, "--db", db, "status", "batches/d1")
	wantCode(t, r, exitNotDone)

	r = gemrecon(t, "--db", db, "retry", "batches/never-seen")
	wantCode(t, r, exitFatal)
}
