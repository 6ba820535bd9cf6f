package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// TestMigration4FillsBatchState: rows stored before version 4 get their
// batch state from their payload ("state", "metadata.state", "data.state",
// else a batch.* event type, normalised as canon does), poll-first rows are
// confirmed, and a row whose payload cannot be read (not JSON, no state, no
// payload) is left unknown — the migration never fails on a payload.
func TestMigration4FillsBatchState(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v3.db")
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 4 || ms[3].MinReader != ms[2].MinReader {
		t.Fatalf("migration 4 must exist and keep min_reader %d (additive), got %+v", ms[2].MinReader, ms[3])
	}
	db, err := openDB(path, sink.DefaultBusyTimeout, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:3] {
		for _, q := range []string{m.SQL, fmt.Sprintf("PRAGMA user_version = %d", m.Version)} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", m.Name, err)
			}
		}
		if _, err := db.ExecContext(ctx, upsertMinReader, m.MinReader); err != nil {
			t.Fatal(err)
		}
	}
	rows := []struct {
		key, source string
		payload     *string
		wantState   string
	}{
		{"gemini:batches/a", "poll", ptr(`{"name":"batches/a","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`), "SUCCEEDED"},
		{"gemini:batches/b", "poll", ptr(`{"name":"x","state":"JOB_STATE_CANCELED"}`), "CANCELLED"},
		{"gemini:batches/c", "webhook", ptr(`{"type":"batch.failed","data":{"id":"c"}}`), "FAILED"},
		{"gemini:batches/d", "webhook", ptr(`{"type":"batch.completed","data":{"id":"d"}}`), ""},
		{"gemini:batches/e", "webhook", ptr(`{"data":{"id":"e","state":"expired"}}`), "EXPIRED"},
		{"gemini:batches/f", "webhook", ptr(`not json {`), ""},
		{"gemini:batches/g", "webhook", ptr(`[1,2]`), ""},
		{"gemini:batches/h", "webhook", ptr(`{"state":5,"type":"batch.expired"}`), "EXPIRED"},
		{"gemini:batches/i", "webhook", ptr(`{"type":"interaction.completed","name":"i"}`), ""},
		{"gemini:batches/j", "webhook", nil, ""},
		{"gemini:batches/k", "webhook", ptr("\xff\xfe"), ""},
		{"gemini:batches/l", "webhook", ptr(`{"type":"BATCH.Succeeded","data":{"id":"l"}}`), "SUCCEEDED"},
	}
	for _, r := range rows {
		if _, err := db.ExecContext(ctx, `INSERT INTO gemrecon_keys (key, state, first_source, sources, first_seen_at, last_seen_at, due_at)
			VALUES (?1, 'done', ?2, ',' || ?2 || ',', 1, 1, 1)`, r.key, r.source); err != nil {
			t.Fatal(err)
		}
		if r.payload != nil {
			if _, err := db.ExecContext(ctx, `INSERT INTO gemrecon_payloads (key, payload, payload_sha) VALUES (?, ?, x'00')`,
				r.key, []byte(*r.payload)); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()

	s, err := Open(ctx, path, sink.Options{})
	if err != nil {
		t.Fatalf("Open (migrating 3 → %d): %v", len(ms), err)
	}
	defer s.Close()
	for _, r := range rows {
		e, err := s.Get(ctx, r.key)
		if err != nil {
			t.Fatal(err)
		}
		if e.BatchState != r.wantState || e.Confirmed != (r.source == "poll") {
			t.Errorf("%s (%v): batch state %q, confirmed %v; want %q, %v", r.key, r.payload, e.BatchState, e.Confirmed, r.wantState, r.source == "poll")
		}
		if r.source == "webhook" && r.payload != nil && string(e.Webhook) != *r.payload {
			t.Errorf("%s: Webhook = %q, want the stored body", r.key, e.Webhook)
		}
	}
	var mr int
	if err := s.db.rdb.QueryRowContext(ctx, `SELECT value FROM gemrecon_meta WHERE name = 'min_reader'`).Scan(&mr); err != nil || mr != ms[2].MinReader {
		t.Fatalf("min_reader = %d, %v; want %d (unchanged: the migration is additive)", mr, err, ms[2].MinReader)
	}
}

func ptr(s string) *string { return &s }
