// Package dispatch turns due keys into effect runs: claim → run the effect
// while renewing the lease → complete or fail with the claim's fencing token
// (spec §3, §4). poll, serve and drain all go through it. The rules on a
// dispatcher's settings (one effect, the effect timeout shorter than the
// lease, confirmation and results only with the API) are
// Config.Validate's (config.go), and the --confirm modes are ConfirmMode's.
package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/internal/ctxsleep"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/sink"
)

// Defaults of spec §4 and of the background loop.
const (
	DefaultLease         = 10 * time.Minute
	DefaultEffectTimeout = 5 * time.Minute
	DefaultConcurrency   = 4
	DefaultGrace         = 10 * time.Second
	DefaultInterval      = time.Second
)

// Pauses between tries of an outcome write (done, or a failure) that failed:
// from outcomeRetryFirst, doubling up to outcomeRetryMax.
const (
	outcomeRetryFirst = 50 * time.Millisecond
	outcomeRetryMax   = time.Second
)

// writeTimeout bounds one sink write made on behalf of an attempt. Those
// writes deliberately ignore the caller's cancellation: a claim or an outcome
// cut off mid-commit may still have committed, and an outcome that is not
// written leaves the key claimed until its lease runs out.
const writeTimeout = 30 * time.Second

// Outcome is how one attempt (or one RunKeyWithin) ended.
type Outcome string

// Outcomes.
const (
	// OutcomeDone: the effect succeeded and the key is done.
	OutcomeDone Outcome = "done"
	// OutcomeRetry: the effect failed; the key is pending again with backoff.
	OutcomeRetry Outcome = "retry"
	// OutcomeDead: the effect failed permanently or for the last time.
	OutcomeDead Outcome = "dead"
	// OutcomeFenced: another attempt took the key over; this outcome was
	// discarded.
	OutcomeFenced Outcome = "fenced"
	// OutcomeBusy: another live holder has the key claimed (RunKeyWithin only).
	OutcomeBusy Outcome = "busy"
	// OutcomeSkipped: nothing to run: the key is done, dead, not due yet, or
	// unknown (RunKeyWithin only).
	OutcomeSkipped Outcome = "skipped"
)

// Observer hears about every attempt: *metrics.Metrics is one. Its
// outcome is an Outcome's name, a plain string so that metrics need not
// import dispatch.
type Observer interface {
	// ObserveEffect is called once per attempt with its outcome and the
	// effect's running time.
	ObserveEffect(outcome string, d time.Duration)
}

// Config configures a Dispatcher. Zero fields take the defaults
// (DefaultConfig) in New; Validate checks the settings.
type Config struct {
	// Sink holds the keys (required).
	Sink sink.Sink
	// Effect runs once per attempt (required unless SQL is set).
	Effect effect.Effect
	// SQL, when set, replaces Effect: the sink runs the script and marks
	// the key done in one transaction (the --sql effect; see sql.go). Sink
	// must then be a sink.SQLCompleter.
	SQL *sqlscript.Script
	// Command names what claims (poll, serve, drain) in the keys' history.
	Command string
	// Lease is how long a claim holds before another process may take it
	// over (default 10m); it is renewed every Lease/3 while the effect runs.
	Lease time.Duration
	// EffectTimeout bounds one effect run (default 5m); it must be shorter
	// than Lease, or an effect could outlive its claim and run twice.
	EffectTimeout time.Duration
	// Concurrency is how many effects run at once (default 4).
	Concurrency int
	// Grace is how long running effects may still finish after the context
	// of Drain or Run is cancelled (default 10s; negative: none). Then — or
	// at once after EndGrace — they are cancelled (an exec's process group
	// is killed) and recorded as retryable failures.
	Grace time.Duration
	// Interval is how often Run drains without a Kick (default 1s).
	Interval time.Duration
	// Logger receives the dispatcher's logs (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock for durations, for a Retry-After's earliest next
	// attempt and for how long a lease is safely held (default time.Now,
	// whose monotonic reading makes wall-clock jumps harmless); give it the
	// sink's clock in tests.
	Now func() time.Time
	// Sleep pauses between the tries of an outcome write that failed
	// (default: a timer). It returns early, with ctx's error, when ctx is
	// done. Tests give it the clock of Now.
	Sleep func(ctx context.Context, d time.Duration) error
	// Observer, when set, hears every attempt's outcome.
	Observer Observer

	// Confirm: unconfirmed keys (first seen by webhook) are fetched with
	// API.Get before their effect runs (spec §9.2; confirm.go). False: they
	// run on what is stored ("confirmed": false), and keys that need
	// confirmation are never claimed. Needs API.
	Confirm bool
	// API fetches batches (Confirm) and downloads results (Results): the
	// process's one poller, so that list, get and downloads share one rate
	// limiter.
	API API
	// RecheckBase and RecheckMax bound recheckDelay (defaults
	// DefaultRecheckBase, DefaultRecheckMax).
	RecheckBase, RecheckMax time.Duration
	// Results, when set, is the results directory (--results-dir, spec
	// §9.5); needs API. DownloadTimeout bounds one download (default
	// DefaultDownloadTimeout); the lease is renewed while it runs.
	Results         *results.Dir
	DownloadTimeout time.Duration
	// Rand returns a uniform float64 in [0,1) for the jitter of rechecks
	// (default math/rand/v2).
	Rand func() float64
}

