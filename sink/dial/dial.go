// Package dial opens the sink backend that a --db value names. It is the one
// place that decides what such a string is (Parse):
//
//   - a postgres:// or postgresql:// URL, or a libpq keyword/value string
//     (host=db user=app dbname=app: the first word is a keyword followed by
//     '='), is PostgreSQL;
//   - a string that starts like a URL but is neither (postgres:/db,
//     POSTGRES://…, mysql://…) is refused with ErrInvalidDSN: taken as a
//     file path it would create a SQLite file of that name, or fail with a
//     message about a file;
//   - anything else is a SQLite file path, optionally written sqlite:PATH
//     (the way to name a file whose name looks like one of the above).
package dial

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// ErrInvalidDSN is wrapped by Parse and Open for a string that names no
// database: empty, or URL-like but not a PostgreSQL URL; and by Open for a
// PostgreSQL connection string that cannot be used as written
// (postgres.ErrInvalidDSN: sslmode=bogus, a bad port, an unterminated
// quote). It is the user's wrong words, not a failure to reach a database.
var ErrInvalidDSN = errors.New("not a database name")

// invalidDSN is a backend's refusal of a connection string, which is
// ErrInvalidDSN too; its text is the backend's alone.
type invalidDSN struct{ err error }

func (e invalidDSN) Error() string        { return e.err.Error() }
func (e invalidDSN) Unwrap() error        { return e.err }
func (e invalidDSN) Is(target error) bool { return target == ErrInvalidDSN }

// Backend says which sink a --db string names.
type Backend int

// The backends.
const (
	SQLite Backend = iota
	Postgres
)

// Target is a parsed --db string: the backend and what to hand to it (for
// SQLite the file path, without a sqlite: prefix).
type Target struct {
	Backend Backend
	DSN     string
}

// Parse decides what dsn names (see the package comment). Its errors wrap
// ErrInvalidDSN and quote no more of dsn than its scheme, since the rest may
// hold a password.
func Parse(dsn string) (Target, error) {
	dsn = strings.TrimSpace(dsn)
	if dsn == "" {
		return Target{}, fmt.Errorf("%w: it is empty (give a SQLite file path or a postgres:// URL)", ErrInvalidDSN)
	}
	if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		return Target{SQLite, path}, nil
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") || keywordValue.MatchString(dsn) {
		return Target{Postgres, dsn}, nil
	}
	if m := urlLike.FindStringSubmatch(dsn); m != nil {
		scheme := m[1]
		switch lower := strings.ToLower(scheme); {
		case lower == "postgres" || lower == "postgresql":
			return Target{}, fmt.Errorf("%w: %s… is not a PostgreSQL URL: write postgres://[user[:password]@]host[:port]/dbname[?param=value…], or host=… dbname=… (libpq keyword/value)",
				ErrInvalidDSN, scheme+":")
		case m[2] != "":
			return Target{}, fmt.Errorf("%w: %s//… is neither a SQLite file path nor a PostgreSQL URL (a file whose name starts so is sqlite:PATH)",
				ErrInvalidDSN, scheme+":")
		}
	}
	return Target{SQLite, dsn}, nil
}

// IsPostgres reports whether dsn names a PostgreSQL database.
func IsPostgres(dsn string) bool {
	t, err := Parse(dsn)
	return err == nil && t.Backend == Postgres
}

// urlLike matches the start of a string that may look like a URL but would
// otherwise be taken for a file path: a scheme, then ':', then maybe "//"
// (Parse refuses "scheme://…", and "postgres:" or "postgresql:" in any case
// without the slashes). A plain file name with a colon (backup:2024.db) is
// no URL. keywordValue matches a libpq keyword/value connection string: its
// first word is an identifier, then '=' (libpq allows spaces around it); a
// SQLite file whose name starts that way is sqlite:NAME or ./NAME.
var (
	urlLike      = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):(//)?`)
	keywordValue = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*[ \t]*=`)
)

// Describe names the database dsn names for a message on stdout or in a
// log, without what may be a secret: for SQLite the file's path; for
// PostgreSQL the database, host and port (and search_path, if set) that pgx
// reads from it — never the string itself, whose password (in the URL's
// user info, a password= word or parameter) would go along. A string that
// names no database, or that pgx cannot parse, is described as such.
func Describe(dsn string) string {
	t, err := Parse(dsn)
	switch {
	case err != nil:
		return "no database (an invalid --db)"
	case t.Backend == SQLite:
		return t.DSN
	}
	cfg, err := pgconn.ParseConfig(t.DSN)
	if err != nil {
		return "a PostgreSQL database"
	}
	d := fmt.Sprintf("PostgreSQL database %s on %s", cfg.Database, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if sp := cfg.RuntimeParams["search_path"]; sp != "" {
		d += ", search_path " + sp
	}
	return d
}

// Open opens the sink named by dsn; the backend reports payload conflicts
// and fenced outcomes to logger (nil: slog.Default()).
func Open(ctx context.Context, dsn string, opt sink.Options, logger *slog.Logger) (sink.Sink, error) {
	t, err := Parse(dsn)
	if err != nil {
		return nil, err
	}
	if t.Backend == Postgres {
		s, err := postgres.Open(ctx, t.DSN, opt, postgres.WithLogger(logger))
		if errors.Is(err, postgres.ErrInvalidDSN) {
			return nil, invalidDSN{err}
		}
		return opened(s, err)
	}
	return opened(sqlite.Open(ctx, t.DSN, opt, sqlite.WithLogger(logger)))
}

// opened returns a nil interface, not a typed nil, on error.
func opened[S sink.Sink](s S, err error) (sink.Sink, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}
