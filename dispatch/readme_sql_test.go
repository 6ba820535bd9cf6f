package dispatch

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// readmeSQL returns the --sql example of the README (the ```sql block after
// the "readme-test: sql-example" marker).
func readmeSQL(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "<!-- readme-test: sql-example")
	if i < 0 {
		t.Fatal("README.md has no sql-example marker")
	}
	text = text[i:]
	start := strings.Index(text, "```sql\n")
	end := strings.Index(text[start+len("```sql\n"):], "```")
	if start < 0 || end < 0 {
		t.Fatal("no ```sql block after the sql-example marker")
	}
	return text[start+len("```sql\n") : start+len("```sql\n")+end]
}

// The README's --sql example still works (spec §9.3 changed what
// @operation is): on PostgreSQL, for a key first seen by webhook, which is
// confirmed with the API (the stand-in) before the script runs, so that
// @operation is the API's operation with its batchStats and @batch_state
// the API's state.
func TestReadmeSQLExampleWorks(t *testing.T) {
	db := pgtest.Schema(t)
	ctx := context.Background()
	api := geminifake.New(geminifake.Options{APIKey: "k"})
	if _, err := api.Start(""); err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	api.Add(geminifake.Batch{Name: "batches/bill-1", State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Hour),
		EndTime: time.Now(), RequestCount: 4, SuccessfulCount: 3, FailedCount: 1})

	s, err := dial.Open(ctx, db, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	app, err := sql.Open("pgx", db)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := app.ExecContext(ctx, `
		CREATE TABLE invoices (id text PRIMARY KEY, status text NOT NULL DEFAULT 'open', amount_due bigint NOT NULL DEFAULT 0);
		CREATE TABLE ledger_entries (invoice_id text NOT NULL, kind text NOT NULL, amount bigint NOT NULL,
			key text NOT NULL, token bigint NOT NULL, UNIQUE (invoice_id, kind));
		CREATE TABLE outbox (aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL);
		INSERT INTO invoices (id) VALUES ('batches/bill-1');`); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "bill-batch.sql")
	if err := os.WriteFile(script, []byte(readmeSQL(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := sqlscript.Load(script)
	if err != nil {
		t.Fatalf("the README's script: %v", err)
	}
	pc := poller.DefaultConfig()
	pc.APIKey, pc.BaseURL = "k", api.URL()
	p, err := poller.New(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Sink: s, SQL: q, Confirm: true, API: p, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/bill-1", Source: sink.SourceWebhook,
		Payload: []byte(`{"type":"batch.succeeded","data":{"id":"bill-1"}}`), State: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if sum, err := d.Drain(ctx); err != nil || sum.OK != 1 {
		t.Fatalf("Drain = %+v, %v", sum, err)
	}
	var amount, due int64
	var status, state string
	if err := app.QueryRowContext(ctx, `SELECT l.amount, i.amount_due, i.status, o.payload ->> 'state'
		FROM ledger_entries l JOIN invoices i ON i.id = l.invoice_id JOIN outbox o ON o.aggregate_id = i.id`).
		Scan(&amount, &due, &status, &state); err != nil {
		t.Fatal(err)
	}
	if amount != 3 || due != 3 || status != "billed" || state != "SUCCEEDED" {
		t.Fatalf("ledger amount %d, invoice due %d %s, outbox state %s; want 3, 3 billed, SUCCEEDED", amount, due, status, state)
	}
}