// Summary counts what one Drain did. Its JSON field names are those of
// drain's summary line (DrainLine).
type Summary struct {
	Claimed int `json:"claimed"` // attempts started
	OK      int `json:"ok"`      // attempts that completed the key
	Failed  int `json:"failed"`  // attempts that failed with a retry scheduled
	Dead    int `json:"dead"`    // attempts that sent the key to dead
	Fenced  int `json:"fenced"`  // attempts whose outcome was discarded (another took over)
	// Unconfirmed counts claims handed back without using an attempt
	// because the API has not confirmed the key yet (not terminal, or no
	// answer): not a failure.
	Unconfirmed int `json:"unconfirmed"`
	// HandedBack counts claims granted ahead and handed back before their
	// effect started (shutdown, or an effect that broke), without using an
	// attempt: not a failure, the key is due again at once.
	HandedBack int `json:"handed_back"`
}

func (s *Summary) add(o Outcome) {
	switch o {
	case OutcomeDone:
		s.OK++
	case OutcomeRetry:
		s.Failed++
	case OutcomeDead:
		s.Dead++
	case OutcomeFenced:
		s.Fenced++
	case OutcomeUnconfirmed:
		s.Unconfirmed++
	}
}

// Dispatcher claims due keys and runs the effect for them. Its methods are
// safe for concurrent use.
type Dispatcher struct {
	cfg   Config
	owner string // names this holder in leases (DefaultOwner)
	log   *slog.Logger
	kick  chan struct{}
	// completer, when set, is the sink that runs Config.SQL and completes
	// the claim in one transaction: it replaces Effect and Complete (sql.go).
	completer sink.SQLCompleter

	// broken is the first effect.Broken error an attempt returned. Once
	// set, nothing more is claimed.
	broken atomic.Pointer[error]

	// outcomeMu orders a Drain's batch claims against failures: a batch
	// claim holds it exclusively, every Fail shares it. So a batch claim
	// never races a Fail that makes a key run in this Drain due again (see
	// drainState.redue). Completions do not take it: they share the sink's
	// group commits with the batch claims.
	outcomeMu sync.RWMutex

	// hurry is done once EndGrace was called: a shutdown's grace is over.
	hurry    context.Context
	endGrace context.CancelFunc

	// slots holds a token for every effect running, or claim granted and
	// waiting for its effect: Concurrency in all, shared by Drain and the
	// claims made where keys are recorded (TakeSlot). freed is signalled
	// whenever one is given back.
	slots chan struct{}
	freed chan struct{}
	// live is the session of Run, where TakeSlot's claims run; nil
	// while Run is not running.
	live atomic.Pointer[session]
}

