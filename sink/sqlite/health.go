package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/gemrecon/gemrecon/sink"
)

// ErrCorrupt is wrapped by the errors of a sink whose database file is
// damaged (SQLITE_CORRUPT, SQLITE_NOTADB, a bad header, an unreadable root
// page). Once a sink has met one, it is broken: see Broken.
var ErrCorrupt = errors.New("the database file is damaged")

// ErrFileReplaced is wrapped by the errors of a sink whose path stopped
// naming the file it opened (deleted, or another file renamed over it).
// Once a sink has seen that, it is broken: see Broken.
var ErrFileReplaced = errors.New("the database file was deleted or replaced while open")

// corruptError is the one-line message of a damaged file: which file, what
// was found, and what to do.
func corruptError(path string, cause error) error {
	return fmt.Errorf("sqlite sink %s: %w (%w; %w): stop every gemrecon that uses it, then restore it from a backup, "+
		"or move it away (with its -wal and -shm files) so that an empty one is created, in which completions seen again run their effect again; "+
		"`sqlite3 %s 'PRAGMA integrity_check'` shows the damage", path, ErrCorrupt, sink.ErrUnusable, cause, shellWord(path))
}

// replacedError is the one-line message of a path that no longer names the
// opened file.
func replacedError(path, what string) error {
	return fmt.Errorf("sqlite sink %s: %w (%s; %w): what this process commits now goes to a file no other process can see, so it acknowledges nothing more; "+
		"restart gemrecon to use the file the path names now (completions recorded only in the old file run their effect again when seen again)",
		path, ErrFileReplaced, what, sink.ErrUnusable)
}

// lockedError is a database that another process kept locked. waited is how
// long the caller waited for it, measured by the clock (-1: not measured), so
// that the message says what really happened: SQLite answers some lock
// conflicts at once, without waiting the busy timeout.
type lockedError struct {
	path   string
	busy   time.Duration // the busy timeout
	waited time.Duration
	err    error
}

func (e *lockedError) Error() string {
	switch {
	case e.waited < 0:
		return fmt.Sprintf("sqlite sink %s: database is locked by another process: %v", e.path, e.err)
	case e.waited >= e.busy:
		return fmt.Sprintf("sqlite sink %s: database is locked by another process (waited %v, the busy timeout of %v): %v",
			e.path, e.waited.Round(time.Millisecond), e.busy, e.err)
	default:
		return fmt.Sprintf("sqlite sink %s: database is locked by another process (gave up after %v, before the busy timeout of %v): %v",
			e.path, e.waited.Round(time.Millisecond), e.busy, e.err)
	}
}

func (e *lockedError) Unwrap() error { return e.err }

// Bounds of the pause between two attempts of an operation that met a busy
// database (see retryBusy). They are small next to any busy timeout: the
// conflicts SQLite answers without waiting (two processes switching a new
// file to WAL mode at once) last a few milliseconds.
const (
	minBusyPause = time.Millisecond
	maxBusyPause = 50 * time.Millisecond
)

// testHookBusyRetry, when set (tests), is called before each pause of
// retryBusy with the busy error that caused it.
var testHookBusyRetry func(error)

// retryBusy runs fn again, after a short randomised pause, while it fails
// with a *lockedError and the busy timeout has not passed since the first
// attempt, by the clock. The returned lockedError carries the time waited. An
// attempt that itself waited the busy timeout in SQLite's busy handler is not
// repeated; one that started just before the deadline may wait it once more,
// so the whole can take up to about twice the busy timeout.
func retryBusy(ctx context.Context, busy time.Duration, fn func() error) error {
	start := time.Now()
	deadline := start.Add(busy)
	pause := minBusyPause
	for {
		err := fn()
		var le *lockedError
		if err == nil || !errors.As(err, &le) {
			return err
		}
		now := time.Now()
		le.waited = now.Sub(start)
		if !now.Before(deadline) || ctx.Err() != nil {
			return err
		}
		if h := testHookBusyRetry; h != nil {
			h(err)
		}
		d := min(pause/2+rand.N(pause/2+1), deadline.Sub(now))
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			le.waited = time.Since(start)
			return err
		}
		pause = min(2*pause, maxBusyPause)
	}
}

