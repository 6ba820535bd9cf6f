package main

import (
	"errors"
	"strings"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/internal/field"
)

// flagFor names the flag that sets a library's config field, for rendering
// the library's field.Errors (internal/field) in the CLI's words. The
// rules themselves live in the libraries' Validate methods.
func flagFor(f string) string {
	switch f {
	case "SQL", "Concurrency", "Lease", "EffectTimeout", "MaxAttempts", "RetryBase", "RetryMax",
		"Confirm", "DownloadTimeout", "Backend", "Project", "Location", "QPS", "Burst", "PageSize",
		"Lookback", "FullScanEvery", "PassLease", "MinInterval", "Force", "Path", "MaxBody",
		"SyncWait", "InsecureNoVerify", "Dynamic", "OlderThan":
		return "--" + strings.ReplaceAll(field.Words(f), " ", "-") // EffectTimeout: --effect-timeout
	case "RecheckBase":
		return "--retry-base" // rechecks back off like retries
	case "RecheckMax":
		return "--retry-max"
	case "Results":
		return "--results-dir"
	case "Secrets":
		return "--secret-file"
	}
	return ""
}

// credentialsHint says how to give the API credentials a setting needs.
const credentialsHint = "set GEMINI_API_KEY (or GOOGLE_API_KEY), or --backend vertex with --project and --location"

// flagError is a library's error as the CLI shows it: its field.Error
// rendered with flag names, the chain kept for errors.Is.
type flagError struct {
	msg string
	err error
}

func (e *flagError) Error() string { return e.msg }
func (e *flagError) Unwrap() error { return e.err }

// usage turns a library's configuration error into exit 2, naming the
// flags (extra maps fields whose flag differs per command: Interval).
// Errors that are no field.Error keep their text. nil stays nil.
func usage(err error, extra ...map[string]string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if fe, ok := field.As(err); ok {
		msg = fe.Render(func(f string) string {
			for _, m := range extra {
				if n, ok := m[f]; ok {
					return n
				}
			}
			return flagFor(f)
		})
	}
	if errors.Is(err, dispatch.ErrNoAPI) {
		msg += ": " + credentialsHint
	}
	return withCode(exitUsage, &flagError{msg: msg, err: err})
}
