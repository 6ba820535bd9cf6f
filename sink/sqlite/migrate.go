package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/gemrecon/gemrecon/sink"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// applicationID marks a database as gemrecon's ('gemr').
const applicationID = 1734700402

// migration is one schema step; version is the number its file name starts with.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded migrations in order; their versions are 1..n.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var ms []migration
	for i, n := range names {
		base := strings.TrimPrefix(n, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil || v != i+1 {
			return nil, fmt.Errorf("migration %s: want version %d", base, i+1)
		}
		b, err := migrationFiles.ReadFile(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	return ms, nil
}

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		return 0
	}
	return len(ms)
}

// migrate applies the missing migrations, each in its own BEGIN IMMEDIATE
// transaction that re-reads the version (another process may have migrated
// meanwhile). Even an up-to-date database gets one empty write transaction:
// it proves at Open that the file is writable and not held by another
// process beyond the busy timeout.
func (s *Sink) migrate(ctx context.Context) error {
	ms, err := migrations()
	if err != nil {
		return fmt.Errorf("sqlite sink %s: %w", s.path, err)
	}
	latest := len(ms)
	for {
		tx, err := s.wdb.BeginTx(ctx, nil)
		if err != nil {
			return s.fail(err)
		}
		cur, app, err := versionOf(ctx, tx)
		if err != nil {
			tx.Rollback()
			return s.fail(err)
		}
		if err := s.checkVersion(ctx, tx, cur, app, latest); err != nil {
			tx.Rollback()
			return err
		}
		if cur == latest {
			// The write probe: a no-op write must be allowed.
			if _, err := tx.ExecContext(ctx, `INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 0) ON CONFLICT (name) DO NOTHING`); err != nil {
				tx.Rollback()
				return s.fail(err)
			}
			return s.fail(tx.Commit())
		}
		m := ms[cur]
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: %w", m.name, s.fail(err))
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.version)); err != nil {
			tx.Rollback()
			return s.fail(err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, s.fail(err))
		}
	}
}

// rowQuerier is what *sql.DB, *sql.Tx and *sql.Conn share.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// versionOf reads user_version and application_id.
func versionOf(ctx context.Context, q rowQuerier) (version, app int, err error) {
	if err := q.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return 0, 0, err
	}
	if err := q.QueryRowContext(ctx, "PRAGMA application_id").Scan(&app); err != nil {
		return 0, 0, err
	}
	return version, app, nil
}

// checkVersion refuses newer schemas and databases of other applications.
func (s *Sink) checkVersion(ctx context.Context, q rowQuerier, cur, app, latest int) error {
	if cur > latest {
		return fmt.Errorf("sqlite sink %s: schema version %d, but this gemrecon knows versions up to %d (upgrade gemrecon): %w", s.path, cur, latest, sink.ErrSchemaTooNew)
	}
	if app != 0 && app != applicationID {
		return fmt.Errorf("sqlite sink %s: not a gemrecon database (application_id %d): refusing to touch it", s.path, app)
	}
	if cur == 0 {
		var n int
		if err := q.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
			return s.fail(err)
		}
		if n > 0 {
			return fmt.Errorf("sqlite sink %s: an SQLite database of another application (%d tables, no gemrecon schema): refusing to touch it", s.path, n)
		}
	}
	return nil
}

// checkReadable validates a read-only open: the schema must be exactly the
// one this build reads (a read-only open never migrates).
func (s *Sink) checkReadable(ctx context.Context) error {
	cur, app, err := versionOf(ctx, s.rdb)
	if err != nil {
		return s.fail(err)
	}
	if err := s.checkVersion(ctx, s.rdb, cur, app, SchemaVersion()); err != nil {
		return err
	}
	if cur == 0 {
		return fmt.Errorf("sqlite sink %s: %w (the file holds no gemrecon schema yet)", s.path, sink.ErrNoDatabase)
	}
	if latest := SchemaVersion(); cur < latest {
		return fmt.Errorf("sqlite sink %s: schema version %d is older than this gemrecon's %d: run a writing command (poll, drain) once to upgrade it", s.path, cur, latest)
	}
	return nil
}
