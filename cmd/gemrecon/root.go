package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// app holds what every command shares: streams, global flags, the logger.
// There are no global variables: tests build a fresh app per command line.
type app struct {
	stdout io.Writer
	stderr io.Writer

	db        string
	logFormat string
	logLevel  string
	logger    *slog.Logger

	// intr is the SIGINT/SIGTERM handler: it learns the logger and every
	// dispatcher the command starts.
	intr *interrupts

	sinksMu sync.Mutex
	sinks   []sink.Sink // every sink the command opened
}

// execute builds the command tree, runs args and returns the exit status;
// SIGINT and SIGTERM reach the command through in (run; in-process tests
// pass an interrupts that no signal feeds).
func execute(ctx context.Context, in *interrupts, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Effects, workers and the logger write to stderr concurrently. (stdout
	// is left as it is: only the print effect writes there, under its own
	// lock, and it must see an *os.File to sync each line.)
	stderr = &syncWriter{w: stderr}
	a := &app{stdout: stdout, stderr: stderr, intr: in}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := a.withBrokenSink(root.ExecuteContext(ctx))
	if err != nil && isCobraUsageError(err) {
		err = withCode(exitUsage, err)
	}
	code := exitCode(err)
	// An exitError with a nil err: the command said what it had to.
	if ee, ok := errors.AsType[*exitError](err); err != nil && (!ok || ee.err != nil) {
		attrs := []any{"exit", code}
		if code == exitUsage {
			attrs = append(attrs, "hint", usageHint)
		}
		a.errorLine(err.Error(), attrs...)
	}
	return code
}

const usageHint = "Run 'gemrecon --help' (or 'gemrecon COMMAND --help') for usage."

// errorLine writes one of gemrecon's own error lines on stderr: "gemrecon:
// MSG" (and, with a "hint" attribute, the hint on a line of its own) in text;
// under --log-format json an ERROR record with MSG and attrs, so that every
// line on stderr stays one JSON object — a failing command's last word
// included (a locked database, a refused retry). Before the flags were
// parsed (an unknown flag) a valid --log-format value still decides. Like
// the text line, the record is written whatever --log-level says (it may be
// above ERROR: "ERROR+4").
func (a *app) errorLine(msg string, attrs ...any) { a.stderrLine(slog.LevelError, msg, attrs...) }

// stderrLine is errorLine at another level (a hint is a WARN record).
func (a *app) stderrLine(level slog.Level, msg string, attrs ...any) {
	if a.logFormat == "json" {
		h := slog.NewJSONHandler(a.stderr, &slog.HandlerOptions{Level: slog.Level(math.MinInt)})
		slog.New(h).Log(context.Background(), level, msg, attrs...)
		return
	}
	fmt.Fprintf(a.stderr, "gemrecon: %s\n", msg)
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "hint" {
			fmt.Fprintln(a.stderr, attrs[i+1])
		}
	}
}

// isCobraUsageError recognises the errors cobra itself returns for wrong
// words on the command line (it has no typed errors for them) that do not
// pass through the FlagErrorFunc (rootCommand), which gives every flag
// parsing error its exit status: an unknown command, a wrong argument count
// of cobra's own commands (completion), a flag group's refusal.
func isCobraUsageError(err error) bool {
	if _, ok := errors.AsType[*exitError](err); ok {
		return false
	}
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "requires at most", "if any flags in the group"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gemrecon",
		Short: "Run each Gemini batch completion's downstream work once",
		Long: `gemrecon turns every sighting of a Gemini batch completion — webhook
deliveries (at least once) and reconciliation poll passes — into an
idempotency key ("gemini:batches/…") in one durable claim/lease sink (SQLite,
or PostgreSQL for many machines), and runs each completion's effect (a
command, an HTTP forward, an SQL script or an NDJSON line) until it succeeds,
and never again once it is done.`,
		Example: `  gemrecon demo                         # a self-contained run, no credentials
  gemrecon --db /var/lib/gemrecon/sink.db init   # once: create the database
  GEMINI_API_KEY=… gemrecon --db /var/lib/gemrecon/sink.db poll --exec ./publish.sh
  gemrecon serve --secret-file /etc/gemrecon/whsec --forward https://internal/hook
  gemrecon status batches/abc123`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error { return a.setup(cmd) },
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if strings.Contains(err.Error(), "time: unknown unit") {
			// "7d": Go durations stop at hours.
			err = fmt.Errorf("%w (durations take h, m, s, ms, us, ns: 7 days is 168h)", err)
		}
		return withCode(exitUsage, err)
	})
	pf := root.PersistentFlags()
	pf.StringVar(&a.db, "db", cmp.Or(os.Getenv("GEMRECON_DB"), "gemrecon.db"),
		"sink database: a SQLite file path, or PostgreSQL as postgres://… or host=… dbname=… (env GEMRECON_DB)")
	pf.StringVar(&a.logFormat, "log-format", cmp.Or(os.Getenv("GEMRECON_LOG_FORMAT"), "text"), "log format on stderr: text or json (env GEMRECON_LOG_FORMAT)")
	pf.StringVar(&a.logLevel, "log-level", cmp.Or(os.Getenv("GEMRECON_LOG_LEVEL"), "info"), "log level: debug, info, warn, error (env GEMRECON_LOG_LEVEL)")

	root.AddCommand(
		a.statusCommand(),
		a.listCommand(),
		a.statsCommand(),
		a.retryCommand(),
		a.rerunCommand(),
		a.purgeCommand(),
		a.drainCommand(),
		a.pollCommand(),
		a.serveCommand(),
		a.demoCommand(),
		a.webhooksCommand(),
		a.emulatorCommand(),
		a.versionCommand(),
		a.initCommand(),
	)
	return root
}

