package main

import (
	"context"

	"github.com/spf13/pflag"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/results"
)

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

// apply puts what the process has of the API into a dispatcher's
// configuration.
func (api apiSetup) apply(cfg dispatch.Config) dispatch.Config {
	cfg.Confirm, cfg.Results = api.confirm, api.results
	if api.poller != nil { // a nil *Poller must not become a non-nil API
		cfg.API = api.poller
	}
	return cfg
}

// setupAPI decides, for --confirm and --results-dir, whether this process
// confirms and writes results (dispatch's rules: ConfirmMode.Confirms,
// Config.Validate, checked against dcfg), and builds its one poller when it
// needs one (p, when the command already has a poller for listing: one
// rate limiter per process for list, get and downloads).
func (a *app) setupAPI(ctx context.Context, pf *pollFlags, mode dispatch.ConfirmMode, ef *effectFlags, p *poller.Poller, dcfg dispatch.Config) (apiSetup, error) {
	pcfg := a.pollerConfig(pf)
	creds := p != nil || pcfg.HasCredentials()
	var out apiSetup
	var err error
	if out.confirm, out.unconfirmed, err = mode.Confirms(creds); err != nil {
		return out, usage(err)
	}
	if creds && (out.confirm || ef.resultsDir != "") && p == nil {
		if err := usage(pcfg.Validate()); err != nil {
			return out, err
		}
		if p, err = poller.New(ctx, pcfg); err != nil {
			return out, err
		}
	}
	out.poller = p // the listing poller, the one just built, or nil
	if ef.resultsDir != "" {
		// Checked before the directory is made: a refused command
		// leaves nothing behind.
		check := out
		check.results = new(results.Dir)
		if err := usage(check.apply(dcfg).Validate()); err != nil {
			return out, err
		}
		if out.results, err = results.Open(ef.resultsDir); err != nil {
			return out, withCode(exitUsage, err)
		}
	}
	return out, usage(out.apply(dcfg).Validate())
}
