package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/sink"
)

// effectFlags are the effect and retry flags of spec §4 and the
// confirmation flags of spec §9.2 and §9.5, shared by poll, serve and
// drain. Their rules are dispatch's (Config.Validate, ParseConfirmMode,
// ConfirmMode.Confirms) and sink.Options.Validate's.
type effectFlags struct {
	exec    string
	forward string
	sql     string // --sql FILE
	print   bool
	given   func(name string) bool // the flag was on the command line
	// cfg holds the dispatcher's flags (concurrency, lease, timeouts,
	// grace), retry the sink's retry policy (which computes backoff).
	cfg        dispatch.Config
	retry      sink.Options
	confirm    string
	resultsDir string
}

func (f *effectFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	f.cfg = dispatch.DefaultConfig()
	c, r := &f.cfg, &f.retry
	fs.StringVar(&f.exec, "exec", "", "effect: run this /bin/sh -c command per completion (event document on stdin, GEMRECON_* env)")
	fs.StringVar(&f.forward, "forward", "", "effect: POST the event document to this URL (signed when GEMRECON_FORWARD_SECRET is set)")
	fs.StringVar(&f.sql, "sql", "", "effect: run the SQL statements of `FILE` in the very transaction that marks the key done, in the sink's database (parameters @"+strings.Join(sqlscript.ParamNames(), " @")+")")
	fs.BoolVar(&f.print, "print", false, "effect: print each completion's event document as one NDJSON line on stdout, before the key is marked done")
	f.given = fs.Changed
	// One effect per process (dispatch.Config.Validate: Effect or SQL);
	// which flag names it is the command line's business.
	cmd.MarkFlagsMutuallyExclusive(effectNames...)
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "effects run at once")
	fs.DurationVar(&c.Lease, "lease", c.Lease, "claim lease; renewed every third of it while the effect runs")
	fs.DurationVar(&c.EffectTimeout, "effect-timeout", c.EffectTimeout, "kill an effect (its whole process group) after this long, or give up an NDJSON line stdout does not take (then exit 1); must be shorter than --lease")
	fs.DurationVar(&c.Grace, "grace", c.Grace, "on SIGINT/SIGTERM, running effects get this long to finish before they are killed and retried later, and recording their outcomes this long to succeed; a second SIGINT/SIGTERM ends it at once")
	fs.IntVar(&r.MaxAttempts, "max-attempts", sink.DefaultMaxAttempts, "a key goes dead after this many failed attempts")
	fs.DurationVar(&r.RetryBase, "retry-base", sink.DefaultRetryBase, "first retry delay ceiling (doubles per attempt, full jitter)")
	fs.DurationVar(&r.RetryMax, "retry-max", sink.DefaultRetryMax, "largest retry delay ceiling")
	fs.StringVar(&f.confirm, "confirm", string(dispatch.ConfirmAuto), "confirm keys first seen by webhook with the API (Batches.Get) before their effect runs: auto (when API credentials are set), always (exit 2 without them), never")
	fs.StringVar(&f.resultsDir, "results-dir", "", "write a succeeded Gemini API batch's results to DIR/<id>.jsonl before its effect runs (needs API credentials); the path is results_file in the event document and GEMRECON_RESULTS_FILE")
	fs.DurationVar(&c.DownloadTimeout, "download-timeout", c.DownloadTimeout, "bound one results download; it runs under the key's claim, whose lease is renewed meanwhile, so it may exceed --lease")
}

// effectNames are the flags that choose the effect, exactly one per process.
var effectNames = []string{"exec", "forward", "sql", "print"}

// noEffect is the refusal of a command line that names no effect. Before
// issue 24 such a line printed NDJSON and marked every key done: a bare
// poll consumed completions without running anything.
const noEffect = "no effect given: choose what runs once per completion with --exec CMD, --forward URL, --sql FILE or --print (add --print to print each completion as an NDJSON line, as before)"