// New fills cfg's zero fields with their defaults, checks it (Validate, and
// that Sink is given and runs SQL when SQL is set) and returns a
// Dispatcher. A negative field is an error (a negative Grace: none).
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Sink == nil {
		return nil, errors.New("dispatch: no sink")
	}
	if cfg.Concurrency < 0 || min(cfg.Lease, cfg.EffectTimeout, cfg.Interval,
		cfg.DownloadTimeout, cfg.RecheckBase, cfg.RecheckMax) < 0 {
		return nil, errors.New("dispatch: lease, effect timeout, concurrency, interval, download timeout and recheck delays must not be negative")
	}
	def := DefaultConfig()
	cfg.Lease = cmp.Or(cfg.Lease, def.Lease)
	cfg.EffectTimeout = cmp.Or(cfg.EffectTimeout, def.EffectTimeout)
	cfg.Grace = cmp.Or(cfg.Grace, def.Grace)
	cfg.Interval = cmp.Or(cfg.Interval, def.Interval)
	cfg.DownloadTimeout = cmp.Or(cfg.DownloadTimeout, def.DownloadTimeout)
	cfg.RecheckBase = cmp.Or(cfg.RecheckBase, def.RecheckBase)
	cfg.RecheckMax = cmp.Or(cfg.RecheckMax, def.RecheckMax)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, def.Concurrency)
	cfg.RecheckMax = max(cfg.RecheckMax, cfg.RecheckBase)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The sink must run the script in its own transaction (that Effect is
	// not set too is Validate's).
	var completer sink.SQLCompleter
	if cfg.SQL != nil {
		var ok bool
		if completer, ok = cfg.Sink.(sink.SQLCompleter); !ok {
			return nil, fmt.Errorf("dispatch: an SQL script needs a sink that runs SQL in its own transaction (sink.SQLCompleter); %T does not", cfg.Sink)
		}
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = ctxsleep.Sleep
	}
	if cfg.Rand == nil {
		cfg.Rand = mrand.Float64
	}
	hurry, endGrace := context.WithCancel(context.Background())
	return &Dispatcher{cfg: cfg, owner: DefaultOwner(), log: cfg.Logger, kick: make(chan struct{}, 1), completer: completer,
		slots: make(chan struct{}, cfg.Concurrency), freed: make(chan struct{}, 1),
		hurry: hurry, endGrace: endGrace}, nil
}

// DefaultOwner names this process in leases: hostname:pid:random, unique
// even when a pid is reused.
func DefaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + ":" + strconv.Itoa(os.Getpid()) + ":" + hex.EncodeToString(b[:])
}

// ErrEffectBroken is wrapped by the errors of Drain, Run and RunKeyWithin once an
// attempt's effect said it cannot run in this process any more
// (effect.Broken: the NDJSON stdout went away or stalled). From then on the
// Dispatcher claims nothing; the keys it held are pending again, without an
// attempt used up. The command should exit.
var ErrEffectBroken = errors.New("the effect cannot run in this process any more")

// markBroken notes the first effect.Broken error.
func (d *Dispatcher) markBroken(err error) {
	if d.broken.CompareAndSwap(nil, &err) {
		d.log.Error("dispatch: the effect cannot run any more; claiming stops, and the keys held are handed back without using an attempt", "err", err)
	}
}

// brokenErr returns an error wrapping ErrEffectBroken and its cause once
// the effect broke, else nil.
func (d *Dispatcher) brokenErr() error {
	broken := d.broken.Load()
	if broken == nil {
		return nil
	}
	// The cause as text only: its chain may hold a context error (a
	// stall), which callers must not take for their own cancellation.
	return fmt.Errorf("dispatch: stopped claiming: %w: %v (the keys it held are pending again; no attempt was used)", ErrEffectBroken, *broken)
}

// Owner returns the owner name this Dispatcher claims with.
func (d *Dispatcher) Owner() string { return d.owner }

// Grace returns how long running effects may still finish once Run's
// context is done (0: none).
func (d *Dispatcher) Grace() time.Duration { return max(d.cfg.Grace, 0) }

// Kick asks Run to drain now. It never blocks.
func (d *Dispatcher) Kick() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Run drains whenever Kick is called and every Interval until ctx is done,
// then lets running effects finish within Grace. It returns ctx's error,
// wrapped, or, once the effect broke, an error wrapping ErrEffectBroken.
func (d *Dispatcher) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	runCtx, release := d.graceContext(ctx)
	s := &session{d: d, ctx: ctx, runCtx: runCtx, release: release}
	d.live.Store(s)
	defer func() {
		d.live.Store(nil)
		s.wg.Wait() // the grace applies once ctx is done
		s.release()
	}()
	failures := 0
	for {
		sum, err := d.Drain(ctx)
		if berr := d.brokenErr(); berr != nil {
			return berr
		}
		if ctx.Err() != nil {
			return fmt.Errorf("dispatch: stopped: %w", ctx.Err())
		}
		if err != nil {
			failures++
			// One line per failure streak step, not per tick: a database
			// that is down would otherwise flood the log.
			if failures&(failures-1) == 0 {
				d.log.Error("dispatch: drain failed", "err", err, "consecutive", failures)
			}
		} else if failures > 0 {
			d.log.Info("dispatch: drain recovered", "after_failures", failures)
			failures = 0
		}
		if sum.Claimed > 0 {
			d.log.Debug("dispatch: drained", "claimed", sum.Claimed, "ok", sum.OK, "failed", sum.Failed, "dead", sum.Dead, "fenced", sum.Fenced)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("dispatch: stopped: %w", ctx.Err())
		case <-d.kick:
		case <-t.C:
		}
	}
}

