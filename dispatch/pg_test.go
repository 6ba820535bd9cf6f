package dispatch

// The backends the multi-process tests (R1, R3) run on: a SQLite file, and a
// private schema on the PostgreSQL server named by GEMRECON_TEST_POSTGRES
// (those subtests skip, saying how to run them, when it is unset).

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
	"github.com/gemrecon/gemrecon/sink/postgres"
)

// backend names a sink backend and makes a fresh, empty database on it.
type backend struct {
	name string
	// newDB returns what GDT_DB (and openDB) take: a SQLite file path in
	// dir, or a postgres:// DSN whose search_path is a schema of its own.
	newDB func(t *testing.T, dir string) string
}

// backends are the backends R1 and R3 run on, each as a subtest.
func backends() []backend {
	return []backend{
		{name: "sqlite", newDB: func(_ *testing.T, dir string) string { return filepath.Join(dir, "gemrecon.db") }},
		{name: "postgres", newDB: func(t *testing.T, _ string) string { return pgtest.Schema(t) }},
	}
}

// forEachBackend runs f as a subtest per backend, with a fresh database and
// a fresh directory (for effect logs).
func forEachBackend(t *testing.T, f func(t *testing.T, db, dir string)) {
	t.Helper()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			f(t, b.newDB(t, dir), dir)
		})
	}
}

// isSQLite reports whether db (a GDT_DB value) names a SQLite file.
func isSQLite(db string) bool { return !dial.IsPostgres(db) }

// openDB opens (creating) the sink db names, for the parent's own use, with
// the same options the child processes use.
func openDB(t *testing.T, db string) sink.Sink {
	t.Helper()
	if isSQLite(db) {
		return openAt(t, db)
	}
	s, err := postgres.Open(context.Background(), db, sink.Options{BusyTimeout: 30 * time.Second}, postgres.WithLogger(quietLogger()))
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	return s
}
