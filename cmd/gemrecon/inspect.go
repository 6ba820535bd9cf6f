package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// statusJSON is the stable --json shape of `gemrecon status`: sink.Entry's
// fields (batch_state, confirmed, results_file among them) plus the batch's
// error message, and for status the stored operation and the first webhook
// body. "state" is "unknown" for a key never seen.
type statusJSON struct {
	sink.Entry
	State      string `json:"state"`
	BatchError string `json:"batch_error,omitempty"`
	// Missing counts the attempts the history lacks (historyMissing).
	Missing   int64           `json:"history_missing,omitempty"`
	Operation json.RawMessage `json:"operation,omitempty"`
	Webhook   json.RawMessage `json:"webhook,omitempty"`
}

// batchError is the reason a batch gives for its outcome: the operation's
// (or Vertex job's) error message, or a failed-batch webhook event's
// error_message; "" when there is none.
func batchError(e sink.Entry) string {
	for _, doc := range [][]byte{e.Payload, e.Webhook} {
		var v struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
			Data struct {
				ErrorMessage string `json:"error_message"`
			} `json:"data"`
		}
		if len(doc) == 0 || json.Unmarshal(doc, &v) != nil {
			continue
		}
		if msg := cmp.Or(v.Error.Message, v.Data.ErrorMessage); msg != "" {
			return msg
		}
	}
	return ""
}

func entryJSON(e sink.Entry, withDocs bool) statusJSON {
	j := statusJSON{Entry: e, State: string(e.State), BatchError: batchError(e), Missing: historyMissing(e)}
	if withDocs {
		j.Operation, j.Webhook = rawOrNil(e.Payload), rawOrNil(e.Webhook)
	}
	return j
}

func (a *app) statusCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status KEY-OR-NAME",
		Short: "Show what happened to one completion, and why",
		Long:  statusLong,
		Example: `  gemrecon status batches/abc123
  gemrecon status 'projects/p/locations/us/operations/abc-123/' --json
  gemrecon --db /var/lib/gemrecon/sink.db status gemini:batches/abc123 || echo "not done yet"`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runStatus(cmd.Context(), asJSON, args[0]) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (stable field names: docs/operating.md)")
	return cmd
}

const statusLong = `Show one completion: its canonical key, state, attempts, fencing token,
sightings and their sources, lease (expired: the next drain, poll or serve
takes the key over), next attempt, done time, last error, conflicts and
history. The argument is a key (gemini:batches/x) or any operation name canon
understands (batches/x, a resource path or URL); a bare id x is the key
gemini:x, and when that is unknown status names a recorded batches/x (or
batchPredictionJobs/x, operations/x) on stderr. A key stored exactly as typed
is found even when today's canonical form differs. Control characters are
escaped (Go-quoted text; --json as JSON does).

Exit status: 0 done, 3 unknown key (the canonical key is still printed),
4 pending or claimed, 5 dead, 1 when the database cannot be read, 2 when the
argument is no operation name or one that could never be recorded (spec §12).`

