// Package postgres is the PostgreSQL backend of the sink (spec §3): the same
// state machine as sink/sqlite, for gemrecon processes on many machines
// sharing one database. It loads and stores rows for package sink, which
// decides every transition.
//
// Every write is one transaction at READ COMMITTED whose rows are locked FOR
// UPDATE from the read to the write (ClaimDue's SKIP LOCKED, so that workers
// on many machines skip each other's rows). Time decisions use the database
// clock (now()) unless the caller injects sink.Options.Now. A commit whose
// answer is lost (the connection broke, the context ended) is settled: the
// orphaned server backend is terminated and the transaction's status asked
// (pg_xact_status), so the answer is the database's, not a guess.
package postgres

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gemrecon/gemrecon/sink"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Defaults of the PostgreSQL backend.
const (
	// DefaultStatementTimeout bounds every statement (statement_timeout).
	DefaultStatementTimeout = 30 * time.Second
	// DefaultMaxConns bounds the connections one Sink opens, unless the DSN
	// sets pool_max_conns.
	DefaultMaxConns = 8
	// maxRetries bounds re-runs after serialization failures and deadlocks.
	maxRetries = 5
	// settleTimeout bounds settling an unknown outcome.
	settleTimeout = 10 * time.Second
	// pingIdleAfter: a pooled connection idle at least this long is pinged
	// before use, so that one the server or the network dropped is replaced
	// rather than failing (or, for a write, leaving its outcome unknown).
	// pgxpool's own default is 1 s; 30 s spares busy-but-bursty callers a
	// round trip per burst, and keeps the lost-reply tests (whose reply
	// stream is cut after a warm-up) from depending on machine speed.
	pingIdleAfter = 30 * time.Second
)

// Option adjusts how Open connects; sink.Options carries the contract's knobs.
type Option func(*config)

type config struct {
	logger        *slog.Logger
	roundTrip     time.Duration // 0: statement_timeout + RoundTripMargin
	pingIdleAfter time.Duration // see the constant; tests change it
	migrations    []migration   // tests: an older or newer binary's (nil: the embedded ones)
}

// WithLogger sets where payload conflicts, fenced outcomes and settled
// unknown outcomes are logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Sink is the PostgreSQL sink: the state machine over one database.
type Sink struct {
	*sink.Machine
	pg *pg
}

// SchemaVersions returns the schema version Open found (0: none, so it
// created gemrecon's tables) and the one the database holds now: this
// binary's, or a newer one that a newer gemrecon wrote and this one may use.
func (s *Sink) SchemaVersions() (found, now int) { return s.pg.schemaFound, s.pg.schemaNow }

// pg is the store of the PostgreSQL sink (sink.Store).
type pg struct {
	pool    *pgxpool.Pool
	opt     sink.Options
	dbClock bool   // time decisions use now() (opt.Now was nil at Open)
	appName string // application_name of our connections, to find orphans
	log     *slog.Logger

	connectTimeout time.Duration // for messages
	migrations     []migration   // what this binary knows
	// schemaFound and schemaNow are SchemaVersions'.
	schemaFound, schemaNow int
	// beforeCommit, when set, runs once before the next COMMIT (tests:
	// a commit whose answer is lost).
	beforeCommit atomic.Pointer[func()]
}

// ErrInvalidDSN is wrapped by Open's error for a connection string that
// pgx cannot parse (a bad URL, an unknown sslmode, pool_max_conns=abc, a TLS
// file it cannot read): the caller's wrong words, not a server that cannot
// be reached. The error text does not quote the string, which may hold a
// password.
var ErrInvalidDSN = errors.New("the connection string cannot be used")

// dsnError is Open's error for a connection string pgx.ParseConfig refused.
// pgx's text quotes the string with its password masked on a best-effort
// basis only (a malformed string can leave part of one), so only what it
// says after the string is kept: "cannot parse `…`: failed to configure TLS
// (sslmode is invalid)" becomes "failed to configure TLS (sslmode is
// invalid)".
func dsnError(err error) error {
	cause := "pgx cannot parse it"
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		if msg := pe.Error(); strings.HasPrefix(msg, "cannot parse `") {
			if i := strings.LastIndex(msg, "`: "); i >= 0 && i+3 < len(msg) {
				cause = msg[i+3:]
			}
		}
	}
	return fmt.Errorf("postgres: %w: %s", ErrInvalidDSN, cause)
}

