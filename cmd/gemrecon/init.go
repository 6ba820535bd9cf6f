package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

const initLong = `Create the database — the SQLite file, or gemrecon's tables in the first
schema of the PostgreSQL search_path — or upgrade an older one, and say what
it found and did. Run it once, as an install step: every other command opens
only a database that holds gemrecon's schema already, so that a mistyped --db
is refused instead of starting afresh and running every completion in the
window again. Running it again, or from several processes at once, is safe.

Exit status: 0 the database holds this gemrecon's schema (or a newer one it
may use), 1 it could not (the message says why), 2 a --db that names no
database.`

func (a *app) initCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "init",
		Short: "Create the database (or PostgreSQL schema) once, or upgrade it; every other command needs it",
		Long:  initLong,
		Example: `  gemrecon --db /var/lib/gemrecon/sink.db init
  gemrecon --db 'postgres://gemrecon@db/app?search_path=gemrecon,public' init`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runInit(cmd.Context()) },
	}
}

// runInit is init: open --db creating what is missing, then say what was
// found and done.
func (a *app) runInit(ctx context.Context) error {
	t, _ := dial.Parse(a.db) // setup has refused what it cannot parse
	where, latest, noFile := dial.Describe(a.db), postgres.SchemaVersion(), false
	if t.Backend == dial.SQLite {
		latest = sqlite.SchemaVersion()
		if abs, err := filepath.Abs(t.DSN); err == nil {
			where = abs
		}
		_, err := os.Lstat(t.DSN)
		noFile = errors.Is(err, os.ErrNotExist)
	}
	s, err := a.dialSink(ctx, sink.Options{})
	if err != nil {
		return err
	}
	found, now := s.(interface{ SchemaVersions() (int, int) }).SchemaVersions()
	if err := s.Close(); err != nil {
		return err
	}
	var did string
	switch {
	case found == 0 && noFile:
		did = fmt.Sprintf("found no file; created it with gemrecon's schema, version %d", now)
	case found == 0:
		did = fmt.Sprintf("found no gemrecon schema; created it, version %d", now)
	case found < now:
		did = fmt.Sprintf("found schema version %d; upgraded it to version %d", found, now)
	case found > latest:
		did = fmt.Sprintf("found schema version %d, newer than this gemrecon's %d and usable by it; nothing to do", found, latest)
	default:
		did = fmt.Sprintf("found schema version %d, this gemrecon's; nothing to do", found)
	}
	fmt.Fprintf(a.stdout, "%s: %s\n", where, did)
	return nil
}
