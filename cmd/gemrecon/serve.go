package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/reconcile"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// serveOptions are serve's flags.
type serveOptions struct {
	ef     effectFlags
	pf     pollFlags
	listen string
	// w holds the receiver's flags (webhookConfig adds the rest).
	w          webhook.Config
	secretFile string
	pollEvery  time.Duration
	drainFor   time.Duration
	dynOn      bool
	jwksURL    string
	audience   string
	// syncWaitSet: --sync-wait was given (it does nothing without --sync).
	syncWaitSet bool
}

func (a *app) serveCommand() *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:     "serve [flags]",
		Short:   "Receive Gemini API webhooks (Standard Webhooks) and run each completion's effect once",
		Long:    serveLong,
		Example: serveExample,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.dynOn = o.dynOn || cmd.Flags().Changed("jwks-url")
			o.syncWaitSet = cmd.Flags().Changed("sync-wait")
			return a.runServe(cmd.Context(), &o)
		},
	}
	o.ef.register(cmd)
	f := cmd.Flags()
	o.pf.register(f)
	o.w = webhook.DefaultConfig()
	w := &o.w
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to listen on")
	f.StringVar(&w.Path, "path", w.Path, "path that receives POSTed deliveries")
	f.StringVar(&o.secretFile, "secret-file", "", "file with whsec_ secrets, one per line (several for rotation; serve warns when its group or others may read it); or set GEMRECON_WEBHOOK_SECRET")
	f.BoolVar(&w.InsecureNoVerify, "insecure-no-verify", false, "accept unsigned requests (only behind something that verifies)")
	f.Int64Var(&w.MaxBody, "max-body", w.MaxBody, "largest accepted body in bytes (larger: 413)")
	f.Int64Var(&w.MaxUnverified, "max-unverified-bytes", w.MaxUnverified, "bytes of bodies read but not yet verified, over all requests; a request that would go over gets 503 with Retry-After before its body is read")
	f.IntVar(&w.MaxConns, "max-connections", w.MaxConns, fmt.Sprintf("open connections kept; %d more answer only /healthz, /readyz and /metrics", webhook.ProbeConns))
	f.BoolVar(&w.Sync, "sync", false, "run the effect inside the request: 200 done, 500 failed")
	f.DurationVar(&w.SyncWait, "sync-wait", w.SyncWait, "with --sync, how long to wait for a key another holder is running before answering 202 (without --sync it does nothing, and serve warns)")
	f.DurationVar(&o.pollEvery, "poll-every", 0, "also run a reconciliation poll pass this often, by this process or another sharing the database (0 = never)")
	f.DurationVar(&o.drainFor, "drain-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests get to finish (0: close them at once; their senders retry)")
	f.BoolVar(&o.dynOn, "dynamic", false, "also accept per-job (dynamic) webhooks, signed v1a (Ed25519) or as an RS256 JWT with the keys at --jwks-url; needs API credentials: such keys are confirmed with Batches.Get before they run")
	f.StringVar(&o.jwksURL, "jwks-url", cmp.Or(os.Getenv(jwksEnv), dynamic.DefaultJWKSURL), "where the Gemini API publishes the keys of dynamic signatures (env "+jwksEnv+"); giving the flag implies --dynamic")
	f.StringVar(&o.audience, "jwt-audience", "", "with --dynamic, refuse a JWT whose aud does not contain this (default: aud is not checked)")
	return cmd
}

