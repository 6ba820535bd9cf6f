package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// retryOptions are the flags of retry and rerun.
type retryOptions struct {
	sink.RetryOptions
	allDead           bool
	since, until, src string // rerun: done keys by their done time and first source
	yes               bool   // rerun: more than one key
}

func (a *app) retryCommand() *cobra.Command {
	var o retryOptions
	cmd := &cobra.Command{
		Use:   "retry KEY-OR-NAME... | --all-dead",
		Short: "Send dead completions back to pending, due now",
		Long:  retryLong,
		Example: `  gemrecon retry batches/abc123
  gemrecon retry --without-results batches/abc123   # its results expired: run the effect without them
  gemrecon retry --all-dead && gemrecon drain --exec ./publish.sh`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runRetry(cmd.Context(), &o, args) },
	}
	cmd.Flags().BoolVar(&o.allDead, "all-dead", false, "retry every dead key")
	cmd.Flags().BoolVar(&o.WithoutResults, "without-results", false, "run the effect without the batch's results (they expired: dead reason results_expired)")
	return cmd
}

const retryLong = `Move dead keys back to pending, due now, so that the next poll, drain or
serve worker runs their effect again; the history is kept and records who
asked. A named key that is not dead is reported (exit 1), and for an unknown
bare id x the report names the recorded batches/x (or batchPredictionJobs/x,
operations/x) it may have meant. --all-dead sends back every key it lists as
dead; one no longer dead when its turn comes is skipped and counted apart (no
error). A database error is exit 1, after the summary of what was sent back.`

func (a *app) rerunCommand() *cobra.Command {
	o := retryOptions{RetryOptions: sink.RetryOptions{Rerun: true}}
	cmd := &cobra.Command{
		Use:   "rerun KEY-OR-NAME... | --done-since T [--done-until T] [--source S]",
		Short: "Run the effect of done completions once more, on purpose",
		Long: `Send done keys back to pending, due now, so that their effect runs once
more: the one way a done completion runs again. The attempt budget restarts,
and the effect is told it is a rerun ("rerun": true in the event document,
GEMRECON_RERUN=1, @rerun for --sql). Keys by name, or every key done between
--done-since and --done-until (RFC 3339; until defaults to now), optionally
first seen by --source (poll or webhook). More than one key needs --yes:
without it rerun prints what it would do. A key that is unknown or not done
is reported (exit 1).`,
		Example: `  gemrecon rerun batches/abc123
  gemrecon rerun --done-since 2026-12-01T00:00:00Z --source webhook          # prints what it would do
  gemrecon rerun --done-since 2026-12-01T00:00:00Z --source webhook --yes`,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runRetry(cmd.Context(), &o, args) },
	}
	cmd.Flags().StringVar(&o.since, "done-since", "", "rerun the keys done at or after this time (RFC 3339)")
	cmd.Flags().StringVar(&o.until, "done-until", "", "with --done-since: and before this time (RFC 3339; default now)")
	cmd.Flags().StringVar(&o.src, "source", "", "with --done-since: only keys first seen by this source (poll or webhook)")
	cmd.Flags().BoolVar(&o.yes, "yes", false, "rerun more than one key (without it, print what would be done)")
	return cmd
}

// whoAsked names the operator of a retry or rerun for the key's history.
func whoAsked() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

// doneBetween lists the done keys of rerun's --done-since, --done-until and
// --source.
func doneBetween(ctx context.Context, s sink.Sink, o *retryOptions) ([]string, error) {
	since, err := time.Parse(time.RFC3339, o.since)
	if err != nil {
		return nil, usageError("--done-since %q: want an RFC 3339 time such as 2026-12-01T00:00:00Z", o.since)
	}
	until := time.Now()
	if o.until != "" {
		if until, err = time.Parse(time.RFC3339, o.until); err != nil {
			return nil, usageError("--done-until %q: want an RFC 3339 time such as 2026-12-02T00:00:00Z", o.until)
		}
	}
	done, err := s.List(ctx, sink.ListOptions{State: sink.StateDone})
	var keys []string
	for _, e := range done {
		if !e.DoneAt.Before(since) && e.DoneAt.Before(until) && (o.src == "" || e.FirstSource == o.src) {
			keys = append(keys, e.Key)
		}
	}
	return keys, err
}

