package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/gemrecon/gemrecon/sink"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// applicationID marks a database as gemrecon's ('gemr').
const applicationID = 1734700402

// migration is one schema step, sink.Migration: its version is the number
// its file name starts with, and its MinReader the oldest schema version a
// binary must know to use the database once the step is applied (spec §3).
// The file rules (the "-- min_reader: N" line, versions 1..n, minimum
// readers never falling) are sink.ParseMigration's and sink.LoadMigrations'.
type migration = sink.Migration

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) { return sink.LoadMigrations(migrationFiles) }

// SchemaVersion is the schema version this build writes.
func SchemaVersion() int {
	ms, _ := migrations()
	return len(ms)
}

// migrate applies the missing migrations, each in its own BEGIN IMMEDIATE
// transaction that re-reads the version (another process may have migrated
// meanwhile), and records the schema's minimum reader with each. A schema
// newer than this binary is used as it is when its minimum reader is not
// newer than this binary, and refused otherwise. Even an up-to-date
// database gets one write transaction: it proves at Open that the file is
// writable and not held by another process beyond the busy timeout.
func (s *db) migrate(ctx context.Context) error {
	ms := s.migrations
	latest := len(ms)
	for {
		tx, err := s.wdb.BeginTx(ctx, nil)
		if err != nil {
			return s.fail(err)
		}
		cur, err := checkSchema(ctx, tx, s.path, ms, s.fail)
		if err != nil {
			tx.Rollback()
			return err
		}
		if s.schemaFound < 0 {
			s.schemaFound = cur
		}
		if cur == 0 && s.opt.MustExist {
			tx.Rollback()
			return noDatabase(s.path, "the file holds no gemrecon schema")
		}
		if cur >= latest {
			s.schemaNow = cur
			// The write probe: a no-op write must be allowed. On this
			// binary's own version it also records the minimum reader for
			// databases migrated before it was recorded.
			q, args := `INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 0) ON CONFLICT (name) DO NOTHING`, []any(nil)
			if cur == latest {
				q, args = upsertMinReader, []any{ms[latest-1].MinReader}
			}
			if _, err := tx.ExecContext(ctx, q, args...); err != nil {
				tx.Rollback()
				return s.fail(err)
			}
			return s.fail(tx.Commit())
		}
		m := ms[cur]
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: %w", m.Name, s.fail(err))
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", m.Version)); err != nil {
			tx.Rollback()
			return s.fail(err)
		}
		if _, err := tx.ExecContext(ctx, upsertMinReader, m.MinReader); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %s: record min_reader: %w", m.Name, s.fail(err))
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %s: %w", m.Name, s.fail(err))
		}
	}
}

// upsertMinReader records the schema's minimum reader (it never goes down).
const upsertMinReader = `INSERT INTO gemrecon_meta (name, value) VALUES ('min_reader', ?1)
	ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)`

// rowQuerier is what *sql.DB, *sql.Tx and *sql.Conn share.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// checkSchema reads the schema version of the database q reads and refuses
// the database of another application (another application_id, or tables
// but no gemrecon schema), and a schema newer than the migrations ms know
// whose minimum reader is newer than they are too, or that records none.
// fail turns an error reading it into the sink's.
func checkSchema(ctx context.Context, q rowQuerier, path string, ms []migration, fail func(error) error) (int, error) {
	var version, app, n, mr int
	var hasMR bool
	err := q.QueryRowContext(ctx, `SELECT (SELECT user_version FROM pragma_user_version),
		(SELECT application_id FROM pragma_application_id), (SELECT count(*) FROM sqlite_schema)`).Scan(&version, &app, &n)
	if err == nil && version > len(ms) {
		mr, hasMR, err = storedMinReader(ctx, q)
	}
	switch {
	case err != nil:
		return 0, fail(err)
	case app != 0 && app != applicationID:
		return 0, fmt.Errorf("sqlite sink %s: not a gemrecon database (application_id %d): refusing to touch it", path, app)
	case version == 0 && n > 0:
		return 0, fmt.Errorf("sqlite sink %s: an SQLite database of another application (%d schema objects, no gemrecon schema): refusing to touch it", path, n)
	}
	if err := sink.CheckReader(version, mr, hasMR, len(ms)); err != nil {
		return 0, fmt.Errorf("sqlite sink %s: %w", path, err)
	}
	return version, nil
}

// storedMinReader reads the minimum reader the database records; ok is false
// when it records none.
func storedMinReader(ctx context.Context, q rowQuerier) (mr int, ok bool, err error) {
	var exists int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'gemrecon_meta'`).Scan(&exists); err != nil {
		return 0, false, err
	}
	if exists == 0 {
		return 0, false, nil
	}
	err = q.QueryRowContext(ctx, `SELECT value FROM gemrecon_meta WHERE name = 'min_reader'`).Scan(&mr)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return mr, err == nil, err
}

// checkReadable validates a read-only open, which never migrates: the schema
// must be this build's, or a newer one whose minimum reader this build is. An
// older schema is refused: this build's queries need its tables, and a
// writing command upgrades it.
func (s *db) checkReadable(ctx context.Context) error {
	cur, err := checkSchema(ctx, s.rdb, s.path, s.migrations, s.fail)
	if err != nil {
		return err
	}
	if cur == 0 {
		return noDatabase(s.path, "the file holds no gemrecon schema")
	}
	if latest := len(s.migrations); cur < latest {
		return fmt.Errorf("sqlite sink %s: schema version %d is older than this gemrecon's %d: run gemrecon init (or any writing command) once to upgrade it", s.path, cur, latest)
	}
	s.schemaFound, s.schemaNow = cur, cur
	return nil
}
