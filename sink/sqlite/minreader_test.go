package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// metaValue reads one gemrecon_meta value of a closed database.
func metaValue(t *testing.T, path, name string) int {
	t.Helper()
	var v int
	sqlitetest.QueryRow(t, sqlitetest.Immutable(path), `SELECT value FROM gemrecon_meta WHERE name = ?`, []any{name}, &v)
	return v
}

// Rolling upgrades (spec §3): a newer gemrecon (simulated by extra
// migrations) adds an additive migration; this binary, which does not know
// it, opens the database and works without migrating it, writing and
// read-only. Then the newer gemrecon applies one that raises the minimum
// reader: this binary refuses it, before touching the file when the header
// shows it (checkFile) and inside its first transaction when the migration is
// still only in the WAL, naming both versions.
func TestMinimumReader(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sink.db")
	known := sqlite.SchemaVersion()
	s, err := openRW(path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sinktest.Use(t, s, "gemini:batches/old-binary-first")
	s.Close()
	minReader := metaValue(t, path, "min_reader")
	if minReader < 1 || minReader > known {
		t.Fatalf("min_reader = %d, want 1..%d", minReader, known)
	}

	additive := sqlite.WithExtraMigration(fmt.Sprintf("%03d_future_column.sql", known+1),
		fmt.Sprintf("-- min_reader: %d\nALTER TABLE gemrecon_keys ADD COLUMN future TEXT NOT NULL DEFAULT '';\nCREATE TABLE gemrecon_future (id INTEGER PRIMARY KEY);\n", minReader))
	// A step older binaries must not live with (say, a table every write
	// must keep in step): it raises the minimum reader. (The simulated newer
	// binary runs this binary's queries, so the step leaves them working.)
	breaking := sqlite.WithExtraMigration(fmt.Sprintf("%03d_future_ledger.sql", known+2),
		fmt.Sprintf("-- min_reader: %d\nCREATE TABLE gemrecon_future_ledger (key TEXT PRIMARY KEY NOT NULL) WITHOUT ROWID;\n", known+2))

	newer, err := sqlite.Open(ctx, path, sink.Options{}, quiet, additive)
	if err != nil {
		t.Fatalf("newer binary, additive migration: %v", err)
	}
	sinktest.Use(t, newer, "gemini:batches/newer-binary")
	newer.Close()
	if v, mr := sqlitetest.UserVersion(t, sqlitetest.Immutable(path)), metaValue(t, path, "min_reader"); v != known+1 || mr != minReader {
		t.Fatalf("after the additive migration: version %d, min_reader %d; want %d, %d", v, mr, known+1, minReader)
	}

	// This binary uses the newer, compatible schema as it is.
	s, err = openRW(path, sink.Options{})
	if err != nil {
		t.Fatalf("this binary on a newer schema whose minimum reader is %d: %v", minReader, err)
	}
	sinktest.Use(t, s, "gemini:batches/old-binary-after")
	s.Close()
	ro, err := openRW(path, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of the newer, compatible schema: %v", err)
	}
	if e, err := ro.Get(ctx, "gemini:batches/newer-binary"); err != nil || e.State != sink.StateDone {
		t.Fatalf("read-only Get = %+v, %v", e, err)
	}
	ro.Close()
	if v := sqlitetest.UserVersion(t, sqlitetest.Immutable(path)); v != known+1 {
		t.Fatalf("version after this binary used it = %d, want %d (never migrated down)", v, known+1)
	}

	// The newer binary raises the minimum reader, and keeps the database
	// open: its migration is in the WAL, the header still says known+1.
	newer, err = sqlite.Open(ctx, path, sink.Options{}, quiet, additive, breaking)
	if err != nil {
		t.Fatalf("newer binary, breaking migration: %v", err)
	}
	wantRefused := func(what string, err error) {
		t.Helper()
		oneLine(t, what, err, path, fmt.Sprintf("schema version %d needs a gemrecon that knows schema version %d or later", known+2, known+2),
			fmt.Sprintf("knows versions up to %d", known), "upgrade gemrecon")
		if !errors.Is(err, sink.ErrSchemaTooNew) {
			t.Fatalf("%s: %v is not ErrSchemaTooNew", what, err)
		}
	}
	if v := sqlitetest.UserVersion(t, sqlitetest.Immutable(path)); v != known+1 {
		t.Logf("the header shows version %d already (checkpointed)", v)
	}
	_, err = openRW(path, sink.Options{})
	wantRefused("Open while the breaking migration is in the WAL", err)
	_, err = openRW(path, sink.Options{ReadOnly: true})
	wantRefused("read-only Open while the breaking migration is in the WAL", err)
	newer.Close()

	// Closed: the header shows it, and the refusal changes nothing.
	if v := sqlitetest.UserVersion(t, sqlitetest.Immutable(path)); v != known+2 {
		t.Fatalf("header version after close = %d, want %d", v, known+2)
	}
	before := snapshot(t, path)
	_, err = openRW(path, sink.Options{})
	wantRefused("Open of the closed database", err)
	_, err = openRW(path, sink.Options{ReadOnly: true})
	wantRefused("read-only Open of the closed database", err)
	if after := snapshot(t, path); after != before {
		t.Fatalf("a refused Open changed the files: %q → %q", before, after)
	}

	// Both steps only in the WAL of a database whose header shows this
	// binary's version: the check inside the first transaction refuses.
	path = filepath.Join(t.TempDir(), "wal.db")
	s, err = openRW(path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	newer, err = sqlite.Open(ctx, path, sink.Options{}, quiet, additive, breaking)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Close()
	if v := sqlitetest.UserVersion(t, sqlitetest.Immutable(path)); v != known {
		t.Fatalf("header version = %d, want %d (the migrations only in the WAL)", v, known)
	}
	_, err = openRW(path, sink.Options{})
	wantRefused("Open with the migrations only in the WAL", err)
}

// A migration file must start with its minimum reader, between 1 and its
// own version, never below its predecessor's.
func TestMigrationMinReaderLine(t *testing.T) {
	next := sqlite.SchemaVersion() + 1
	for _, text := range []string{
		"CREATE TABLE x (a);\n",
		"-- min_reader:\nCREATE TABLE x (a);\n",
		"-- min_reader: 0\nCREATE TABLE x (a);\n",
		fmt.Sprintf("-- min_reader: %d\nCREATE TABLE x (a);\n", next+1),
	} {
		if err := sqlite.ParseMigration(fmt.Sprintf("%03d_x.sql", next), text); err == nil || !strings.Contains(err.Error(), "min_reader") {
			t.Errorf("migration %q: error %v, want one about its min_reader line", text, err)
		}
	}
	if err := sqlite.ParseMigration(fmt.Sprintf("%03d_x.sql", next), fmt.Sprintf("-- min_reader: %d\nCREATE TABLE x (a);\n", next)); err != nil {
		t.Errorf("a valid migration: %v", err)
	}
	falling := fstest.MapFS{}
	for i, mr := range []int{1, 2, 1} {
		falling[fmt.Sprintf("migrations/%03d_x.sql", i+1)] = &fstest.MapFile{Data: fmt.Appendf(nil, "-- min_reader: %d\n", mr)}
	}
	if _, err := sink.LoadMigrations(falling); err == nil || !strings.Contains(err.Error(), "below its predecessor") {
		t.Errorf("a minimum reader below its predecessor's: LoadMigrations = %v", err)
	}
}