// runRetry does the work of retry and rerun.
func (a *app) runRetry(ctx context.Context, o *retryOptions, args []string) error {
	verb, byList, listFlag := "retried", o.allDead, "--all-dead"
	if o.Rerun {
		verb, byList, listFlag = "rerun", o.since != "", "--done-since"
		if o.since == "" && (o.until != "" || o.src != "") {
			return usageError("--done-until and --source go with --done-since")
		}
		if o.src != "" && o.src != sink.SourcePoll && o.src != sink.SourceWebhook {
			return usageError("--source %q: want poll or webhook", o.src)
		}
	}
	if byList == (len(args) > 0) {
		return usageError("give one or more keys, or %s (not both)", listFlag)
	}
	// The canonical keys of the arguments, and for those typed as a key
	// whose canonical form differs, the key exactly as typed (spec §12).
	keys, exact := make([]string, 0, len(args)), map[string]string{}
	for _, arg := range args {
		ks, err := keysFor(arg)
		if err != nil {
			return err
		}
		keys = append(keys, ks[0])
		if len(ks) > 1 {
			exact[ks[0]] = ks[1]
		}
	}
	s, err := a.openSink(ctx, sink.Options{})
	if err != nil {
		return err
	}
	o.By = whoAsked()
	if o.allDead {
		return a.retryAllDead(ctx, s, o.RetryOptions)
	}
	if o.Rerun && byList {
		if keys, err = doneBetween(ctx, s, o); err != nil {
			return err
		}
	}
	if o.Rerun && len(keys) > 1 && !o.yes {
		n := 0
		for _, k := range keys {
			switch e, err := s.Get(ctx, k); {
			case errors.Is(err, sink.ErrNotFound):
				fmt.Fprintf(a.stdout, "%s: unknown, would be left alone\n", printable(k))
			case err != nil:
				return err
			case e.State != sink.StateDone:
				fmt.Fprintf(a.stdout, "%s: %s, not done: would be left alone\n", printable(k), e.State)
			default:
				n++
				fmt.Fprintf(a.stdout, "%s: would be rerun\n", printable(k))
			}
		}
		fmt.Fprintf(a.stdout, "%d key(s) would be rerun: add --yes to rerun them\n", n)
		return nil
	}
	var failed, never int
	for _, k := range keys {
		err := s.Retry(ctx, k, o.RetryOptions)
		if as, ok := exact[k]; ok && errors.Is(err, sink.ErrNotFound) {
			if err = s.Retry(ctx, as, o.RetryOptions); !errors.Is(err, sink.ErrNotFound) {
				k = as
			}
		}
		if errors.Is(err, sink.ErrNotFound) {
			if cerr := canon.CheckKey(k); cerr != nil {
				never++
				err = fmt.Errorf("%w (and none could be: %v)", err, cerr)
			} else if hint := meantKeys(ctx, s, k); hint != "" {
				err = fmt.Errorf("%w; %s", err, hint)
			}
		}
		switch {
		case err == nil:
			fmt.Fprintf(a.stdout, "%s: pending, due now\n", printable(k))
		case errors.Is(err, sink.ErrNotFound), errors.Is(err, sink.ErrNotDead), errors.Is(err, sink.ErrNotDone):
			failed++
			// sink.KeyText: quoted and cut short when the key is one
			// spec §12 refuses (the sink's text names it again).
			a.errorLine(fmt.Sprintf("%s: %v", sink.KeyText(k), err))
		default:
			return err
		}
	}
	switch {
	case never > 0:
		// A name that spec §12 refuses and that is not stored can never
		// be retried: a usage error, as status says of it (exit 2).
		return usageError("%d of %d key(s) could not be %s (%d of them names that no key can have)", failed, len(keys), verb, never)
	case failed > 0:
		return withCode(exitFatal, fmt.Errorf("%d of %d key(s) could not be %s", failed, len(keys), verb))
	}
	return nil
}

// retryAllDead is retry --all-dead: every key the listing found dead goes
// back to pending. A listed key that is no longer dead when its turn comes
// (another retry, a worker or a purge got to it after the listing) is
// skipped, not an error: it is not dead, which is what the operator asked
// for. The summary counts the keys this run actually sent back, and the
// skipped ones apart. A database error ends the run (exit 1) after saying
// how many were sent back before it.
func (a *app) retryAllDead(ctx context.Context, s sink.Sink, ro sink.RetryOptions) error {
	dead, err := s.List(ctx, sink.ListOptions{State: sink.StateDead})
	if err != nil {
		return err
	}
	var retried, skipped int
	summary := func(failed bool) {
		line := fmt.Sprintf("%d dead key(s) sent back to pending", retried)
		if skipped > 0 {
			line += fmt.Sprintf(", %d skipped: no longer dead when retried (another process changed them after the listing)", skipped)
		}
		if failed {
			line += fmt.Sprintf(", then an error stopped it with %d listed key(s) to go", len(dead)-retried-skipped)
		}
		fmt.Fprintln(a.stdout, line)
	}
	for _, e := range dead {
		err := s.Retry(ctx, e.Key, ro)
		if errors.Is(err, sink.ErrNotDead) || errors.Is(err, sink.ErrNotFound) {
			// The sink's error carries the state only as text: Get says
			// what the key is now.
			now := "no longer recorded"
			en, gerr := s.Get(ctx, e.Key)
			switch {
			case gerr == nil:
				now = "now " + string(en.State)
			case !errors.Is(gerr, sink.ErrNotFound):
				summary(true)
				return gerr
			}
			skipped++
			fmt.Fprintf(a.stdout, "%s: skipped, not dead when its retry ran (%s)\n", printable(e.Key), now)
			continue
		}
		if err != nil {
			summary(true)
			return err
		}
		retried++
		fmt.Fprintf(a.stdout, "%s: pending, due now\n", printable(e.Key))
	}
	summary(false)
	return nil
}

