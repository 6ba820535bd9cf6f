package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
)

// pollFlags configure the listing side of a poll pass (spec §5).
type pollFlags struct {
	backend  string
	baseURL  string
	project  string
	location string
	qps      float64
	burst    int
	pageSize int
	lookback time.Duration
	// fullScanEvery: at least one pass per interval reads every page (§5.2).
	fullScanEvery time.Duration
	// passLease: how long a pass holds its scope's pass lease unrenewed (§5.5).
	passLease time.Duration
}

func (f *pollFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "gemini", "API backend: gemini (API key from GOOGLE_API_KEY or GEMINI_API_KEY) or vertex (Application Default Credentials)")
	fs.StringVar(&f.baseURL, "base-url", "", "API base URL, to point at an emulator or proxy (default: the SDK's)")
	fs.StringVar(&f.project, "project", os.Getenv("GOOGLE_CLOUD_PROJECT"), "Vertex project (env GOOGLE_CLOUD_PROJECT)")
	fs.StringVar(&f.location, "location", os.Getenv("GOOGLE_CLOUD_LOCATION"), "Vertex location (env GOOGLE_CLOUD_LOCATION)")
	fs.Float64Var(&f.qps, "qps", 5, "API requests per second, all requests included (0 = unlimited)")
	fs.IntVar(&f.burst, "burst", 1, "API request burst")
	fs.IntVar(&f.pageSize, "page-size", 100, "operations per list request")
	fs.DurationVar(&f.lookback, "lookback", 72*time.Hour, "the window: terminal batches created longer ago are skipped, and once the listing proves newest first, paging stops at a whole page older than this (0 = no window, read every page)")
	fs.DurationVar(&f.fullScanEvery, "full-scan-every", ingest.DefaultFullScanEvery, "read every page on at least one pass this often, whatever the listing's order (shorter than --lookback − 48h; 0 = every pass)")
	fs.DurationVar(&f.passLease, "pass-lease", ingest.DefaultPassLease, "a pass lists only while it holds its API scope's pass lease, renewed every third of this; when its holder dies, another process takes over after at most this long (at least 1s)")
}

func (f *pollFlags) validate() error {
	if f.backend != "gemini" && f.backend != "vertex" {
		return usageError("--backend %q: want gemini or vertex", f.backend)
	}
	if f.qps < 0 || f.burst < 1 {
		return usageError("--qps must not be negative and --burst must be at least 1")
	}
	if f.pageSize < 1 || f.pageSize > 1000 {
		return usageError("--page-size %d: want 1..1000", f.pageSize)
	}
	if f.lookback < 0 {
		return usageError("--lookback must not be negative (0 = every page)")
	}
	if f.passLease < time.Second {
		return usageError("--pass-lease %v: want at least 1s (it is renewed every third of it)", f.passLease)
	}
	if err := ingest.ValidateFullScanEvery(f.lookback, f.fullScanEvery); err != nil {
		return withCode(exitUsage, err)
	}
	if f.backend == "vertex" && (f.project == "" || f.location == "") {
		return usageError("--backend vertex needs --project and --location (or GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION)")
	}
	return nil
}

// newPoller builds the poller from flags and the environment.
func (a *app) newPoller(ctx context.Context, f *pollFlags) (*poller.Poller, error) {
	key := os.Getenv("GOOGLE_API_KEY")
	if key == "" {
		key = os.Getenv("GEMINI_API_KEY")
	}
	if f.backend == "gemini" && key == "" {
		return nil, withCode(exitFatal, errors.New("no API key: set GEMINI_API_KEY (or GOOGLE_API_KEY) to a Gemini API key"))
	}
	return a.pollerWithKey(ctx, f, key)
}

