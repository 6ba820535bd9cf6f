// Package sqlite is the embedded SQLite backend of the sink (spec §3): one
// local file in WAL mode with synchronous=FULL, every write in a BEGIN
// IMMEDIATE transaction on one writer connection, reads on a separate pool.
//
// All writes of one process go through a single writer goroutine that
// batches whatever operations are queued into one transaction and one commit
// (group commit), each in its own SAVEPOINT so that one operation's error
// does not undo the others. Duplicate sightings never wait for the disk:
// their statistics are buffered in memory and written with the next commit,
// by a periodic flush, by Flush or by Close.
package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/gemrecon/gemrecon/sink"
)

// ErrReadOnly is returned by writes on a sink opened with Options.ReadOnly.
var ErrReadOnly = errors.New("sink opened read-only")

// DefaultDoneCacheSize bounds the in-memory set of keys known to be done.
const DefaultDoneCacheSize = 100_000

// flushEvery bounds how long buffered sighting statistics wait for a commit.
const flushEvery = 500 * time.Millisecond

// maxBatch bounds how many queued operations share one transaction.
const maxBatch = 512

// Option adjusts what sink.Options does not cover.
type Option func(*config)

type config struct {
	logger        *slog.Logger
	doneCacheSize int
}

// WithLogger sets where payload conflicts and fenced outcomes are logged
// (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithDoneCacheSize bounds the in-memory cache of done keys (default
// DefaultDoneCacheSize; <0 disables it).
func WithDoneCacheSize(n int) Option { return func(c *config) { c.doneCacheSize = n } }

// Sink is the SQLite implementation of sink.Sink and sink.RecordClaimer.
type Sink struct {
	path string
	opt  sink.Options
	log  *slog.Logger

	rdb *sql.DB // reader pool
	wdb *sql.DB // one writer connection; nil when read-only

	rprep prepared // readerQueries on rdb
	wprep prepared // writerQueries on wdb; nil when read-only
	// batchTx is the writer's current transaction and batchStmts its
	// statements bound to it; only the writer goroutine touches them.
	batchTx    *sql.Tx
	batchStmts map[string]*sql.Stmt
	unprepared atomic.Int64 // queries run without a prepared statement

	done  *doneCache
	stats *statBuffer

	mu      sync.RWMutex // guards closed against submissions
	closed  bool
	ops     chan *op
	quit    chan struct{}
	exited  chan struct{}
	commits atomic.Int64 // committed write transactions
	// finalErr is the last batch's error, written by the writer goroutine
	// before it closes exited.
	finalErr error
}

var (
	_ sink.Sink          = (*Sink)(nil)
	_ sink.RecordClaimer = (*Sink)(nil)
)

// processSetup enables OFD locks (so that closing any other descriptor of the
// file in this process cannot drop SQLite's locks) and fdatasync commits, once
// per process, before the first database is opened. Where OFD locks do not
// exist, or another part of the process opened an SQLite file first (the
// mode is then fixed), the sink keeps SQLite's POSIX locks: every connection
// of one process must use the same kind.
var processSetup = sync.OnceValue(func() error {
	if _, err := msqlite.OFDLocking(true); err != nil &&
		!errors.Is(err, msqlite.ErrOFDLockingUnavailable) && !errors.Is(err, msqlite.ErrOFDLockingTooLate) {
		return err
	}
	if _, err := msqlite.Fdatasync(true); err != nil &&
		!errors.Is(err, msqlite.ErrFdatasyncUnavailable) {
		return err
	}
	return nil
})

// sqliteHeader starts every SQLite database file.
const sqliteHeader = "SQLite format 3\x00"

