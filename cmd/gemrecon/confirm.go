package main

import (
	"context"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/results"
)

// confirmFlags are the flags of spec §9.2 and §9.5, shared by poll, serve
// and drain: --confirm, --results-dir, --download-timeout.
type confirmFlags struct {
	mode            string
	resultsDir      string
	downloadTimeout time.Duration
}

// The --confirm modes.
const (
	confirmAuto   = "auto"
	confirmAlways = "always"
	confirmNever  = "never"
)

func (f *confirmFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.mode, "confirm", confirmAuto, "confirm keys first seen by webhook with the API (Batches.Get) before their effect runs: auto (when API credentials are set), always (exit 2 without them), never")
	fs.StringVar(&f.resultsDir, "results-dir", "", "write a succeeded Gemini API batch's results to DIR/<id>.jsonl before its effect runs (needs API credentials); the path is results_file in the event document and GEMRECON_RESULTS_FILE")
	fs.DurationVar(&f.downloadTimeout, "download-timeout", dispatch.DefaultDownloadTimeout, "bound one results download; it runs under the key's claim, whose lease is renewed meanwhile, so it may exceed --lease")
}

func (f *confirmFlags) validate() error {
	switch f.mode {
	case confirmAuto, confirmAlways, confirmNever:
	default:
		return usageError("--confirm %q: want auto, always or never", f.mode)
	}
	if f.downloadTimeout <= 0 {
		return usageError("--download-timeout must be positive")
	}
	return nil
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

// validateAPI checks the API flags alone (a command that does not list
// leaves the listing's flags alone: serve without --poll-every, drain).
func (f *pollFlags) validateAPI() error {
	if f.backend != "gemini" && f.backend != "vertex" {
		return usageError("--backend %q: want gemini or vertex", f.backend)
	}
	if f.qps < 0 || f.burst < 1 {
		return usageError("--qps must not be negative and --burst must be at least 1")
	}
	if f.backend == "vertex" && (f.project == "" || f.location == "") {
		return usageError("--backend vertex needs --project and --location (or GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION)")
	}
	return nil
}

// hasCredentials reports whether the environment and flags name API
// credentials: an API key for the Gemini API; a project and a location for
// Vertex AI (whose Application Default Credentials are looked up by the SDK).
func hasCredentials(pf *pollFlags) bool {
	if pf.backend == "vertex" {
		return pf.project != "" && pf.location != ""
	}
	return os.Getenv("GOOGLE_API_KEY") != "" || os.Getenv("GEMINI_API_KEY") != ""
}

// apiSetup is what a command's dispatcher gets of the API: the process's one
// poller (nil when it has none) and whether it confirms.
type apiSetup struct {
	poller  *poller.Poller
	confirm bool
	results *results.Dir
	// unconfirmed: --confirm auto without credentials (warn, once the
	// command is under way).
	unconfirmed bool
}

// warn says once, at start, that webhook-first keys run unconfirmed. It
// is called once the database is open, so that a command that cannot start
// says only why.
func (a *app) warn(api apiSetup) {
	if api.unconfirmed {
		a.logger.Warn(`no API credentials: keys first seen by webhook run unconfirmed ("confirmed": false, their operation is the webhook's body); keys seen only through a dynamic signature wait for a process that can confirm them. Set GEMINI_API_KEY to confirm, or --confirm never to silence this`)
	}
}

// setupAPI decides, for --confirm and --results-dir, whether this process
// confirms and writes results, and builds its one poller when it needs one
// (p, when the command already has a poller for listing: one rate limiter
// per process for list, get and downloads). Without credentials --confirm
// auto warns once and runs webhook-first keys unconfirmed; --confirm always
// and --results-dir are exit 2.
func (a *app) setupAPI(ctx context.Context, pf *pollFlags, cf *confirmFlags, p *poller.Poller) (apiSetup, error) {
	creds := p != nil || hasCredentials(pf)
	var out apiSetup
	switch {
	case cf.mode == confirmAlways && !creds:
		return out, usageError("--confirm always needs API credentials: set GEMINI_API_KEY (or GOOGLE_API_KEY), or --backend vertex with --project and --location")
	case cf.resultsDir != "" && !creds:
		return out, usageError("--results-dir needs API credentials to download results: set GEMINI_API_KEY (or GOOGLE_API_KEY), or --backend vertex with --project and --location")
	case cf.mode == confirmAuto && !creds:
		out.unconfirmed = true
	}
	out.confirm = creds && cf.mode != confirmNever
	if cf.resultsDir != "" {
		d, err := results.Open(cf.resultsDir)
		if err != nil {
			return out, withCode(exitUsage, err)
		}
		out.results = d
	}
	if !out.confirm && out.results == nil {
		out.poller = p
		return out, nil
	}
	if p == nil {
		if err := pf.validateAPI(); err != nil {
			return out, err
		}
		var err error
		if p, err = a.newPoller(ctx, pf); err != nil {
			return out, err
		}
	}
	out.poller = p
	return out, nil
}