// Open connects to the database named by dsn (postgres://, postgresql:// or
// key=value; a search_path parameter is passed to the server, and pgxpool's
// pool_* parameters such as pool_max_conns configure the pool), applies
// pending migrations under an advisory lock, and returns the sink. With
// opt.ReadOnly it never creates or migrates, and with opt.MustExist it
// migrates but never creates: missing tables are sink.ErrNoDatabase. If
// opt.Now is nil the database clock decides every time; otherwise opt.Now
// does.
func Open(ctx context.Context, dsn string, opt sink.Options, opts ...Option) (*Sink, error) {
	c := config{pingIdleAfter: pingIdleAfter}
	for _, o := range opts {
		o(&c)
	}
	c.logger = cmp.Or(c.logger, slog.Default())
	dbClock := opt.Now == nil
	opt = opt.WithDefaults()

	// pgxpool.ParseConfig takes the pool_* parameters (pool_max_conns,
	// pool_max_conn_lifetime, …) out of the DSN; the rest are sent to the
	// server as run-time parameters.
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, dsnError(err)
	}
	// ParseConfig does not say whether pool_max_conns was there, so look
	// at the unparsed parameters.
	if raw, err := pgx.ParseConfig(dsn); err != nil || raw.RuntimeParams["pool_max_conns"] == "" {
		cfg.MaxConns = DefaultMaxConns
	}
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		return p.IdleDuration >= c.pingIdleAfter
	}
	// The DSN's settings win over these. Writes run at READ COMMITTED and
	// must be durable when they return, whatever the server's defaults say.
	rp := cfg.ConnConfig.RuntimeParams
	for name, v := range map[string]string{
		"statement_timeout":             strconv.FormatInt(DefaultStatementTimeout.Milliseconds(), 10),
		"lock_timeout":                  strconv.FormatInt(opt.BusyTimeout.Milliseconds(), 10),
		"default_transaction_isolation": "read committed",
		"synchronous_commit":            "on",
		"application_name":              "gemrecon/" + strings.ToLower(rand.Text()[:8]),
	} {
		if _, ok := rp[name]; !ok {
			rp[name] = v
		}
	}
	if opt.ReadOnly {
		rp["default_transaction_read_only"] = "on"
	}
	// Client-side deadlines: the server's statement_timeout cannot help when
	// the server (or the network) accepts TCP and never answers.
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	rt := c.roundTrip
	if rt <= 0 {
		rt = roundTripTimeout(rp["statement_timeout"])
	}
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &deadlineConn{Conn: nc, d: rt}, nil
	}
	// Ask the server to cancel a statement whose context ends, so that most
	// cancellations get a definite answer; the deadline is the fallback,
	// after which the outcome is unknown and settled by reading back.
	cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: time.Second}
	}

	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &pg{pool: pool, opt: opt, dbClock: dbClock, appName: rp["application_name"], log: c.logger}
	s.connectTimeout = cfg.ConnConfig.ConnectTimeout
	if s.migrations = c.migrations; s.migrations == nil {
		s.migrations, err = migrations()
	}
	if err == nil {
		err = s.migrate(ctx)
	}
	if err != nil {
		s.pool.Close()
		return nil, err
	}
	return &Sink{Machine: sink.NewMachine(s, opt, c.logger, "postgres sink"), pg: s}, nil
}

// migration is one embedded schema step, sink.Migration: MinReader is the
// oldest schema version a binary must know to use the database once the
// step is applied (spec §3). The file rules are sink.ParseMigration's and
// sink.LoadMigrations'.
type migration = sink.Migration

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	ms, err := sink.LoadMigrations(migrationFS)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return ms, nil
}

