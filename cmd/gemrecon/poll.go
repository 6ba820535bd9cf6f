package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/reconcile"
)

// pollFlags configure the listing side of a poll pass (spec §5). Their
// rules are poller.Config.Validate's and reconcile's.
type pollFlags struct {
	// cfg holds the poller's flags (APIKey and Logger are set at use:
	// pollerConfig), loop the pass loop's: --full-scan-every (§5.2),
	// --pass-lease (§5.5), and poll's --min-interval and --force.
	cfg  poller.Config
	loop reconcile.PollConfig
}

func (f *pollFlags) register(fs *pflag.FlagSet) {
	f.cfg = poller.DefaultConfig()
	c := &f.cfg
	fs.StringVar(&c.Backend, "backend", c.Backend, "API backend: gemini (API key from GOOGLE_API_KEY or GEMINI_API_KEY) or vertex (Application Default Credentials)")
	fs.StringVar(&c.BaseURL, "base-url", "", "API base URL, to point at an emulator or proxy (default: the SDK's)")
	fs.StringVar(&c.Project, "project", os.Getenv("GOOGLE_CLOUD_PROJECT"), "Vertex project (env GOOGLE_CLOUD_PROJECT)")
	fs.StringVar(&c.Location, "location", os.Getenv("GOOGLE_CLOUD_LOCATION"), "Vertex location (env GOOGLE_CLOUD_LOCATION)")
	fs.Float64Var(&c.QPS, "qps", 5, "API requests per second, all requests included (0 = unlimited)")
	fs.IntVar(&c.Burst, "burst", c.Burst, "API request burst")
	fs.IntVar(&c.PageSize, "page-size", c.PageSize, "operations per list request")
	fs.DurationVar(&c.Lookback, "lookback", c.Lookback, "the window: terminal batches created longer ago are skipped, and once the listing proves newest first, paging stops at a whole page older than this (0 = no window, read every page)")
	fs.DurationVar(&f.loop.FullScanEvery, "full-scan-every", reconcile.DefaultFullScanEvery, "read every page on at least one pass this often, whatever the listing's order (shorter than --lookback − 48h; 0 = every pass)")
	fs.DurationVar(&f.loop.PassLease, "pass-lease", reconcile.DefaultPassLease, "a pass lists only while it holds its API scope's pass lease, renewed every third of this; when its holder dies, another process takes over after at most this long (at least 1s)")
}

// registerAPI registers the API flags of pollFlags alone (backend, base URL,
// Vertex project and location, rate limit), for a command that talks to the
// API without listing (drain). The listing's flags keep their defaults.
func (f *pollFlags) registerAPI(fs *pflag.FlagSet) {
	all := pflag.NewFlagSet("api", pflag.ContinueOnError)
	f.register(all)
	for _, name := range []string{"backend", "base-url", "project", "location", "qps", "burst"} {
		fs.AddFlag(all.Lookup(name))
	}
}

// pollerConfig is the poller's configuration from the flags and the
// environment's API key.
func (a *app) pollerConfig(f *pollFlags) poller.Config {
	cfg := f.cfg
	cfg.APIKey, cfg.Logger = poller.EnvAPIKey(), a.logger
	return cfg
}

// newPoller builds the listing poller: missing credentials are exit 1 (a
// Gemini API key) or 2 (Vertex without a project and a location).
func (a *app) newPoller(ctx context.Context, cfg poller.Config) (*poller.Poller, error) {
	if err := cfg.CheckCredentials(); errors.Is(err, poller.ErrNoAPIKey) {
		return nil, withCode(exitFatal, err)
	} else if err != nil {
		return nil, usage(err)
	}
	return poller.New(ctx, cfg)
}

// pollConfig is the pass loop's configuration from the flags, with interval
// between the starts of passes (0: one pass; intervalFlag names its flag in
// messages), checked (reconcile's rules: exit 2) before anything is opened;
// the caller adds the sink, the poller and the dispatcher.
func (a *app) pollConfig(f *pollFlags, interval time.Duration, intervalFlag string) (reconcile.PollConfig, error) {
	cfg := f.loop
	cfg.Interval, cfg.Logger = interval, a.logger
	names := map[string]string{"Interval": intervalFlag}
	if err := usage(reconcile.ValidateFullScanEvery(f.cfg.Lookback, cfg.FullScanEvery), names); err != nil {
		return cfg, err
	}
	return cfg, usage(cfg.Validate(), names)
}

// pollOptions are poll's flags.
type pollOptions struct {
	pf          pollFlags
	ef          effectFlags
	watch       bool
	interval    time.Duration
	metricsFile string
	// intervalSet: --interval was given (it does nothing without --watch).
	intervalSet bool
}

func (a *app) pollCommand() *cobra.Command {
	var o pollOptions
	cmd := &cobra.Command{
		Use:     "poll [flags]",
		Short:   "One reconciliation pass over the batch list (for cron), or --watch to repeat",
		Long:    pollLong,
		Example: pollExample,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.intervalSet = cmd.Flags().Changed("interval")
			return a.runPoll(cmd.Context(), &o)
		},
	}
	o.pf.register(cmd.Flags())
	o.ef.register(cmd)
	f := cmd.Flags()
	f.BoolVar(&o.watch, "watch", false, "repeat passes every --interval until SIGINT/SIGTERM")
	f.DurationVar(&o.interval, "interval", 5*time.Minute, "time between the starts of passes with --watch; a pass also skips its listing when a pass of the scope, by any process, started less than 0.9 × this ago")
	f.DurationVar(&o.pf.loop.MinInterval, "min-interval", 0, "without --watch: skip the listing when a pass of the scope, by any process, started less than 0.9 × this ago (for cron on several hosts: give the cron period; 0 = skip only while another process holds the pass lease)")
	f.BoolVar(&o.pf.loop.Force, "force", false, "list even when another process holds the scope's pass lease or listed recently (without --watch)")
	f.StringVar(&o.metricsFile, "metrics-textfile", "", "write each pass's gauges here in Prometheus text format, with the scope's last success and last full scan from the database (atomically; for node_exporter's textfile collector)")
	return cmd
}