// purgeOptions are purge's flags.
type purgeOptions struct {
	req        sink.PurgeRequest
	resultsDir string
}

func (a *app) purgeCommand() *cobra.Command {
	var o purgeOptions
	cmd := &cobra.Command{
		Use:   "purge --older-than D",
		Short: "Delete done rows older than D",
		Long: `Delete keys that have been done for longer than D, by the clock that wrote
the done times (on PostgreSQL the server's). A purged key that a poll pass
sees again would run its effect again, so purge refuses a D shorter than the
longest --lookback any poll recorded in this database (a lookback of 0 means
"forever": then every purge needs --force). With --results-dir the purged
keys' results files (DIR/<id>.jsonl) are deleted too.`,
		Example: `  gemrecon purge --older-than 720h
  gemrecon purge --older-than 24h --force   # only if no poll will re-see those batches
  gemrecon purge --older-than 720h --results-dir /var/lib/gemrecon/results`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runPurge(cmd.Context(), &o) },
	}
	cmd.Flags().DurationVar(&o.req.OlderThan, "older-than", 0, "delete keys done for longer than this (e.g. 720h), by the clock that wrote the done times")
	cmd.Flags().BoolVar(&o.req.Force, "force", false, "purge even when a poll's lookback could re-see the keys")
	cmd.Flags().StringVar(&o.resultsDir, "results-dir", "", "also delete the purged keys' results files from this directory (the --results-dir of poll, serve, drain)")
	return cmd
}

// runPurge is purge: the lookback guard (sink.PurgeRequest.Check), the rows,
// then their results files.
func (a *app) runPurge(ctx context.Context, o *purgeOptions) error {
	if err := usage(o.req.Validate()); err != nil {
		return err
	}
	var dir *results.Dir
	if o.resultsDir != "" {
		var err error
		if dir, err = results.Open(o.resultsDir); err != nil {
			return withCode(exitUsage, err)
		}
	}
	s, err := a.openSink(ctx, sink.Options{})
	if err != nil {
		return err
	}
	if err := o.req.Check(ctx, s); errors.Is(err, sink.ErrPurgeRefused) {
		return usage(err)
	} else if err != nil {
		return err
	}
	// The sink measures the age with the clock that wrote the done times
	// (on PostgreSQL the server's), never with this process's clock: one
	// that runs ahead would purge keys done less than D ago.
	clock := "this machine's clock"
	if dial.IsPostgres(a.db) {
		clock = "the PostgreSQL server's clock"
	}
	keys, err := s.Purge(ctx, o.req.OlderThan)
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "purged %d done key(s) older than %v by %s\n", len(keys), o.req.OlderThan, clock)
	if dir == nil {
		return nil
	}
	return a.removeResults(dir, keys)
}

// removeResults deletes the purged keys' results files. It runs after the
// rows: a purge that failed deletes no file. A crash in between leaves
// files no key names (harmless).
func (a *app) removeResults(dir *results.Dir, keys []string) error {
	removed, failed := 0, 0
	for _, k := range keys {
		id, ok := strings.CutPrefix(canon.Name(k), "batches/")
		if !ok {
			continue // only Gemini API batches have results files
		}
		gone, err := dir.Remove(id)
		switch {
		case err != nil:
			failed++
			// sink.KeyText: quoted and cut short when the key is one
			// spec §12 refuses (the sink's text names it again).
			a.errorLine(fmt.Sprintf("%s: %v", sink.KeyText(k), err))
		case gone:
			removed++
		}
	}
	fmt.Fprintf(a.stdout, "removed %d results file(s) from %s\n", removed, dir.Path())
	if failed > 0 {
		return withCode(exitFatal, fmt.Errorf("%d results file(s) could not be removed", failed))
	}
	return nil
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the release version (or module version), VCS revision and Go version",
		Example: `  gemrecon version`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(a.stdout, versionString())
			return nil
		},
	}
}

// version is the release's version, stamped by scripts/release.sh
// (-ldflags "-X main.version=…": a git tag, else the VERSION file). It is
// set at link time only; an unstamped build reports the module version.
var version string

// versionString is the stamped version (else the module version) with the
// VCS stamp and the Go version from build info.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "gemrecon " + cmp.Or(version, "(unknown version)")
	}
	v := cmp.Or(version, bi.Main.Version, "(devel)")
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		vcs[s.Key] = s.Value
	}
	rev, modified := vcs["vcs.revision"], ""
	if vcs["vcs.modified"] == "true" {
		modified = "+dirty"
	}
	out := "gemrecon " + v
	if rev != "" {
		out += fmt.Sprintf(" (%s%s, %s)", rev[:min(len(rev), 12)], modified, vcs["vcs.time"])
	}
	return out + " " + bi.GoVersion
}