// firstSchema returns the first schema a search_path setting names, ""
// for "$user" (PostgreSQL's default, which must not be created) or none.
func firstSchema(path string) string {
	first, _, _ := strings.Cut(path, ",")
	first = strings.TrimSpace(first)
	if strings.HasPrefix(first, `"`) && strings.HasSuffix(first, `"`) && len(first) >= 2 {
		first = strings.ReplaceAll(first[1:len(first)-1], `""`, `"`)
	}
	if first == "$user" {
		return ""
	}
	return first
}

// SchemaVersion is the schema version this binary migrates to.
func SchemaVersion() int {
	ms, _ := migrations()
	return len(ms)
}

const migrateLock = `SELECT pg_advisory_xact_lock(hashtext('gemrecon.migrate'), hashtext(current_setting('search_path')))`

// upsertMinReader records the schema's minimum reader in gemrecon_counters
// (it never goes down).
const upsertMinReader = `INSERT INTO gemrecon_counters (name, value) VALUES ('min_reader', $1)
	ON CONFLICT (name) DO UPDATE SET value = greatest(gemrecon_counters.value, excluded.value)`

// minReaderOf reads the minimum reader the database records; ok is false
// when it records none.
func minReaderOf(ctx context.Context, q pgx.Tx) (mr int, ok bool, err error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('gemrecon_counters') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, false, err
	}
	err = q.QueryRow(ctx, `SELECT value FROM gemrecon_counters WHERE name = 'min_reader'`).Scan(&mr)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return mr, err == nil, err
}

