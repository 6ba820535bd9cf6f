// Package reconcile is the reconciliation pass loop of spec §5 that
// `gemrecon poll` (once, or --watch), `serve --poll-every` and the demo
// share: the scope's pass lease → list → record each terminal operation
// (through ingest.Listed, spec §9.1) → drain → the scope's pass record
// (spec §5.5), including when a pass must read every page, and when it must
// not list at all because another replica holds the lease or listed less
// than an interval ago (lease.go); and the pass's summary line and
// textfile (summary.go).
//
// Commands only wire flags to it.
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/ctxsleep"
	"github.com/gemrecon/gemrecon/internal/field"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
)

// DefaultFullScanEvery is the default of --full-scan-every (spec §5.2).
const DefaultFullScanEvery = 12 * time.Hour

// recordTimeout bounds the pass record's write and read at the end of a
// pass, which run even when the pass's context was cancelled (a pass cut
// short by SIGTERM is still a pass that happened).
const recordTimeout = 10 * time.Second

// ValidateFullScanEvery checks PollConfig.FullScanEvery against the
// poller's Lookback (spec §5.2): a completion must still be inside the
// window when the next full scan comes, so every must be shorter than
// lookback − dispatch.BatchExpiry. Lookback 0 reads every page on every
// pass, so any every is fine. every 0 makes every pass a full scan. Errors are
// field.Errors naming FullScanEvery and Lookback.
func ValidateFullScanEvery(lookback, every time.Duration) error {
	const p = "reconcile: "
	switch {
	case every < 0:
		return field.Errorf(p, "{FullScanEvery} %v is negative (0 makes every pass a full scan)", every)
	case lookback == 0:
		return nil
	case lookback <= dispatch.BatchExpiry:
		return field.Errorf(p, "{Lookback} %v is not longer than the %v a batch may run: a completion could be outside the window before any pass sees it; use a lookback over %v (the default is 72h) or 0 (read every page)", lookback, dispatch.BatchExpiry, dispatch.BatchExpiry)
	case every >= lookback-dispatch.BatchExpiry:
		return field.Errorf(p, "{FullScanEvery} %v must be shorter than {the lookback|Lookback} − 48h (%v), so that a completion is still inside the window when the next full scan comes; lower {FullScanEvery} or raise {the lookback|Lookback}", every, lookback-dispatch.BatchExpiry)
	}
	return nil
}

// MinPassLease is the shortest pass lease: it is renewed every third of
// it, each renewal a database write.
const MinPassLease = time.Second

// Validate checks the settings (spec §5.5) as they will run: a PassLease of
// at least MinPassLease, MinInterval only for a single pass (Interval 0:
// Watch's passes keep the fleet's interval already), Force only for a
// single pass without MinInterval. It does not look at Sink, Poller and
// Dispatcher, so that a command can check its flags before it opens
// anything; FullScanEvery against the poller's lookback is
// ValidateFullScanEvery's. NewPoll fills defaults and checks only what it
// cannot run with (tests use pass leases shorter than MinPassLease).
// Errors are field.Errors.
func (c PollConfig) Validate() error {
	const p = "reconcile: "
	switch {
	case c.Interval < 0:
		return field.Errorf(p, "{Interval} must not be negative")
	case c.PassLease < MinPassLease:
		return field.Errorf(p, "{PassLease} %v: want at least %v (it is renewed every third of it)", c.PassLease, MinPassLease)
	case c.Interval > 0 && c.MinInterval > 0:
		return field.Errorf(p, "{MinInterval} is for single passes: a pass every {Interval} already skips its listing when one of the scope started less than 0.9 × that ago")
	case c.Force && c.Interval > 0:
		return field.Errorf(p, "{Force} is for one pass: with an {Interval} every pass would ignore the other processes' pass lease")
	case c.Force && c.MinInterval > 0:
		return field.Errorf(p, "{Force} lists regardless of {MinInterval}: give one or the other")
	}
	return nil
}

// PollSink is what a poll pass needs of the sink: Record, the pass records
// and pass lease of spec §5.5, and NoteLookback (the purge guard's record).
type PollSink interface {
	ingest.Recorder
	sink.Passes
	NoteLookback(ctx context.Context, lookback time.Duration) error
}

