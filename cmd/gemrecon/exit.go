package main

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/internal/field"
)

// Exit statuses (spec §5, §7, §8). They are documented in the README and
// docs/design.md §8, and mapped from errors in exactly one place: exitCode.
const (
	exitOK         = 0
	exitFatal      = 1
	exitUsage      = 2
	exitUnknownKey = 3 // status: the key was never recorded
	exitNotDone    = 4 // status: pending or claimed; poll/drain: some effect failed
	exitDead       = 5 // status: dead
)

// exitError carries an exit status through cobra's error return. A nil err
// means the command already said what it had to (status exits 3/4/5 that way).
// A non-empty msg is shown instead of err's text (usage: a library's
// field.Error rendered with flag names), the chain kept for errors.Is.
type exitError struct {
	code int
	err  error
	msg  string
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return cmp.Or(e.msg, e.err.Error())
}

func (e *exitError) Unwrap() error { return e.err }

// withCode attaches an exit status to err (nil err: silent exit).
func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// usageError marks an error as the user's wrong words (exit 2).
func usageError(format string, a ...any) error {
	return withCode(exitUsage, fmt.Errorf(format, a...))
}

// exitCode maps a command's error to its exit status; errors without a code
// are fatal (1).
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	if ee, ok := errors.AsType[*exitError](err); ok {
		return ee.code
	}
	return exitFatal
}

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
	}
	return otherFlags[f]
}

// otherFlags are the flags not named by their field's words (rechecks back
// off like retries).
var otherFlags = map[string]string{"RecheckBase": "--retry-base", "RecheckMax": "--retry-max",
	"Results": "--results-dir", "Secrets": "--secret-file"}

// credentialsHint says how to give the API credentials a setting needs.
const credentialsHint = "set GEMINI_API_KEY (or GOOGLE_API_KEY), or --backend vertex with --project and --location"

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
	return &exitError{code: exitUsage, err: err, msg: msg}
}