// errShutdown is the cause given to effects cancelled after Grace.
var errShutdown = errors.New("interrupted by shutdown")

// EndGrace ends the grace of a shutdown now (the CLI's second SIGINT or
// SIGTERM): the effects of every Drain, Run and RunKeyWithin whose context is
// done are cancelled at once, exactly as when Grace runs out — an exec's
// process group is killed, the attempt is recorded as a retryable failure
// (the outcome write is still made, bounded as after Grace), a claim not
// yet started is handed back — and a context done later gets no grace.
// Effects whose context is not done run on: EndGrace shortens a shutdown,
// it starts none. The calls then return as after Grace. Safe to call from
// any goroutine, any number of times.
func (d *Dispatcher) EndGrace() { d.endGrace() }

// GraceEnded is closed once EndGrace was called.
func (d *Dispatcher) GraceEnded() <-chan struct{} { return d.hurry.Done() }

// graceContext returns a context for effects that is cancelled (cause
// errShutdown) Grace after ctx is done — at once after EndGrace —, and a
// release function.
func (d *Dispatcher) graceContext(ctx context.Context) (context.Context, func()) {
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	go func() {
		select {
		case <-ctx.Done():
		case <-runCtx.Done(): // released
			return
		}
		if d.cfg.Grace >= 0 {
			t := time.NewTimer(d.cfg.Grace)
			defer t.Stop()
			select {
			case <-t.C:
			case <-d.hurry.Done():
			case <-runCtx.Done():
				return
			}
		}
		cancel(errShutdown)
	}()
	return runCtx, func() { cancel(nil) }
}

// writeContext is for sink writes on behalf of an attempt: not cancelled
// with ctx (see writeTimeout).
func writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

// RunKeyWithin claims key and runs its effect now (serve --sync). It
// returns OutcomeBusy when another live holder has the key, and
// OutcomeSkipped when the key is done, dead, not due or unknown,
// OutcomeUnconfirmed when the API has not confirmed it yet (it was handed
// back). ctx bounds the effect as the context of Drain does (Grace applies).
// confirmWait bounds the confirmation, if the key needs one (serve --sync:
// --sync-wait; 0: DefaultConfirmTimeout).
func (d *Dispatcher) RunKeyWithin(ctx context.Context, key string, confirmWait time.Duration) (Outcome, error) {
	if err := ctx.Err(); err != nil {
		return OutcomeSkipped, fmt.Errorf("dispatch: %s: %w", key, err)
	}
	if err := d.brokenErr(); err != nil {
		return OutcomeSkipped, err
	}
	asked := d.cfg.Now() // the lease cannot have started earlier
	wctx, cancel := writeContext(ctx)
	c, err := d.cfg.Sink.Claim(wctx, key, d.owner, d.cfg.Lease, d.claimOpts())
	cancel()
	switch {
	case errors.Is(err, sink.ErrNotFound):
		return OutcomeSkipped, nil
	case errors.Is(err, sink.ErrNotClaimable):
		e, gerr := d.cfg.Sink.Get(ctx, key)
		if gerr != nil {
			return OutcomeSkipped, fmt.Errorf("dispatch: %s: %w", key, gerr)
		}
		if e.State == sink.StateClaimed {
			return OutcomeBusy, nil
		}
		return OutcomeSkipped, nil
	case err != nil:
		return OutcomeSkipped, fmt.Errorf("dispatch: claim %s: %w", key, err)
	}
	runCtx, release := d.graceContext(ctx)
	defer release()
	return d.newAttempt(ctx, runCtx, c, asked).run(nil, confirmWait)
}

