// Package sqlite is the embedded SQLite backend of the sink (spec §3): one
// local file in WAL mode with synchronous=FULL, every write in a BEGIN
// IMMEDIATE transaction on one writer connection, reads on a separate pool.
// It loads and stores rows for the state machine of package sink, which
// decides every transition.
//
// A writer goroutine runs whatever writes are queued in one transaction and
// one commit (group commit: one disk sync shared by concurrent callers), each
// in its own SAVEPOINT so that one write's error undoes only its own. The
// file is watched (health.go): a damaged file is refused at open, and a file
// deleted or replaced under the process stops every later write.
package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
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

// Option adjusts what sink.Options does not cover.
type Option func(*config)

type config struct {
	logger     *slog.Logger
	migrations []migration // tests: a newer binary's (nil: the embedded ones)
	dsnParams  string      // tests: appended to the writing pools' DSN
}

// WithLogger sets where conflicts, fenced outcomes and a broken file are
// logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Sink is the SQLite sink: the state machine over one database file.
type Sink struct {
	*sink.Machine
	db *db
}

// Path is the database file.
func (s *Sink) Path() string { return s.db.path }

// Broken returns the error that made the sink unusable — a damaged file
// (ErrCorrupt) or a path that stopped naming the opened file
// (ErrFileReplaced) — or nil while it is usable. A broken sink stays broken:
// its writes, Records and Pings fail with that error.
func (s *Sink) Broken() error { return s.db.Broken() }

// Commits counts the write transactions this sink committed: with group
// commit, operations per commit shows how many share one disk sync.
func (s *Sink) Commits() int64 { return s.db.commits.Load() }

// SchemaVersions returns the schema version Open found (0: none, so it
// created gemrecon's schema) and the one the database holds now: this
// binary's, or a newer one that a newer gemrecon wrote and this one may use.
func (s *Sink) SchemaVersions() (found, now int) { return s.db.schemaFound, s.db.schemaNow }

// db is the store of the SQLite sink (sink.Store).
type db struct {
	path       string
	opt        sink.Options
	log        *slog.Logger
	migrations []migration // what this binary knows
	// schemaFound and schemaNow are SchemaVersions'.
	schemaFound, schemaNow int
	ident                  *identity // the opened file; nil when read-only
	dsnParams              string    // see config
	broken                 atomic.Pointer[error]
	opened                 atomic.Bool // Open has returned the sink (checkConn)

	rdb *sql.DB // reader pool
	wdb *sql.DB // one writer connection; nil when read-only
	// wconn is wdb's one connection, held from Open to Close: every write
	// transaction runs on it, in the writer goroutine.
	wconn *sql.Conn

	mu      sync.RWMutex // guards closed against submissions
	closed  bool
	ops     chan *op
	quit    chan struct{}
	exited  chan struct{}
	commits atomic.Int64 // committed write transactions

	// The statements prepared once, by their text: SQLite parses a
	// statement's text each time it runs it, and on the paths a key takes
	// the parse cost more than the work (BENCHMARKS.md, "statements").
	wstmts, rstmts sync.Map
}

// preparer is a connection or a pool.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// prepared returns q prepared on c, once per cache.
func prepared(cache *sync.Map, c preparer, q string) (*sql.Stmt, error) {
	if st, ok := cache.Load(q); ok {
		return st.(*sql.Stmt), nil
	}
	st, err := c.PrepareContext(context.Background(), q)
	if err != nil {
		return nil, err
	}
	if prev, loaded := cache.LoadOrStore(q, st); loaded {
		st.Close()
		return prev.(*sql.Stmt), nil
	}
	return st, nil
}

// closeStmts closes the prepared statements of cache.
func closeStmts(cache *sync.Map) {
	cache.Range(func(q, st any) bool {
		st.(*sql.Stmt).Close()
		cache.Delete(q)
		return true
	})
}

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

// readers is the size of the reader pool. All of them stay open when idle:
// a connection closed and opened again costs its files' opens, a schema
// read and the WAL check of checkConn.
const readers = 4