// checkChoice is the rule of issue 24: exactly one effect flag (cobra
// refuses two), none of them empty, and an --exec command that is a single
// word or path must name an executable file now rather than fail with 127
// on every attempt for hours. The refusals are usage errors (exit 2).
func (f *effectFlags) checkChoice() error {
	for _, e := range []struct{ flag, value, what string }{
		{"exec", f.exec, "command to run"}, {"forward", f.forward, "URL to POST to"}, {"sql", f.sql, "SQL file to run"},
	} {
		if f.given(e.flag) && strings.TrimSpace(e.value) == "" {
			return usageError("--%s is empty: give the %s (an unset variable in a crontab or unit gives an empty value)", e.flag, e.what)
		}
	}
	if f.exec == "" && f.forward == "" && f.sql == "" && !f.print {
		return usageError(noEffect)
	}
	if f.exec != "" {
		return execCheck(f.exec)
	}
	return nil
}

// shellSyntax are the bytes that make an --exec command more than a word to
// /bin/sh: white space, quotes, expansions, redirections, operators, globs,
// comments, assignments. Such a command is the shell's to run, unchecked.
const shellSyntax = " \t\n\"'`$\\;&|<>(){}[]*?~#!="

// shBuiltins are /bin/sh's special built-ins, which no PATH lookup finds.
var shBuiltins = map[string]bool{":": true, ".": true, "break": true, "continue": true, "eval": true, "exec": true,
	"exit": true, "export": true, "readonly": true, "return": true, "set": true, "shift": true, "times": true,
	"trap": true, "unset": true}

// execCheck refuses an --exec command that is one word or path (no shell
// syntax) and names no executable file, as /bin/sh would find it: through
// PATH for a bare word, else relative to the working directory.
func execCheck(command string) error {
	word := strings.TrimSpace(command)
	if strings.ContainsAny(word, shellSyntax) || shBuiltins[word] {
		return nil
	}
	_, err := exec.LookPath(word)
	var why string
	switch {
	case err == nil || errors.Is(err, exec.ErrDot):
		return nil
	case errors.Is(err, exec.ErrNotFound):
		why = fmt.Sprintf("no executable %s on PATH (%s): give its path (./%s), or run gemrecon with its directory on PATH", word, os.Getenv("PATH"), word)
	case errors.Is(err, fs.ErrNotExist):
		why = "no such file"
		if wd, werr := os.Getwd(); werr == nil && !filepath.IsAbs(word) {
			why += " in the working directory " + wd
		}
	case errors.Is(err, fs.ErrPermission):
		why = "not executable: chmod +x " + word
	case errors.Is(err, syscall.EISDIR):
		why = "is a directory"
	default:
		why = err.Error()
	}
	return usageError("--exec %s: %s", word, why)
}

// dispatchConfig builds the dispatcher's configuration from the flags, its
// effect included, and checks it with the sink's retry policy (exit 2),
// before anything is opened. startDispatcher adds the Sink and the API.
func (a *app) dispatchConfig(f *effectFlags) (dispatch.Config, error) {
	cfg := f.cfg
	if err := usage(f.retry.Validate()); err != nil {
		return cfg, err
	}
	if err := durationFlagCheck("grace", cfg.Grace); err != nil {
		return cfg, err
	}
	if err := f.checkChoice(); err != nil {
		return cfg, err
	}
	var err error
	if f.sql != "" { // checked at start-up (unreadable file, unknown parameter)
		if cfg.SQL, err = sqlscript.Load(f.sql); err != nil {
			return cfg, usageError("--sql %v", err)
		}
	} else if cfg.Effect, err = a.effect(f); err != nil {
		return cfg, err
	}
	if cfg.Grace == 0 {
		cfg.Grace = -1 // dispatch reads 0 as "the default"; --grace 0 means none
	}
	cfg.Logger = a.logger
	// Rechecks of keys the API has not confirmed back off like retries
	// (but use no attempt).
	cfg.RecheckBase, cfg.RecheckMax = f.retry.RetryBase, f.retry.RetryMax
	return cfg, usage(cfg.Validate())
}