// OutcomeMargin is how long before the end of a lease its holder stops
// trying to record the attempt's outcome: max(lease/10, 5s). The lease ends
// Lease after the last successful claim or renewal (measured from just
// before it was asked for); the margin covers the last write's own duration
// and a drift between this process's clock and the clock that judges the
// lease (the database's, or another process's).
func OutcomeMargin(lease time.Duration) time.Duration { return max(lease/10, 5*time.Second) }

// attempt carries one granted claim, and its fencing token, from its
// preparation and effect to the write of its outcome. ctx is the caller's
// (values only: writes outlive its cancellation); runCtx bounds the effect
// and, once done, the retries of the outcome write.
type attempt struct {
	d           *Dispatcher
	ctx, runCtx context.Context
	log         *slog.Logger
	c           sink.Claim

	// leaseAt is when the claim's lease was last granted or renewed, by
	// Config.Now read just before the request was sent. The lease cannot
	// have started earlier, so the holder may count on it until leaseAt +
	// Lease. Only one goroutine renews at a time (keepRenewed's, until it
	// is stopped), so it needs no lock.
	leaseAt time.Time
}

// newAttempt starts an attempt of c, whose claim (or last renewal) was
// asked for at leaseFrom, by Config.Now.
func (d *Dispatcher) newAttempt(ctx, runCtx context.Context, c sink.Claim, leaseFrom time.Time) *attempt {
	log := d.log.With("key", c.Key, "token", c.Token, "attempt", c.Attempt)
	return &attempt{d: d, ctx: ctx, runCtx: runCtx, log: log, c: c, leaseAt: leaseFrom}
}

// stale reports whether the lease was last granted or renewed Lease/3 ago
// or more.
func (a *attempt) stale() bool { return a.d.cfg.Now().Sub(a.leaseAt) >= a.d.cfg.Lease/3 }

// renew renews the lease once, the request bounded by timeout, and notes a
// success.
func (a *attempt) renew(timeout time.Duration) error {
	asked := a.d.cfg.Now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), timeout)
	defer cancel()
	err := a.d.cfg.Sink.Renew(ctx, a.c.Key, a.c.Token, a.d.cfg.Lease)
	if err == nil && asked.After(a.leaseAt) {
		a.leaseAt = asked
	}
	return err
}

// keepRenewed renews the lease every Lease/3 (each renewal bounded by
// Lease/3) until the function it returns is called, which waits for the
// renewals to end. A fenced renewal means someone took the key over: it
// calls fenced and renews no more.
func (a *attempt) keepRenewed(fenced func()) (stop func()) {
	stopc, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(a.d.cfg.Lease/3, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-stopc:
				return
			case <-t.C:
			}
			switch err := a.renew(a.d.cfg.Lease / 3); {
			case errors.Is(err, sink.ErrFenced):
				fenced()
				return
			case err != nil:
				a.log.Warn("dispatch: lease renewal failed; will try again", "err", err)
			}
		}
	}()
	return func() {
		close(stopc)
		<-done
	}
}

// run prepares the claim when it needs it (confirmation, results; a
// confirmation bounded by confirmWait, 0: DefaultConfirmTimeout), runs its effect
// while renewing the lease, and records the outcome with the claim's token.
// mark, when set, sees the outcome while outcomeMu is still held.
func (a *attempt) run(mark func(Outcome), confirmWait time.Duration) (out Outcome, err error) {
	d := a.d
	if a.c.Takeover {
		a.log.Warn("dispatch: took over a claim whose lease expired")
	}
	start := d.cfg.Now()
	ev := eventFor(a.c)
	var v *verdict
	// Work before the effect: a confirmation, results to write.
	if !a.c.Confirmed && (d.cfg.Confirm || a.c.NeedsConfirm) || d.cfg.Results != nil && !a.c.NoResults {
		ev, v = a.prepareUnderLease(ev, confirmWait)
	}
	ran := v == nil
	var elapsed time.Duration // the effect's running time; else the preparation's
	if ran {
		v, elapsed = a.effect(ev)
	} else {
		elapsed = d.cfg.Now().Sub(start)
	}
	defer func() {
		if d.cfg.Observer != nil {
			if !ran {
				elapsed = d.cfg.Now().Sub(start)
			}
			d.cfg.Observer.ObserveEffect(string(out), elapsed)
		}
	}()
	switch {
	case v == nil:
		out, err = a.complete(elapsed)
	case v.fenced:
		out = OutcomeFenced
	case v.outcome == OutcomeDone: // the effect completed the claim itself (sql.go)
		out = OutcomeDone
	default:
		// Only a failure can make this key due again at once (a fenced
		// key is another holder's): hold outcomeMu until mark has noted
		// it, so that no batch claim of this Drain sees it due first.
		d.outcomeMu.RLock()
		defer d.outcomeMu.RUnlock()
		out, err = a.recordFailure(v.failure, v.outcome, elapsed)
	}
	if mark != nil {
		mark(out)
	}
	return out, err
}