// webhookConfig is the receiver's configuration from the flags, checked
// (webhook.Config.Validate: exit 2); the caller adds the sink, the
// dispatcher and metrics.
func (a *app) webhookConfig(o *serveOptions) (webhook.Config, error) {
	cfg := o.w
	var err error
	if cfg.Secrets, err = webhook.LoadSecrets(os.Getenv(webhook.SecretEnv), o.secretFile); err != nil {
		return cfg, withCode(exitUsage, err)
	}
	// A warning, as rotate's: the file works, but whoever can read it can
	// sign deliveries.
	if w := looseSecretFile(o.secretFile); w != "" {
		a.logger.Warn("--secret-file " + w)
	}
	switch {
	case o.audience != "" && !o.dynOn:
		return cfg, usageError("--jwt-audience is for dynamic signatures: add --dynamic")
	case o.dynOn && o.pf.cfg.Backend == poller.BackendVertex:
		return cfg, usageError("--dynamic verifies the Gemini API's per-job webhooks, whose batches only the Gemini API can confirm: it does not go with --backend vertex")
	}
	// Where the secrets came from, never their values, for the line that
	// logs refused signatures.
	from := webhook.SecretEnv
	if o.secretFile != "" && os.Getenv(webhook.SecretEnv) != "" {
		from += " and --secret-file " + o.secretFile
	} else if o.secretFile != "" {
		from = "--secret-file " + o.secretFile
	}
	cfg.SecretSource = fmt.Sprintf("%d from %s", len(cfg.Secrets), from)
	cfg.Logger = a.logger
	if o.dynOn {
		// The verifier of dynamic signatures (spec §6); a bad URL is exit 2.
		if cfg.Dynamic, err = dynamic.New(dynamic.Config{JWKSURL: o.jwksURL, Audience: o.audience, Log: a.logger}); err != nil {
			return cfg, usageError("--jwks-url: %v", err)
		}
	}
	err = cfg.Validate()
	if errors.Is(err, webhook.ErrNoVerifier) && os.Getenv(jwksEnv) != "" {
		// The variable only sets the key set's address.
		return cfg, withCode(exitUsage, fmt.Errorf("%w (%s only sets the key set's address: --dynamic turns dynamic verification on)", usage(err), jwksEnv))
	}
	return cfg, usage(err, map[string]string{"MaxUnverified": "--max-unverified-bytes", "MaxConns": "--max-connections"})
}

// runServe is serve: the receiver, its dispatcher and --poll-every's
// passes, until ctx is done (package serve owns their lifecycle).
func (a *app) runServe(ctx context.Context, o *serveOptions) error {
	if err := durationFlagCheck("drain-timeout", o.drainFor); err != nil {
		return err
	}
	mode, err := dispatch.ParseConfirmMode(o.ef.confirm)
	if err != nil {
		return usage(err)
	}
	var pcfg reconcile.PollConfig
	// The listing poller's configuration, checked with --poll-every (a
	// negative --poll-every is reconcile's error).
	plcfg := a.pollerConfig(&o.pf)
	if o.pollEvery != 0 {
		if err := usage(plcfg.Validate()); err != nil {
			return err
		}
		if pcfg, err = a.pollConfig(&o.pf, o.pollEvery, "--poll-every"); err != nil {
			return err
		}
	}
	dcfg, err := a.dispatchConfig(&o.ef)
	if err != nil {
		return err
	}
	wcfg, err := a.webhookConfig(o)
	if err != nil {
		return err
	}
	if o.syncWaitSet && !o.w.Sync {
		// A warning, not exit 2 (as poll's --interval without --watch): a
		// unit that carries it has always started, and must go on doing so.
		a.logger.Warn("--sync-wait has no effect without --sync: deliveries are answered 202 once recorded and their effects run in the background; add --sync to run each effect inside its request")
	}
	// One poller for the process: the passes of --poll-every,
	// confirmations and downloads share its rate limiter.
	var p *poller.Poller
	if o.pollEvery > 0 {
		if p, err = a.newPoller(ctx, plcfg); err != nil {
			return err
		}
	}
	dcfg, unconfirmed, err := a.setupAPI(ctx, &o.pf, mode, &o.ef, p, dcfg)
	if err != nil {
		return err
	}
	// Spec §6: a dynamic signature proves that Google sent the body, not
	// that the batch is this project's, so --dynamic needs a process that
	// confirms.
	if wcfg.Dynamic != nil && !dcfg.Confirm {
		if mode == dispatch.ConfirmNever {
			return usageError("--dynamic needs confirmation, and --confirm never turns it off: the keys of dynamic signatures are Google-wide, so every key seen that way must be confirmed with Batches.Get before it runs")
		}
		return usageError("--dynamic needs API credentials to confirm each dynamically signed batch with Batches.Get (the keys are Google-wide, so the signature does not prove the batch is yours): set GEMINI_API_KEY (or GOOGLE_API_KEY)")
	}
	var m *metrics.Metrics
	s, d, err := a.startDispatcher(ctx, "serve", dcfg, o.ef.retry, unconfirmed, func(s sink.Sink) dispatch.Observer {
		m = metrics.New(s)
		return m
	})
	if err != nil {
		return err
	}
	wcfg.Dispatcher, wcfg.Metrics = d, m
	h, err := serve.Receiver(wcfg, s)
	if err != nil {
		return usage(err)
	}
	// --drain-timeout 0 closes the connections at once (webhook.NoDrain;
	// Serve's zero value would be its 30 s default). A request cut that way
	// got no answer, and it is answered 2xx only once its sighting is
	// durable, so its sender retries and nothing is lost.
	sc := serve.Config{Handler: h, Dispatcher: d, Logger: a.logger,
		Server: webhook.ServerOptions{DrainTimeout: cmp.Or(o.drainFor, webhook.NoDrain), Logger: a.logger}}
	if o.w.Sync {
		// The answer of a --sync request comes after the effect.
		sc.Server.WriteTimeout = o.ef.cfg.EffectTimeout + o.w.SyncWait + 30*time.Second
	}
	if o.pollEvery > 0 {
		pcfg.Sink, pcfg.Poller, pcfg.Dispatcher, pcfg.Metrics = s, p, d, m
		if sc.Poll, err = reconcile.NewPoll(pcfg); err != nil {
			return err
		}
		sc.OnPass = func(r reconcile.Result) {
			a.reportPass(r, "")
			if err := r.Err(); err != nil && ctx.Err() == nil {
				a.logger.Error("poll pass failed; the next pass retries", "err", err)
			}
		}
	}
	if sc.Listener, err = net.Listen("tcp", o.listen); err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	a.logger.Info("serving webhooks", "addr", sc.Listener.Addr().String(), "path", wcfg.Path, "sync", o.w.Sync,
		"verify", verifiersText(len(wcfg.Secrets), wcfg.Dynamic, o.audience, o.w.InsecureNoVerify))
	if wcfg.Dynamic != nil {
		a.prefetchKeys(ctx, wcfg.Dynamic)
	}
	return serve.Start(ctx, sc).Wait()
}