// runPoll is poll: one pass, or --watch's passes until ctx is done.
func (a *app) runPoll(ctx context.Context, o *pollOptions) error {
	plcfg := a.pollerConfig(&o.pf) // the listing poller's, checked (exit 2)
	if err := usage(plcfg.Validate()); err != nil {
		return err
	}
	mode, err := dispatch.ParseConfirmMode(o.ef.confirm)
	if err != nil {
		return usage(err)
	}
	if o.watch && o.interval <= 0 {
		return usageError("--watch needs a positive --interval")
	}
	if err := durationFlagCheck("min-interval", o.pf.loop.MinInterval); err != nil {
		return err
	}
	interval := o.interval // --watch's passes; else one
	if !o.watch {
		interval = 0
	}
	if o.intervalSet && !o.watch {
		// A warning, not exit 2: a crontab that gives it has always run
		// its one pass, and must go on doing so.
		a.logger.Warn("--interval has no effect without --watch: this is one pass; add --watch to repeat passes every --interval, or give cron's period as --min-interval")
	}
	pcfg, err := a.pollConfig(&o.pf, interval, "--interval")
	if err != nil {
		return err
	}
	dcfg, err := a.dispatchConfig(&o.ef)
	if err != nil {
		return err
	}
	// Credentials first: a missing key should not leave a new, empty
	// database behind.
	p, err := a.newPoller(ctx, plcfg)
	if err != nil {
		return err
	}
	dcfg, unconfirmed, err := a.setupAPI(ctx, &o.pf, mode, &o.ef, p, dcfg)
	if err != nil {
		return err
	}
	s, d, err := a.startDispatcher(ctx, "poll", dcfg, o.ef.retry, unconfirmed, nil)
	if err != nil {
		return err
	}
	pcfg.Sink, pcfg.Poller, pcfg.Dispatcher = s, p, d
	loop, err := reconcile.NewPoll(pcfg)
	if err != nil {
		return err
	}
	if !o.watch {
		r := loop.Pass(ctx)
		a.reportPass(r, o.metricsFile)
		// The exit status of spec §5: 1 fatal, 4 some effect failed or an
		// outcome was fenced, else 0.
		if err := r.Err(); err != nil || !r.EffectsFailed() {
			return err
		}
		return withCode(exitNotDone, nil)
	}
	return a.watch(ctx, loop, o.metricsFile)
}

// reportPass writes a pass's summary line (spec §5.4) on stderr, as JSON
// under --log-format json, and --metrics-textfile.
func (a *app) reportPass(r reconcile.Result, metricsFile string) {
	if err := r.Summary().Write(a.stderr, a.logFormat == "json"); err != nil {
		a.logger.Error("writing the poll summary", "err", err)
	}
	if metricsFile == "" {
		return
	}
	if err := reconcile.WriteTextfile(metricsFile, r); err != nil {
		a.logger.Error("writing --metrics-textfile", "path", metricsFile, "err", err)
	}
}

// watch runs poll --watch's passes until ctx is done. A broken stdout (the
// print effect's reader went away) ends the watch: no later pass could run
// an effect.
func (a *app) watch(ctx context.Context, loop *reconcile.Poll, metricsFile string) error {
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	_ = loop.Watch(wctx, func(r reconcile.Result) {
		a.reportPass(r, metricsFile)
		err := r.Err()
		if errors.Is(err, dispatch.ErrEffectBroken) {
			stop(err)
			return
		}
		if err != nil && ctx.Err() == nil {
			a.logger.Error("poll pass failed; the next pass retries", "err", err)
		}
	})
	if err := context.Cause(wctx); errors.Is(err, dispatch.ErrEffectBroken) {
		return err
	}
	return nil
}

const pollLong = `List batch operations through the genai SDK, record every terminal one
created within --lookback with source "poll", then run the effect for every
due key. Paging ends early only once the listing proved newest first; at
least one pass per --full-scan-every reads every page. All API requests share
one rate limiter (--qps, --burst); 429/5xx are retried.

Processes polling one API scope into one database list one at a time: a pass
lists only while it holds the scope's pass lease (--pass-lease), and skips
the listing when a pass of the scope started less than 0.9 × --interval
(--watch) or --min-interval ago; it still runs every due effect and exits 0.
--force lists regardless. Keys a webhook saw first are confirmed with the
API before their effect runs (--confirm); --results-dir writes results first.

Prints one summary line to stderr per pass. Exit status: 0 listed fully (or
skipped the listing) and every effect succeeded, 1 fatal (credentials,
database, listing failed after retries or lost its pass lease), 4 some effect
failed (retry scheduled or key dead) or an outcome was fenced. Overlapping
cron runs are safe: claims decide who runs each effect.`

const pollExample = `  # crontab: every 10 minutes
  */10 * * * * GEMINI_API_KEY=… gemrecon --db /var/lib/gemrecon/sink.db poll --exec /usr/local/bin/publish-batch
  gemrecon poll --watch --interval 5m --forward https://internal/hook
  # the same crontab on three hosts, one PostgreSQL database: about one listing per 10 minutes in all
  */10 * * * * GEMINI_API_KEY=… gemrecon --db postgres://gemrecon@db/gemrecon poll --min-interval 10m --exec /usr/local/bin/publish-batch
  gemrecon poll --backend vertex --project my-proj --location us-central1 --lookback 0 --print > completions.ndjson`
