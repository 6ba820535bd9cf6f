package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestMigration5PartialDueIndexes: a version-4 database (one due index over
// every key) migrates to the two partial indexes, keeps min_reader, and its
// due keys, pending and expired claims alike, are still found in order.
func TestMigration5PartialDueIndexes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v4.db")
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 5 || ms[4].MinReader != ms[3].MinReader {
		t.Fatalf("migration 5 must exist and keep min_reader %d (older binaries keep working), got %+v", ms[3].MinReader, ms[4])
	}
	db, err := openDB(path, sink.DefaultBusyTimeout, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:4] {
		for _, q := range []string{m.SQL, fmt.Sprintf("PRAGMA user_version = %d", m.Version)} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
		}
		if _, err := db.ExecContext(ctx, upsertMinReader, m.MinReader); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UnixNano()
	rows := []struct {
		key, state string
		due        int64
	}{
		{"gemini:batches/p-late", "pending", now + int64(time.Hour)},
		{"gemini:batches/p-due", "pending", now - 3},
		{"gemini:batches/c-expired", "claimed", now - 2},
		{"gemini:batches/c-live", "claimed", now + int64(time.Hour)},
		{"gemini:batches/d", "done", 1},
		{"gemini:batches/x", "dead", 0},
	}
	for _, r := range rows {
		next, until := int64(0), int64(0)
		if r.state == "pending" {
			next = r.due
		}
		if r.state == "claimed" {
			until = r.due
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO gemrecon_keys (key, state, first_source, sources, first_seen_at, last_seen_at,
			next_attempt_at, lease_until, due_at, attempts, token, lease_owner)
			VALUES (?1, ?2, 'poll', ',poll,', 1, 1, ?3, ?4, ?5, 1, 1, 'w')`, r.key, r.state, next, until, r.due); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	s, err := Open(ctx, path, sink.Options{})
	if err != nil {
		t.Fatalf("Open (migrating 4 → %d): %v", len(ms), err)
	}
	defer s.Close()
	var idx []string
	r, err := s.db.rdb.QueryContext(ctx, `SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'gemrecon_keys' AND sql IS NOT NULL ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var n string
		r.Scan(&n)
		idx = append(idx, n)
	}
	r.Close()
	if !slices.Equal(idx, []string{"gemrecon_keys_due", "gemrecon_keys_leases"}) {
		t.Errorf("indexes after migration 5 = %q, want gemrecon_keys_due and gemrecon_keys_leases", idx)
	}
	due, err := s.Due(ctx, 0, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"gemini:batches/p-due", "gemini:batches/c-expired"}; !slices.Equal(due, want) {
		t.Errorf("Due after migration 5 = %q, want %q", due, want)
	}
	if n, err := s.Purge(ctx, time.Hour); err != nil || len(n) != 1 { // done at 1 ns after the epoch
		t.Errorf("Purge of the done key = %q, %v; want 1", n, err)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.ByState[sink.StatePending] != 2 || st.ByState[sink.StateClaimed] != 2 || st.ByState[sink.StateDead] != 1 || st.ByState[sink.StateDone] != 0 {
		t.Errorf("Stats.ByState after purge = %v", st.ByState)
	}
	var mr int
	if err := s.db.rdb.QueryRowContext(ctx, `SELECT value FROM gemrecon_meta WHERE name = 'min_reader'`).Scan(&mr); err != nil || mr != ms[3].MinReader {
		t.Fatalf("min_reader = %d, %v; want %d (unchanged)", mr, err, ms[3].MinReader)
	}
}

// TestPageSize: a database the sink creates has PageSize pages; one
// created with SQLite's default keeps its 4 KiB pages and works.
func TestPageSize(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	pageSize := func(s *Sink) int {
		var n int
		if err := s.db.rdb.QueryRowContext(ctx, "PRAGMA page_size").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	s, err := Open(ctx, filepath.Join(dir, "new.db"), sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pageSize(s); got != PageSize {
		t.Errorf("new database: page size %d, want %d", got, PageSize)
	}
	s.Close()

	old := filepath.Join(dir, "old.db")
	db, err := sql.Open("sqlite", "file:"+old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "PRAGMA page_size = 4096; PRAGMA journal_mode = WAL; CREATE TABLE x (a); DROP TABLE x"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err = Open(ctx, old, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := pageSize(s); got != 4096 {
		t.Errorf("existing database: page size %d, want its own 4096", got)
	}
	if _, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll}, sink.ClaimRequest{Owner: "w", Lease: time.Minute}); err != nil || c == nil {
		t.Fatal(c, err)
	} else if err := s.Complete(ctx, c.Key, c.Token); err != nil {
		t.Fatal(err)
	}
}