// Open opens (and, unless opt.ReadOnly, creates and migrates) the sink stored
// in the SQLite file at path.
func Open(ctx context.Context, path string, opt sink.Options, extra ...Option) (*Sink, error) {
	cfg := config{doneCacheSize: DefaultDoneCacheSize}
	for _, o := range extra {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	opt = opt.WithDefaults()
	if err := processSetup(); err != nil {
		return nil, fmt.Errorf("sqlite sink %s: %w", path, err)
	}
	if err := checkFile(path, opt.ReadOnly); err != nil {
		return nil, err
	}
	s := &Sink{
		path:  path,
		opt:   opt,
		log:   cfg.logger,
		done:  newDoneCache(cfg.doneCacheSize),
		stats: newStatBuffer(),
	}
	var err error
	if opt.ReadOnly {
		s.rdb, err = openDB(path, opt.BusyTimeout, true)
		if err != nil {
			return nil, s.fail(err)
		}
		s.rdb.SetMaxOpenConns(4)
		s.rdb.SetMaxIdleConns(4)
		if err := s.checkReadable(ctx); err != nil {
			s.rdb.Close()
			return nil, err
		}
		if s.rprep, err = prepare(ctx, s.rdb, readerQueries()); err != nil {
			s.rdb.Close()
			return nil, s.fail(err)
		}
		return s, nil
	}
	s.wdb, err = openDB(path, opt.BusyTimeout, false)
	if err != nil {
		return nil, s.fail(err)
	}
	s.wdb.SetMaxOpenConns(1)
	s.wdb.SetMaxIdleConns(1)
	s.wdb.SetConnMaxLifetime(0)
	s.wdb.SetConnMaxIdleTime(0)
	if err := s.migrate(ctx); err != nil {
		s.wdb.Close()
		return nil, err
	}
	s.rdb, err = openDB(path, opt.BusyTimeout, false)
	if err != nil {
		s.wdb.Close()
		return nil, s.fail(err)
	}
	// Every reader connection stays open, with its prepared statements.
	s.rdb.SetMaxOpenConns(4)
	s.rdb.SetMaxIdleConns(4)
	if s.wprep, err = prepare(ctx, s.wdb, writerQueries()); err != nil {
		s.rdb.Close()
		s.wdb.Close()
		return nil, s.fail(err)
	}
	if s.rprep, err = prepare(ctx, s.rdb, readerQueries()); err != nil {
		s.wprep.close()
		s.rdb.Close()
		s.wdb.Close()
		return nil, s.fail(err)
	}
	s.batchStmts = make(map[string]*sql.Stmt)
	s.ops = make(chan *op, maxBatch)
	s.quit = make(chan struct{})
	s.exited = make(chan struct{})
	go s.writeLoop()
	return s, nil
}

// checkFile refuses, before SQLite touches anything, a path that is a
// directory, a file that is not SQLite, a file this process may not write,
// and (read-only) a missing file. A missing file is created with mode 0600.
func checkFile(path string, readOnly bool) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if readOnly {
			return fmt.Errorf("sqlite sink %s: %w (nothing recorded yet: run a writing command such as poll first)", path, sink.ErrNoDatabase)
		}
		dir := filepath.Dir(path)
		if err := syscall.Access(dir, 2|1); err != nil { // W_OK|X_OK
			return fmt.Errorf("sqlite sink %s: cannot create the database: directory %s is not writable: %v", path, dir, err)
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("sqlite sink %s: cannot create the database: %v", path, err)
		}
		if f != nil {
			f.Close()
		}
		return nil
	case err != nil:
		return fmt.Errorf("sqlite sink %s: %v", path, err)
	case fi.IsDir():
		return fmt.Errorf("sqlite sink %s: is a directory, not a database file", path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("sqlite sink %s: is not a regular file", path)
	}
	if fi.Size() > 0 {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("sqlite sink %s: %v", path, err)
		}
		head := make([]byte, 100)
		_, err = io.ReadFull(f, head)
		f.Close()
		if err != nil || string(head[:len(sqliteHeader)]) != sqliteHeader {
			return fmt.Errorf("sqlite sink %s: file is not a database (no SQLite header): refusing to touch it", path)
		}
		// Refuse a newer schema or another application's database before
		// opening it: opening for writing would switch it to WAL mode.
		// (The header can lag a WAL not yet checkpointed; the checks are
		// repeated inside the first transaction.)
		version := int(binary.BigEndian.Uint32(head[60:64]))
		app := int(binary.BigEndian.Uint32(head[68:72]))
		if app != 0 && app != applicationID {
			return fmt.Errorf("sqlite sink %s: not a gemrecon database (application_id %d): refusing to touch it", path, app)
		}
		if latest := SchemaVersion(); version > latest {
			return fmt.Errorf("sqlite sink %s: schema version %d, but this gemrecon knows versions up to %d (upgrade gemrecon): %w", path, version, latest, sink.ErrSchemaTooNew)
		}
		if version == 0 && app == 0 {
			if err := checkForeignTables(path); err != nil {
				return err
			}
		}
	}
	if !readOnly {
		if err := syscall.Access(path, 2); err != nil { // W_OK
			return fmt.Errorf("sqlite sink %s: database file is read-only (%v): fix its permissions or use a read-only command", path, err)
		}
		if dir := filepath.Dir(path); syscall.Access(dir, 2|1) != nil {
			return fmt.Errorf("sqlite sink %s: directory %s is read-only: SQLite needs to create its -wal and -shm files there", path, dir)
		}
	}
	return nil
}