// effect builds the configured effect (checkChoice made sure there is
// one): --exec, --forward or --print.
func (a *app) effect(f *effectFlags) (effect.Effect, error) {
	switch {
	case f.exec != "":
		return effect.NewExec(f.exec, a.execOutput()), nil
	case f.forward != "":
		fw, err := effect.NewForward(f.forward, os.Getenv("GEMRECON_FORWARD_SECRET"), &http.Client{Timeout: f.cfg.EffectTimeout})
		if err != nil {
			// The error never contains the secret (effect's contract).
			return nil, withCode(exitUsage, fmt.Errorf("--forward: %w", err))
		}
		return fw, nil
	default:
		// Without a handler, a write to a broken stdout kills a Go
		// program with SIGPIPE: nothing logged, keys left claimed. With
		// one, the write returns EPIPE and the print effect breaks
		// cleanly (issue 12 item 6). Notify, not Ignore: an ignored
		// signal would be inherited by --exec commands.
		handleSIGPIPE()
		// Appended to a file whose last line an earlier run's cut-off
		// write left partial, the first line starts a new one.
		return effect.NewPrint(a.stdout, func() {
			a.logger.Warn("stdout ended in a partial line (an earlier write was cut off); started a new line")
		}), nil
	}
}

// execOutput is where an --exec command's stdout and stderr go: to
// gemrecon's stderr, a whole line at a time; under --log-format json each
// line as a record of its own ({"msg":"effect output","key":…,"stream":…,
// "line":…}), so that every line on stderr stays one JSON object. Like the
// raw lines of the text format, these records do not depend on
// --log-level.
func (a *app) execOutput() func(effect.OutputLine) {
	if a.logFormat != "json" {
		return effect.ExecOutput(a.stderr)
	}
	out := slog.New(slog.NewJSONHandler(a.stderr, nil))
	return func(l effect.OutputLine) {
		out.Info("effect output", "key", l.Key, "stream", l.Stream, "line", l.Text)
	}
}

// handleSIGPIPE makes writes to a broken pipe return EPIPE instead of
// killing the process. The channel is never read: signal.Notify drops what
// does not fit.
var handleSIGPIPE = sync.OnceFunc(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })

// setupAPI puts what the process has of the API into the dispatcher's
// configuration cfg (dispatchConfig): it decides, for --confirm and
// --results-dir, whether this process confirms and writes results
// (dispatch's rules: ConfirmMode.Confirms, Config.Validate), and builds its
// one poller when it needs one (p, when the command already has a poller for
// listing: one rate limiter per process for list, get and downloads).
// unconfirmed: --confirm auto without credentials (startDispatcher warns,
// once the command is under way).
func (a *app) setupAPI(ctx context.Context, pf *pollFlags, mode dispatch.ConfirmMode, ef *effectFlags, p *poller.Poller, cfg dispatch.Config) (_ dispatch.Config, unconfirmed bool, err error) {
	pcfg := a.pollerConfig(pf)
	creds := p != nil || pcfg.CheckCredentials() == nil
	if cfg.Confirm, unconfirmed, err = mode.Confirms(creds); err != nil {
		return cfg, false, usage(err)
	}
	if creds && (cfg.Confirm || ef.resultsDir != "") && p == nil {
		if err := usage(pcfg.Validate()); err != nil {
			return cfg, false, err
		}
		if p, err = poller.New(ctx, pcfg); err != nil {
			return cfg, false, err
		}
	}
	// The listing poller, or the one just built; a nil *Poller must not
	// become a non-nil API.
	if p != nil {
		cfg.API = p
	}
	if ef.resultsDir != "" {
		// Checked before the directory is made: a refused command
		// leaves nothing behind.
		cfg.Results = new(results.Dir)
		if err := usage(cfg.Validate()); err != nil {
			return cfg, false, err
		}
		if cfg.Results, err = results.Open(ef.resultsDir); err != nil {
			return cfg, false, withCode(exitUsage, err)
		}
	}
	return cfg, unconfirmed, usage(cfg.Validate())
}