// PollConfig configures a Poll.
type PollConfig struct {
	// Sink records the sightings and the scope's pass records (required).
	Sink PollSink
	// Poller lists the API (required).
	Poller *poller.Poller
	// Dispatcher runs every due key after the listing (required).
	Dispatcher *dispatch.Dispatcher
	// Metrics counts sightings (gemrecon_deliveries_total{source="poll"})
	// and passes (gemrecon_poll_passes_total); nil counts nothing.
	Metrics *metrics.Metrics
	// FullScanEvery: a pass reads every page when the scope's last full
	// scan is this old, less Interval, so that one pass per FullScanEvery
	// reads every page (spec §5.2). 0 makes every pass a full scan. Check
	// it with ValidateFullScanEvery.
	FullScanEvery time.Duration
	// Interval is the time between the starts of Watch's passes; 0 for a
	// single pass (cron), whose next pass comes at a time unknown here.
	Interval time.Duration
	// MinInterval is the fleet's interval (spec §5.5): a pass skips its
	// listing when a pass of the scope, by any process, started less than
	// MinInterval − MinInterval/10 ago (fleetGap). 0 means Interval: Watch's
	// passes keep the fleet's interval; a single pass (cron) with neither
	// skips only while another process holds the lease, as does any pass
	// when MinInterval is negative.
	MinInterval time.Duration
	// PassLease is how long the scope's pass lease is held without renewal
	// (default DefaultPassLease); RenewEvery how often it is renewed while
	// the pass runs (default PassLease/3; each renewal bounded by it).
	PassLease, RenewEvery time.Duration
	// Force lists without the pass lease and whatever the interval (poll
	// --force): the pass is recorded (EndPass with token 0) but leaves the
	// lease alone.
	Force bool
	// Owner names this process in the pass records and holds the pass lease
	// (default: the dispatcher's owner). It must be unique per process.
	Owner string
	// Logger receives the pass's logs (default: discard).
	Logger *slog.Logger
	// Now is the clock of the pass records and the full-scan schedule
	// (default time.Now). Give the poller the same clock in tests.
	Now func() time.Time

	// renewTicks, when set (tests), replaces the ticker every RenewEvery that
	// times the pass lease's renewals.
	renewTicks <-chan time.Time
}

// Poll runs reconciliation passes over one scope.
type Poll struct {
	cfg   PollConfig
	scope string
}

// NewPoll checks cfg and returns a Poll.
func NewPoll(cfg PollConfig) (*Poll, error) {
	if cfg.Sink == nil || cfg.Poller == nil || cfg.Dispatcher == nil {
		return nil, errors.New("reconcile: a poll needs a sink, a poller and a dispatcher")
	}
	if cfg.FullScanEvery < 0 || cfg.Interval < 0 || cfg.PassLease < 0 || cfg.RenewEvery < 0 {
		return nil, errors.New("reconcile: negative full-scan interval, pass interval, pass lease or renewal period")
	}
	cfg.PassLease = cmp.Or(cfg.PassLease, DefaultPassLease)
	cfg.RenewEvery = cmp.Or(cfg.RenewEvery, cfg.PassLease/3)
	if cfg.RenewEvery <= 0 || cfg.RenewEvery >= cfg.PassLease {
		return nil, fmt.Errorf("reconcile: the pass lease %v must be renewed more often than it lasts (every %v)", cfg.PassLease, cfg.RenewEvery)
	}
	cfg.MinInterval = cmp.Or(cfg.MinInterval, cfg.Interval)
	cfg.Owner = cmp.Or(cfg.Owner, cfg.Dispatcher.Owner())
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Poll{cfg: cfg, scope: cfg.Poller.Scope()}
	cfg.Metrics.DeclarePassScope(p.scope)
	return p, nil
}