// runStatus does the work of status.
func (a *app) runStatus(ctx context.Context, asJSON bool, arg string) error {
	keys, err := keysFor(arg)
	if err != nil {
		return err
	}
	key := keys[0]
	s, err := a.openSink(ctx, sink.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	var e sink.Entry
	for _, k := range keys {
		if e, err = s.Get(ctx, k); !errors.Is(err, sink.ErrNotFound) {
			break
		}
	}
	if errors.Is(err, sink.ErrNotFound) {
		if cerr := canon.CheckKey(key); cerr != nil {
			// Not "unknown": no sighting of it could ever be recorded.
			return usageError("%v; no such key is recorded, and none could be", cerr)
		}
		if asJSON {
			writeJSON(a.stdout, map[string]string{"key": key, "state": "unknown"})
		} else {
			// dial.Describe: a PostgreSQL --db may hold a password.
			fmt.Fprintf(a.stdout, "%s: unknown (never recorded in %s)\n", printable(key), printable(dial.Describe(a.db)))
		}
		if hint := meantKeys(ctx, s, key); hint != "" {
			a.stderrLine(slog.LevelWarn, hint)
		}
		return withCode(exitUnknownKey, nil)
	}
	if err != nil {
		return err
	}
	if asJSON {
		writeJSON(a.stdout, entryJSON(e, true))
	} else {
		printStatus(a.stdout, e, sink.NowOf(ctx, s))
	}
	switch e.State {
	case sink.StateDone:
		return nil
	case sink.StateDead:
		return withCode(exitDead, nil)
	default:
		return withCode(exitNotDone, nil)
	}
}

// keysFor returns the keys a typed name may be stored under, first the
// canonical key, then — for an argument that is a key (gemini:…) whose
// canonical form differs — the argument exactly, so that a key stored under
// an older canon stays reachable (spec §12). A name that is no operation
// name at all is a usage error.
func keysFor(arg string) ([]string, error) {
	key, err := canon.Key(arg)
	if err != nil {
		return nil, usageError("%s is not an operation name: %v", canon.Quote(arg), err)
	}
	if arg != key && strings.HasPrefix(arg, canon.Prefix) {
		return []string{key, arg}, nil
	}
	return []string{key}, nil
}

// meantKeys says which recorded keys an unknown bare id may have meant
// ("did you mean batches/demo-quota? (recorded: done)"), or "" when it is no
// bare id or none of its keys is recorded (canon.BareIDKeys).
func meantKeys(ctx context.Context, s sink.Sink, key string) string {
	var found []string
	for _, k := range canon.BareIDKeys(key) {
		if e, err := s.Get(ctx, k); err == nil {
			found = append(found, fmt.Sprintf("%s (recorded: %s)", printable(canon.Name(k)), e.State))
		}
	}
	if len(found) == 0 {
		return ""
	}
	return "did you mean " + strings.Join(found, " or ") + "?"
}

// printable returns s as it is when every character in it prints as itself
// (strconv.IsPrint), and Go-quoted otherwise, so that a stored key, source or
// error with a control character, an escape sequence or invalid UTF-8 cannot
// rewrite the terminal or hide what it holds (spec §12).
func printable(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) {
		return s
	}
	return strconv.Quote(s)
}

func rawOrNil(b []byte) json.RawMessage {
	if len(b) == 0 || !json.Valid(b) {
		return nil
	}
	return json.RawMessage(b)
}

// printStatus writes e as aligned text; now only says whether a lease has
// expired or a next attempt is due (by the sink's clock, sink.NowOf).
func printStatus(w io.Writer, e sink.Entry, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("key", printable(e.Key))
	row("state", string(e.State))
	// The batch's own outcome (spec §9.6): "FAILED (Enqueued token quota
	// exceeded for this model.)", "SUCCEEDED", "unknown".
	batch := cmp.Or(e.BatchState, "unknown")
	if msg := batchError(e); msg != "" {
		batch += " (" + truncate(oneLine(msg), 200) + ")"
	}
	row("batch", printable(batch))
	confirmed := "no: the operation is the webhook's body"
	if e.Confirmed {
		confirmed = "yes: the operation is the API's"
	} else if e.NeedsConfirm {
		confirmed = "no: seen only through a dynamic signature, it waits for a process that can confirm it with the API"
	}
	row("confirmed", confirmed)
	row("attempts", fmt.Sprint(e.Attempts))
	row("fencing token", fmt.Sprint(e.Token))
	row("first seen", fmt.Sprintf("%s via %s", fmtTime(e.FirstSeenAt), printable(e.FirstSource)))
	row("last seen", fmtTime(e.LastSeenAt))
	sources := make([]string, len(e.Sources))
	for i, src := range e.Sources {
		sources[i] = printable(src)
	}
	row("seen", fmt.Sprintf("%d× from %s", e.SeenCount, strings.Join(sources, ", ")))
	if e.State == sink.StateClaimed {
		lease := fmt.Sprintf("held by %s until %s", printable(e.LeaseOwner), fmtTime(e.LeaseUntil))
		if !now.Before(e.LeaseUntil) {
			// Its holder stopped renewing it (it died, or is paused).
			lease += " (expired: the next drain, poll or serve takes the key over, counting that attempt as failed)"
		}
		row("lease", lease)
	}
	if e.State == sink.StatePending {
		next := fmtTime(e.NextAttemptAt)
		if !now.Before(e.NextAttemptAt) {
			next += " (due now)"
		}
		row("next attempt", next)
	}
	if !e.DoneAt.IsZero() {
		row("done at", fmtTime(e.DoneAt))
	}
	if e.LastError != "" {
		row("last error", printable(oneLine(e.LastError)))
	}
	if e.State == sink.StateDead {
		row("dead because", deadReasonText(e.DeadReason))
	}
	if e.ResultsFile != "" {
		row("results file", printable(e.ResultsFile))
	}
	if e.BatchState == "SUCCEEDED" && e.State != sink.StateDone && !e.BatchEnd.IsZero() {
		left := e.BatchEnd.Add(sink.ResultsKept).Sub(now)
		kept := fmt.Sprintf("until %s (%s from now: the API deletes them 48 h after the batch ended)", fmtTime(e.BatchEnd.Add(sink.ResultsKept)), fmtAge(left))
		if left <= 0 {
			kept = fmt.Sprintf("no longer: they were deleted at %s (retry --without-results runs the effect without them)", fmtTime(e.BatchEnd.Add(sink.ResultsKept)))
		}
		row("results kept", kept)
	}
	row("conflicts", fmt.Sprint(e.Conflicts))
	tw.Flush()
	printHistory(w, e)
}

