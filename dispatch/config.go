package dispatch

import (
	"errors"

	"github.com/gemrecon/gemrecon/internal/field"
)

// DefaultConfig returns a Config with every setting at its default; the
// caller adds the Sink, the effect (Effect or SQL) and what it changes,
// then checks it with Validate.
func DefaultConfig() Config {
	return Config{
		Lease:           DefaultLease,
		EffectTimeout:   DefaultEffectTimeout,
		Concurrency:     DefaultConcurrency,
		Grace:           DefaultGrace,
		Interval:        DefaultInterval,
		DownloadTimeout: DefaultDownloadTimeout,
		RecheckBase:     DefaultRecheckBase,
		RecheckMax:      DefaultRecheckMax,
	}
}

// ErrNoAPI is wrapped by the errors of a configuration that confirms keys
// or writes results without the API (no credentials).
var ErrNoAPI = errors.New("needs API credentials")

// Validate checks the settings as they will run, naming the field at fault
// (a field.Error): every rule of spec §4 and §9.2 on a dispatcher's
// configuration lives here. A zero duration or count is an error here (New
// fills zero fields with their defaults before it calls Validate). Validate
// does not look at Sink, so a command can check its flags before it opens
// the database.
func (c Config) Validate() error {
	const p = "dispatch: "
	switch {
	case c.Effect == nil && c.SQL == nil:
		return field.Errorf(p, "no effect: give an {Effect} or an {SQL} script")
	case c.Effect != nil && c.SQL != nil:
		// One effect per process: a second would be a second
		// completion of the same claim.
		return field.Errorf(p, "{an effect|Effect} and {an SQL script|SQL} are exclusive: give one")
	case c.Concurrency < 1:
		return field.Errorf(p, "{Concurrency} %d: must be at least 1", c.Concurrency)
	case c.Lease <= 0 || c.EffectTimeout <= 0:
		return field.Errorf(p, "{the lease|Lease} and {the effect timeout|EffectTimeout} must be positive")
	case c.EffectTimeout >= c.Lease:
		// spec §4: an effect that outlives its lease can be taken over
		// and run twice.
		return field.Errorf(p, "{EffectTimeout} %v must be shorter than {the lease|Lease} %v: an effect outliving its lease could run twice", c.EffectTimeout, c.Lease)
	case c.Interval <= 0:
		return field.Errorf(p, "{Interval} must be positive")
	case c.Confirm && c.API == nil:
		return field.Errorf(p, "{confirmation|Confirm} %w", ErrNoAPI)
	case c.Results != nil && c.API == nil:
		return field.Errorf(p, "{a results directory|Results} %w to download results", ErrNoAPI)
	case c.DownloadTimeout <= 0:
		return field.Errorf(p, "{DownloadTimeout} must be positive")
	case c.RecheckBase <= 0 || c.RecheckMax < c.RecheckBase:
		return field.Errorf(p, "{RecheckBase} must be positive and not above {RecheckMax}")
	}
	return nil
}

// ConfirmMode says when a process confirms the keys webhooks saw first
// (spec §9.2): serve's, poll's and drain's --confirm.
type ConfirmMode string

// The confirm modes.
const (
	// ConfirmAuto confirms when the process has the API (credentials),
	// else runs such keys unconfirmed.
	ConfirmAuto ConfirmMode = "auto"
	// ConfirmAlways confirms, and refuses to run without the API.
	ConfirmAlways ConfirmMode = "always"
	// ConfirmNever runs every key on what is stored.
	ConfirmNever ConfirmMode = "never"
)

// ParseConfirmMode reads a confirm mode: auto, always or never.
func ParseConfirmMode(s string) (ConfirmMode, error) {
	switch m := ConfirmMode(s); m {
	case ConfirmAuto, ConfirmAlways, ConfirmNever:
		return m, nil
	}
	return "", field.Errorf("dispatch: ", "{confirm mode|Confirm} %q: want auto, always or never", s)
}

// Confirms decides, for a process that has the API or not, whether it
// confirms (Config.Confirm) and whether it runs webhook-first keys
// unconfirmed although it was not told to (auto without the API: the
// command says so once). Always without the API is an error wrapping
// ErrNoAPI.
func (m ConfirmMode) Confirms(haveAPI bool) (confirm, unconfirmed bool, err error) {
	switch {
	case m == ConfirmAlways && !haveAPI:
		return false, false, field.Errorf("dispatch: ", "{confirm mode|Confirm} always %w", ErrNoAPI)
	case m == ConfirmNever:
		return false, false, nil
	}
	return haveAPI, !haveAPI, nil
}
