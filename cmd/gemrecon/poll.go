package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/dispatch"
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
}

func (f *pollFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.backend, "backend", "gemini", "API backend: gemini (API key from GOOGLE_API_KEY or GEMINI_API_KEY) or vertex (Application Default Credentials)")
	fs.StringVar(&f.baseURL, "base-url", "", "API base URL, to point at an emulator or proxy (default: the SDK's)")
	fs.StringVar(&f.project, "project", os.Getenv("GOOGLE_CLOUD_PROJECT"), "Vertex project (env GOOGLE_CLOUD_PROJECT)")
	fs.StringVar(&f.location, "location", os.Getenv("GOOGLE_CLOUD_LOCATION"), "Vertex location (env GOOGLE_CLOUD_LOCATION)")
	fs.Float64Var(&f.qps, "qps", 5, "API requests per second, all requests included (0 = unlimited)")
	fs.IntVar(&f.burst, "burst", 1, "API request burst")
	fs.IntVar(&f.pageSize, "page-size", 100, "operations per list request")
	fs.DurationVar(&f.lookback, "lookback", 72*time.Hour, "stop paging after a whole page older than this (0 = read every page)")
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

// passResult is what one reconciliation pass did.
type passResult struct {
	list     poller.PassStats
	new      int
	dup      int
	sum      dispatch.Summary
	listErr  error
	drainErr error
	duration time.Duration
}

// err is the pass's fatal error, if any (listing or dispatch).
func (r passResult) err() error {
	if r.listErr != nil {
		return r.listErr
	}
	return r.drainErr
}

func (r passResult) String() string {
	return fmt.Sprintf("poll: listed=%d terminal=%d new=%d duplicates=%d effects ok=%d failed=%d api_requests=%d duration=%s",
		r.list.Listed, r.list.Terminal, r.new, r.dup, r.sum.OK, r.sum.Failed+r.sum.Dead, r.list.Requests, r.duration.Round(time.Millisecond))
}

// pollPass lists, records every terminal operation with source poll, then
// dispatches every due key. A listing error still dispatches what was
// recorded before it.
func (a *app) pollPass(ctx context.Context, s sink.Sink, p *poller.Poller, d *dispatch.Dispatcher, lookback time.Duration) passResult {
	start := time.Now()
	var r passResult
	if err := s.NoteLookback(ctx, lookback); err != nil {
		r.listErr = err
		r.duration = time.Since(start)
		return r
	}
	r.list, r.listErr = p.Pass(ctx, func(op poller.Operation) error {
		key, err := canon.Key(op.Name)
		if err == nil {
			err = canon.CheckKey(key) // spec §12: a name that could never be stored or run
		}
		if err != nil {
			a.logger.Warn("listed operation has no usable name; skipped", "name", canon.Quote(op.Name), "err", err)
			return nil
		}
		res, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: op.Raw})
		if err != nil {
			return err
		}
		if res.New {
			r.new++
		} else {
			r.dup++
		}
		return nil
	})
	if ctx.Err() == nil {
		r.sum, r.drainErr = d.Drain(ctx)
	}
	r.duration = time.Since(start)
	return r
}

func (a *app) pollCommand() *cobra.Command {
	var (
		pf          pollFlags
		ef          effectFlags
		watch       bool
		interval    time.Duration
		metricsFile string
	)
	cmd := &cobra.Command{
		Use:   "poll [flags]",
		Short: "One reconciliation pass over the batch list (for cron), or --watch to repeat",
		Long: `List batch operations through the official genai SDK, record every terminal one
(SUCCEEDED, FAILED, CANCELLED, EXPIRED, PARTIALLY_SUCCEEDED) with source
"poll", then run the effect for every due key. Paging stops after a whole
page of operations created before now − --lookback. Every API request waits
on one rate limiter (--qps, --burst); 429/5xx are retried honouring
Retry-After and google.rpc.RetryInfo.

Prints one summary line to stderr per pass. Exit status: 0 listed fully and
every effect succeeded, 1 fatal (credentials, database, listing failed after
retries), 4 some effect failed (retry scheduled or key dead). Overlapping cron
runs are safe: claims decide who runs each effect.`,
		Example: `  # crontab: every 10 minutes
  */10 * * * * GEMINI_API_KEY=… gemrecon --db /var/lib/gemrecon/sink.db poll --exec /usr/local/bin/publish-batch
  gemrecon poll --watch --interval 5m --forward https://internal/hook
  gemrecon poll --backend vertex --project my-proj --location us-central1 --lookback 0`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := pf.validate(); err != nil {
				return err
			}
			if err := ef.validate(); err != nil {
				return err
			}
			if watch && interval <= 0 {
				return usageError("--watch needs a positive --interval")
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
			d, err := a.dispatcher(s, &ef, nil)
			if err != nil {
				return err
			}
			for {
				r := a.pollPass(ctx, s, p, d, pf.lookback)
				fmt.Fprintln(a.stderr, r)
				if metricsFile != "" {
					if err := writePassMetrics(metricsFile, r); err != nil {
						a.logger.Error("writing --metrics-textfile", "path", metricsFile, "err", err)
					}
				}
				if !watch {
					if err := r.err(); err != nil {
						return err
					}
					return summaryExit(r.sum)
				}
				if err := r.err(); err != nil && ctx.Err() == nil {
					a.logger.Error("poll pass failed; the next pass retries", "err", err)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	pf.register(cmd.Flags())
	ef.register(cmd.Flags())
	cmd.Flags().BoolVar(&watch, "watch", false, "repeat passes every --interval until SIGINT/SIGTERM")
	cmd.Flags().DurationVar(&interval, "interval", 5*time.Minute, "time between passes with --watch")
	cmd.Flags().StringVar(&metricsFile, "metrics-textfile", "", "write this pass's counters here in Prometheus text format (atomically; for node_exporter's textfile collector)")
	return cmd
}

// writePassMetrics writes a pass's counters for node_exporter's textfile
// collector; cron users have no /metrics endpoint.
func writePassMetrics(path string, r passResult) error {
	reg := prometheus.NewRegistry()
	g := func(name, help string, v float64) {
		c := prometheus.NewGauge(prometheus.GaugeOpts{Name: "gemrecon_poll_" + name, Help: help})
		c.Set(v)
		reg.MustRegister(c)
	}
	ok := 1.0
	if r.err() != nil {
		ok = 0
	}
	g("last_run_timestamp_seconds", "Unix time the last poll pass ended.", float64(time.Now().Unix()))
	g("last_run_success", "1 if the last pass listed fully and dispatched without a fatal error.", ok)
	g("last_run_duration_seconds", "Duration of the last pass.", r.duration.Seconds())
	g("listed", "Operations listed by the last pass.", float64(r.list.Listed))
	g("terminal", "Terminal operations seen by the last pass.", float64(r.list.Terminal))
	g("new", "Keys the last pass recorded for the first time.", float64(r.new))
	g("duplicates", "Terminal operations the last pass had already recorded.", float64(r.dup))
	g("effects_ok", "Effects that succeeded in the last pass.", float64(r.sum.OK))
	g("effects_failed", "Effects that failed in the last pass (retry scheduled or dead).", float64(r.sum.Failed+r.sum.Dead))
	g("fenced", "Outcomes discarded as fenced in the last pass.", float64(r.sum.Fenced))
	g("api_requests", "HTTP requests the last pass sent to the API.", float64(r.list.Requests))
	return prometheus.WriteToTextfile(path, reg)
}