// checkForeignTables refuses an SQLite file that holds tables but no
// gemrecon schema, reading it without changing it. The header said version 0,
// but a WAL not yet checkpointed may hold gemrecon's schema: ask SQLite.
func checkForeignTables(path string) error {
	db, err := openDB(path, sink.DefaultBusyTimeout, true)
	if err != nil {
		return fmt.Errorf("sqlite sink %s: %w", path, err)
	}
	defer db.Close()
	var version, app, n int
	err = db.QueryRow(`SELECT (SELECT user_version FROM pragma_user_version),
		(SELECT application_id FROM pragma_application_id), (SELECT count(*) FROM sqlite_schema)`).Scan(&version, &app, &n)
	if err != nil {
		return fmt.Errorf("sqlite sink %s: %w", path, err)
	}
	switch {
	case app != 0 && app != applicationID:
		return fmt.Errorf("sqlite sink %s: not a gemrecon database (application_id %d): refusing to touch it", path, app)
	case version > SchemaVersion():
		return fmt.Errorf("sqlite sink %s: schema version %d, but this gemrecon knows versions up to %d (upgrade gemrecon): %w", path, version, SchemaVersion(), sink.ErrSchemaTooNew)
	case version == 0 && n > 0:
		return fmt.Errorf("sqlite sink %s: an SQLite database of another application (%d schema objects, no gemrecon schema): refusing to touch it", path, n)
	}
	return nil
}

// openDB opens a pool on path. The busy timeout comes first so that the
// pragmas after it already wait for other processes.
func openDB(path string, busy time.Duration, readOnly bool) (*sql.DB, error) {
	pragmas := []string{fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds())}
	if !readOnly {
		pragmas = append(pragmas, "journal_mode(WAL)", "synchronous(FULL)")
	}
	pragmas = append(pragmas, "foreign_keys(1)")
	var b bytes.Buffer
	for i, p := range pragmas {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString("_pragma=" + url.QueryEscape(p))
	}
	if readOnly {
		b.WriteString("&mode=ro")
	} else {
		b.WriteString("&_txlock=immediate")
	}
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: b.String()}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return nil, err
	}
	return db, nil
}

// fail turns a driver error into one line naming the file and the cause.
func (s *Sink) fail(err error) error {
	if err == nil {
		return nil
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("sqlite sink %s: database is locked by another process (waited the busy timeout of %v): %w", s.path, s.opt.BusyTimeout, err)
		case sqlite3.SQLITE_NOTADB:
			return fmt.Errorf("sqlite sink %s: file is not a database: %w", s.path, err)
		case sqlite3.SQLITE_READONLY:
			return fmt.Errorf("sqlite sink %s: database is read-only: %w", s.path, err)
		case sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("sqlite sink %s: cannot open the database file: %w", s.path, err)
		}
	}
	return fmt.Errorf("sqlite sink %s: %w", s.path, err)
}

// Commits returns how many write transactions this sink has committed: with
// group commit, operations per commit shows how many share one disk sync.
func (s *Sink) Commits() int64 { return s.commits.Load() }

// Path is the database file.
func (s *Sink) Path() string { return s.path }

// Close flushes buffered statistics and releases the database. It is safe to
// call more than once.
func (s *Sink) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	var errs []error
	if s.wdb != nil {
		close(s.quit)
		<-s.exited
		if err := s.flushErr(); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, s.wprep.close(), s.wdb.Close())
	}
	errs = append(errs, s.rprep.close(), s.rdb.Close())
	return errors.Join(errs...)
}

func (s *Sink) nowNS() int64 { return s.opt.Now().UnixNano() }

func fromNS(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func toNS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
