package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// withExtraMigration makes Open know one more migration after the embedded
// ones, as a newer gemrecon would (one call per version, in order).
func withExtraMigration(name, text string) Option {
	return func(c *config) {
		m, err := sink.ParseMigration(name, text)
		if err != nil {
			panic(err)
		}
		if c.migrations == nil {
			c.migrations, _ = migrations()
		}
		c.migrations = append(c.migrations, m)
	}
}

func minReaderIn(t *testing.T, schema string) int {
	t.Helper()
	var v int
	if err := adminConn(t, baseDSN(t)).QueryRow(context.Background(),
		`SELECT value FROM `+schema+`.gemrecon_counters WHERE name = 'min_reader'`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func schemaVersionIn(t *testing.T, schema string) int {
	t.Helper()
	var v int
	if err := adminConn(t, baseDSN(t)).QueryRow(context.Background(),
		`SELECT max(version) FROM `+schema+`.gemrecon_schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Rolling upgrades (spec §3) on PostgreSQL: a newer gemrecon (simulated by
// extra migrations) applies an additive migration; this binary opens the
// database and works without migrating it, writing and read-only. After a
// migration that raises the minimum reader, this binary refuses it, naming
// both versions.
func TestMinimumReader(t *testing.T) {
	ctx := context.Background()
	dsn, schema := testSchema(t)
	known := SchemaVersion()
	s, err := Open(ctx, dsn, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sinktest.Use(t, s, "gemini:batches/old-first")
	s.Close()
	minReader := minReaderIn(t, schema)
	if minReader < 1 || minReader > known {
		t.Fatalf("min_reader = %d, want 1..%d", minReader, known)
	}
	additive := withExtraMigration(fmt.Sprintf("%04d_future_column.sql", known+1),
		fmt.Sprintf("-- min_reader: %d\nALTER TABLE gemrecon_keys ADD COLUMN future text NOT NULL DEFAULT '';\nCREATE TABLE gemrecon_future (id bigint PRIMARY KEY);\n", minReader))
	// A step older binaries must not live with; the simulated newer binary
	// runs this binary's queries, so it leaves them working.
	breaking := withExtraMigration(fmt.Sprintf("%04d_future_ledger.sql", known+2),
		fmt.Sprintf("-- min_reader: %d\nCREATE TABLE gemrecon_future_ledger (key text PRIMARY KEY);\n", known+2))

	newer, err := Open(ctx, dsn, sink.Options{}, additive)
	if err != nil {
		t.Fatalf("newer binary, additive migration: %v", err)
	}
	sinktest.Use(t, newer, "gemini:batches/newer")
	newer.Close()
	if v, mr := schemaVersionIn(t, schema), minReaderIn(t, schema); v != known+1 || mr != minReader {
		t.Fatalf("after the additive migration: version %d, min_reader %d; want %d, %d", v, mr, known+1, minReader)
	}

	s, err = Open(ctx, dsn, sink.Options{})
	if err != nil {
		t.Fatalf("this binary on a newer schema whose minimum reader is %d: %v", minReader, err)
	}
	sinktest.Use(t, s, "gemini:batches/old-after")
	s.Close()
	ro, err := Open(ctx, dsn, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of the newer, compatible schema: %v", err)
	}
	if e, err := ro.Get(ctx, "gemini:batches/newer"); err != nil || e.State != sink.StateDone {
		t.Fatalf("read-only Get = %+v, %v", e, err)
	}
	ro.Close()
	if v := schemaVersionIn(t, schema); v != known+1 {
		t.Fatalf("version after this binary used it = %d, want %d", v, known+1)
	}

	newer, err = Open(ctx, dsn, sink.Options{}, additive, breaking)
	if err != nil {
		t.Fatalf("newer binary, breaking migration: %v", err)
	}
	newer.Close()
	for _, readOnly := range []bool{false, true} {
		_, err := Open(ctx, dsn, sink.Options{ReadOnly: readOnly})
		if !errors.Is(err, sink.ErrSchemaTooNew) {
			t.Fatalf("Open(read-only=%v) after the breaking migration = %v, want ErrSchemaTooNew", readOnly, err)
		}
		for _, w := range []string{fmt.Sprintf("schema version %d needs a gemrecon that knows schema version %d or later", known+2, known+2),
			fmt.Sprintf("knows versions up to %d", known), "upgrade gemrecon"} {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Open(read-only=%v) error %q, want it to say %q", readOnly, err, w)
			}
		}
	}
}

func TestMigrationMinReaderLine(t *testing.T) {
	next := SchemaVersion() + 1
	for _, text := range []string{
		"CREATE TABLE x (a int);\n",
		"-- min_reader:\nCREATE TABLE x (a int);\n",
		"-- min_reader: 0\nCREATE TABLE x (a int);\n",
		fmt.Sprintf("-- min_reader: %d\nCREATE TABLE x (a int);\n", next+1),
	} {
		if _, err := sink.ParseMigration(fmt.Sprintf("%04d_x.sql", next), text); err == nil || !strings.Contains(err.Error(), "min_reader") {
			t.Errorf("migration %q: error %v, want one about its min_reader line", text, err)
		}
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if ms[0].MinReader != 1 {
		t.Errorf("0001's min_reader = %d, want 1", ms[0].MinReader)
	}
	falling := fstest.MapFS{}
	for i, mr := range []int{1, 2, 1} {
		falling[fmt.Sprintf("migrations/%04d_x.sql", i+1)] = &fstest.MapFile{Data: fmt.Appendf(nil, "-- min_reader: %d\n", mr)}
	}
	if _, err := sink.LoadMigrations(falling); err == nil || !strings.Contains(err.Error(), "below its predecessor") {
		t.Errorf("a minimum reader below its predecessor's: %v", err)
	}
}
