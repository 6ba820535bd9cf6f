package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/sink"
)

// effectFlags are the effect and retry flags of spec §4, shared by poll,
// serve and drain.
type effectFlags struct {
	exec          string
	forward       string
	sql           string            // --sql FILE
	sqlScript     *sqlscript.Script // loaded by validate
	concurrency   int
	lease         time.Duration
	effectTimeout time.Duration
	grace         time.Duration
	maxAttempts   int
	retryBase     time.Duration
	retryMax      time.Duration
}

func (f *effectFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.exec, "exec", "", "effect: run this /bin/sh -c command per completion (event document on stdin, GEMRECON_* env)")
	fs.StringVar(&f.forward, "forward", "", "effect: POST the event document to this URL (signed when GEMRECON_FORWARD_SECRET is set)")
	fs.StringVar(&f.sql, "sql", "", "effect: run the SQL statements of `FILE` in the very transaction that marks the key done, in the sink's database (parameters @key @name @state @source @token @attempt @operation)")
	fs.IntVar(&f.concurrency, "concurrency", 4, "effects run at once")
	fs.DurationVar(&f.lease, "lease", 10*time.Minute, "claim lease; renewed every third of it while the effect runs")
	fs.DurationVar(&f.effectTimeout, "effect-timeout", 5*time.Minute, "kill an effect (its whole process group) after this long, or give up an NDJSON line stdout does not take (then exit 1); must be shorter than --lease")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "on SIGINT/SIGTERM, running effects get this long to finish before they are killed and retried later, and recording their outcomes this long to succeed")
	fs.IntVar(&f.maxAttempts, "max-attempts", sink.DefaultMaxAttempts, "a key goes dead after this many failed attempts")
	fs.DurationVar(&f.retryBase, "retry-base", sink.DefaultRetryBase, "first retry delay ceiling (doubles per attempt, full jitter)")
	fs.DurationVar(&f.retryMax, "retry-max", sink.DefaultRetryMax, "largest retry delay ceiling")
}

// validate checks the flags before anything is opened (exit 2 on error).
func (f *effectFlags) validate() error {
	if n := btoi(f.exec != "") + btoi(f.forward != "") + btoi(f.sql != ""); n > 1 {
		return usageError("--exec, --forward and --sql are exclusive: choose one effect")
	}
	if f.sql != "" { // --sql: checked at start-up (unreadable file, unknown parameter)
		q, err := sqlscript.Load(f.sql)
		if err != nil {
			return usageError("--sql %v", err)
		}
		f.sqlScript = q
	}
	if f.concurrency < 1 {
		return usageError("--concurrency %d: must be at least 1", f.concurrency)
	}
	if f.lease <= 0 || f.effectTimeout <= 0 {
		return usageError("--lease and --effect-timeout must be positive")
	}
	if f.effectTimeout >= f.lease {
		return usageError("--effect-timeout %v must be shorter than --lease %v: an effect outliving its lease could run twice", f.effectTimeout, f.lease)
	}
	if f.maxAttempts < 1 {
		return usageError("--max-attempts %d: must be at least 1", f.maxAttempts)
	}
	if f.retryBase <= 0 || f.retryMax < f.retryBase {
		return usageError("--retry-base must be positive and not above --retry-max")
	}
	if f.grace < 0 {
		return usageError("--grace must not be negative")
	}
	if f.forward != "" && !strings.HasPrefix(f.forward, "http://") && !strings.HasPrefix(f.forward, "https://") {
		return usageError("--forward %q: want an http:// or https:// URL", f.forward)
	}
	return nil
}

// sinkOptions carries the retry policy into the sink, which computes backoff.
func (f *effectFlags) sinkOptions() sink.Options {
	return sink.Options{RetryBase: f.retryBase, RetryMax: f.retryMax, MaxAttempts: f.maxAttempts}
}

// effect builds the configured effect; the default prints NDJSON on stdout.
func (a *app) effect(f *effectFlags) (effect.Effect, error) {
	switch {
	case f.exec != "":
		return effect.NewExec(f.exec, effect.ExecOutput(a.stderr)), nil
	case f.forward != "":
		secret := os.Getenv("GEMRECON_FORWARD_SECRET")
		client := &http.Client{Timeout: f.effectTimeout}
		fw, err := effect.NewForward(f.forward, secret, client)
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
		return effect.NewPrint(a.stdout), nil
	}
}

var sigpipeOnce sync.Once

// handleSIGPIPE makes writes to a broken pipe return EPIPE instead of
// killing the process. The channel is never read: signal.Notify drops what
// does not fit.
func handleSIGPIPE() {
	sigpipeOnce.Do(func() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) })
}

