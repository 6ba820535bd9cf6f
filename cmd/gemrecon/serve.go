package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/webhook"
)

func (a *app) serveCommand() *cobra.Command {
	var (
		ef         effectFlags
		pf         pollFlags
		cf         confirmFlags
		listen     string
		path       string
		secretFile string
		insecure   bool
		maxBody    int64
		syncMode   bool
		syncWait   time.Duration
		pollEvery  time.Duration
		drainFor   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Receive Gemini API webhooks (Standard Webhooks) and run each completion's effect once",
		Long: `Receive webhook deliveries on POST --path, verify their Standard Webhooks
signature (secrets from GEMRECON_WEBHOOK_SECRET or --secret-file, several for
rotation), record the completion durably, answer 202 {"key","status"} and let
background workers run the effect. With --sync the effect runs inside the
request: 200 once done, 500 if it failed (the sender retries).

With API credentials (GEMINI_API_KEY; --base-url for an emulator) each key
first seen by webhook is confirmed with Batches.Get before its effect runs, so
the effect gets the API's operation, not the webhook's thin body (--confirm
auto, the default; without credentials such keys run unconfirmed and serve
says so once; --confirm never turns it off). --results-dir writes a succeeded
batch's results before its effect.

Also serves GET /healthz, GET /readyz (database reachable) and GET /metrics
(Prometheus). --poll-every runs reconciliation passes in the same process;
replicas on one database list one at a time, about once per --poll-every in
all (a tick skips its listing while another process holds the API scope's
pass lease, or when a pass of the scope started less than 0.9 × --poll-every
ago), and every replica still runs due effects.
SIGTERM stops accepting, finishes in-flight requests and effects, then exits.`,
		Example: `  GEMRECON_WEBHOOK_SECRET=whsec_… gemrecon serve --exec ./publish.sh
  gemrecon serve --secret-file /etc/gemrecon/whsec --listen 127.0.0.1:8080 --forward https://internal/hook
  GEMINI_API_KEY=… gemrecon serve --secret-file s.txt --poll-every 10m   # webhook and reconciliation in one process`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ef.validate(); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			if pollEvery < 0 || syncWait < 0 || maxBody <= 0 {
				return usageError("--poll-every and --sync-wait must not be negative; --max-body must be positive")
			}
			if pollEvery > 0 {
				if err := pf.validate(); err != nil {
					return err
				}
			}
			secrets, err := webhook.LoadSecrets(os.Getenv("GEMRECON_WEBHOOK_SECRET"), secretFile)
			if err != nil {
				return withCode(exitUsage, err)
			}
			if len(secrets) == 0 && !insecure {
				return usageError("no webhook secret: set GEMRECON_WEBHOOK_SECRET or --secret-file (whsec_…), or pass --insecure-no-verify to accept unsigned requests")
			}
			ctx := cmd.Context()
			// One poller for the process: the passes of --poll-every,
			// confirmations and downloads share its rate limiter.
			var p *poller.Poller
			if pollEvery > 0 {
				if p, err = a.newPoller(ctx, &pf); err != nil {
					return err
				}
			}
			api, err := a.setupAPI(ctx, &pf, &cf, p)
			if err != nil {
				return err
			}
			s, err := a.openSink(ctx, ef.sinkOptions())
			if err != nil {
				return err
			}
			defer s.Close()
			a.warn(api)
			m := metrics.New(s)
			d, err := a.dispatcher(s, &ef, m.Observer(), api, &cf)
			if err != nil {
				return err
			}
			h, err := webhook.NewHandler(webhook.Config{
				Sink:             s,
				Secrets:          secrets,
				InsecureNoVerify: insecure,
				Path:             path,
				MaxBody:          maxBody,
				Sync:             syncMode,
				SyncWait:         syncWait,
				Dispatcher:       d,
				Metrics:          m,
				Logger:           a.logger,
			})
			if err != nil {
				return withCode(exitUsage, err)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			a.logger.Info("serving webhooks", "addr", ln.Addr().String(), "path", path, "sync", syncMode, "verify", !insecure)

			var wg sync.WaitGroup
			errs := make(chan error, 3)
			// Workers outlive the HTTP server by the drain period so that
			// accepted keys still get their effect started before exit;
			// whatever is left is pending in the database for the next run.
			workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
			defer stopWork()
			// A dispatcher that stops on its own (the effect broke: the
			// NDJSON stdout went away) stops the server too: accepting
			// deliveries that nothing here can run would hide it.
			ctx, stopServing := context.WithCancel(ctx)
			defer stopServing()
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := d.Run(workCtx); err != nil && !errors.Is(err, context.Canceled) {
					errs <- fmt.Errorf("dispatch: %w", err)
					stopServing()
				}
			}()
			if pollEvery > 0 {
				loop, err := a.pollLoop(s, p, d, m, &pf, loopOptions{interval: pollEvery})
				if err != nil {
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = loop.Watch(ctx, func(r ingest.Result) {
						a.printSummary(r)
						if err := r.Err(); err != nil && ctx.Err() == nil {
							a.logger.Error("poll pass failed; the next pass retries", "err", err)
						}
					})
				}()
			}
			opts := webhook.ServerOptions{DrainTimeout: drainFor, Logger: a.logger}
			if syncMode {
				// The answer of a --sync request comes after the effect.
				opts.WriteTimeout = ef.effectTimeout + syncWait + 30*time.Second
			}
			serveErr := webhook.Serve(ctx, ln, h, opts)
			a.logger.Info("webhook server stopped; finishing running effects", "grace", ef.grace)
			stopWork()
			wg.Wait()
			close(errs)
			if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
				return serveErr
			}
			return <-errs
		},
	}
	f := cmd.Flags()
	ef.register(f)
	pf.register(f)
	cf.register(f)
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on")
	f.StringVar(&path, "path", "/webhook", "path that receives POSTed deliveries")
	f.StringVar(&secretFile, "secret-file", "", "file with whsec_ secrets, one per line (several for rotation); or set GEMRECON_WEBHOOK_SECRET")
	f.BoolVar(&insecure, "insecure-no-verify", false, "accept unsigned requests (only behind something that verifies)")
	f.Int64Var(&maxBody, "max-body", 1<<20, "largest accepted body in bytes (larger: 413)")
	f.BoolVar(&syncMode, "sync", false, "run the effect inside the request: 200 done, 500 failed")
	f.DurationVar(&syncWait, "sync-wait", 10*time.Second, "with --sync, how long to wait for a key another holder is running before answering 202")
	f.DurationVar(&pollEvery, "poll-every", 0, "also run a reconciliation poll pass this often, by this process or another sharing the database (0 = never)")
	f.DurationVar(&drainFor, "drain-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests get to finish")
	return cmd
}