// migrate applies pending migrations in one transaction holding an advisory
// lock, so that processes opening the database at once take turns, and
// records the schema's minimum reader. A schema newer than this binary is
// used as it is when its minimum reader is not newer than this binary.
//
// A read-only open never migrates: the tables must exist at this binary's
// version, or at a newer one whose minimum reader this binary is. An older
// schema is refused: this binary's queries need its tables, and a command
// that writes upgrades it.
func (s *pg) migrate(ctx context.Context) error {
	ms := s.migrations
	return s.withConn(ctx, func(c *pgx.Conn) error {
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if !s.opt.ReadOnly {
			if _, err := tx.Exec(ctx, migrateLock); err != nil {
				return fmt.Errorf("postgres: migration lock: %w", err)
			}
		}
		// A search_path from the DSN names where the tables belong: create
		// its first schema too, or CREATE TABLE would fall through to the
		// next one (usually public).
		var path string
		if err := tx.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path); err != nil {
			return fmt.Errorf("postgres: read search_path: %w", err)
		}
		schema := firstSchema(path)
		if s.opt.MustExist || s.opt.ReadOnly {
			if err := requireTables(ctx, tx, schema); err != nil {
				return err
			}
		}
		if schema != "" && !s.opt.ReadOnly {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize()); err != nil {
				return fmt.Errorf("postgres: create schema %s: %w", schema, err)
			}
		}
		if !s.opt.ReadOnly {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS gemrecon_schema_version (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				return fmt.Errorf("postgres: schema version table: %w", err)
			}
		}
		var cur int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM gemrecon_schema_version`).Scan(&cur); err != nil {
			return fmt.Errorf("postgres: read schema version: %w", err)
		}
		s.schemaFound, s.schemaNow = cur, max(cur, len(ms))
		if cur > len(ms) {
			mr, ok, err := minReaderOf(ctx, tx)
			if err != nil {
				return fmt.Errorf("postgres: read the schema's minimum reader: %w", err)
			}
			if err := sink.CheckReader(cur, mr, ok, len(ms)); err != nil {
				return fmt.Errorf("postgres: %w", err)
			}
			return tx.Commit(ctx) // a newer schema this binary may use as it is
		}
		if s.opt.ReadOnly {
			if cur < len(ms) {
				return fmt.Errorf("postgres: schema version %d is older than %d: run gemrecon init (or any writing command) once to upgrade it", cur, len(ms))
			}
			return nil
		}
		for _, m := range ms[cur:] {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO gemrecon_schema_version (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("postgres: migration %s: %w", m.Name, err)
			}
		}
		// Also for databases migrated before the minimum reader was kept.
		if _, err := tx.Exec(ctx, upsertMinReader, ms[len(ms)-1].MinReader); err != nil {
			return fmt.Errorf("postgres: record the schema's minimum reader: %w", err)
		}
		return tx.Commit(ctx)
	})
}

// requireTables is sink.ErrNoDatabase unless gemrecon's tables are in
// schema, the one the search_path names first ("": the first of its
// schemas that exists, current_schema()), which is where migrate creates
// them. A search_path whose first schema does not exist must not fall
// through to a later one: a mistyped schema would then find another
// deployment's tables, or none. The message names the database and the
// schema.
func requireTables(ctx context.Context, q pgx.Tx, schema string) error {
	var db, where string
	var hasSchema, hasTables bool
	err := q.QueryRow(ctx, `SELECT current_database(), n.name,
			EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = n.name),
			CASE WHEN n.name = '' THEN false ELSE
				to_regclass(format('%I.gemrecon_schema_version', n.name)) IS NOT NULL AND
				to_regclass(format('%I.gemrecon_keys', n.name)) IS NOT NULL END
		FROM (SELECT coalesce(nullif($1, ''), current_schema(), '') AS name) n`, schema).Scan(&db, &where, &hasSchema, &hasTables)
	switch {
	case err != nil:
		return fmt.Errorf("postgres: look for gemrecon tables: %w", err)
	case hasTables:
		return nil
	case where == "":
		return fmt.Errorf("postgres: database %q: %w: no schema on the search_path exists", db, sink.ErrNoDatabase)
	case !hasSchema:
		return fmt.Errorf("postgres: database %q, schema %q: %w: the schema does not exist", db, where, sink.ErrNoDatabase)
	}
	return fmt.Errorf("postgres: database %q, schema %q: %w: the schema holds no gemrecon tables", db, where, sink.ErrNoDatabase)
}

// withConn runs fn on a pooled connection, re-running it (boundedly) after
// serialization failures, deadlocks and errors raised before anything was
// sent. fn must be one autocommit statement or a whole transaction.
func (s *pg) withConn(ctx context.Context, fn func(c *pgx.Conn) error) error {
	var err error
	for try := 0; ; try++ {
		var pc *pgxpool.Conn
		pc, err = s.pool.Acquire(ctx)
		if err != nil {
			return acquireError{err: err, connectTimeout: s.connectTimeout, callerEnded: ctx.Err() != nil}
		}
		err = fn(pc.Conn())
		// Release destroys the connection instead if it is closed, busy or
		// still inside a transaction.
		pc.Release()
		if err == nil || try >= maxRetries || !retryable(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(time.Duration(try+1) * 5 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

// retryable reports errors after which the statement certainly did not
// commit and running it again may succeed.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40001" || pe.Code == "40P01"
	}
	return pgconn.SafeToRetry(err)
}

// acquireError wraps an error getting a pooled connection (the pool is
// closed, the context ended while waiting, the server refused a new
// connection): no statement was sent, so the outcome is known.
type acquireError struct {
	err            error
	connectTimeout time.Duration
	callerEnded    bool // the caller's context ended (not the connect timeout)
}

func (e acquireError) Error() string {
	var nr *noReply
	if !e.callerEnded && !errors.As(e.err, &nr) && (pgconn.Timeout(e.err) || errors.Is(e.err, context.DeadlineExceeded)) {
		return fmt.Sprintf("postgres: could not connect within the connect timeout of %v (connect_timeout in the DSN sets it): %v", e.connectTimeout, e.err)
	}
	return "postgres: acquire a connection: " + e.err.Error()
}
func (e acquireError) Unwrap() error { return e.err }

// unknownOutcome reports an error after which the statement may or may not
// have committed: the request may have reached the server, and no reply
// (neither success nor an error) came back, or a FATAL error that ended the
// connection came instead of one.
func unknownOutcome(err error) bool {
	if err == nil {
		return false
	}
	var nc notCommitted
	if errors.As(err, &nc) {
		return false // raised inside a transaction before COMMIT was sent
	}
	var ae acquireError
	if errors.As(err, &ae) || pgconn.SafeToRetry(err) {
		return false // nothing was sent (a FATAL error connecting included)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// An error reply: the autocommit statement (or COMMIT) rolled
		// back — unless it is FATAL or PANIC, which ends the connection,
		// not necessarily the statement: a server that crashes after the
		// commit record was flushed tells every client "terminating
		// connection because of crash of another server process" in place
		// of its reply, and the commit survives the crash.
		sev := cmp.Or(pe.SeverityUnlocalized, pe.Severity)
		return sev == "FATAL" || sev == "PANIC"
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// The whole reply came (the result, then ReadyForQuery after the
		// implicit commit) and held no row: known, not lost.
		return false
	}
	return true
}

// Write runs fn in one transaction (sink.Store), again after a
// serialization failure or a deadlock. When the answer to its COMMIT is
// lost, Write terminates the server backend that ran it (so that it cannot
// still commit later) and asks the transaction's status: committed is
// success, aborted the error, and anything else an error wrapping
// sink.ErrOutcomeUnknown.
func (s *pg) Write(ctx context.Context, fn func(sink.Tx) error) error {
	var (
		pid uint32
		xid string
	)
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		pid, xid = c.PgConn().PID(), ""
		tx, err := c.Begin(ctx)
		if err != nil {
			return notCommitted{err}
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		t := &pgTx{tx: tx, ctx: ctx}
		if err := tx.QueryRow(ctx, `SELECT now(), pg_current_xact_id()::text`).Scan(&t.now, &xid); err != nil {
			return notCommitted{err}
		}
		if !s.dbClock {
			t.now = s.opt.Now()
		}
		if err := fn(t); err != nil {
			return notCommitted{err}
		}
		if hook := s.beforeCommit.Swap(nil); hook != nil {
			(*hook)()
		}
		return tx.Commit(ctx)
	})
	if !unknownOutcome(err) || xid == "" {
		if err != nil {
			return withCtxErr(ctx, err)
		}
		return nil
	}
	s.log.Warn("postgres sink: a commit's answer was lost; terminating its backend and asking the transaction's status",
		"pid", pid, "err", err)
	s.settle(ctx, pid)
	status := "unknown" // NULL: too old to be known
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if serr := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT coalesce(pg_xact_status($1::xid8), 'unknown')`, xid).Scan(&status)
	}); serr != nil || status == "unknown" || status == "in progress" {
		return fmt.Errorf("postgres: %w (%w; the transaction's status: %v %v)", sink.ErrOutcomeUnknown, err, status, serr)
	}
	if status == "committed" {
		return nil
	}
	return notCommitted{err}
}

