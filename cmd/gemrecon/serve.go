package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
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
		dynOn      bool
		jwksURL    string
		audience   string
	)
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Receive Gemini API webhooks (Standard Webhooks) and run each completion's effect once",
		Long: `Receive webhook deliveries on POST --path, verify their Standard Webhooks
signature (secrets from GEMRECON_WEBHOOK_SECRET or --secret-file, several for
rotation), record the completion durably, answer 202 {"key","status"} and let
background workers run the effect. With --sync the effect runs inside the
request: 200 once done, 500 if it failed (the sender retries).

--dynamic also accepts per-job (dynamic) webhooks — a batch's webhookConfig —
which the Gemini API signs with keys it publishes (--jwks-url, default its
.well-known/jwks.json; --jwks-url implies --dynamic): a v1a (Ed25519) entry
or an RS256 JWT. HMAC is tried first; a request no scheme verifies is 401,
and 503 when the key set cannot be fetched (HMAC requests are unaffected).
Those keys are Google-wide — a delivery Google signed for any customer
verifies — so --dynamic needs API credentials and confirmation: each key seen
only that way is fetched with Batches.Get before it runs, and one the API does
not know (another project's batch) goes dead as "unknown to the API" without
running.

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
  GEMINI_API_KEY=… gemrecon serve --secret-file s.txt --poll-every 10m   # webhook and reconciliation in one process
  GEMINI_API_KEY=… gemrecon serve --secret-file s.txt --dynamic --exec ./publish.sh   # static and per-job webhooks`,
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
			dynOn = dynOn || cmd.Flags().Changed("jwks-url")
			switch {
			case audience != "" && !dynOn:
				return usageError("--jwt-audience is for dynamic signatures: add --dynamic")
			case dynOn && pf.backend == "vertex":
				return usageError("--dynamic verifies the Gemini API's per-job webhooks, whose batches only the Gemini API can confirm: it does not go with --backend vertex")
			case dynOn && insecure:
				return usageError("--insecure-no-verify accepts every request unverified, so --dynamic would prove nothing: use one or the other")
			case len(secrets) == 0 && !insecure && !dynOn:
				msg := "no webhook verifier: set GEMRECON_WEBHOOK_SECRET or --secret-file (whsec_…) for static webhooks, and/or --dynamic for per-job ones, or pass --insecure-no-verify to accept unsigned requests"
				if os.Getenv(jwksEnv) != "" {
					msg += " (" + jwksEnv + " only sets the key set's address: --dynamic turns dynamic verification on)"
				}
				return usageError("%s", msg)
			}
			var dyn *dynamic.Verifier
			if dynOn {
				if dyn, err = a.dynamicVerifier(jwksURL, audience); err != nil {
					return err
				}
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
			if dyn != nil && !api.confirm {
				// spec §6: a dynamic signature proves that Google sent the
				// body, not that the batch is this project's.
				if cf.mode == confirmNever {
					return usageError("--dynamic needs confirmation, and --confirm never turns it off: the keys of dynamic signatures are Google-wide, so every key seen that way must be confirmed with Batches.Get before it runs")
				}
				return usageError("--dynamic needs API credentials to confirm each dynamically signed batch with Batches.Get (the keys are Google-wide, so the signature does not prove the batch is yours): set GEMINI_API_KEY (or GOOGLE_API_KEY)")
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
				Dynamic:          dyn,
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
			a.logger.Info("serving webhooks", "addr", ln.Addr().String(), "path", path, "sync", syncMode,
				"verify", verifiersText(len(secrets), dyn, audience, insecure))
			if dyn != nil {
				a.prefetchKeys(ctx, dyn)
			}

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
	f.BoolVar(&dynOn, "dynamic", false, "also accept per-job (dynamic) webhooks, signed v1a (Ed25519) or as an RS256 JWT with the keys at --jwks-url; needs API credentials: such keys are confirmed with Batches.Get before they run")
	f.StringVar(&jwksURL, "jwks-url", envOr(jwksEnv, dynamic.DefaultJWKSURL), "where the Gemini API publishes the keys of dynamic signatures (env "+jwksEnv+"); giving the flag implies --dynamic")
	f.StringVar(&audience, "jwt-audience", "", "with --dynamic, refuse a JWT whose aud does not contain this (default: aud is not checked)")
	return cmd
}

// jwksEnv is the environment variable of --jwks-url. It sets the address
// only: unlike the flag it does not turn --dynamic on, so that an exported
// variable (the emulator prints one) never enables a verifier by itself.
const jwksEnv = "GEMRECON_JWKS_URL"

// dynamicVerifier builds the verifier of dynamic signatures (spec §6) that
// serve and demo use; a bad URL is exit 2.
func (a *app) dynamicVerifier(url, audience string) (*dynamic.Verifier, error) {
	v, err := dynamic.New(dynamic.Config{JWKSURL: url, Audience: audience, Log: a.logger})
	if err != nil {
		return nil, usageError("--jwks-url: %v", err)
	}
	return v, nil
}

// prefetchKeys fetches the key set once in the background, so that a
// wrong --jwks-url shows in the log at start rather than at the first
// dynamic delivery. It changes nothing else: /readyz does not depend on the
// key set (HMAC requests do not need it, and a receiver taken out of its
// load balancer would refuse those too), and a request that needs the set
// while it is unavailable gets 503 on its own.
func (a *app) prefetchKeys(ctx context.Context, v *dynamic.Verifier) {
	go func() {
		ctx, cancel := context.WithTimeout(ctx, dynamic.DefaultFetchTimeout+time.Second)
		defer cancel()
		if err := v.Ready(ctx); err != nil && ctx.Err() == nil {
			a.logger.Warn("dynamic webhooks: the key set could not be fetched at start; dynamically signed deliveries get 503 (the sender retries) until it can, HMAC deliveries are unaffected",
				"jwks_url", v.URL(), "err", err)
		}
	}()
}

// verifiersText says which verifiers serve uses, for the start line.
func verifiersText(secrets int, dyn *dynamic.Verifier, audience string, insecure bool) string {
	if insecure {
		return "none (--insecure-no-verify: every request is accepted unverified)"
	}
	var parts []string
	if secrets > 0 {
		parts = append(parts, fmt.Sprintf("HMAC v1 (%d secret(s))", secrets))
	}
	if dyn != nil {
		d := "dynamic v1a and RS256 JWT (keys from " + dyn.URL()
		if audience != "" {
			d += ", JWT audience " + strconv.Quote(audience)
		}
		parts = append(parts, d+"; keys seen only this way are confirmed before they run)")
	}
	return strings.Join(parts, " + ")
}