// printHistory prints the key's history (design §3 "History"), one entry a
// line, and what is not on record: older entries no longer kept, and the
// attempts of a gemrecon from before the history.
func printHistory(w io.Writer, e sink.Entry) {
	if len(e.History) == 0 && e.Token == 0 {
		return
	}
	fmt.Fprintln(w, "history:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, a := range e.History {
		switch a.Kind {
		case sink.KindAttempt:
			took := "-"
			if !a.End.IsZero() {
				took = a.End.Sub(a.Start).Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "  #%d\t%s\t%s\tby %s via %s\ttook %s\t%s\n", a.Token, fmtTime(a.Start), a.Outcome,
				printable(a.Holder), printable(a.Command), took, printable(oneLine(a.Error)))
		case sink.KindFenced:
			fmt.Fprintf(tw, "  #%d\t%s\tfenced\ta stale holder's %s, discarded\t\t\n", a.Token, fmtTime(a.Start), printable(a.Error))
		default: // retry, rerun
			fmt.Fprintf(tw, "  \t%s\t%s\tasked by %s\t\t\n", fmtTime(a.Start), a.Kind, printable(a.Holder))
		}
	}
	tw.Flush()
	if e.Dropped > 0 {
		fmt.Fprintf(w, "  (%d older entries not kept)\n", e.Dropped)
	}
	if n := historyMissing(e); n > 0 {
		fmt.Fprintf(w, "  (%d attempt(s) not on record: made by a gemrecon from before the history)\n", n)
	}
}

// historyMissing counts the attempts the history lacks: tokens, from the
// oldest entry kept on (or from 1 when none was dropped), that no attempt
// entry has.
func historyMissing(e sink.Entry) int64 {
	from := int64(1)
	if e.Dropped > 0 && len(e.History) > 0 {
		from = e.History[0].Token
	}
	seen := map[int64]bool{}
	for _, a := range e.History {
		if a.Kind == sink.KindAttempt && a.Token >= from {
			seen[a.Token] = true
		}
	}
	return max(e.Token-from+1, 0) - int64(len(seen))
}

