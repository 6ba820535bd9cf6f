package sinktest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// SQLDatabase is one database of a backend whose sink is a
// sink.SQLCompleter, as CompleteSQL needs it: sinks on it, and a connection
// of the test's own (the application's, not the sink's) to make and read
// the table the scripts write.
type SQLDatabase struct {
	// Open opens a sink on the database and arranges for it to be closed
	// when the test ends; each call opens a new sink on the same database.
	Open func(t *testing.T, opt sink.Options) sink.Sink
	// Exec runs statement on the test's own connection.
	Exec func(t *testing.T, statement string)
	// QueryRow scans the one row of query on the test's own connection.
	QueryRow func(t *testing.T, query string, dest ...any)
	// OperationName is the backend's SQL expression, for a script, of the
	// "name" member of the JSON text bound to @operation.
	OperationName string
}

// EffectsTable is the table CompleteSQL makes (with SQLDatabase.Exec) for
// its scripts to write, in SQL both backends accept. A row's n must stay
// below 2: a script that raises it twice fails.
const EffectsTable = `CREATE TABLE effects (key TEXT, token BIGINT, name TEXT, n INTEGER NOT NULL CHECK (n < 2))`

// SQLParams returns the parameters of a --sql script for c, with operation
// {"name":"batches/o'brien"}.
func SQLParams(c sink.Claim) map[string]any {
	return map[string]any{"key": c.Key, "token": c.Token, "name": "x", "operation": json.RawMessage(`{"name":"batches/o'brien"}`)}
}

// quote is s as an SQL string literal.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// CompleteSQL is the conformance suite of sink.SQLCompleter (spec §4), run
// by every backend on a fresh database: a script and the done mark commit
// together; a second run of a token no longer current is fenced and writes
// nothing; a failing script rolls back everything it wrote and leaves the
// key claimed under its token, for its holder to record the failure; an
// unknown key is ErrNotFound; and the fenced counter survives a restart.
func CompleteSQL(t *testing.T, db SQLDatabase) {
	ctx := context.Background()
	s := db.Open(t, sink.Options{})
	sc, ok := s.(sink.SQLCompleter)
	if !ok {
		t.Fatalf("%T is no sink.SQLCompleter", s)
	}
	db.Exec(t, EffectsTable)
	// Every statement uses parameters: all of them must be bound.
	script := `INSERT INTO effects (key, token, name, n) VALUES (@key, @token, ` + db.OperationName + `, 0);
		-- a comment; with a semicolon
		UPDATE effects SET n = n + 1 WHERE key = @key AND token = @token;`
	claim := func(key string) sink.Claim { t.Helper(); return Claimed(t, s, key) }
	// rows returns how many rows the key's scripts wrote, and how many of
	// them ran to the end (n = 1) with the name of the last.
	rows := func(t *testing.T, key string) (all, complete int, name string) {
		t.Helper()
		db.QueryRow(t, `SELECT count(*), coalesce(sum(CASE WHEN n = 1 THEN 1 ELSE 0 END), 0), coalesce(max(CASE WHEN n = 1 THEN name END), '')
			FROM effects WHERE key = `+quote(key), &all, &complete, &name)
		return all, complete, name
	}

	t.Run("done with the script", func(t *testing.T) {
		c := claim("gemini:batches/o'brien")
		if err := sc.CompleteSQL(ctx, c.Key, c.Token, script, SQLParams(c)); err != nil {
			t.Fatalf("CompleteSQL: %v", err)
		}
		if all, n, name := rows(t, c.Key); all != 1 || n != 1 || name != "batches/o'brien" {
			t.Fatalf("effects rows = %d (%d complete), name %q; want 1, %q", all, n, name, "batches/o'brien")
		}
		if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateDone {
			t.Fatalf("Get = %+v, %v; want done", e, err)
		}
		// A duplicate sighting finds it done.
		if rr, err := s.Record(ctx, sink.Sighting{Key: c.Key, Source: sink.SourcePoll}); err != nil || rr.State != sink.StateDone {
			t.Fatalf("Record after CompleteSQL = %+v, %v; want done", rr, err)
		}
		if err := sc.CompleteSQL(ctx, c.Key, c.Token, script, SQLParams(c)); !errors.Is(err, sink.ErrFenced) {
			t.Fatalf("second CompleteSQL error = %v, want ErrFenced", err)
		}
		if all, _, _ := rows(t, c.Key); all != 1 {
			t.Fatalf("effects rows after a fenced CompleteSQL = %d, want 1", all)
		}
	})

	for _, f := range []struct{ name, script string }{
		// The second statement violates the CHECK (n < 2).
		{"check", `INSERT INTO effects (key, token, n) VALUES (@key, @token, 1);
			UPDATE effects SET n = n + 1 WHERE key = @key;`},
		{"no such table", `INSERT INTO effects (key) VALUES (@key); INSERT INTO no_such_table VALUES (1);`},
	} {
		t.Run("script fails: "+f.name, func(t *testing.T) {
			c := claim("gemini:batches/bad-" + strings.ReplaceAll(f.name, " ", "-"))
			scriptErr := sc.CompleteSQL(ctx, c.Key, c.Token, f.script, SQLParams(c))
			if scriptErr == nil || errors.Is(scriptErr, sink.ErrFenced) {
				t.Fatalf("CompleteSQL with a failing script = %v, want the script's error", scriptErr)
			}
			if all, _, _ := rows(t, c.Key); all != 0 {
				t.Fatalf("effects rows of the failed script = %d; want 0 (rolled back)", all)
			}
			if e, err := s.Get(ctx, c.Key); err != nil || e.State != sink.StateClaimed || e.Token != c.Token {
				t.Fatalf("Get = %+v, %v; want still claimed with token %d", e, err, c.Token)
			}
			// The key is still claimed: its holder can record the failure.
			if st, err := s.Fail(ctx, c.Key, c.Token, sink.Failure{Cause: scriptErr.Error()}); err != nil || st != sink.StatePending {
				t.Fatalf("Fail after the failed script = %s, %v; want pending", st, err)
			}
		})
	}

	t.Run("unknown key", func(t *testing.T) {
		err := sc.CompleteSQL(ctx, "gemini:batches/none", 1, script, map[string]any{"key": "x", "token": 1, "operation": "{}"})
		if !errors.Is(err, sink.ErrNotFound) {
			t.Fatalf("CompleteSQL(unknown) error = %v, want ErrNotFound", err)
		}
	})

	// The fenced counter survives a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := db.Open(t, sink.Options{}).Stats(ctx); err != nil || st.Fenced != 1 {
		t.Fatalf("Stats.Fenced after reopening = %d, %v; want 1", st.Fenced, err)
	}
}
