// Package sqlitetest holds what the tests of several packages do with a
// real SQLite sink file: open one (in a temporary directory), read a file's
// header and check its integrity on a connection of their own, damage a
// page of it, and hold its write lock from another process. Nothing but
// tests may import it.
//
// The external tests of sink/sqlite use it; its internal tests cannot (it
// imports sink/sqlite).
package sqlitetest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// Quiet keeps a sink's expected warnings (fenced outcomes, conflicts,
// failures) out of the test output.
var Quiet = sqlite.WithLogger(slog.New(slog.DiscardHandler))

// Path returns the path of a database file that does not exist yet, in a
// temporary directory of t's.
func Path(t testing.TB) string { return filepath.Join(t.TempDir(), "gemrecon.db") }

// Open opens the sink at path with Quiet and extra, and closes it when the
// test ends (a Close error fails the test). A failed Open fails the test.
func Open(t testing.TB, path string, opt sink.Options, extra ...sqlite.Option) *sqlite.Sink {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, opt, append([]sqlite.Option{Quiet}, extra...)...)
	if err != nil {
		t.Fatalf("sqlite.Open(%q): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close(%q): %v", path, err)
		}
	})
	return s
}

// OpenTemp opens a fresh sink at Path(t), as Open.
func OpenTemp(t testing.TB, opt sink.Options, extra ...sqlite.Option) *sqlite.Sink {
	t.Helper()
	return Open(t, Path(t), opt, extra...)
}

// ReadOnly is the URI of a read-only connection to the database at path:
// it sees what the WAL holds.
func ReadOnly(path string) string { return "file:" + path + "?mode=ro" }

// Immutable is the URI of a connection that reads only the main file of
// the closed database at path, creating nothing beside it (no WAL is read,
// no shared memory created).
func Immutable(path string) string { return "file:" + path + "?mode=ro&immutable=1" }

// QueryRow scans the one row of query (with args) into dest, on a
// connection of its own to uri (ReadOnly, Immutable), closed before it
// returns. An error fails the test.
func QueryRow(t testing.TB, uri, query string, args []any, dest ...any) {
	t.Helper()
	db, err := sql.Open("sqlite", uri)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(query, args...).Scan(dest...); err != nil {
		t.Fatalf("%s on %s: %v", query, uri, err)
	}
}

// UserVersion returns the user_version (the schema version) of the
// database at uri (ReadOnly, Immutable).
func UserVersion(t testing.TB, uri string) int {
	t.Helper()
	var v int
	QueryRow(t, uri, "PRAGMA user_version", nil, &v)
	return v
}

// Exec runs stmt with args on a connection of its own to the database at
// path (waiting up to 5s for its write lock), closed before it returns. An
// error fails the test.
func Exec(t testing.TB, path, stmt string, args ...any) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(stmt, args...); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// StoreRaw writes a key straight into the database at path with SQL, first
// and last seen at at and due then, as a gemrecon from before spec §12 (or
// an older canon) could have stored it: no check of the key.
func StoreRaw(t testing.TB, path, key, state, lastError string, at time.Time) {
	t.Helper()
	Exec(t, path, `INSERT INTO gemrecon_keys
		(key, state, first_source, sources, seen_count, first_seen_at, last_seen_at, next_attempt_at, due_at, last_error)
		VALUES (?1, ?2, 'poll', ',poll,', 1, ?3, ?3, ?3, ?3, ?4)`, key, state, at.UnixNano(), lastError)
}

// IntegrityCheck fails the test unless PRAGMA integrity_check, on a
// read-only connection, says ok.
func IntegrityCheck(t testing.TB, path string) {
	t.Helper()
	var res string
	QueryRow(t, ReadOnly(path), "PRAGMA integrity_check", nil, &res)
	if res != "ok" {
		t.Errorf("PRAGMA integrity_check of %s = %q, want ok", path, res)
	}
}

// Page returns the number of the b-tree page that query (on the dbstat
// table, with args) selects, and the database's page size, on a read-only
// connection.
func Page(t testing.TB, path, query string, args ...any) (pgno, size int64) {
	t.Helper()
	QueryRow(t, ReadOnly(path), "PRAGMA page_size", nil, &size)
	QueryRow(t, ReadOnly(path), query, args, &pgno)
	return pgno, size
}

// Queries for Page, of the b-tree named by their one argument.
const (
	// RootPage selects the b-tree's root page.
	RootPage = `SELECT pageno FROM dbstat WHERE name = ? AND path = '/'`
	// LastLeaf selects its last leaf page (of a table: the greatest keys).
	LastLeaf = `SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' AND path <> '/' ORDER BY path DESC LIMIT 1`
)

// Overwrite writes b at offset off of the file at path.
func Overwrite(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TrashPage fills page pgno (of size bytes) of the closed database at path
// with 0xff bytes: no valid b-tree page.
func TrashPage(t testing.TB, path string, pgno, size int64) {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = 0xff
	}
	Overwrite(t, path, (pgno-1)*size, b)
}

// HoldLockCommand is the name under which a package's TestMain registers
// HoldLockMain with testkit.Main, for HoldLock.
const HoldLockCommand = "sqlite-hold-lock"

// HoldLockMain is a child process (testkit.Main) that takes the write lock
// of the database at its one argument, says "locked", and keeps the lock
// until its stdin closes.
func HoldLockMain() int {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage:", HoldLockCommand, "PATH")
		return 2
	}
	db, err := sql.Open("sqlite", "file:"+os.Args[1]+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("locked")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	_ = tx.Rollback()
	return 0
}

// HoldLock starts a process (HoldLockMain, which the test binary's TestMain
// must register) that holds path's write lock, and returns once it does.
// release lets the lock go and waits for the process to exit (its failure
// fails the test); it may be called more than once, and is called when the
// test ends.
func HoldLock(t testing.TB, path string) (release func()) {
	t.Helper()
	cmd := testkit.Command(HoldLockCommand, path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("lock holder: %v", err)
			}
		})
	}
	t.Cleanup(release)
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); strings.TrimSpace(line) != "locked" {
		t.Fatalf("lock holder said %q, want locked", line)
	}
	return release
}