// notCommitted wraps an error after which the transaction certainly did
// not commit: raised before COMMIT was sent, or an aborted transaction.
type notCommitted struct{ err error }

func (e notCommitted) Error() string { return e.err.Error() }
func (e notCommitted) Unwrap() error { return e.err }

// settle makes an orphaned statement's outcome final: it terminates the
// backend (waiting for it to exit) if it is still there. Terminating is safe:
// a transaction is either committed or rolled back by it, never half.
func (s *pg) settle(ctx context.Context, pid uint32) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_ = s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
			WHERE pid = $1 AND application_name = $2 AND pid <> pg_backend_pid()`, int64(pid), s.appName)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	})
}

// Now is the time by the clock the sink's statements use (sink.Clock): the
// server's now() as a statement there would see it, or the injected clock.
func (s *pg) Now(ctx context.Context) (time.Time, error) {
	if !s.dbClock {
		return s.opt.Now(), nil
	}
	var t time.Time
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT now()`).Scan(&t)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("postgres: the server's time: %w", err)
	}
	return t.UTC(), nil
}

// closeWait bounds how long Close waits for the driver to finish closing
// connections: closing one the server stopped answering takes the driver up
// to 15 s (a cancel request and a drain, each bounded by the round-trip
// deadline), which would only delay a command's exit.
const closeWait = 2 * time.Second

// Close closes the connections, waiting for any still in use by other
// calls to be given back, and at most closeWait for the driver to finish
// closing them.
func (s *pg) Close() error {
	closed := make(chan struct{})
	go func() {
		s.pool.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeWait):
		s.log.Warn("postgres sink: the server does not answer; not waiting for the last connections to close", "waited", closeWait)
	}
	return nil
}
