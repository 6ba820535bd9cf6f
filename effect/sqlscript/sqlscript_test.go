package sqlscript_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
)

func TestParse(t *testing.T) {
	tests := []struct {
		script string
		stmts  int
		uses   []string
	}{
		{`INSERT INTO t VALUES (@key)`, 1, []string{"key"}},
		{`INSERT INTO t VALUES (@key); UPDATE t SET a = @token WHERE k = @key;`, 2, []string{"key", "token"}},
		{"-- only @comment here\nSELECT 1; /* @nope; */ SELECT @attempt", 2, []string{"attempt"}},
		{`SELECT '@invoice; it''s', "col@x", ` + "`c@d`" + `, @name`, 1, []string{"name"}},
		{`SELECT E'it\'s @invoice', @state`, 1, []string{"state"}},
		{`SELECT $$ @invoice; $$, $tag$ @x $tag$, @source`, 1, []string{"source"}},
		{`SELECT @operation::jsonb ->> 'name', a @> b, c <@ d`, 1, []string{"operation"}},
		{`/* outer /* nested @x */ still comment @y */ SELECT 1`, 1, nil},
		{`;;SELECT 1;;`, 1, nil},
		// A trigger body's semicolons do not end the statement; CASE … END
		// inside it does not end the body.
		{`CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE u SET n = CASE WHEN n > 0 THEN n ELSE 0 END; DELETE FROM v; END; SELECT @key`, 2, []string{"key"}},
		{`SELECT begin_at, rollback_count FROM t`, 1, nil},
		{`SET LOCAL statement_timeout = '5s'; UPDATE t SET a = 1 WHERE k = @key`, 2, []string{"key"}},
	}
	for _, tt := range tests {
		q, err := sqlscript.Parse(tt.script)
		if err != nil {
			t.Errorf("Parse(%q) error = %v, want nil", tt.script, err)
			continue
		}
		if got := len(q.Statements()); got != tt.stmts {
			t.Errorf("Parse(%q) statements = %d %q, want %d", tt.script, got, q.Statements(), tt.stmts)
		}
		if got := q.Uses(); !reflect.DeepEqual(got, tt.uses) {
			t.Errorf("Parse(%q) uses = %q, want %q", tt.script, got, tt.uses)
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		script string
		want   string // in the error
	}{
		{``, "no SQL statements"},
		{"  -- nothing\n/* at all */ ;", "no SQL statements"},
		{`INSERT INTO t VALUES (@invoice)`, "unknown parameter @invoice at line 1 (known: @key, @name, @state, @source, @token, @attempt, @operation, @batch_state, @confirmed, @results_file, @webhook, @rerun)"},
		{"SELECT 1;\nSELECT @key, @Key", "unknown parameter @Key at line 2"},
		{`SELECT ?`, "positional parameter ?"},
		{`SELECT ?1`, "positional parameter ?1"},
		{`SELECT $1`, "parameter $1"},
		{`SELECT $key`, "parameter $key"},
		{`SELECT :key`, "parameter :key"},
		{`SELECT 'open`, "unterminated string literal"},
		{`SELECT "open`, "unterminated quoted identifier"},
		{`SELECT 1 /* open`, "unterminated /* comment"},
		{`SELECT $x$ open`, "unterminated $x$ string"},
		{`BEGIN; INSERT INTO t VALUES (@key); COMMIT;`, "BEGIN: the script runs inside gemrecon's transaction"},
		{`INSERT INTO t VALUES (@key); commit`, "COMMIT"},
		{"SELECT 1;\nROLLBACK", "line 2: ROLLBACK"},
		{`SAVEPOINT a`, "SAVEPOINT"},
		{`RELEASE a`, "RELEASE"},
		{`END`, "END"},
		{`START TRANSACTION`, "START TRANSACTION"},
		{`PRAGMA synchronous = OFF`, "PRAGMA: the script runs on gemrecon's own connection"},
		{`SET search_path = other`, "SET: the script runs on gemrecon's own connection"},
		{`ATTACH 'x.db' AS x`, "ATTACH"},
		{`RESET ALL`, "RESET"},
		{`INSERT OR ROLLBACK INTO t VALUES (@key)`, "line 1: ROLLBACK (a conflict clause"},
		{"SELECT 1;\nSELECT RAISE(rollback, 'x')", "line 2: ROLLBACK"},
		{`CREATE TRIGGER tr AFTER INSERT ON t BEGIN DELETE FROM v;`, "BEGIN without its END"},
	}
	for _, tt := range tests {
		_, err := sqlscript.Parse(tt.script)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error = %v, want one containing %q", tt.script, err, tt.want)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.sql")
	if err := os.WriteFile(good, []byte("INSERT INTO ledger VALUES (@key, @token);\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := sqlscript.Load(good)
	if err != nil {
		t.Fatalf("Load(%q) error = %v", good, err)
	}
	if q.Path() != good || !strings.Contains(q.Text(), "@token") {
		t.Fatalf("Load(%q) = path %q, script %q", good, q.Path(), q.Text())
	}
	bad := filepath.Join(dir, "bad.sql")
	if err := os.WriteFile(bad, []byte("INSERT INTO ledger VALUES (@invoice);\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		bad:                               bad + ": unknown parameter @invoice at line 1 (known: @key,",
		filepath.Join(dir, "missing.sql"): filepath.Join(dir, "missing.sql") + ": open ",
		dir:                               dir + ": ",
	} {
		if _, err := sqlscript.Load(path); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Load(%q) error = %v, want one starting %q", path, err, want)
		}
	}
}

func TestParams(t *testing.T) {
	q, err := sqlscript.Parse(`SELECT @key`)
	if err != nil {
		t.Fatal(err)
	}
	ev := effect.Event{Key: "gemini:batches/a", Name: "batches/a", State: "JOB_STATE_SUCCEEDED", Source: "webhook",
		Attempt: 2, Token: 7, Operation: json.RawMessage(`{"name":"batches/a"}`), Confirmed: true, BatchState: "SUCCEEDED",
		ResultsFile: "/r/a.jsonl", Webhook: json.RawMessage(`{"type":"batch.succeeded"}`)}
	want := map[string]any{"key": "gemini:batches/a", "name": "batches/a", "state": "JOB_STATE_SUCCEEDED", "source": "webhook",
		"token": int64(7), "attempt": int64(2), "operation": `{"name":"batches/a"}`,
		"batch_state": "SUCCEEDED", "confirmed": true, "results_file": "/r/a.jsonl", "webhook": `{"type":"batch.succeeded"}`, "rerun": false}
	if got := q.Params(ev); !reflect.DeepEqual(got, want) {
		t.Errorf("Params(%+v) = %v, want %v", ev, got, want)
	}
	names := sqlscript.ParamNames()
	if got := q.Params(effect.Event{}); len(got) != len(names) || got["operation"] != nil || got["webhook"] != nil {
		t.Errorf("Params(empty event) = %v, want all of %q with operation nil (SQL NULL)", got, names)
	}
}