// Result is what one pass did.
type Result struct {
	Scope      string
	Start, End time.Time
	// List is the poller's account of the listing (zero if it did not run).
	List poller.PassStats
	// Skip says why the pass did not list (another process holds the pass
	// lease, or listed less than the fleet's interval ago); its Reason is ""
	// for a pass that listed. A skipped pass still drains.
	Skip Skip
	// Forced: the pass listed without the pass lease (PollConfig.Force).
	Forced bool
	// FullScanAsked: the schedule asked this pass to read every page.
	FullScanAsked bool
	// New, Duplicates and Invalid split the terminal operations handed over:
	// recorded for the first time, already known, or refused as keys (§12).
	New, Duplicates, Invalid int
	// Effects is what the drain after the listing ran.
	Effects dispatch.Summary
	// ListErr ends the listing (credentials, the API after retries, the
	// database refusing a Record or the pass lease, the lease lost:
	// ErrPassLost); DrainErr the drain; RecordErr the pass record. Each is
	// fatal (exit 1).
	ListErr, DrainErr, RecordErr error
	// Unfinished counts the listed batches that had not finished, by state,
	// and OldestUnfinished is the creation of the oldest (spec §5.5).
	Unfinished       map[string]int64
	OldestUnfinished time.Time
	// Record is the scope's pass record read after this pass was recorded
	// (for the textfile); RecordKnown is false when it could not be read.
	Record      sink.PassRecord
	RecordKnown bool
}

// Err returns the pass's fatal error, if any.
func (r Result) Err() error {
	return errors.Join(r.ListErr, r.DrainErr, r.RecordErr)
}

// EffectsFailed reports whether some effect of the drain failed (a retry
// scheduled or the key dead) or an outcome was fenced: exit 4 (spec §5).
func (r Result) EffectsFailed() bool {
	return r.Effects.Failed > 0 || r.Effects.Dead > 0 || r.Effects.Fenced > 0
}

// Success reports exit status 0: the pass listed fully (or skipped its
// listing because another process holds the lease or listed recently),
// recorded its pass, and every effect it ran succeeded.
func (r Result) Success() bool { return r.Err() == nil && !r.EffectsFailed() }

// Skipped reports whether the pass skipped its listing.
func (r Result) Skipped() bool { return r.Skip.Reason != "" }

// FullScan reports whether the pass read every page to the end.
func (r Result) FullScan() bool { return r.ListErr == nil && r.List.FullScan }

// Duration is the pass's wall time by the Poll's clock.
func (r Result) Duration() time.Duration { return r.End.Sub(r.Start) }

// Pass runs one reconciliation pass: it takes the scope's pass lease (or
// skips the listing, see begin), lists (every page when a full scan is
// due), records every terminal operation inside the window with source
// poll, drains every due key, and records the pass for its scope, releasing
// the lease. A listing error still drains what was recorded before it; so
// does a skipped listing.
func (p *Poll) Pass(ctx context.Context) Result {
	r := Result{Scope: p.scope, Start: p.cfg.Now()}
	l, rec, err := p.begin(ctx, &r)
	if err != nil {
		r.ListErr = err
		r.End = p.cfg.Now()
		p.cfg.Metrics.ObservePass(p.scope, metrics.PassError)
		return r
	}
	var held *lease
	if !r.Skipped() {
		listCtx := ctx
		if l.Token != 0 {
			held, listCtx = p.hold(ctx, l, r.Start)
		}
		p.list(ctx, listCtx, rec, &r)
	}
	if ctx.Err() == nil {
		r.Effects, r.DrainErr = p.cfg.Dispatcher.Drain(ctx)
	}
	r.End = p.cfg.Now()
	if !r.Skipped() {
		var lost error
		if held != nil {
			l, lost = held.stop()
		}
		p.end(ctx, l, lost, &r)
	}
	p.observe(&r)
	return r
}