// pollerWithKey is newPoller with the API key given (demo: the emulator's).
func (a *app) pollerWithKey(ctx context.Context, f *pollFlags, key string) (*poller.Poller, error) {
	cfg := poller.DefaultConfig()
	cfg.Backend = f.backend
	cfg.APIKey = key
	cfg.Project, cfg.Location = f.project, f.location
	cfg.BaseURL = f.baseURL
	cfg.QPS, cfg.Burst = f.qps, f.burst
	cfg.PageSize = f.pageSize
	cfg.Lookback = f.lookback
	cfg.Logger = a.logger
	p, err := poller.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// loopOptions are how a command runs its passes: interval between the
// starts of passes (0: one pass), the fleet's minimum interval of a single
// pass (poll --min-interval; 0: Interval), and poll --force.
type loopOptions struct {
	interval, minInterval time.Duration
	force                 bool
}

// pollLoop wires the ingest package's pass loop to this process's flags.
func (a *app) pollLoop(s sink.Sink, p *poller.Poller, d *dispatch.Dispatcher, m *metrics.Metrics, f *pollFlags, o loopOptions) (*ingest.Poll, error) {
	return ingest.NewPoll(ingest.PollConfig{
		Sink:          s,
		Poller:        p,
		Dispatcher:    d,
		Metrics:       m,
		FullScanEvery: f.fullScanEvery,
		Interval:      o.interval,
		MinInterval:   o.minInterval,
		PassLease:     f.passLease,
		Force:         o.force,
		Logger:        a.logger,
	})
}

// printSummary writes a pass's summary line (spec §5.4) on stderr, as JSON
// under --log-format json.
func (a *app) printSummary(r ingest.Result) {
	if err := r.Summary().Write(a.stderr, a.logFormat == "json"); err != nil {
		a.logger.Error("writing the poll summary", "err", err)
	}
}

// passExit maps a pass to the exit status of spec §5: 1 fatal, 4 some
// effect failed or an outcome was fenced, else 0.
func passExit(r ingest.Result) error {
	if err := r.Err(); err != nil {
		return err
	}
	if r.EffectsFailed() {
		return withCode(exitNotDone, nil)
	}
	return nil
}

func (a *app) pollCommand() *cobra.Command {
	var (
		pf          pollFlags
		ef          effectFlags
		cf          confirmFlags
		watch       bool
		interval    time.Duration
		minInterval time.Duration
		force       bool
		metricsFile string
	)
	cmd := &cobra.Command{
		Use:   "poll [flags]",
		Short: "One reconciliation pass over the batch list (for cron), or --watch to repeat",
		Long: `List batch operations through the official genai SDK, record every terminal one
(SUCCEEDED, FAILED, CANCELLED, EXPIRED, PARTIALLY_SUCCEEDED) created within
--lookback with source "poll", then run the effect for every due key.

The API promises no listing order, so paging ends early only after two pages
whose boundary was newest first (every page so far newer than the next) and
a whole page older than now − --lookback; any other order reads every page.
At least one pass per --full-scan-every reads every page regardless (the
time of the last one is kept in the database per API scope), in case the
listing is several newest-first runs joined end to end. Every API request
waits on one rate limiter (--qps, --burst); 429/5xx are retried honouring
Retry-After and google.rpc.RetryInfo.

Several processes may poll one API scope into one database (replicas,
cron on several hosts): a pass lists only while it holds the scope's pass
lease in the database (renewed every third of --pass-lease; a dead holder's
lease runs out after --pass-lease). A pass that finds the lease held skips
its listing; with --watch it also skips when a pass of the scope, by any
process, started less than 0.9 × --interval ago, and a single pass does when
--min-interval says so. A skipped pass still runs every due effect, exits 0
and says skipped=held|recent (with the holder and until when) in its
summary. --force lists regardless.

A listed operation confirms a key a webhook saw first (its operation becomes
the API's); a due key that is still unconfirmed is fetched with Batches.Get
before its effect runs, through the same limiter (--confirm auto, the
default; never to turn it off). With --results-dir a succeeded batch's
results are written to DIR/<id>.jsonl before its effect (GEMRECON_RESULTS_FILE).

Prints one summary line to stderr per pass (one JSON object with
--log-format json). Exit status: 0 listed fully (or skipped the listing) and
every effect succeeded, 1 fatal (credentials, database, listing failed after
retries or lost its pass lease), 4 some effect failed (retry scheduled or key
dead) or an outcome was fenced. Overlapping cron runs are safe: claims decide
who runs each effect.`,
		Example: `  # crontab: every 10 minutes
  */10 * * * * GEMINI_API_KEY=… gemrecon --db /var/lib/gemrecon/sink.db poll --exec /usr/local/bin/publish-batch
  gemrecon poll --watch --interval 5m --forward https://internal/hook
  # the same crontab on three hosts, one PostgreSQL database: about one listing per 10 minutes in all
  */10 * * * * GEMINI_API_KEY=… gemrecon --db postgres://gemrecon@db/gemrecon poll --min-interval 10m --exec /usr/local/bin/publish-batch
  gemrecon poll --backend vertex --project my-proj --location us-central1 --lookback 0`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := pf.validate(); err != nil {
				return err
			}
			if err := ef.validate(); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			if watch && interval <= 0 {
				return usageError("--watch needs a positive --interval")
			}
			switch {
			case minInterval < 0:
				return usageError("--min-interval must not be negative")
			case watch && minInterval > 0:
				return usageError("--min-interval is for single passes: --watch already skips a pass when one of the scope started less than 0.9 × --interval ago")
			case force && watch:
				return usageError("--force is for one pass: with --watch every pass would ignore the other processes' pass lease")
			case force && minInterval > 0:
				return usageError("--force lists regardless of --min-interval: give one or the other")
			}
			ctx := cmd.Context()
			// Credentials first: a missing key should not leave a new,
			// empty database behind.
			p, err := a.newPoller(ctx, &pf)
			if err != nil {
				return err
			}
			s, err := a.openSink(ctx, ef.sinkOptions())
			if err != nil {
				return err
			}
			defer s.Close()
			api, err := a.setupAPI(ctx, &pf, &cf, p)
			if err != nil {
				return err
			}
			d, err := a.dispatcher(s, &ef, nil, api, &cf)
			if err != nil {
				return err
			}
			lo := loopOptions{minInterval: minInterval, force: force}
			if watch {
				lo.interval = interval
			}
			loop, err := a.pollLoop(s, p, d, nil, &pf, lo)
			if err != nil {
				return err
			}
			report := func(r ingest.Result) {
				a.printSummary(r)
				if metricsFile != "" {
					if err := ingest.WriteTextfile(metricsFile, r); err != nil {
						a.logger.Error("writing --metrics-textfile", "path", metricsFile, "err", err)
					}
				}
			}
			if !watch {
				r := loop.Pass(ctx)
				report(r)
				return passExit(r)
			}
			// A broken stdout (the print effect's reader went away) ends the
			// watch: no later pass could run an effect.
			wctx, stop := context.WithCancelCause(ctx)
			defer stop(nil)
			_ = loop.Watch(wctx, func(r ingest.Result) {
				report(r)
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
		},
	}
	pf.register(cmd.Flags())
	ef.register(cmd.Flags())
	cf.register(cmd.Flags())
	cmd.Flags().BoolVar(&watch, "watch", false, "repeat passes every --interval until SIGINT/SIGTERM")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Minute, "time between the starts of passes with --watch; a pass also skips its listing when a pass of the scope, by any process, started less than 0.9 × this ago")
	cmd.Flags().DurationVar(&minInterval, "min-interval", 0, "without --watch: skip the listing when a pass of the scope, by any process, started less than 0.9 × this ago (for cron on several hosts: give the cron period; 0 = skip only while another process holds the pass lease)")
	cmd.Flags().BoolVar(&force, "force", false, "list even when another process holds the scope's pass lease or listed recently (without --watch)")
	cmd.Flags().StringVar(&metricsFile, "metrics-textfile", "", "write each pass's gauges here in Prometheus text format, with the scope's last success and last full scan from the database (atomically; for node_exporter's textfile collector)")
	return cmd
}