// syncWriter serialises writes to one stream.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// opensDB names the commands that open the --db database; the others
// (version, completion, emulator, webhooks, demo with its own database) run
// whatever --db or GEMRECON_DB says.
var opensDB = map[string]bool{"status": true, "list": true, "stats": true, "retry": true,
	"purge": true, "drain": true, "poll": true, "serve": true, "init": true, "rerun": true}

// setup validates the global flags and builds the logger. --db is checked
// only for a command that opens it.
func (a *app) setup(cmd *cobra.Command) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return usageError("--log-level %q: want debug, info, warn or error", a.logLevel)
	}
	if a.logFormat != "text" && a.logFormat != "json" {
		return usageError("--log-format %q: want text or json", a.logFormat)
	}
	a.logger = a.newLogger(level)
	a.intr.setLogger(a.logger)
	usesDB := cmd.HasParent() && !cmd.Parent().HasParent() && opensDB[cmd.Name()]
	if _, err := dial.Parse(a.db); err != nil && usesDB { // sink/dial decides what --db names
		return withCode(exitUsage, fmt.Errorf("--db: %w", err))
	}
	return nil
}

// newLogger is a logger on stderr in the --log-format (already validated)
// that writes records at level and above.
func (a *app) newLogger(level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if a.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(a.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(a.stderr, opts))
}

// openSink opens the configured database, which must hold gemrecon's
// schema already (an older one is upgraded): only init creates one, so a
// mistyped --db is refused instead of being started afresh, which would run
// every completion in the window again (issue 24).
func (a *app) openSink(ctx context.Context, opt sink.Options) (sink.Sink, error) {
	opt.MustExist = true
	return a.dialSink(ctx, opt)
}

// dialSink opens the configured database as opt says; it stays open until
// the command has ended (withBrokenSink closes it). A --db string that
// names no database (sink/dial decides: a URL-like string that is no
// PostgreSQL URL) is a usage error; a database without gemrecon's schema
// (exit 1) is named by the sink, and the message says what to do.
func (a *app) dialSink(ctx context.Context, opt sink.Options) (sink.Sink, error) {
	s, err := dial.Open(ctx, a.db, opt, a.logger)
	if errors.Is(err, dial.ErrInvalidDSN) {
		return nil, withCode(exitUsage, fmt.Errorf("--db: %w", err))
	}
	if errors.Is(err, sink.ErrNoDatabase) {
		return nil, fmt.Errorf("%w; check --db, or run 'gemrecon init' once to create it", err)
	}
	if err != nil {
		return nil, err
	}
	a.sinksMu.Lock()
	a.sinks = append(a.sinks, s)
	a.sinksMu.Unlock()
	return s, nil
}

// withBrokenSink closes the sinks the command opened (dialSink: the
// commands leave that to it), and makes a command whose database became
// unusable while it ran (a damaged file, a file deleted or replaced under
// it, a failed close: see sink.ErrUnusable) fail with exit 1 and the sink's
// message, which says what to do, whatever the command itself returned
// (spec §8).
func (a *app) withBrokenSink(err error) error {
	a.sinksMu.Lock()
	defer a.sinksMu.Unlock()
	for _, s := range a.sinks {
		s.Close()
	}
	for _, s := range a.sinks {
		var berr error
		if b, ok := s.(interface{ Broken() error }); ok {
			berr = b.Broken()
		}
		if berr == nil {
			continue
		}
		ee, isExit := errors.AsType[*exitError](err)
		switch {
		case errors.Is(err, sink.ErrUnusable): // it says so already
			return withCode(exitFatal, err)
		case err == nil || (isExit && ee.err == nil):
			return berr
		default:
			return withCode(exitFatal, errors.Join(err, berr))
		}
	}
	return err
}

// durationFlagCheck rejects negative durations with a usage error.
func durationFlagCheck(name string, d time.Duration) error {
	if d < 0 {
		return usageError("--%s %v: must not be negative", name, d)
	}
	return nil
}

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