// Open opens (and, unless opt.ReadOnly, creates and migrates) the sink stored
// in the SQLite file at path.
//
// Processes that start together on a file that does not exist yet race to
// create it and switch it to WAL mode, and SQLite answers some of those races
// with SQLITE_BUSY at once, without calling the busy handler (it would risk a
// deadlock). Open therefore runs again whenever it meets a busy database,
// until the busy timeout has passed by the clock since it began: every start
// succeeds unless another process really holds the lock that long.
func Open(ctx context.Context, path string, opt sink.Options, extra ...Option) (*Sink, error) {
	var cfg config
	for _, o := range extra {
		o(&cfg)
	}
	cfg.logger = cmp.Or(cfg.logger, slog.Default())
	opt = opt.WithDefaults()
	if err := processSetup(); err != nil {
		return nil, fmt.Errorf("sqlite sink %s: %w", path, err)
	}
	var d *db
	err := retryBusy(ctx, opt.BusyTimeout, func() error {
		var err error
		d, err = openOnce(ctx, path, opt, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Sink{Machine: sink.NewMachine(d, opt, cfg.logger.With("db", path), "sqlite sink"), db: d}, nil
}

// openOnce is one attempt of Open; on error it leaves nothing open.
func openOnce(ctx context.Context, path string, opt sink.Options, cfg config) (*db, error) {
	var err error
	ms := cfg.migrations
	if ms == nil {
		if ms, err = migrations(); err != nil {
			return nil, fmt.Errorf("sqlite sink %s: %w", path, err)
		}
	}
	if err := checkFile(path, opt, ms); err != nil {
		return nil, err
	}
	s := &db{path: path, opt: opt, log: cfg.logger, migrations: ms, dsnParams: cfg.dsnParams, schemaFound: -1}
	if opt.ReadOnly {
		if s.rdb, err = openDB(path, opt.BusyTimeout, true); err != nil {
			return nil, s.fail(err)
		}
		s.rdb.SetMaxOpenConns(readers)
		s.rdb.SetMaxIdleConns(readers)
		err := s.checkReadable(ctx)
		if err == nil {
			err = s.checkStructure(ctx, s.rdb)
		}
		if err != nil {
			s.rdb.Close()
			return nil, err
		}
		return s, nil
	}
	// The descriptor that says which file this sink opened: after every
	// commit, the path must still name it (see checkIdentity). It is taken
	// before SQLite opens the path and compared once SQLite has.
	if s.ident, err = openIdentity(path); err != nil {
		return nil, err
	}
	fail := func(err error) (*db, error) {
		if s.wconn != nil {
			s.wconn.Close()
		}
		for _, p := range []*sql.DB{s.rdb, s.wdb} {
			if p != nil {
				p.Close()
			}
		}
		s.ident.close()
		return nil, err
	}
	if s.wdb, err = s.openWritable(); err != nil {
		return fail(s.fail(err))
	}
	s.wdb.SetMaxOpenConns(1)
	// A damaged file is refused before anything is written to it.
	if err := s.checkStructure(ctx, s.wdb); err != nil {
		return fail(err)
	}
	if err := s.migrate(ctx); err != nil {
		return fail(err)
	}
	if s.rdb, err = s.openWritable(); err != nil {
		return fail(s.fail(err))
	}
	s.rdb.SetMaxOpenConns(readers)
	s.rdb.SetMaxIdleConns(readers)
	if s.wconn, err = s.wdb.Conn(ctx); err != nil {
		return fail(s.fail(err))
	}
	var name string
	if err := s.wconn.QueryRowContext(ctx, qMainFile).Scan(&name); err != nil {
		return fail(s.fail(err))
	}
	if err := errors.Join(s.ident.sameFile(path, name), s.ident.watchSides(path, name), s.checkIdentity()); err != nil {
		return fail(err)
	}
	s.ops = make(chan *op, maxBatch)
	s.quit = make(chan struct{})
	s.exited = make(chan struct{})
	go s.writeLoop()
	s.opened.Store(true)
	return s, nil
}

// checkFile refuses, before SQLite touches anything, a path that is a
// directory, a file that is not SQLite, a damaged header, a schema this
// binary may not use, a file this process may not write, and (read-only or
// MustExist) a missing or empty file. Otherwise a missing file is created
// with mode 0600.
func checkFile(path string, opt sink.Options, ms []migration) error {
	readOnly, mustExist := opt.ReadOnly, opt.ReadOnly || opt.MustExist
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		// A link to nothing: creating the file (O_EXCL) would fail on the
		// link, and creating its target is not what was asked.
		if target, lerr := os.Readlink(path); lerr == nil {
			what := fmt.Sprintf("is a symbolic link to %s, which does not exist: point it at the database", target)
			if mustExist {
				return fmt.Errorf("sqlite sink %s: %w: %s", path, sink.ErrNoDatabase, what)
			}
			return fmt.Errorf("sqlite sink %s: %s, or give the path of the file to create instead of the link (gemrecon does not create a link's target)", path, what)
		}
		if mustExist {
			return noDatabase(path, "the file does not exist")
		}
		dir := filepath.Dir(path)
		if err := syscall.Access(dir, 2|1); err != nil { // W_OK|X_OK
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("sqlite sink %s: cannot create the database: directory %s does not exist (gemrecon creates the file, not its directory: create it, or check --db)", path, dir)
			}
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
	if fi.Size() == 0 && mustExist {
		return noDatabase(path, "the file is empty")
	}
	if fi.Size() > 0 {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("sqlite sink %s: %v", path, err)
		}
		head := make([]byte, 100)
		n, _ := io.ReadFull(f, head)
		f.Close()
		if n < len(sqliteHeader) || string(head[:len(sqliteHeader)]) != sqliteHeader {
			return fmt.Errorf("sqlite sink %s: file is not a database (no SQLite header): refusing to touch it", path)
		}
		if n < len(head) {
			return corruptError(path, fmt.Errorf("the file ends inside its %d-byte header (%d bytes)", len(head), n))
		}
		if err := checkHeader(head); err != nil {
			return corruptError(path, err)
		}
		// Refuse a schema this binary may not use or another application's
		// database before opening it: opening for writing would switch it
		// to WAL mode. (The header can lag a WAL not yet checkpointed; the
		// checks are repeated inside the first transaction.)
		version := int(binary.BigEndian.Uint32(head[60:64]))
		app := int(binary.BigEndian.Uint32(head[68:72]))
		if app != 0 && app != applicationID {
			return fmt.Errorf("sqlite sink %s: not a gemrecon database (application_id %d): refusing to touch it", path, app)
		}
		// A newer schema may still be one this binary can use (its minimum
		// reader is not newer than this binary): ask SQLite, read-only.
		if version > len(ms) || (version == 0 && app == 0) {
			if err := checkSchemaReadOnly(path, head, ms); err != nil {
				return err
			}
		}
	}
	if !readOnly {
		if err := checkSides(path, opt.BusyTimeout); err != nil {
			return err
		}
		if err := syscall.Access(path, 2); err != nil { // W_OK
			return fmt.Errorf("sqlite sink %s: database file is read-only (%v): fix its permissions or use a read-only command", path, err)
		}
		if dir, shown := walDir(path); syscall.Access(dir, 2|1) != nil {
			return fmt.Errorf("sqlite sink %s: directory %s is read-only: SQLite needs to create its -wal and -shm files there", path, shown)
		}
	}
	return nil
}

// noDatabase is sink.ErrNoDatabase for the file at path, named by its
// absolute path (a relative --db resolves against a working directory the
// reader of the message may not know), saying why.
func noDatabase(path, why string) error {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return fmt.Errorf("sqlite sink %s: %w: %s", path, sink.ErrNoDatabase, why)
}

// checkSides refuses a database whose -wal exists without its -shm, or the
// other way round, for longer than wait: SQLite deletes both when the last
// connection closes, one after the other, so one alone for longer than that
// says that one was deleted while a process may still use the database
// through it. SQLite would build a new -shm beside the other process's
// orphaned one (or read a -wal the other's -shm does not describe), and two
// processes writing through two WAL-indexes corrupt the file (spec §3 "A
// deleted or replaced file").
func checkSides(path string, wait time.Duration) error {
	name, err := sqliteName(path)
	if err != nil {
		return nil // SQLite, which resolves it too, says what is wrong
	}
	var wal, shm bool
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if wal, shm = exists(name+"-wal"), exists(name+"-shm"); wal == shm {
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
	}
	there, gone := name+"-wal", name+"-shm"
	if shm {
		there, gone = gone, there
	}
	return fmt.Errorf("sqlite sink %s: %s exists without %s: one was deleted, and a process may still use the database through it; "+
		"refusing to open it, which could corrupt it: stop every process that uses the database, then remove %s and run again",
		path, there, gone, shellWord(there))
}

// sqliteName is the name SQLite's unix VFS gives the existing file at path
// (unixFullPathname), after which it names the file's -wal and -shm: made
// absolute from the process's working directory (getcwd) and with every
// symbolic link of every component followed, a ".." going up from where the
// links before it led. A --db that is a link into another directory has its
// -wal and -shm in the directory of the link's target. EvalSymlinks resolves
// as SQLite does, and syscall.Getwd is the kernel's working directory (no
// link in it, as $PWD, which os.Getwd may return, can have).
func sqliteName(path string) (string, error) {
	r, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	if filepath.IsAbs(r) {
		return r, nil
	}
	wd, err := syscall.Getwd()
	if err != nil {
		return "", err
	}
	return filepath.Join(wd, r), nil
}

// walDir is the directory where SQLite keeps the -wal and -shm files of the
// existing file at path (that of sqliteName), and how messages name it: as
// filepath.Dir(path) when that is the same directory, else the resolved
// directory and why it is that one. When the name cannot be resolved it is
// filepath.Dir(path): SQLite, which resolves it too, then says what is
// wrong.
func walDir(path string) (dir, shown string) {
	given := filepath.Dir(path)
	name, err := sqliteName(path)
	if err != nil {
		return given, given
	}
	dir = filepath.Dir(name)
	if a, err := os.Stat(given); err == nil {
		if b, err := os.Stat(dir); err == nil && os.SameFile(a, b) {
			return given, given
		}
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return dir, fmt.Sprintf("%s (where the link %s points)", dir, filepath.Base(path))
	}
	return dir, fmt.Sprintf("%s (where %s leads, its symbolic links followed)", dir, path)
}

// checkHeader checks the fields of an SQLite header (after its magic string)
// that have only a few valid values: a header that fails is damaged.
func checkHeader(h []byte) error {
	ps := int(binary.BigEndian.Uint16(h[16:18]))
	if ps == 1 {
		ps = 65536
	}
	switch {
	case ps < 512 || ps > 65536 || ps&(ps-1) != 0:
		return fmt.Errorf("the header is damaged: page size %d", ps)
	case h[18] < 1 || h[18] > 2 || h[19] < 1 || h[19] > 2:
		return fmt.Errorf("the header is damaged: file format versions %d/%d", h[18], h[19])
	case int(h[20]) >= ps-480:
		return fmt.Errorf("the header is damaged: %d reserved bytes per page", h[20])
	case h[21] != 64 || h[22] != 32 || h[23] != 32:
		return fmt.Errorf("the header is damaged: payload fractions %d/%d/%d", h[21], h[22], h[23])
	}
	return nil
}

// checkSchemaReadOnly refuses, reading the file without changing it, an
// SQLite file that holds tables but no gemrecon schema, and a gemrecon schema
// newer than this binary whose minimum reader is newer too. The header said
// version 0 or a newer version, but a WAL not yet checkpointed may hold more:
// ask SQLite.
//
// A file in WAL mode with no -wal file beside it is used by no connection
// (each keeps one), and its main file holds everything: it is read as
// immutable, so that refusing a newer schema creates nothing beside it (a
// read-only connection would leave an empty -wal and an -shm file). Beside
// it is beside SQLite's name of it, links resolved (immutableFile).
// Otherwise, or should that read fail, SQLite reads it the ordinary way.
func checkSchemaReadOnly(path string, head []byte, ms []migration) error {
	// check reads the file named immutable as immutable, or when that is
	// "", path the ordinary way.
	check := func(immutable string) error {
		var db *sql.DB
		var err error
		if immutable != "" {
			db, err = openImmutable(immutable)
		} else {
			db, err = openDB(path, sink.DefaultBusyTimeout, true)
		}
		fail := func(err error) error { return classify(path, err, -1, sink.DefaultBusyTimeout) }
		if err != nil {
			return fail(err)
		}
		defer db.Close()
		_, err = checkSchema(context.Background(), db, path, ms, fail)
		return err
	}
	if file, ok := immutableFile(path, head); ok {
		// Trusted only for the newer-schema rule: a read that raced a
		// checkpoint may mix two states, but versions and minimum readers
		// only grow, so a refusal it gives is right. Anything else (a read
		// that failed included) is decided by an ordinary read.
		if err := check(file); err == nil || errors.Is(err, sink.ErrSchemaTooNew) {
			return err
		}
	}
	return check("")
}

// immutableFile returns the file checkSchemaReadOnly may read as immutable:
// the file at path, named as SQLite names it (sqliteName), when its header
// says WAL mode and no -wal (or -journal) exists beside that name, where
// SQLite keeps them — beside the target of a link, not beside the link. It
// is that name that is read, so that a link retargeted since cannot give
// another file whose -wal was not looked for.
func immutableFile(path string, head []byte) (string, bool) {
	if head[18] != 2 {
		return "", false
	}
	file, err := sqliteName(path)
	if err != nil || exists(file+"-wal") || exists(file+"-journal") {
		return "", false
	}
	return file, true
}

// exists reports whether something exists at path.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// openImmutable opens path read-only as an immutable file: no locks, no -wal
// or -shm (see checkSchemaReadOnly for when that is safe).
func openImmutable(path string) (*sql.DB, error) {
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: "mode=ro&immutable=1"}
	return sql.Open("sqlite", u.String())
}

// PageSize is the page size of a database this sink creates. Each page a
// commit changes is written whole to the WAL, and a completion's two commits
// change about six pages: at 1 KiB instead of SQLite's default 4 KiB a
// commit appends about a third of the bytes (BENCHMARKS.md, issue 17). A
// database keeps the page size it was created with; docs/operating.md
// ("SQLite files") says how to rebuild one with this size.
const PageSize = 1024

// openDB opens a pool on path. The busy timeout comes first so that the
// pragmas after it already wait for other processes. The driver runs the
// _pragma list sorted by name and _journal_mode after it: page_size comes
// before the switch to WAL, which creates the file's first page (the page
// size of an existing database does not change). The driver discards what
// the switch answers: a writing sink's pools check it (openWritable).
func openDB(path string, busy time.Duration, readOnly bool) (*sql.DB, error) {
	return sql.Open("sqlite", dsn(path, busy, readOnly))
}

// dsn is the driver's name for path, with the pragmas of openDB.
func dsn(path string, busy time.Duration, readOnly bool) string {
	q := url.Values{"_pragma": {fmt.Sprintf("busy_timeout(%d)", busy.Milliseconds()), "foreign_keys(1)"}}
	if readOnly {
		q.Set("mode", "ro")
	} else {
		q["_pragma"] = append(q["_pragma"], fmt.Sprintf("page_size(%d)", PageSize), "synchronous(FULL)")
		q.Set("_txlock", "immediate")
		q.Set("_journal_mode", "WAL")
	}
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: q.Encode()}
	return u.String()
}

