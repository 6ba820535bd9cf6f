package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/sink"
)

// Confirmation and results, before the effect runs (spec §9.2, §9.5).
//
// A claimed key whose stored payload is not the API's (first seen by a
// webhook) is confirmed first: the batch is fetched with Batches.Get
// through the process's one poller (its client, rate limiter and retry
// rules), the answer decides what happens, and only a decisive answer uses
// an attempt:
//
//   - terminal: Sink.Confirm stores the operation and its state; the effect
//     runs on them ("confirmed": true).
//   - not terminal: handed back without using an attempt (Failure.NoAttempt),
//     rechecked after recheckDelay, until the batch's createTime + 48 h
//     (after which the API reports it EXPIRED): from then on "still not
//     terminal" counts as an attempt, so that a batch the API never
//     finishes ends dead instead of being rechecked forever.
//   - 404, or 403 for a batch of another project (poller.ErrNotFound): dead,
//     reason sink.DeadUnknownToAPI; a later poll sighting revives it.
//   - 429, 5xx, transport errors, timeouts (poller.ErrTransient) and 401
//     (poller.ErrAuth): handed back without an attempt, not before the
//     server's delay (RetryInfo, Retry-After) nor recheckDelay.
//   - a name Batches.Get cannot fetch (poller.ErrInvalidName: operations/…,
//     a name of no known shape, a job of another backend): no request is
//     sent and the effect runs unconfirmed ("confirmed": false) — unless
//     the key needs confirmation (seen only through a dynamic signature),
//     which never runs unconfirmed: it goes dead as unknown to the API.
//   - any other answer (poller.ErrUnexpected: another 4xx, a body that is
//     not the batch, or one larger than poller.MaxResponseBody, which the
//     poller asked for once): a counted failure.
//
// A process that does not confirm (Config.Confirm false: no credentials
// with --confirm auto, or --confirm never) runs unconfirmed keys on what
// it has, and never claims a key that needs confirmation (it passes
// sink.SkipNeedsConfirm to every claim and listing): such keys wait, due,
// for a process that can, and no claim is spent on them.
//
// With Config.Results, a confirmed SUCCEEDED Gemini API batch's responses
// file (or its inlined responses) is written to the results directory
// before the effect, bounded by DownloadTimeout; the lease is renewed
// meanwhile. A failed download is a failure of the attempt (retried with
// backoff), except results that expired (sink.ResultsKept): dead at once.

// API is what dispatch needs of the Gemini API: *poller.Poller.
type API interface {
	Get(ctx context.Context, name string) (poller.Operation, error)
	Download(ctx context.Context, file string, w io.Writer) (int64, error)
}

// Defaults of the confirmation and results settings. DefaultConfirmTimeout
// bounds one confirmation request, retries included (RunKeyWithin can ask
// for less).
const (
	DefaultConfirmTimeout  = 5 * time.Minute
	DefaultDownloadTimeout = 30 * time.Minute
	DefaultRecheckBase     = 10 * time.Second
	DefaultRecheckMax      = time.Hour
)

// BatchExpiry is how long after its creation the API reports a batch that
// is still pending or running as EXPIRED (48 h).
const BatchExpiry = 48 * time.Hour

// OutcomeUnconfirmed: the key was handed back without using an attempt
// because the API has not confirmed it yet (not terminal, or no answer); it
// is rechecked later.
const OutcomeUnconfirmed Outcome = "unconfirmed"

// claimOpts are the claim options of this dispatcher.
func (d *Dispatcher) claimOpts() sink.ClaimOptions {
	return sink.ClaimOptions{Command: d.cfg.Command, SkipNeedsConfirm: !d.cfg.Confirm}
}

// verdict is how an attempt ends when it is not a success to record: a
// failure to record, with the outcome to report for it; or nothing to
// record, the claim taken over (fenced) or completed by the effect itself
// (OutcomeDone, sql.go).
type verdict struct {
	failure sink.Failure
	outcome Outcome // OutcomeUnconfirmed, OutcomeDone, or "" to let the recorded state decide
	fenced  bool    // the claim was taken over: nothing is recorded
}

