package main

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql's "pgx", for the application's tables

	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// The worked --sql example of docs/effects.md, run as the page says, on
// SQLite and on PostgreSQL: init, the application's schema, an invoice,
// then the page's gemrecon command line with the page's script against
// the local Gemini API. The batch was first seen by webhook, so the script
// must read the API's operation (its batchStats), which the listing
// confirmed. What changes from the page, and only that: --db names the
// test's database; on PostgreSQL the application's schema is a fresh one
// instead of public; the API is the stand-in (GOOGLE_GEMINI_BASE_URL);
// sqlite3 and psql are replaced by running the schema file here.
func TestDocsSQLExample(t *testing.T) {
	parallel(t)
	for _, backend := range []string{"sqlite", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			var db, appDB string
			switch backend {
			case "sqlite":
				db = filepath.Join(t.TempDir(), "sink.db")
				appDB = db
			case "postgres":
				if os.Getenv(pgtest.EnvDSN) == "" {
					t.Skip("set " + pgtest.EnvDSN)
				}
				gem, gemSchema := pgtest.NewSchema(t)
				app, appSchema := pgtest.NewSchema(t)
				u, err := url.Parse(gem)
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("search_path", gemSchema+","+appSchema)
				u.RawQuery = q.Encode()
				db, appDB = u.String(), app
			}
			schema := docBlock(t, "docs/effects.md", "docs-test: sql-"+backend+"-schema", "sql")
			script := filepath.Join(t.TempDir(), "bill-batch.sql")
			if err := os.WriteFile(script, []byte(docBlock(t, "docs/effects.md", "docs-test: sql-"+backend+"-script", "sql")), 0o600); err != nil {
				t.Fatal(err)
			}
			api := geminifake.New(geminifake.Options{APIKey: testAPIKey})
			if _, err := api.Start("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { api.Close() })
			api.Add(geminifake.Batch{Name: "batches/bill-1", State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Hour),
				EndTime: time.Now(), RequestCount: 4, SuccessfulCount: 3, FailedCount: 1})
			env := []string{"GEMINI_API_KEY=" + testAPIKey, "GOOGLE_API_KEY=", "GOOGLE_GEMINI_BASE_URL=" + api.URL(), "GEMRECON_DB="}

			ran := 0
			for _, line := range strings.Split(strings.TrimSpace(docBlock(t, "docs/effects.md", "docs-test: sql-"+backend+"-run", "sh")), "\n") {
				words := shellWords(line)
				switch words[0].text {
				case "sqlite3", "psql": // the page's schema file, run here
					execSQL(t, appDB, schema+"\nINSERT INTO invoices (id) VALUES ('batches/bill-1');")
					// The webhook came first: the key is unconfirmed until
					// the listing confirms it.
					withDB(t, db, func(s sink.Sink) {
						if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/bill-1", Source: sink.SourceWebhook,
							Payload: []byte(`{"type":"batch.succeeded","data":{"id":"bill-1"}}`), State: "SUCCEEDED"}); err != nil {
							t.Fatal(err)
						}
					})
				case "gemrecon":
					args := gemreconCalls(line)[0]
					args[1] = db // --db VALUE
					if i := indexOf(args, "--sql"); i >= 0 {
						args[i+1] = script
					}
					if c := commandOf(args); c == "serve" { // run the same effect once, with poll
						args[indexOf(args, "serve")] = "poll"
						args = removeFlag(args, "--secret-file")
					}
					if r := runChild(t, env, args...); r.code != exitOK {
						t.Fatalf("gemrecon %s: %v", strings.Join(args, " "), r)
					}
					ran++
				default:
					t.Fatalf("unexpected line in the run block: %q", line)
				}
			}
			if ran != 2 {
				t.Fatalf("the run block ran gemrecon %d times, want init and one command with --sql", ran)
			}
			var amount, due int64
			var status, state string
			q := `SELECT l.amount, i.amount_due, i.status, json_extract(o.payload, '$.state')
				FROM ledger_entries l JOIN invoices i ON i.id = l.invoice_id JOIN outbox o ON o.aggregate_id = i.id`
			if backend == "postgres" {
				q = strings.Replace(q, "json_extract(o.payload, '$.state')", "o.payload ->> 'state'", 1)
			}
			queryRow(t, appDB, q, &amount, &due, &status, &state)
			if amount != 3 || due != 3 || status != "billed" || state != "SUCCEEDED" {
				t.Fatalf("ledger amount %d, invoice due %d %s, outbox state %s; want 3, 3 billed, SUCCEEDED", amount, due, status, state)
			}
		})
	}
}

func indexOf(args []string, s string) int {
	for i, a := range args {
		if a == s {
			return i
		}
	}
	return -1
}

// removeFlag drops --name and its value from args.
func removeFlag(args []string, name string) []string {
	if i := indexOf(args, name); i >= 0 {
		return append(args[:i:i], args[i+2:]...)
	}
	return args
}

// withDB opens the sink --db names (library defaults) for fn.
func withDB(t *testing.T, db string, fn func(sink.Sink)) {
	t.Helper()
	s, err := dial.Open(context.Background(), db, sink.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fn(s)
}

// openApp opens db (a SQLite path or a postgres:// URL) with database/sql.
func openApp(t *testing.T, db string) *sql.DB {
	t.Helper()
	driver := "sqlite"
	if dial.IsPostgres(db) {
		driver = "pgx"
	}
	d, err := sql.Open(driver, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func execSQL(t *testing.T, db, script string) {
	t.Helper()
	if _, err := openApp(t, db).Exec(script); err != nil {
		t.Fatalf("%v\n%s", err, script)
	}
}

func queryRow(t *testing.T, db, q string, dest ...any) {
	t.Helper()
	if err := openApp(t, db).QueryRow(q).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// --sql's parameters are listed once in code (sqlscript.ParamNames): poll's
// help is built from them, and docs/effects.md's table must name the same
// ones (issue 26: help listed 7, the README 11).
func TestSQLParamsDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "effects.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "| parameter | value |")
	if i < 0 {
		t.Fatal("docs/effects.md has no parameter table")
	}
	table, _, _ := strings.Cut(text[i:], "\n\n")
	documented := map[string]bool{}
	for _, row := range strings.Split(table, "\n")[2:] {
		first, _, _ := strings.Cut(strings.TrimPrefix(row, "|"), "|")
		for _, m := range regexp.MustCompile("`@([a-z_]+)`").FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	help := gemrecon(t, "poll", "--help").stdout
	for _, p := range sqlscript.ParamNames() {
		if !documented[p] {
			t.Errorf("docs/effects.md does not list @%s", p)
		}
		if !strings.Contains(help, "@"+p+" ") && !strings.Contains(help, "@"+p+")") {
			t.Errorf("poll --help does not list @%s", p)
		}
		delete(documented, p)
	}
	for p := range documented {
		t.Errorf("docs/effects.md lists @%s, which scripts may not use", p)
	}
}