// effect runs the effect under EffectTimeout, the lease renewed meanwhile
// (unless it completes its own claim: that renews once, up front; sql.go),
// and returns its verdict — nil: a success to record — and its running
// time. A fenced renewal means someone took the key over: the effect is
// stopped and its outcome discarded.
func (a *attempt) effect(ev effect.Event) (*verdict, time.Duration) {
	d := a.d
	effCtx, cancelTimeout := context.WithTimeoutCause(a.runCtx, d.cfg.EffectTimeout,
		&effectTimeoutError{d: d.cfg.EffectTimeout})
	defer cancelTimeout()
	effCtx, cancelEffect := context.WithCancelCause(effCtx)
	defer cancelEffect(nil)
	var renewFenced bool
	stopRenewing := func() {}
	if d.completer == nil {
		stopRenewing = a.keepRenewed(func() {
			renewFenced = true
			cancelEffect(sink.ErrFenced)
		})
	}
	start := d.cfg.Now()
	runErr := d.runEffect(effCtx, ev)
	elapsed := d.cfg.Now().Sub(start)
	if effect.IsBroken(runErr) {
		d.markBroken(runErr) // before anything else is claimed
	}
	stopRenewing()
	switch {
	case d.completer != nil && runErr == nil:
		a.log.Info("dispatch: effect ok (in the transaction that marked the key done)", "duration", elapsed)
		return &verdict{outcome: OutcomeDone}, elapsed
	case d.completer != nil && errors.Is(runErr, sink.ErrFenced):
		a.log.Error("dispatch: FENCED: the key was taken over before this attempt's transaction committed; nothing of it was written", "err", runErr)
		return &verdict{fenced: true}, elapsed
	case renewFenced:
		// The backend already counted the fenced renewal; writing the
		// outcome would only be fenced (and counted) again.
		a.log.Error("dispatch: FENCED: another attempt took this key over while its effect ran; this attempt's outcome is discarded", "effect_err", errString(runErr))
		return &verdict{fenced: true}, elapsed
	case runErr == nil:
		return nil, elapsed
	}
	return &verdict{failure: d.failureOf(effCtx, runErr)}, elapsed
}

// runEffect runs the effect, turning a panic into a retryable error.
func (d *Dispatcher) runEffect(ctx context.Context, ev effect.Event) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("effect panicked: %v", p)
		}
	}()
	if d.completer != nil { // sql.go
		return d.completeClaim(ctx, ev)
	}
	return d.cfg.Effect.Run(ctx, ev)
}

// readBack returns the key's entry when it holds this claim's token and
// landed accepts it, else nil.
func (a *attempt) readBack(landed func(sink.Entry) bool) *sink.Entry {
	ctx, cancel := writeContext(a.ctx)
	defer cancel()
	e, err := a.d.cfg.Sink.Get(ctx, a.c.Key)
	if err == nil && e.Token == a.c.Token && landed(e) {
		return &e
	}
	return nil
}

func isDone(e sink.Entry) bool { return e.State == sink.StateDone }