// prepare confirms the claim when it must be, fills in what the document
// says of the batch, and writes its results. ev is the document built from
// the claim; confirmWait bounds the Get (0: DefaultConfirmTimeout). It returns the
// document to run, or the verdict when the effect must not run.
func (d *Dispatcher) prepare(ctx context.Context, log *slog.Logger, c sink.Claim, ev effect.Event, confirmWait time.Duration) (effect.Event, *verdict) {
	if !c.Confirmed && c.NeedsConfirm && !d.cfg.Confirm {
		// Never claimed by this dispatcher (SkipNeedsConfirm); should one
		// be, it goes back for a process that can confirm it.
		log.Error("dispatch: a key that needs confirmation was claimed by a process that cannot confirm it; handed back")
		return ev, &verdict{outcome: OutcomeUnconfirmed, failure: sink.Failure{NoAttempt: true,
			Cause:     "needs confirmation by the API (seen only through a dynamic signature); this process cannot confirm",
			NotBefore: d.cfg.Now().Add(d.cfg.RecheckMax)}}
	}
	if !c.Confirmed && d.cfg.Confirm {
		var v *verdict
		if ev, v = d.confirm(ctx, log, c, ev, confirmWait); v != nil {
			return ev, v
		}
	}
	if ev.Confirmed {
		if r, err := poller.ResultsOf(poller.Operation{Name: ev.Name, Raw: ev.Operation}); err == nil && r.Location != "" {
			ev.ResultsLocation = r.Location
		}
	}
	if d.cfg.Results != nil && !c.NoResults { // retry --without-results: they expired
		if v := d.writeResults(ctx, log, c, &ev); v != nil {
			return ev, v
		}
	}
	return ev, nil
}

// confirm fetches the batch and applies the rules of spec §9.2 (see the
// comment at the top of this file).
func (d *Dispatcher) confirm(ctx context.Context, log *slog.Logger, c sink.Claim, ev effect.Event, wait time.Duration) (effect.Event, *verdict) {
	// Batches.Get is handed the key's canonical name, except that a Vertex
	// job goes by its numeric id (the SDK rebuilds the path from the
	// client's own project and location).
	name := canon.Name(c.Key)
	if id, ok := strings.CutPrefix(name, "batchPredictionJobs/"); ok {
		name = id
	}
	gctx, cancel := context.WithTimeout(ctx, cmp.Or(max(wait, 0), DefaultConfirmTimeout)) // wait <= 0: the default
	op, err := d.cfg.API.Get(gctx, name)
	cancel()
	now := d.cfg.Now()
	recheck := func(cause string, serverDelay time.Duration) *verdict {
		return &verdict{outcome: OutcomeUnconfirmed, failure: sink.Failure{NoAttempt: true, Cause: cause,
			NotBefore: now.Add(max(serverDelay, d.recheckDelay(now.Sub(c.FirstSeenAt))))}}
	}
	var te *poller.TransientError
	switch {
	case err == nil && op.Terminal:
		wctx, cancel := writeContext(ctx)
		cerr := d.cfg.Sink.Confirm(wctx, c.Key, c.Token, sink.Confirmation{Operation: op.Raw, State: op.State})
		cancel()
		switch {
		case errors.Is(cerr, sink.ErrFenced):
			log.Error("dispatch: FENCED: the key was taken over while it was being confirmed; nothing runs", "err", cerr)
			return ev, &verdict{fenced: true}
		case cerr != nil:
			return ev, recheck("recording the API's answer failed: "+cerr.Error(), 0)
		}
		if sink.StateConflict(c.BatchState, op.State) {
			log.Warn("dispatch: the API's batch state differs from the webhook's; the API's wins", "webhook", c.BatchState, "api", op.State)
		}
		log.Debug("dispatch: confirmed by the API", "batch_state", op.State)
		ev.Operation, ev.BatchState, ev.State, ev.Confirmed = op.Raw, op.State, op.State, true
		return ev, nil
	case err == nil:
		created := op.CreateTime
		if created.IsZero() || created.After(c.FirstSeenAt) {
			created = c.FirstSeenAt // the batch existed when its webhook came
		}
		if now.Before(created.Add(BatchExpiry)) {
			v := recheck(fmt.Sprintf("not confirmed yet: the API says the batch is %s (the webhook said %s); rechecked later without using an attempt",
				cmp.Or(op.State, "unknown"), cmp.Or(c.BatchState, "unknown")), 0)
			log.Info("dispatch: the API says the batch is not finished; rechecked later", "batch_state", op.State, "next", v.failure.NotBefore)
			return ev, v
		}
		return ev, &verdict{failure: sink.Failure{Cause: fmt.Sprintf(
			"the API still says the batch is %s %v after it was created (%s), when it should have expired: counted as an attempt",
			cmp.Or(op.State, "unknown"), now.Sub(created).Round(time.Minute), created.Format(time.RFC3339))}}
	case errors.Is(err, poller.ErrNotFound):
		log.Warn("dispatch: the API does not know this batch; the key is dead as unknown to the API", "err", err)
		return ev, &verdict{failure: sink.Failure{Permanent: true, DeadReason: sink.DeadUnknownToAPI,
			Cause: "unknown to the API: " + err.Error()}}
	case errors.Is(err, poller.ErrInvalidName):
		if c.NeedsConfirm {
			log.Warn("dispatch: the API cannot fetch this name, and a key seen only through a dynamic signature never runs unconfirmed; the key is dead as unknown to the API", "err", err)
			return ev, &verdict{failure: sink.Failure{Permanent: true, DeadReason: sink.DeadUnknownToAPI,
				Cause: "unknown to the API: cannot be confirmed (" + err.Error() + "), and a key seen only through a dynamic signature never runs unconfirmed"}}
		}
		log.Debug("dispatch: Batches.Get cannot fetch this name; the effect runs unconfirmed", "err", err)
		return ev, nil
	case errors.As(err, &te):
		log.Warn("dispatch: the API did not answer; the key is rechecked later without using an attempt", "err", err)
		return ev, recheck("not confirmed yet: "+err.Error(), te.RetryAfter)
	case errors.Is(err, poller.ErrAuth):
		log.Error("dispatch: the API refused the credential while confirming; the key is rechecked later without using an attempt", "err", err)
		v := recheck("not confirmed: "+err.Error(), 0)
		v.outcome = OutcomeRetry // counted as a failure in the summary: someone must fix the credential
		return ev, v
	}
	return ev, &verdict{failure: sink.Failure{Cause: "confirming with the API: " + err.Error()}}
}

