package dial

import (
	"errors"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// TestParse: what a --db string names (issue 16's newcomer traps: a libpq
// keyword/value string was taken for a SQLite file name, and so was
// postgres:/bad).
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		backend Backend
		dsn     string
	}{
		{"gemrecon.db", SQLite, "gemrecon.db"},
		{"/var/lib/gemrecon/sink.db", SQLite, "/var/lib/gemrecon/sink.db"},
		{"  ./s.db ", SQLite, "./s.db"},
		{"sqlite:s.db", SQLite, "s.db"},
		{"sqlite:host=x.db", SQLite, "host=x.db"}, // the way to name such a file
		{"./host=x.db", SQLite, "./host=x.db"},
		{"backup:2024.db", SQLite, "backup:2024.db"}, // a colon in a file name is no URL
		{"file:x.db", SQLite, "file:x.db"},
		{"my db.sqlite", SQLite, "my db.sqlite"},
		{"postgres://u@h/db?sslmode=disable", Postgres, "postgres://u@h/db?sslmode=disable"},
		{"postgresql://h/db", Postgres, "postgresql://h/db"},
		{"host=127.0.0.1 user=postgres dbname=test", Postgres, "host=127.0.0.1 user=postgres dbname=test"},
		{"dbname=test", Postgres, "dbname=test"},
		{"host = db port=5433", Postgres, "host = db port=5433"},
		{"service=gemrecon", Postgres, "service=gemrecon"},
	} {
		got, err := Parse(tc.in)
		if err != nil || got.Backend != tc.backend || got.DSN != tc.dsn {
			t.Errorf("Parse(%q) = %+v, %v; want backend %d, DSN %q", tc.in, got, err, tc.backend, tc.dsn)
		}
		if IsPostgres(tc.in) != (tc.backend == Postgres) {
			t.Errorf("IsPostgres(%q) = %v", tc.in, !(tc.backend == Postgres))
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "empty"},
		{"   ", "empty"},
		{"postgres:/bad", "postgres:… is not a PostgreSQL URL"},
		{"postgres:bad", "postgres:… is not a PostgreSQL URL"},
		{"postgresql:/x", "postgresql:… is not a PostgreSQL URL"},
		{"POSTGRES://u:secret@h/db", "POSTGRES:… is not a PostgreSQL URL"},
		{"Postgres:/u:secret@h/db", "Postgres:… is not a PostgreSQL URL"},
		{"mysql://u:secret@h/db", "mysql://… is neither a SQLite file path nor a PostgreSQL URL"},
		{"http://h/x.db", "http://… is neither"},
	} {
		got, err := Parse(tc.in)
		if !errors.Is(err, ErrInvalidDSN) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrInvalidDSN saying %q", tc.in, got, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q): the error %q quotes the password", tc.in, err)
		}
		if IsPostgres(tc.in) {
			t.Errorf("IsPostgres(%q) = true for a refused string", tc.in)
		}
	}
}

// TestOpenUnusablePostgresString: a PostgreSQL connection string pgx cannot
// parse is ErrInvalidDSN (the user's wrong words: exit 2), not a failure to
// reach a server, and its error quotes none of the string — pgx's own text
// masks passwords on a best-effort basis only (a malformed keyword/value
// string leaves part of one).
func TestOpenUnusablePostgresString(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://app:secret@127.0.0.1:1/app?sslmode=bogus", "failed to configure TLS (sslmode is invalid)"},
		{"postgres://app:secret@127.0.0.1:99999/app", "invalid port"},
		{"postgres://app:secret@127.0.0.1:1/app?pool_max_conns=abc", "pool_max_conns"},
		{"host=127.0.0.1 port=1 password='sec ret dbname=app", "unterminated quoted string"},
	} {
		s, err := Open(t.Context(), tc.dsn, sink.Options{}, nil)
		if err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", tc.dsn)
			continue
		}
		if !errors.Is(err, ErrInvalidDSN) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q) = %v; want ErrInvalidDSN saying %q", tc.dsn, err, tc.want)
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "ret dbname") || strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("Open(%q): the error %q quotes the connection string", tc.dsn, err)
		}
	}
}

// TestDescribe: what a message may say of a --db string: a SQLite file's
// path, or a PostgreSQL database, host, port and search_path, and never a
// password, wherever the string holds one.
func TestDescribe(t *testing.T) {
	for _, v := range []string{"PGHOST", "PGPORT", "PGDATABASE", "PGSERVICE"} {
		t.Setenv(v, "") // pgx reads them for what the string leaves out
	}
	for _, tc := range []struct{ in, want string }{
		{"gemrecon.db", "gemrecon.db"},
		{"sqlite:host=x.db", "host=x.db"},
		{"postgres://app:secret@db.internal:5433/app?sslmode=disable&search_path=gemrecon,public",
			"PostgreSQL database app on db.internal:5433, search_path gemrecon,public"},
		{"postgres://app@db/app?password=secret", "PostgreSQL database app on db:5432"},
		{"host=db user=app password=secret dbname=app", "PostgreSQL database app on db:5432"},
		{"host=db password='sec ret' dbname=app", "PostgreSQL database app on db:5432"},
		{"host=db password='sec ret dbname=app", "a PostgreSQL database"}, // pgx cannot parse it
		{"mysql://u:secret@h/db", "no database (an invalid --db)"},
	} {
		if got := Describe(tc.in); got != tc.want {
			t.Errorf("Describe(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
