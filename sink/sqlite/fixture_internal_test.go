package sqlite

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// fixtureV1 is a database written by schema version 1 (before retries and
// the fenced counter), committed under testdata so that every later build
// proves it still upgrades it.
const fixtureV1 = "../../testdata/sink/schema-v1.db"

// TestWriteFixtureV1 regenerates the fixture: GEMRECON_WRITE_FIXTURE=1 go test -run TestWriteFixtureV1
func TestWriteFixtureV1(t *testing.T) {
	if os.Getenv("GEMRECON_WRITE_FIXTURE") == "" {
		t.Skip("set GEMRECON_WRITE_FIXTURE=1 to regenerate " + fixtureV1)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), "v1.db")
	db, err := sql.Open("sqlite", "file:"+tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()
	stmts := []string{
		ms[0].SQL,
		"PRAGMA user_version = 1",
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	rows := []struct {
		key, state, first, sources string
		attempts, token, seen      int64
		lease, next, done          int64
		lastErr                    string
	}{
		{"gemini:batches/pending", "pending", "poll", ",poll,", 0, 0, 1, 0, t0, 0, ""},
		{"gemini:batches/done", "done", "webhook", ",webhook,poll,", 1, 1, 3, 0, 0, t0 + int64(time.Minute), ""},
		{"gemini:batches/dead", "dead", "poll", ",poll,", 10, 10, 2, 0, 0, 0, "exit status 1"},
		{"gemini:batches/claimed", "claimed", "webhook", ",webhook,", 2, 2, 1, t0 + int64(time.Hour), 0, 0, "lease expired"},
	}
	for _, r := range rows {
		if _, err := db.Exec(`INSERT INTO gemrecon_keys (key, state, attempts, token, first_source, sources, seen_count,
			first_seen_at, last_seen_at, lease_owner, lease_until, next_attempt_at, done_at, last_error, payload, payload_sha)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.key, r.state, r.attempts, r.token, r.first, r.sources, r.seen, t0, t0, "", r.lease, r.next, r.done, r.lastErr,
			[]byte(`{"name":"`+r.key[len("gemini:"):]+`"}`), sink.PayloadHash([]byte(`{"name":"`+r.key[len("gemini:"):]+`"}`))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`INSERT INTO gemrecon_meta (name, value) VALUES ('max_lookback_ns', ?)`, int64(72*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("VACUUM INTO '" + tmp + ".out'"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(tmp + ".out")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fixtureV1, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var v int
	if err := db.QueryRowContext(context.Background(), "PRAGMA user_version").Scan(&v); err != nil || v != 1 {
		t.Fatalf("user_version = %d, %v", v, err)
	}
}
