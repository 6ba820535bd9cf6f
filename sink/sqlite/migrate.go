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
func migrations() ([]migration, error) { return allMigrations(nil) }

// allMigrations is migrations followed by extra (tests simulate a newer
// binary with them).
func allMigrations(extra []migration) ([]migration, error) {
	return sink.LoadMigrations(migrationFiles, extra)
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
		cur, app, err := versionOf(ctx, tx)
		if err != nil {
			tx.Rollback()
			return s.fail(err)
		}
		if err := s.checkVersion(ctx, tx, cur, app); err != nil {
			tx.Rollback()
			return err
		}
		if err := checkReader(ctx, tx, s.path, cur, ms); err != nil {
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

// checkReader refuses a schema newer than the migrations ms know whose
// minimum reader is newer than they are too (or that records none). A schema
// this binary knows needs no check: it is one of ms's.
func checkReader(ctx context.Context, q rowQuerier, path string, cur int, ms []migration) error {
	if cur <= len(ms) {
		return nil
	}
	mr, ok, err := storedMinReader(ctx, q)
	if err != nil {
		return classify(path, err, -1, 0)
	}
	return readerError(path, cur, mr, ok, len(ms))
}

// readerError is checkReader's rule: a binary that knows versions up to
// latest may use schema version cur whose minimum reader is mr (ok: the
// database records one).
func readerError(path string, cur, mr int, ok bool, latest int) error {
	switch {
	case cur <= latest:
		return nil
	case !ok:
		return fmt.Errorf("sqlite sink %s: schema version %d records no minimum reader, and this gemrecon knows versions up to %d (upgrade gemrecon): %w",
			path, cur, latest, sink.ErrSchemaTooNew)
	case mr > latest:
		return fmt.Errorf("sqlite sink %s: schema version %d needs a gemrecon that knows schema version %d or later (its minimum reader), and this one knows versions up to %d (upgrade gemrecon): %w",
			path, cur, mr, latest, sink.ErrSchemaTooNew)
	}
	return nil
}

// checkVersion refuses databases of other applications.
func (s *db) checkVersion(ctx context.Context, q rowQuerier, cur, app int) error {
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

// checkReadable validates a read-only open, which never migrates: the schema
// must be this build's, or a newer one whose minimum reader this build is. An
// older schema is refused: this build's queries need its tables, and a
// writing command upgrades it.
func (s *db) checkReadable(ctx context.Context) error {
	cur, app, err := versionOf(ctx, s.rdb)
	if err != nil {
		return s.fail(err)
	}
	if err := s.checkVersion(ctx, s.rdb, cur, app); err != nil {
		return err
	}
	if err := checkReader(ctx, s.rdb, s.path, cur, s.migrations); err != nil {
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