// markBroken makes every later write, Record and Ping of the sink fail with
// err (the first such error wins) and logs it, once, at error level.
func (s *db) markBroken(err error) {
	if s.broken.CompareAndSwap(nil, &err) {
		s.log.Error("sqlite sink: THE DATABASE IS UNUSABLE; every write and readiness check fails from now on", "db", s.path, "err", err)
	}
}

// Broken returns the error that made the sink unusable — a damaged file
// (ErrCorrupt) or a path that stopped naming the opened file
// (ErrFileReplaced) — or nil while it is usable. A broken sink stays broken:
// its writes, Records and Pings fail with that error.
func (s *db) Broken() error {
	if b := s.broken.Load(); b != nil {
		return *b
	}
	return nil
}

// identity is a descriptor of the database file taken when the sink opened
// it: as long as it is open, the file's inode cannot be reused, so device and
// inode name that file and no other. wal and shm are the -wal and -shm files
// SQLite opened beside it (zero until the open has them): SQLite keeps its
// descriptors of them open, so their inodes cannot be reused either.
type identity struct {
	f              *os.File
	main, wal, shm fileID
	name           string // SQLite's name of the file, beside which the -wal and -shm are
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// statID is the device and inode of the file at path.
func statID(path string) (fileID, error) {
	var st syscall.Stat_t
	err := syscall.Stat(path, &st)
	return fileID{uint64(st.Dev), st.Ino}, err
}

func openIdentity(path string) (*identity, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite sink %s: %v", path, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("sqlite sink %s: %v", path, err)
	}
	return &identity{f: f, main: fileID{uint64(st.Dev), st.Ino}}, nil
}

// watchSides records the -wal and -shm files SQLite opened beside name (its
// name of the database, which the writer connection gives).
func (id *identity) watchSides(path, name string) error {
	var err1, err2 error
	id.name = name
	id.wal, err1 = statID(name + "-wal")
	id.shm, err2 = statID(name + "-shm")
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("sqlite sink %s: its -wal and -shm files: %v", path, err)
	}
	return nil
}

// close releases the descriptor. With POSIX locks (no OFD locks), closing a
// descriptor drops the process's locks on the file: call it only after the
// sink's connections are closed.
func (id *identity) close() {
	if id != nil && id.f != nil {
		id.f.Close()
		id.f = nil
	}
}

// sameFile fails unless file — the name SQLite gives the database it has
// open (qMainFile), every symbolic link resolved — names the file of id. The
// path the sink was given may be a link, and retargeting it while the sink
// opens could give SQLite or one connection another file than the identity
// check sees.
func (id *identity) sameFile(path, file string) error {
	now, err := statID(file)
	if err != nil {
		return fmt.Errorf("sqlite sink %s: %w (the file SQLite opened, %s: %v): the path was changed while gemrecon opened it; run gemrecon again",
			path, ErrFileReplaced, file, err)
	}
	if now != id.main {
		return fmt.Errorf("sqlite sink %s: %w (SQLite opened %s, device %d inode %d; the path named device %d inode %d when the open began): "+
			"the path was changed while gemrecon opened it; run gemrecon again", path, ErrFileReplaced, file, now.dev, now.ino, id.main.dev, id.main.ino)
	}
	return nil
}