// record writes an attempt's outcome with write (Complete or Fail, fenced
// on the claim's token); what names it for logs ("done", "a failure"), and
// landed reports whether the key's entry, read back with this claim's
// token, shows the write committed (a try whose answer was lost).
//
// The effect has run, so losing the record would run it again (done) or
// leave the key claimed for the rest of its lease (a failure): a write
// that fails for another reason than fencing
// is tried again, with pauses, for as long as the lease is safely this
// claim's — until the last successful claim or renewal + Lease −
// OutcomeMargin, by Config.Now — and, once runCtx is done (shutdown's grace
// ran out), not again. Meanwhile the lease is renewed every third of it.
// Before each new try the key is read back, since a try that failed in
// transit may have committed. It returns the entry read back when that is
// how success was learnt (else nil), and nil, an error wrapping
// sink.ErrFenced, or the last failure.
func (a *attempt) record(what string, landed func(sink.Entry) bool, write func(context.Context) error) (*sink.Entry, error) {
	d := a.d
	pause := outcomeRetryFirst
	for try := 1; ; try++ {
		wctx, cancel := writeContext(a.ctx)
		err := write(wctx)
		cancel()
		if err == nil {
			return nil, nil
		}
		if errors.Is(err, sink.ErrFenced) && try > 1 {
			if e := a.readBack(landed); e != nil {
				return e, nil // an earlier try had committed
			}
		}
		if errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrUnusable) {
			// Unusable: damaged, deleted or replaced, it will not come back
			// in this process, so trying until the lease runs short only
			// delays the exit (the command ends with exit 1 and says what
			// to do).
			return nil, err
		}
		now := d.cfg.Now()
		deadline := a.leaseAt.Add(d.cfg.Lease - OutcomeMargin(d.cfg.Lease))
		switch {
		case a.runCtx.Err() != nil:
			return nil, fmt.Errorf("%w (tried %d times; shutdown's grace ran out)", err, try)
		case !now.Before(deadline):
			return nil, fmt.Errorf("%w (tried %d times, until the lease ran short)", err, try)
		}
		if try&(try-1) == 0 { // 1, 2, 4, 8…: an outage must not flood the log
			a.log.Warn("dispatch: recording "+what+" failed; trying again while the lease lasts", "err", err, "try", try, "until", deadline)
		}
		_ = d.cfg.Sleep(a.runCtx, min(pause, deadline.Sub(now)))
		pause = min(2*pause, outcomeRetryMax)
		if e := a.readBack(landed); e != nil {
			return e, nil // the last try had committed
		}
		if a.stale() {
			if rerr := a.renew(writeTimeout); errors.Is(rerr, sink.ErrFenced) {
				if e := a.readBack(landed); e != nil {
					return e, nil
				}
				return nil, rerr
			}
		}
	}
}

// complete records success (see record).
func (a *attempt) complete(elapsed time.Duration) (Outcome, error) {
	_, err := a.record("done", isDone, func(wctx context.Context) error {
		return a.d.cfg.Sink.Complete(wctx, a.c.Key, a.c.Token)
	})
	switch {
	case err == nil:
		a.log.Info("dispatch: effect ok", "duration", elapsed)
		return OutcomeDone, nil
	case errors.Is(err, sink.ErrFenced):
		a.log.Error("dispatch: FENCED: the key was taken over before this attempt completed; its success is discarded (the effect may have run twice)", "err", err)
		return OutcomeFenced, nil
	default:
		a.log.Error("dispatch: could not record done; the key stays claimed until its lease expires and its effect will run again", "err", err)
		return OutcomeRetry, fmt.Errorf("dispatch: complete %s: %w", a.c.Key, err)
	}
}

// effectTimeoutError is the cause of an effect context that ran out of
// --effect-timeout.
type effectTimeoutError struct{ d time.Duration }

func (e *effectTimeoutError) Error() string { return fmt.Sprintf("effect timeout %v exceeded", e.d) }

// failureOf is the failure an effect's error records. The error decides
// what is said about it: the effect context's state after the run does not
// (it may have ended after the effect failed on its own).
func (d *Dispatcher) failureOf(effCtx context.Context, runErr error) sink.Failure {
	cause := runErr.Error()
	// Only an error that says the effect was stopped by its context (it
	// wraps the context's error), as opposed to failing on its own, is
	// explained by the context's cause: the context may well have ended
	// after the effect had failed, or succeeded, by itself (issue 12 item 3).
	if errors.Is(runErr, context.DeadlineExceeded) || errors.Is(runErr, context.Canceled) {
		var te *effectTimeoutError
		switch why := context.Cause(effCtx); {
		case errors.Is(why, errShutdown):
			cause = "interrupted by shutdown: " + cause
		case errors.As(why, &te):
			cause = fmt.Sprintf("effect timed out after %v: %s", te.d, cause)
		}
	}
	// A broken effect (gemrecon's stdout went away) is not the key's fault:
	// the attempt uses up none of its budget.
	f := sink.Failure{Cause: sink.TruncateError(cause), Permanent: effect.IsPermanent(runErr), NoAttempt: effect.IsBroken(runErr)}
	if after, ok := effect.RetryAfterOf(runErr); ok {
		f.NotBefore = d.cfg.Now().Add(after)
	}
	return f
}