// startDispatcher opens the sink with the retry policy and starts the
// command's dispatcher on it: cfg (dispatchConfig, with the API: setupAPI)
// and the observer newObs builds on the sink (nil: none); a second SIGINT or
// SIGTERM ends its grace.
func (a *app) startDispatcher(ctx context.Context, command string, cfg dispatch.Config, retry sink.Options, unconfirmed bool, newObs func(sink.Sink) dispatch.Observer) (sink.Sink, *dispatch.Dispatcher, error) {
	s, err := a.openSink(ctx, retry)
	if err != nil {
		return nil, nil, err
	}
	if unconfirmed {
		// Said once the database is open, so that a command that cannot
		// start says only why.
		a.logger.Warn(`no API credentials: keys first seen by webhook run unconfirmed ("confirmed": false, their operation is the webhook's body); keys seen only through a dynamic signature wait for a process that can confirm them. Set GEMINI_API_KEY to confirm, or --confirm never to silence this`)
	}
	cfg.Command, cfg.Sink = command, s
	if newObs != nil {
		cfg.Observer = newObs(s)
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		return nil, nil, usage(err)
	}
	a.intr.add(d)
	return s, d, nil
}

// drainOptions are drain's flags.
type drainOptions struct {
	ef effectFlags
	pf pollFlags
}

const drainLong = `Claim and run every key that is due now — new keys, retries whose backoff has
passed, claims whose lease expired — with the configured effect, then exit.
API credentials are optional: with them keys first seen by webhook are
confirmed before their effect runs (--confirm) and --results-dir can write
results; without them such keys run unconfirmed (dynamically signed ones
wait). SIGINT or SIGTERM stops claiming and gives running effects --grace; a
second signal kills them at once and drain exits 1.

Exit status: 0 every effect it ran succeeded, 4 some effect failed (retry
scheduled or key dead) or an outcome was fenced (the effect may have run
twice), 1 a fatal error or an interruption.`

func (a *app) drainCommand() *cobra.Command {
	var o drainOptions
	cmd := &cobra.Command{
		Use:   "drain [effect flags]",
		Short: "Run the effect for every key that is due now (retries, takeovers), without listing",
		Long:  drainLong,
		Example: `  gemrecon drain --exec ./publish.sh
  gemrecon drain --forward https://billing.internal/hooks/gemini --concurrency 8`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runDrain(cmd.Context(), &o) },
	}
	o.ef.register(cmd)
	o.pf.registerAPI(cmd.Flags())
	return cmd
}

// runDrain is drain: one Dispatcher.Drain and its summary line.
func (a *app) runDrain(ctx context.Context, o *drainOptions) error {
	mode, err := dispatch.ParseConfirmMode(o.ef.confirm)
	if err != nil {
		return usage(err)
	}
	dcfg, err := a.dispatchConfig(&o.ef)
	if err != nil {
		return err
	}
	dcfg, unconfirmed, err := a.setupAPI(ctx, &o.pf, mode, &o.ef, nil, dcfg)
	if err != nil {
		return err
	}
	_, d, err := a.startDispatcher(ctx, "drain", dcfg, o.ef.retry, unconfirmed, nil)
	if err != nil {
		return err
	}
	start := time.Now()
	sum, err := d.Drain(ctx)
	a.printDrainSummary(sum, time.Since(start))
	if err != nil {
		return err
	}
	// The exit status of spec §5: 4 when some effect failed (a retry is
	// scheduled or the key went dead) or some outcome was fenced (another
	// attempt took the key over: the effect may have run twice).
	if sum.Failed > 0 || sum.Dead > 0 || sum.Fenced > 0 {
		return withCode(exitNotDone, nil)
	}
	return nil
}

// printDrainSummary writes drain's summary line on stderr, as one JSON
// object under --log-format json (as poll's, reportPass), and when an
// outcome was fenced a second line (a warning record in JSON) saying an
// effect may have run twice.
func (a *app) printDrainSummary(sum dispatch.Summary, took time.Duration) {
	asJSON := a.logFormat == "json"
	if err := dispatch.WriteLine(a.stderr, sum.Line(took), asJSON); err != nil {
		a.logger.Error("writing the drain summary", "err", err)
	}
	if sum.Fenced == 0 {
		return
	}
	const why = "another attempt took the key over, so an effect may have run twice (see the FENCED log lines; raise --lease, or make the downstream refuse stale fencing tokens)"
	if asJSON {
		a.logger.Warn("drain: outcomes fenced: "+why, "fenced", sum.Fenced)
		return
	}
	fmt.Fprintf(a.stderr, "drain: %d outcome(s) fenced: %s\n", sum.Fenced, why)
}