// recheckDelay is how long a key that the API has not confirmed waits for
// its next check: a quarter of the time since it was first seen, within
// [RecheckBase, RecheckMax], jittered to between half and all of that. A
// key seen a minute ago is rechecked within seconds; one seen a day ago
// about hourly: a batch that takes 24 h costs a few dozen requests, not
// thousands.
func (d *Dispatcher) recheckDelay(since time.Duration) time.Duration {
	ceiling := min(max(since/4, d.cfg.RecheckBase), d.cfg.RecheckMax)
	return ceiling/2 + time.Duration(d.cfg.Rand()*float64(ceiling/2))
}

// writeResults writes a confirmed SUCCEEDED Gemini API batch's results to
// the results directory (spec §9.5) and sets ev.ResultsFile.
func (d *Dispatcher) writeResults(ctx context.Context, log *slog.Logger, c sink.Claim, ev *effect.Event) *verdict {
	id, ok := strings.CutPrefix(ev.Name, "batches/")
	if !ok || !ev.Confirmed || ev.BatchState != "SUCCEEDED" {
		return nil
	}
	r, err := poller.ResultsOf(poller.Operation{Name: ev.Name, Raw: ev.Operation})
	if err != nil {
		return &verdict{failure: sink.Failure{Cause: "results: " + err.Error()}}
	}
	var fetch results.Fetch
	switch {
	case r.File != "":
		fetch = func(ctx context.Context, w io.Writer) error {
			lw := &lineWriter{w: w}
			_, err := d.cfg.API.Download(ctx, r.File, lw)
			if errors.Is(err, poller.ErrSizeUnknown) {
				// Nothing told the end of the file from a dropped
				// connection: it is whole only if it holds a line per
				// request and ends in a newline.
				if r.Requests > 0 && lw.lines == r.Requests && lw.last == '\n' {
					return nil
				}
				return fmt.Errorf("%w; it holds %d complete lines (ending in %q) and the batch counted %d requests: taken as cut short", err, lw.lines, lw.last, r.Requests)
			}
			return err
		}
	case r.HasInlined:
		fetch = results.Lines(r.Inlined)
	default:
		return nil // the batch names no results
	}
	dctx, cancel := context.WithTimeout(ctx, d.cfg.DownloadTimeout)
	defer cancel()
	start := d.cfg.Now()
	w, err := d.cfg.Results.Write(dctx, id, c.Token, fetch)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return &verdict{failure: sink.Failure{Cause: "results: " + err.Error()}, fenced: errors.Is(context.Cause(ctx), sink.ErrFenced)}
		}
		if dctx.Err() != nil {
			err = fmt.Errorf("%w (--download-timeout %v)", err, d.cfg.DownloadTimeout)
		}
		if errors.Is(err, poller.ErrNotFound) && !r.EndTime.IsZero() && d.cfg.Now().Sub(r.EndTime) > sink.ResultsKept {
			log.Warn("dispatch: the batch's results expired; the key is dead", "ended", r.EndTime, "err", err)
			return &verdict{failure: sink.Failure{Permanent: true, DeadReason: sink.DeadResultsExpired, Cause: fmt.Sprintf(
				"results expired: the batch ended %s, more than %v ago, and the API no longer has its results (%v)",
				r.EndTime.UTC().Format(time.RFC3339), sink.ResultsKept, err)}}
		}
		log.Warn("dispatch: writing the batch's results failed; the attempt fails and is retried", "err", err)
		return &verdict{failure: sink.Failure{Cause: "results: " + err.Error()}}
	}
	if w.Fetched {
		log.Info("dispatch: results written", "file", w.Path, "bytes", w.Size, "duration", d.cfg.Now().Sub(start))
	}
	ev.ResultsFile = w.Path
	if c.ResultsFile != w.Path {
		wctx, cancel := writeContext(ctx)
		err := d.cfg.Sink.NoteResults(wctx, c.Key, c.Token, w.Path)
		cancel()
		switch {
		case errors.Is(err, sink.ErrFenced):
			log.Error("dispatch: FENCED: the key was taken over while its results were written; nothing runs", "err", err)
			return &verdict{fenced: true}
		case err != nil:
			// Only status shows it: the effect still gets the path.
			log.Warn("dispatch: recording where the results are failed", "err", err)
		}
	}
	return nil
}