// jwksEnv is the environment variable of --jwks-url. It sets the address
// only: unlike the flag it does not turn --dynamic on, so that an exported
// variable (the emulator prints one) never enables a verifier by itself.
const jwksEnv = "GEMRECON_JWKS_URL"

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

const serveLong = `Receive webhook deliveries on POST --path, verify their Standard Webhooks
signature (secrets from GEMRECON_WEBHOOK_SECRET or --secret-file), record the
completion durably, answer 202 and let background workers run the effect;
with --sync the effect runs inside the request (200 done, 500 failed).
--dynamic (implied by --jwks-url) also accepts per-job webhooks signed with
the Gemini API's published keys (v1a or RS256 JWT). Those keys are
Google-wide, so --dynamic needs API credentials: each key seen only that way
is confirmed with Batches.Get before it runs.

With API credentials each key first seen by webhook is confirmed before its
effect runs (--confirm); --results-dir writes a succeeded batch's results
first. Also serves GET /healthz, /readyz and /metrics; --poll-every runs
reconciliation passes in the same process. SIGTERM stops accepting, finishes
in-flight requests (up to --drain-timeout) and effects (up to --grace; a
second signal kills them), then exits.`

const serveExample = `  GEMRECON_WEBHOOK_SECRET=whsec_… gemrecon serve --exec ./publish.sh
  gemrecon serve --secret-file /etc/gemrecon/whsec --listen 127.0.0.1:8080 --forward https://internal/hook
  GEMINI_API_KEY=… gemrecon serve --secret-file s.txt --poll-every 10m --exec ./publish.sh   # webhook and reconciliation in one process
  GEMINI_API_KEY=… gemrecon serve --secret-file s.txt --dynamic --exec ./publish.sh   # static and per-job webhooks`