// dispatcher wires a sink, the configured effect and what the process has
// of the API (confirmation, results: setupAPI).
func (a *app) dispatcher(s sink.Sink, f *effectFlags, obs dispatch.Observer, api apiSetup, cf *confirmFlags) (*dispatch.Dispatcher, error) {
	eff, err := a.effect(f)
	if err != nil {
		return nil, err
	}
	return a.dispatcherFor(s, eff, f, obs, api, cf)
}

// dispatcherFor is dispatcher with the effect given (demo wraps the
// configured one to tell its story).
func (a *app) dispatcherFor(s sink.Sink, eff effect.Effect, f *effectFlags, obs dispatch.Observer, api apiSetup, cf *confirmFlags) (*dispatch.Dispatcher, error) {
	grace := f.grace
	if grace == 0 {
		grace = -1 // dispatch reads 0 as "the default"; --grace 0 means none
	}
	if f.sqlScript != nil { // --sql replaces the effect
		eff = nil
	}
	cfg := dispatch.Config{
		Sink:          s,
		Effect:        eff,
		SQL:           f.sqlScript,
		Lease:         f.lease,
		EffectTimeout: f.effectTimeout,
		Concurrency:   f.concurrency,
		Grace:         grace,
		Logger:        a.logger,
		Observer:      obs,
		Confirm:       api.confirm,
		Results:       api.results,
		// Rechecks of keys the API has not confirmed back off like
		// retries (but use no attempt).
		RecheckBase:     f.retryBase,
		RecheckMax:      f.retryMax,
		DownloadTimeout: cf.downloadTimeout,
	}
	if api.poller != nil {
		cfg.API = api.poller
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		return nil, withCode(exitUsage, err)
	}
	return d, nil
}

// summaryExit maps a dispatch summary to the exit status of spec §5: 4 when
// some effect failed (a retry is scheduled or the key went dead) or some
// outcome was fenced (another attempt took the key over: the effect may have
// run twice).
func summaryExit(sum dispatch.Summary) error {
	if sum.Failed > 0 || sum.Dead > 0 || sum.Fenced > 0 {
		return withCode(exitNotDone, nil)
	}
	return nil
}

func (a *app) drainCommand() *cobra.Command {
	var (
		ef effectFlags
		pf pollFlags
		cf confirmFlags
	)
	cmd := &cobra.Command{
		Use:   "drain [effect flags]",
		Short: "Run the effect for every key that is due now (retries, takeovers), without listing",
		Long: `Claim and run every key that is due now — new keys, retries whose backoff has
passed, claims whose lease expired — with the configured effect, then exit.
poll does the same after its listing. drain needs no API credentials: with
them (GEMINI_API_KEY, or --backend vertex with --project and --location) it
confirms keys first seen by webhook with the API before their effect runs
(--confirm auto, the default) and can write results (--results-dir); without
them it runs such keys unconfirmed, and leaves keys seen only through a
dynamic signature for a process that can confirm them.

Exit status: 0 every effect it ran succeeded, 4 some effect failed (a retry is
scheduled or the key went dead) or some outcome was fenced (another attempt
took the key over: the effect may have run twice), 1 a fatal error.`,
		Example: `  gemrecon drain --exec ./publish.sh
  gemrecon drain --forward https://billing.internal/hooks/gemini --concurrency 8`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ef.validate(); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			api, err := a.setupAPI(cmd.Context(), &pf, &cf, nil)
			if err != nil {
				return err
			}
			s, err := a.openSink(cmd.Context(), ef.sinkOptions())
			if err != nil {
				return err
			}
			defer s.Close()
			a.warn(api)
			d, err := a.dispatcher(s, &ef, nil, api, &cf)
			if err != nil {
				return err
			}
			start := time.Now()
			sum, err := d.Drain(cmd.Context())
			a.printDrainSummary(sum, time.Since(start))
			if err != nil {
				return err
			}
			return summaryExit(sum)
		},
	}
	ef.register(cmd.Flags())
	pf.registerAPI(cmd.Flags())
	cf.register(cmd.Flags())
	return cmd
}

// printDrainSummary writes drain's summary line on stderr, as one JSON
// object under --log-format json (as poll's, printSummary), and when an
// outcome was fenced a second line (a warning record in JSON) saying an
// effect may have run twice.
func (a *app) printDrainSummary(sum dispatch.Summary, took time.Duration) {
	asJSON := a.logFormat == "json"
	if err := sum.Line(took).Write(a.stderr, asJSON); err != nil {
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

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