// begin starts a pass: it notes the lookback (purge's guard), reads the
// scope's pass record and takes the scope's pass lease (spec §5.5) — unless
// another process holds it, or a pass of the scope started less than the
// fleet's gap ago (fleetGap), in which case r.Skip says so and the pass
// lists nothing. With Force it takes no lease (token 0).
func (p *Poll) begin(ctx context.Context, r *Result) (sink.PassLease, sink.PassRecord, error) {
	l := sink.PassLease{Scope: p.scope, Owner: p.cfg.Owner}
	if err := p.cfg.Sink.NoteLookback(ctx, p.cfg.Poller.Lookback()); err != nil {
		return l, sink.PassRecord{}, err
	}
	rec, _, err := p.record(ctx)
	if err != nil {
		return l, rec, err
	}
	if p.cfg.Force {
		r.Forced = true
		return l, rec, nil
	}
	gap := fleetGap(p.cfg.MinInterval, rec)
	got, now, err := p.cfg.Sink.AcquirePass(ctx, p.scope, p.cfg.Owner, p.cfg.PassLease, gap)
	switch {
	case errors.Is(err, sink.ErrPassHeld):
		r.Skip = Skip{Reason: SkipHeld, Holder: now.Holder, Until: now.HeldUntil}
	case errors.Is(err, sink.ErrPassRecent):
		r.Skip = Skip{Reason: SkipRecent, Holder: now.LastHolder,
			Until: now.LastStart.Add(p.cfg.MinInterval - p.cfg.MinInterval/fleetGapShare)}
	case err != nil:
		return l, rec, fmt.Errorf("taking the pass lease: %w", err)
	default:
		return got, now, nil
	}
	r.Record, r.RecordKnown = now, true
	p.cfg.Logger.Debug("skipping the listing", "scope", p.scope, "reason", r.Skip.Reason,
		"holder", r.Skip.Holder, "until", r.Skip.Until)
	return l, now, nil
}

// list runs the listing under listCtx (cancelled when the pass lease is
// lost) and records every terminal operation it hands over.
func (p *Poll) list(ctx, listCtx context.Context, rec sink.PassRecord, r *Result) {
	r.FullScanAsked = p.fullScanDue(rec, r.Start)
	r.Unfinished = map[string]int64{}
	r.List, r.ListErr = p.cfg.Poller.PassWith(listCtx, poller.PassOptions{FullScan: r.FullScanAsked,
		Unfinished: func(op poller.Operation) { p.unfinished(r, rec, op) }},
		func(ops []poller.Operation) error { return p.recordPage(ctx, r, ops) })
	if cause := context.Cause(listCtx); r.ListErr != nil && errors.Is(cause, ErrPassLost) {
		r.ListErr = fmt.Errorf("stopped listing after %d pages: %w", r.List.Pages, cause)
	}
}

// end records the pass's outcome, releasing the lease, and reads the record
// back. A pass whose lease was taken over records nothing: the sink would
// refuse it as fenced, and another process lists now.
func (p *Poll) end(ctx context.Context, l sink.PassLease, lost error, r *Result) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if errors.Is(lost, sink.ErrFenced) {
		p.cfg.Logger.Warn("not recording this poll pass: its pass lease was taken over", "scope", p.scope)
	} else {
		o := sink.PassOutcome{Start: r.Start, End: r.End, Success: r.Success(), FullScan: r.FullScan()}
		if r.ListErr == nil {
			o.Unfinished, o.OldestUnfinished = r.Unfinished, r.OldestUnfinished
		}
		err := p.cfg.Sink.EndPass(ctx, l, o)
		switch {
		case errors.Is(err, sink.ErrFenced):
			// Taken over after the last renewal: the listing, if it was
			// complete, still counts, but not the record.
			p.cfg.Logger.Warn("not recording this poll pass: its pass lease was taken over", "scope", p.scope, "err", err)
		case err != nil:
			r.RecordErr = fmt.Errorf("recording the poll pass: %w", err)
			return
		}
	}
	var err error
	r.Record, r.RecordKnown, err = p.record(ctx)
	if err != nil {
		p.cfg.Logger.Warn("reading the pass record back", "scope", p.scope, "err", err)
	}
}

// observe counts a pass that began in gemrecon_poll_passes_total by what
// it did.
func (p *Poll) observe(r *Result) {
	outcome := metrics.PassListed
	switch {
	case r.Skip.Reason == SkipHeld:
		outcome = metrics.PassSkippedHeld
	case r.Skip.Reason == SkipRecent:
		outcome = metrics.PassSkippedRecent
	case errors.Is(r.ListErr, ErrPassLost):
		outcome = metrics.PassLeaseLost
	case r.Forced:
		outcome = metrics.PassForced
	}
	p.cfg.Metrics.ObservePass(p.scope, outcome)
}