// openWritable opens one of a writing sink's pools: openDB's, with every
// connection checked by checkConn as it opens (the pools open connections
// when they need them, after Open too), so that none is used before it is.
func (s *db) openWritable() (*sql.DB, error) {
	c, err := msqlite.NewConnector(dsn(s.path, s.opt.BusyTimeout, false) + s.dsnParams)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(checkedConnector{Connector: c, check: s.checkConn}), nil
}

// checkedConnector runs check on each connection it opens, and closes it
// and fails when check does. The connection itself is the driver's.
type checkedConnector struct {
	driver.Connector
	check func(context.Context, driver.Conn) error
}

func (c checkedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.check(ctx, conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// ErrNotWAL is wrapped by the refusal of a writing sink's connection that
// SQLite did not put in WAL mode (at Open: the Open's error).
var ErrNotWAL = errors.New("the database is not in WAL mode")

// qMainFile is SQLite's own name of the database file a connection has
// open: the absolute path, with every symbolic link resolved.
const qMainFile = `SELECT file FROM pragma_database_list WHERE name = 'main'`

// checkConn refuses a writing sink's connection that is not in WAL mode, or
// that SQLite opened on another file than the sink's identity (sameFile).
//
// The driver runs PRAGMA journal_mode=WAL and discards its answer, and
// SQLite answers a switch it cannot make (no shared memory for the file:
// another VFS, nolock) with the mode it keeps, not an error. Everything the
// sink does assumes WAL: commits under synchronous=FULL, readers beside the
// writer, and the row cache, which reads the WAL-index header of the -shm
// file. In another mode an -shm beside the file is a stale one that no
// commit changes (the row cache, armed only by a change its own commit
// made, would stay off; nothing here relies on that).
func (s *db) checkConn(ctx context.Context, c driver.Conn) error {
	mode, err := connText(ctx, c, "PRAGMA journal_mode")
	if err != nil {
		return err
	}
	if mode != "wal" {
		return fmt.Errorf("sqlite sink %s: %w: SQLite kept it in journal mode %q when asked for WAL (it does so when it cannot switch), and gemrecon needs WAL mode: "+
			"refusing to use it; run gemrecon again once `sqlite3 %s 'PRAGMA journal_mode=WAL'` prints wal", s.path, ErrNotWAL, mode, shellWord(s.path))
	}
	file, err := connText(ctx, c, qMainFile)
	if err != nil {
		return err
	}
	if err := s.ident.sameFile(s.path, file); err != nil {
		// A connection opened later (the reader pool reconnects) on
		// another file: the path names another file now, and the sink is
		// broken, as its next commit's identity check would find.
		if s.opened.Load() {
			s.markBroken(err)
		}
		return err
	}
	return nil
}

// connText runs q, which answers one row of one text column, on a driver
// connection.
func connText(ctx context.Context, c driver.Conn, q string) (string, error) {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx, q, nil)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return "", fmt.Errorf("%s: %w", q, err)
	}
	if s, ok := v[0].(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("%s: %T, want text", q, v[0])
}

// fail turns a driver error into one line naming the file and the cause. A
// busy database gives a *lockedError (the time waited is not known here); a
// corruption error marks the sink broken.
func (s *db) fail(err error) error {
	if err == nil {
		return nil
	}
	err = classify(s.path, err, -1, s.opt.BusyTimeout)
	if errors.Is(err, ErrCorrupt) {
		s.markBroken(err)
	}
	return err
}

// classify is fail without a sink: waited is how long the caller waited for
// a lock (-1: not measured).
func classify(path string, err error, waited, busy time.Duration) error {
	var le *lockedError
	if errors.As(err, &le) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrFileReplaced) || errors.Is(err, ErrNotWAL) || errors.Is(err, ErrNoRoom) {
		return err // classified already
	}
	var se *msqlite.Error
	if errors.As(err, &se) {
		if nr := noRoomError(path, err, se); nr != nil {
			return nr
		}
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return &lockedError{path: path, busy: busy, waited: waited, err: err}
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return corruptError(path, err)
		case sqlite3.SQLITE_READONLY:
			if se.Code() == sqlite3.SQLITE_READONLY_DIRECTORY {
				// A read of a WAL database whose -wal and -shm files do
				// not exist, in a directory this user may not write.
				_, dir := walDir(path)
				return fmt.Errorf("sqlite sink %s: cannot read it: its directory %s is not writable by this user, and SQLite must create the database's -wal and -shm files there even to read it (WAL mode): let this user write the directory, or run as one who may: %w",
					path, dir, err)
			}
			return fmt.Errorf("sqlite sink %s: database is read-only: %w", path, err)
		case sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("sqlite sink %s: cannot open the database file: %w", path, err)
		}
	}
	return fmt.Errorf("sqlite sink %s: %w", path, err)
}

// Close stops the writer (answering what is queued) and releases the
// database. It is safe to call more than once.
func (s *db) Close() error {
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
		closeStmts(&s.wstmts)
		errs = append(errs, s.wconn.Close(), s.wdb.Close())
	}
	closeStmts(&s.rstmts)
	errs = append(errs, s.rdb.Close())
	s.ident.close() // after the connections: see identity.close
	return errors.Join(errs...)
}

// Now is the sink's clock (sink.Clock): the one its times are written by.
func (s *db) Now(context.Context) (time.Time, error) { return s.opt.Now(), nil }

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