// deadReasonText names a dead reason class for people.
func deadReasonText(reason string) string {
	switch reason {
	case sink.DeadUnknownToAPI:
		return "unknown to the API"
	case sink.DeadResultsExpired:
		return "its results expired (the API keeps them 48 h): retry --without-results runs the effect without them"
	case "", sink.DeadEffect:
		return "the effect failed (permanently or for the last time)"
	}
	return printable(reason)
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// listOptions are the flags of list.
type listOptions struct {
	state  string
	limit  int
	asJSON bool
}

func (a *app) listCommand() *cobra.Command {
	var o listOptions
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List recorded completions, oldest first",
		Example: `  gemrecon list --state dead
  gemrecon list --limit 20 --json | jq -r '.[].key'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runList(cmd.Context(), &o) },
	}
	cmd.Flags().StringVar(&o.state, "state", "", "only keys in this state: pending, claimed, done, dead")
	cmd.Flags().IntVar(&o.limit, "limit", 100, "at most this many rows (0 = all)")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print a JSON array of entries")
	return cmd
}

// runList does the work of list.
func (a *app) runList(ctx context.Context, o *listOptions) error {
	st := sink.State(o.state)
	if o.state != "" && !st.Valid() {
		return usageError("--state %q: want pending, claimed, done or dead", o.state)
	}
	if o.limit < 0 {
		return usageError("--limit %d: must not be negative", o.limit)
	}
	s, err := a.openSink(ctx, sink.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	entries, err := s.List(ctx, sink.ListOptions{State: st, Limit: o.limit})
	if err != nil {
		return err
	}
	if o.asJSON {
		out := make([]statusJSON, 0, len(entries))
		for _, e := range entries {
			out = append(out, entryJSON(e, false))
		}
		writeJSON(a.stdout, out)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tSTATE\tBATCH\tATTEMPTS\tSEEN\tFIRST SOURCE\tLAST SEEN\tLAST ERROR")
	for _, e := range entries {
		batch := cmp.Or(e.BatchState, "unknown")
		if !e.Confirmed {
			batch += "?" // as the webhook says: not confirmed by the API
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", printable(e.Key), e.State, printable(batch), e.Attempts, e.SeenCount,
			printable(e.FirstSource), fmtTime(e.LastSeenAt), printable(truncate(oneLine(e.LastError), 60)))
	}
	return tw.Flush()
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (a *app) statsCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Summarise the sink: states, duplicates, sources, conflicts, fencing, latency, poll passes",
		Long:  statsLong,
		Example: `  gemrecon stats
  gemrecon stats --json | jq .by_state
  gemrecon stats --json | jq -r '.passes[] | "\(.scope) \(.last_success // "never")"'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error { return a.runStats(cmd.Context(), asJSON) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (durations in nanoseconds)")
	return cmd
}

const statsLong = `Summarise the sink: keys by state, duplicates, "first source" (keys first
seen by poll are completions whose webhook was missed), conflicts and fenced
outcomes, and for each poll scope the pass records shared by every process on
the database — last pass, last success, last full scan, pass lease holder. A
cron job that keeps failing shows as an old "last success". Control characters
in stored text are escaped (Go-quoted; --json as JSON does).`

// runStats does the work of stats.
func (a *app) runStats(ctx context.Context, asJSON bool) error {
	s, err := a.openSink(ctx, sink.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	st, err := s.Stats(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		writeJSON(a.stdout, st)
		return nil
	}
	printStats(a.stdout, st, sink.NowOf(ctx, s))
	return nil
}

// printStats writes st as aligned text; now only says whether a pass lease
// has expired (by the sink's clock, sink.NowOf). Scopes, holders and sources
// are stored by other processes: they are printed through printable, as
// list and status print keys and errors (spec §12).
func printStats(w io.Writer, st sink.Stats, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var total int64
	for _, n := range st.ByState {
		total += n
	}
	fmt.Fprintf(tw, "keys:\t%d\n", total)
	for _, s := range []sink.State{sink.StatePending, sink.StateClaimed, sink.StateDone, sink.StateDead} {
		fmt.Fprintf(tw, "  %s:\t%d\n", s, st.ByState[s])
	}
	if st.ByState[sink.StateDead] > 0 {
		fmt.Fprintf(tw, "    by reason:\tunknown to the API %d, results expired %d, effect %d\n",
			st.DeadByReason[sink.DeadUnknownToAPI], st.DeadByReason[sink.DeadResultsExpired], st.DeadByReason[sink.DeadEffect])
	}
	fmt.Fprintf(tw, "results expiring:\t%d key(s) not done whose results the API deletes within %v\n", st.ResultsExpiring, sink.ResultsWarning)
	fmt.Fprintf(tw, "oldest pending:\t%s\n", fmtAge(st.OldestPendingAge))
	fmt.Fprintf(tw, "duplicates suppressed:\t%d\n", st.DuplicatesSuppressed)
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(st.FirstSource)) {
		parts = append(parts, fmt.Sprintf("%s %d", printable(s), st.FirstSource[s]))
	}
	fmt.Fprintf(tw, "first source:\t%s\n", cmp.Or(strings.Join(parts, ", "), "-"))
	fmt.Fprintf(tw, "state conflicts:\t%d\n", st.Conflicts)
	fmt.Fprintf(tw, "fenced outcomes:\t%d\n", st.Fenced)
	fmt.Fprintf(tw, "first seen → done:\tp50 %s, p99 %s, max %s\n", fmtAge(st.LatencyP50), fmtAge(st.LatencyP99), fmtAge(st.LatencyMax))
	passes := fmt.Sprintf("%d scopes", len(st.Passes))
	switch len(st.Passes) {
	case 0:
		passes = "none recorded"
	case 1:
		passes = "1 scope"
	}
	fmt.Fprintf(tw, "poll passes:\t%s\n", passes)
	// A scope is a line of its own (no cell), so that a long one does not
	// widen the columns.
	for _, p := range st.Passes {
		fmt.Fprintf(tw, "  %s\n", printable(p.Scope))
		last := "-"
		if !p.LastEnd.IsZero() {
			last = fmt.Sprintf("%s → %s by %s", fmtTime(p.LastStart), fmtTime(p.LastEnd), cmp.Or(printable(p.LastHolder), "-"))
		}
		fmt.Fprintf(tw, "    last pass:\t%s\n", last)
		fmt.Fprintf(tw, "    last success:\t%s\n", fmtTime(p.LastSuccess))
		fmt.Fprintf(tw, "    last full scan:\t%s\n", fmtTime(p.LastFullScan))
		fmt.Fprintf(tw, "    unfinished:\t%s\n", unfinishedLine(p, now))
		fmt.Fprintf(tw, "    lease:\t%s\n", passLease(p, now))
	}
	tw.Flush()
}

// unfinishedLine says what the scope's last listing saw unfinished: the
// count by state and the age of the oldest (the API expires a batch 48 h
// after its creation).
func unfinishedLine(p sink.PassRecord, now time.Time) string {
	if len(p.Unfinished) == 0 {
		return "none listed"
	}
	states := make([]string, 0, len(p.Unfinished))
	for s, n := range p.Unfinished {
		states = append(states, fmt.Sprintf("%s %d", printable(s), n))
	}
	slices.Sort(states)
	line := strings.Join(states, ", ")
	if !p.OldestUnfinished.IsZero() {
		line += fmt.Sprintf("; the oldest created %s ago", fmtAge(now.Sub(p.OldestUnfinished)))
	}
	return line
}

// passLease describes a scope's pass lease.
func passLease(p sink.PassRecord, now time.Time) string {
	switch {
	case p.Holder == "":
		return fmt.Sprintf("free (token %d)", p.Token)
	case now.Before(p.HeldUntil):
		return fmt.Sprintf("held by %s until %s (token %d)", printable(p.Holder), fmtTime(p.HeldUntil), p.Token)
	default:
		return fmt.Sprintf("expired: held by %s until %s (token %d); the next pass takes it over", printable(p.Holder), fmtTime(p.HeldUntil), p.Token)
	}
}

func fmtAge(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

// exactArgs is cobra.ExactArgs with a usage error (exit 2) that says what to do.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError("%s takes %d argument(s), got %d: see 'gemrecon %s --help'", cmd.Name(), n, len(args), cmd.Name())
		}
		return nil
	}
}