// record returns the scope's pass record (one with only its scope when
// there is none yet), and true unless it could not be read.
func (p *Poll) record(ctx context.Context) (sink.PassRecord, bool, error) {
	recs, err := p.cfg.Sink.PassRecords(ctx)
	if err != nil {
		return sink.PassRecord{}, false, fmt.Errorf("reading the pass records: %w", err)
	}
	for _, rec := range recs {
		if rec.Scope == p.scope {
			return rec, true, nil
		}
	}
	return sink.PassRecord{Scope: p.scope}, true, nil
}

// fullScanDue decides whether the pass starting at now must read every
// page: when FullScanEvery is 0, when the scope never had a full scan, and
// when its last one started FullScanEvery − Interval ago or longer — so that
// with passes every Interval, the gap between full scans stays within
// FullScanEvery (plus one pass's duration). A last full scan stamped in the
// future (another machine's clock ahead of ours) is not trusted.
func (p *Poll) fullScanDue(rec sink.PassRecord, now time.Time) bool {
	last := rec.LastFullScan
	switch {
	case p.cfg.FullScanEvery == 0, p.cfg.Poller.Lookback() == 0, last.IsZero(), last.After(now):
		return true
	}
	return !now.Before(last.Add(p.cfg.FullScanEvery - p.cfg.Interval))
}

// StuckAfter is how long a batch may stay pending or running before each
// pass warns of it (spec §5.5): the API targets a day, and expires a batch
// that has not finished after dispatch.BatchExpiry.
const StuckAfter = 24 * time.Hour

// unfinished counts a listed batch that has not finished, and warns of one
// pending or running for longer than StuckAfter: at most once per hour of
// its age, whichever process lists it, because a pass warns only when an
// hour of that age ended since the scope's previous pass began (rec).
func (p *Poll) unfinished(r *Result, rec sink.PassRecord, op poller.Operation) {
	r.Unfinished[op.State]++
	if op.CreateTime.IsZero() {
		return
	}
	if r.OldestUnfinished.IsZero() || op.CreateTime.Before(r.OldestUnfinished) {
		r.OldestUnfinished = op.CreateTime
	}
	hour := func(at time.Time) int64 { return int64(at.Sub(op.CreateTime.Add(StuckAfter)) / time.Hour) }
	if age := r.Start.Sub(op.CreateTime); age > StuckAfter &&
		(rec.LastStart.IsZero() || rec.LastStart.Before(op.CreateTime.Add(StuckAfter)) || hour(rec.LastStart) < hour(r.Start)) {
		p.cfg.Logger.Warn("a batch has not finished for over a day: the API expires it 48 h after its creation",
			"batch", canon.Quote(op.Name), "state", op.State, "age", age.Round(time.Minute),
			"expires_in", (dispatch.BatchExpiry - age).Round(time.Minute))
	}
}

// recordPage turns the listed terminal operations of one page into
// recorded keys, in one commit, through Listed: each carries its state and
// says it comes from the API (spec §9.2).
func (p *Poll) recordPage(ctx context.Context, r *Result, ops []poller.Operation) error {
	news, dups, invalid, err := ingest.Listed{Sink: p.cfg.Sink, Metrics: p.cfg.Metrics, Logger: p.cfg.Logger}.RecordPage(ctx, ops)
	if err != nil {
		return err
	}
	r.New += news
	r.Duplicates += dups
	r.Invalid += invalid // spec §12: never recorded, never a reason to fail the pass
	return nil
}

// Watch runs passes until ctx ends, each Interval after the previous one
// started (at once when a pass took longer), and hands each Result to each.
// No pass starts once ctx has ended, also when the next pass's time came
// during the one that was running then. It returns ctx's error.
func (p *Poll) Watch(ctx context.Context, each func(Result)) error {
	if p.cfg.Interval <= 0 {
		return errors.New("reconcile: Watch needs a positive Interval")
	}
	for {
		// A select between an ended ctx and a fired timer picks either.
		if err := ctx.Err(); err != nil {
			return err
		}
		started := time.Now()
		each(p.Pass(ctx))
		if err := ctxsleep.Sleep(ctx, time.Until(started.Add(p.cfg.Interval))); err != nil {
			return err
		}
	}
}