// checkIdentity fails unless the path still names the file the sink
// opened, and its -wal and -shm are still the files SQLite opened: three
// stats, made after every commit and every second. A -wal or -shm deleted or
// replaced under the process (spec §3 "A deleted or replaced file") makes
// it copy what its WAL holds into the database file first (a checkpoint
// through SQLite's open descriptors): a WAL that no path names any more is
// lost with the process, and with it every commit not yet checkpointed.
func (s *db) checkIdentity() error {
	now, err := statID(s.path)
	if err != nil {
		return replacedError(s.path, fmt.Sprintf("the path names no file now: %v", err))
	}
	if now != s.ident.main {
		return replacedError(s.path, fmt.Sprintf("the path names another file now: device %d inode %d, opened: device %d inode %d",
			now.dev, now.ino, s.ident.main.dev, s.ident.main.ino))
	}
	for _, side := range []struct {
		suffix string
		id     fileID
	}{{"-wal", s.ident.wal}, {"-shm", s.ident.shm}} {
		if side.id == (fileID{}) {
			continue // not open yet
		}
		if now, err := statID(s.ident.name + side.suffix); err != nil || now != side.id {
			_, cerr := s.wconn.ExecContext(context.Background(), `PRAGMA wal_checkpoint(FULL)`)
			saved := "what its WAL held was copied into the database file"
			if cerr != nil {
				saved = fmt.Sprintf("copying what its WAL held into the database file failed (%v): what was committed since the last checkpoint is lost when this process ends", cerr)
			}
			return replacedError(s.path, fmt.Sprintf("its %s file %s was deleted or replaced; %s; stop every gemrecon that uses the database before you start one again",
				side.suffix, s.ident.name+side.suffix, saved))
		}
	}
	return nil
}

// schemaObject is a table or index of the schema with its own b-tree.
type schemaObject struct {
	typ, name, table string
	root             int64
	withoutRowid     bool
}

// checkStructure finds a damaged file at open without reading all of it (a
// full integrity_check is O(size)): the header's free-page list must point
// inside the file, and every table and index of the schema must be
// reachable: its root page is a b-tree page of its kind, and the query for
// its first entry succeeds (SQLite validates each page it reads on the way:
// the root and the pages down to that entry).
//
// Every figure comes from one read transaction: another process may be
// migrating the file meanwhile.
func (s *db) checkStructure(ctx context.Context, pool *sql.DB) error {
	db, err := pool.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return s.fail(err)
	}
	defer db.Rollback()
	var pages, pageSize int64
	var head []byte
	if err := db.QueryRowContext(ctx, `SELECT (SELECT page_count FROM pragma_page_count), (SELECT page_size FROM pragma_page_size),
		(SELECT data FROM sqlite_dbpage WHERE pgno = 1)`).Scan(&pages, &pageSize, &head); err != nil {
		return s.fail(fmt.Errorf("read the header: %w", err))
	}
	if pages == 0 {
		return nil // a new, empty file
	}
	if len(head) < 100 {
		return s.fail(corruptError(s.path, fmt.Errorf("page 1 is %d bytes", len(head))))
	}
	freeTrunk := int64(binary.BigEndian.Uint32(head[32:36]))
	freeCount := int64(binary.BigEndian.Uint32(head[36:40]))
	if freeTrunk > pages || (freeTrunk == 0) != (freeCount == 0) || freeCount > pages {
		return s.fail(corruptError(s.path, fmt.Errorf("the header's free-page list is damaged (first trunk page %d, %d free pages, %d pages in all)",
			freeTrunk, freeCount, pages)))
	}
	usable := pageSize - int64(head[20])
	objs, err := schemaObjects(ctx, db)
	if err != nil {
		return s.fail(fmt.Errorf("read the schema: %w", err))
	}
	for _, o := range objs {
		what := fmt.Sprintf("%s %s (root page %d)", o.typ, o.name, o.root)
		if o.root > pages {
			return s.fail(corruptError(s.path, fmt.Errorf("%s: beyond the file's %d pages", what, pages)))
		}
		var page []byte
		if err := db.QueryRowContext(ctx, `SELECT data FROM sqlite_dbpage WHERE pgno = ?`, o.root).Scan(&page); err != nil {
			return s.fail(fmt.Errorf("%s: %w", what, err))
		}
		if err := checkBtreePage(page, o.root, usable, o.typ == "index" || o.withoutRowid); err != nil {
			return s.fail(corruptError(s.path, fmt.Errorf("%s: %w", what, err)))
		}
		var one int
		err = db.QueryRowContext(ctx, firstEntryQuery(o)).Scan(&one)
		switch {
		case err == nil || errors.Is(err, sql.ErrNoRows):
		case o.typ == "index" && !isCorruption(err) && strings.Contains(err.Error(), "no query solution"):
			// A partial index no plain scan may use: its root page was checked.
		default:
			return s.fail(fmt.Errorf("%s: %w", what, err))
		}
	}
	return nil
}

