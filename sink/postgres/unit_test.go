package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gemrecon/gemrecon/sink"
)

// These tests need no server.

func TestMigrationsEmbedded(t *testing.T) {
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 || SchemaVersion() != len(ms) {
		t.Fatalf("migrations() = %d, SchemaVersion() = %d; want the same, > 0", len(ms), SchemaVersion())
	}
	for i, m := range ms {
		if m.Version != i+1 {
			t.Errorf("migration %d = %s, version %d, want %d", i, m.Name, m.Version, i+1)
		}
	}
	if !strings.Contains(ms[0].SQL, "CREATE TABLE gemrecon_keys") {
		t.Errorf("migration %s does not create gemrecon_keys", ms[0].Name)
	}
}

func TestOpenBadDSN(t *testing.T) {
	tests := []struct {
		dsn, want string
	}{
		{"postgres://u@127.0.0.1:1/db?pool_max_conns=zero", "pool_max_conns"},
		{"postgres://u@127.0.0.1:1/db?pool_max_conns=0", "pool_max_conns"},
		{"postgres://%zz", "the connection string cannot be used"},
	}
	for _, tt := range tests {
		_, err := Open(context.Background(), tt.dsn, sink.Options{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Open(%q) error = %v, want one mentioning %q", tt.dsn, err, tt.want)
		}
	}
}

func TestFirstSchema(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`gemrecon, public`, "gemrecon"},
		{`"$user", public`, ""},
		{`$user, public`, ""},
		{`"My Schema",public`, "My Schema"},
		{`"we""ird"`, `we"ird`},
		{``, ""},
	} {
		if got := firstSchema(tc.in); got != tc.want {
			t.Errorf("firstSchema(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A search_path in the DSN whose first schema does not exist yet: a writing
// Open creates it and puts the tables there, not in the next schema.
func TestSearchPathSchemaIsCreated(t *testing.T) {
	base := baseDSN(t)
	schema := "gemrecon_search_path_test"
	admin := adminConn(t, base)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	s := openDSN(t, withParam(base, "search_path", schema+",public"), sink.Options{})
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/sp", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	var where string
	if err := admin.QueryRow(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = 'gemrecon_keys' AND table_schema = $1`, schema).Scan(&where); err != nil {
		t.Fatalf("gemrecon_keys is not in schema %s: %v", schema, err)
	}
}

// TestUnknownOutcomeOfConnectFailures: a FATAL error while connecting (a
// server starting up or out of connection slots), met while acquiring a
// connection, is not a lost reply: nothing was sent, and settling it would
// only wait for a server that refuses connections. A FATAL error in place
// of a statement's reply is (TestCompleteCommittedThenFatal).
func TestUnknownOutcomeOfConnectFailures(t *testing.T) {
	fatal := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P03", Message: "the database system is starting up"}
	if unknownOutcome(acquireError{err: fatal}) {
		t.Error("a FATAL error acquiring a connection counts as an unknown outcome; want known (nothing was sent)")
	}
	if !unknownOutcome(fmt.Errorf("complete: %w", fatal)) {
		t.Error("a FATAL error in place of a reply counts as a known outcome; want unknown")
	}
	if unknownOutcome(&pgconn.PgError{Severity: "ERROR", Code: "40001"}) {
		t.Error("an ERROR reply counts as an unknown outcome; want known (rolled back)")
	}
}
