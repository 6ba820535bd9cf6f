package postgres

import (
	"context"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// TestMigration3FillsBatchState: rows stored before version 3 get their
// batch state from their payload ("state", "metadata.state", "data.state",
// else a batch.* event type, normalised as canon does), poll-first rows are
// confirmed, and a payload that cannot be read (not JSON, not UTF-8, no
// state) leaves it unknown — no payload can fail the migration. The
// minimum reader stays (additive).
func TestMigration3FillsBatchState(t *testing.T) {
	ctx := context.Background()
	dsn, schema := testSchema(t)
	old, err := Open(ctx, dsn, sink.Options{}, func(c *config) {
		ms, _ := migrations()
		c.migrations = ms[:2]
	})
	if err != nil {
		t.Fatal(err)
	}
	mrBefore := minReaderIn(t, schema)
	rows := []struct {
		key, source string
		payload     []byte
		wantState   string
	}{
		{"gemini:batches/a", "poll", []byte(`{"name":"batches/a","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`), "SUCCEEDED"},
		{"gemini:batches/b", "poll", []byte(`{"name":"x","state":"JOB_STATE_CANCELED"}`), "CANCELLED"},
		{"gemini:batches/c", "webhook", []byte(`{"type":"batch.failed","data":{"id":"c"}}`), "FAILED"},
		{"gemini:batches/d", "webhook", []byte(`{"type":"batch.completed","data":{"id":"d"}}`), ""},
		{"gemini:batches/e", "webhook", []byte(`{"data":{"id":"e","state":"expired"}}`), "EXPIRED"},
		{"gemini:batches/f", "webhook", []byte(`not json {`), ""},
		{"gemini:batches/g", "webhook", []byte(`[1,2]`), ""},
		{"gemini:batches/h", "webhook", []byte(`{"state":5,"type":"batch.expired"}`), "EXPIRED"},
		{"gemini:batches/i", "webhook", []byte(`{"type":"interaction.completed","name":"i"}`), ""},
		{"gemini:batches/j", "webhook", nil, ""},
		{"gemini:batches/k", "webhook", []byte("\xff\xfe"), ""},
		{"gemini:batches/l", "webhook", []byte(`{"type":"BATCH.Succeeded","data":{"id":"l"}}`), "SUCCEEDED"},
		{"gemini:batches/m", "webhook", []byte(`{"state":"\u0000"}`), ""},
	}
	admin := adminConn(t, baseDSN(t))
	for _, r := range rows {
		if _, err := admin.Exec(ctx, `INSERT INTO `+schema+`.gemrecon_keys
			(key, state, first_source, sources, first_seen_at, last_seen_at, done_at, payload)
			VALUES ($1, 'done', $2, ARRAY[$2], now(), now(), now(), $3)`, r.key, r.source, r.payload); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	s := openDSN(t, dsn, sink.Options{})
	if v := schemaVersionIn(t, schema); v != SchemaVersion() {
		t.Fatalf("schema version %d, want %d", v, SchemaVersion())
	}
	for _, r := range rows {
		e, err := s.Get(ctx, r.key)
		if err != nil {
			t.Fatal(err)
		}
		if e.BatchState != r.wantState || e.Confirmed != (r.source == "poll") {
			t.Errorf("%s (%q): batch state %q, confirmed %v; want %q, %v", r.key, r.payload, e.BatchState, e.Confirmed, r.wantState, r.source == "poll")
		}
		if r.source == "webhook" && string(e.Webhook) != string(r.payload) {
			t.Errorf("%s: Webhook = %q, want the stored body", r.key, e.Webhook)
		}
	}
	if mr := minReaderIn(t, schema); mr != mrBefore {
		t.Fatalf("min_reader = %d, want %d (unchanged: the migration is additive)", mr, mrBefore)
	}
}