// recordFailure records a failed attempt f (see record). An uncounted
// failure reports noAttempt as its outcome when that is set (a claim the
// API has not confirmed yet), else OutcomeRetry.
func (a *attempt) recordFailure(f sink.Failure, noAttempt Outcome, elapsed time.Duration) (Outcome, error) {
	log, c := a.log, a.c
	cause := f.Cause
	f.Cause = sink.TruncateError(f.Cause)
	var state sink.State
	// Only this claim's Fail turns its claim into pending or dead without a
	// new token.
	landed := func(e sink.Entry) bool { return e.State == sink.StatePending || e.State == sink.StateDead }
	e, err := a.record("a failure", landed, func(wctx context.Context) error {
		var err error
		state, err = a.d.cfg.Sink.Fail(wctx, c.Key, c.Token, f)
		return err
	})
	if e != nil {
		state = e.State
	}
	switch {
	case errors.Is(err, sink.ErrFenced) && a.d.completer != nil && a.readBack(isDone) != nil:
		// The effect's transaction committed (the key is done with this
		// claim's token) although it reported an error, as when the
		// context ended during the commit: the outcome is the commit's.
		log.Info("dispatch: effect ok (its commit's answer was an error)", "duration", elapsed, "err", cause)
		return OutcomeDone, nil
	case errors.Is(err, sink.ErrFenced):
		log.Error("dispatch: FENCED: the key was taken over before this attempt's failure was recorded; its outcome is discarded", "err", err, "effect_err", cause)
		return OutcomeFenced, nil
	case err != nil:
		log.Error("dispatch: could not record a failure; the key stays claimed until its lease expires", "err", err, "effect_err", cause)
		return OutcomeRetry, fmt.Errorf("dispatch: fail %s: %w", c.Key, err)
	case state == sink.StateDead:
		log.Error("dispatch: effect failed; key is dead", "err", cause, "permanent", f.Permanent, "duration", elapsed)
		return OutcomeDead, nil
	default:
		attrs := []any{"err", cause, "duration", elapsed}
		if !f.NotBefore.IsZero() {
			attrs = append(attrs, "not_before", f.NotBefore)
		}
		if f.NoAttempt {
			if noAttempt != "" {
				log.Debug("dispatch: handed back without using an attempt; the key is pending again", attrs...)
				return noAttempt, nil
			}
			log.Warn("dispatch: attempt handed back without using an attempt; the key is pending again", attrs...)
			return OutcomeRetry, nil
		}
		log.Warn("dispatch: effect failed; retry scheduled", attrs...)
		return OutcomeRetry, nil
	}
}

// eventFor builds the event document of spec §4 and §9.3 from a claim:
// what the sink stored, nothing parsed again (the batch state is the one
// canon computed when the key was seen, or the API's once confirmed).
func eventFor(c sink.Claim) effect.Event {
	return effect.Event{
		Key:        c.Key,
		Name:       canon.Name(c.Key),
		State:      c.BatchState,
		Source:     c.FirstSource,
		Attempt:    c.Attempt,
		Token:      c.Token,
		Operation:  jsonOrString(c.Payload),
		Confirmed:  c.Confirmed,
		BatchState: c.BatchState,
		Webhook:    jsonOrString(c.Webhook),
		Rerun:      c.Rerun,

		WithoutResults: c.NoResults,
	}
}

// jsonOrString is b as JSON: as it is when valid, else as a JSON string
// (it should always be JSON: hand it over rather than fail every attempt
// on encoding). Empty stays empty. Bytes that are not UTF-8 (a webhook
// body is stored as it was sent, and JSON's grammar lets them pass inside
// strings) become U+FFFD, as encoding/json reads them: an effect gets
// UTF-8 JSON, and PostgreSQL does not refuse @operation at every attempt.
func jsonOrString(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		if !utf8.Valid(b) {
			// Outside strings JSON allows only ASCII, so every invalid
			// sequence is inside a string, where U+FFFD is one character.
			b = bytes.ToValidUTF8(b, []byte("\uFFFD"))
		}
		return json.RawMessage(b)
	}
	q, _ := json.Marshal(string(b))
	return q
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