// schemaObjects lists the tables and indexes that have a b-tree.
func schemaObjects(ctx context.Context, db *sql.Tx) ([]schemaObject, error) {
	rows, err := db.QueryContext(ctx, `SELECT s.type, s.name, s.tbl_name, s.rootpage, coalesce(l.wr, 0)
		FROM sqlite_schema s LEFT JOIN pragma_table_list l ON l.schema = 'main' AND l.name = s.name
		WHERE s.type IN ('table', 'index') AND s.rootpage > 0 ORDER BY s.rootpage`)
	objs, err := collect(rows, err, func(sc scanner) (o schemaObject, err error) {
		return o, sc.Scan(&o.typ, &o.name, &o.table, &o.root, &o.withoutRowid)
	})
	for i, o := range objs {
		// The primary key's order is the table's own b-tree: its columns,
		// quoted, are what firstEntryQuery orders by.
		if err == nil && o.typ == "table" && o.withoutRowid {
			err = db.QueryRowContext(ctx, `SELECT group_concat('"' || replace(name, '"', '""') || '"', ', ' ORDER BY pk)
				FROM pragma_table_info(?) WHERE pk > 0`, o.name).Scan(&objs[i].table)
		}
	}
	return objs, err
}

// firstEntryQuery reads the first entry of o's own b-tree.
func firstEntryQuery(o schemaObject) string {
	switch {
	case o.typ == "index":
		return `SELECT 1 FROM ` + quoteIdent(o.table) + ` INDEXED BY ` + quoteIdent(o.name) + ` LIMIT 1`
	case o.withoutRowid:
		return `SELECT 1 FROM ` + quoteIdent(o.name) + ` ORDER BY ` + o.table + ` LIMIT 1`
	default:
		return `SELECT 1 FROM ` + quoteIdent(o.name) + ` ORDER BY rowid LIMIT 1`
	}
}

// checkBtreePage checks the header of b-tree page pgno: its type (an index
// b-tree, which WITHOUT ROWID tables are too, or a table b-tree) and that its
// cell pointers fit in the page.
func checkBtreePage(page []byte, pgno, usable int64, indexTree bool) error {
	off := 0
	if pgno == 1 {
		off = 100
	}
	if len(page) < off+8 {
		return fmt.Errorf("the page is %d bytes", len(page))
	}
	flag := page[off]
	hdr := 8
	switch {
	case indexTree && flag == 0x02, !indexTree && flag == 0x05:
		hdr = 12
	case indexTree && flag == 0x0a, !indexTree && flag == 0x0d:
	default:
		kind := "a table"
		if indexTree {
			kind = "an index"
		}
		return fmt.Errorf("not %s b-tree page (page type 0x%02x)", kind, flag)
	}
	cells := int64(binary.BigEndian.Uint16(page[off+3 : off+5]))
	start := int64(binary.BigEndian.Uint16(page[off+5 : off+7]))
	if start == 0 {
		start = 65536
	}
	if end := int64(off+hdr) + 2*cells; end > usable || (cells > 0 && start < end) || start > usable {
		return fmt.Errorf("%d cells do not fit in the page (cell content from byte %d)", cells, start)
	}
	return nil
}

// isCorruption reports SQLite's errors for a damaged file.
func isCorruption(err error) bool {
	var se *msqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return true
		}
	}
	return errors.Is(err, ErrCorrupt)
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// shellWord quotes path for a shell command line that a message suggests
// (single quotes, unless it needs none): a path with a space or a quote
// in it is one word when pasted.
func shellWord(path string) string {
	if plainWord.MatchString(path) {
		return path
	}
	return "'" + strings.ReplaceAll(path, "'", `'\''`) + "'"
}

// plainWord matches a path that is one shell word as it is.
var plainWord = regexp.MustCompile(`^[a-zA-Z0-9/._+,:@%-]+$`)