// lineWriter counts the newlines written through it and keeps the last
// byte: what tells a responses file cut short when nothing else can.
type lineWriter struct {
	w     io.Writer
	lines int64
	last  byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	l.lines += int64(bytes.Count(p[:n], []byte{'\n'}))
	if n > 0 {
		l.last = p[n-1]
	}
	return n, err
}

// prepareUnderLease runs prepare while the claim's lease is renewed every
// Lease/3 (a confirmation may wait on the API's retries, a download may take
// longer than the lease: --download-timeout is not bounded by it). A fenced
// renewal stops the preparation: someone took the key over. Before the
// effect runs its lease must be fresh: when the last claim or renewal is
// Lease/3 old or more (renewals failed meanwhile), it is renewed once more,
// and the attempt is handed back, using none of its budget, if that fails —
// an effect never starts on a lease that may already have run out.
func (a *attempt) prepareUnderLease(ev effect.Event, confirmWait time.Duration) (effect.Event, *verdict) {
	pctx, cancel := context.WithCancelCause(a.runCtx)
	defer cancel(nil)
	stopRenewing := a.keepRenewed(func() { cancel(sink.ErrFenced) })
	ev, v := a.d.prepare(pctx, a.log, a.c, ev, confirmWait)
	stopRenewing()
	if errors.Is(context.Cause(pctx), sink.ErrFenced) {
		a.log.Error("dispatch: FENCED: the key was taken over before its effect started; nothing runs")
		return ev, &verdict{fenced: true}
	}
	if v != nil || !a.stale() {
		return ev, v
	}
	switch err := a.renew(writeTimeout); {
	case errors.Is(err, sink.ErrFenced):
		return ev, &verdict{fenced: true}
	case err != nil:
		return ev, &verdict{failure: sink.Failure{NoAttempt: true, Cause: "could not renew the lease before the effect: " + err.Error()}}
	}
	return ev, nil
}
