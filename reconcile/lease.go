package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The pass lease of spec §5.5, as a poll pass uses it: taken in begin,
// renewed by a goroutine while the pass lists and drains, released by
// EndPass in end. Replicas of one fleet (several `serve --poll-every`, cron
// `poll` on several hosts) therefore list one at a time, and about once per
// interval in all (see fleetGap).

// DefaultPassLease is the default of --pass-lease: how long a pass holds
// its scope's pass lease without renewing it. A holder that dies (kill -9,
// a lost machine) keeps the fleet from listing for at most this long; the
// next tick of another replica after that takes over, so a pass by another
// replica starts within DefaultPassLease + the interval. Renewals come every
// third of it (renewEvery), so one renewal may fail — a database stalled
// for up to 20 s, past SQLite's 5 s busy timeout — and the next still comes
// before the lease runs out.
const DefaultPassLease = time.Minute

// Why a pass skipped its listing (Skip.Reason, the summary's `skipped`).
const (
	// SkipHeld: another process holds the scope's pass lease.
	SkipHeld = "held"
	// SkipRecent: a pass of the scope started less than the fleet's gap ago
	// (see fleetGap).
	SkipRecent = "recent"
)

// Skip says why a pass did not list, and who did or does instead.
type Skip struct {
	// Reason is SkipHeld or SkipRecent; "" for a pass that listed.
	Reason string
	// Holder is the process that holds the lease (SkipHeld) or that ran the
	// last pass (SkipRecent).
	Holder string
	// Until is when the lease ends (SkipHeld, the sink's clock) or when the
	// interval lets the next pass list (SkipRecent, the last holder's clock).
	Until time.Time
}

// ErrPassLost is wrapped by a pass's ListErr when the pass stopped listing
// because its pass lease was taken over (sink.ErrFenced: another process
// lists now) or could not be renewed before it ran out.
var ErrPassLost = errors.New("the pass lease was lost")

// fleetGapShare is the part of the interval that may separate two passes'
// starts at the least: a tick skips its listing when a pass of the scope
// started less than interval − interval/10 ago (see fleetGap).
const fleetGapShare = 10

// fleetGap is the rule of the fleet's interval. Every replica ticks every
// D = MinInterval (start to start, Watch), each on its own phase. A tick
// lists unless a pass of the scope started less than D − D/10 ago:
//
//   - the replica that ran the last pass ticks again D after its start and
//     finds it D old, so while it lives the fleet's gap between passes is at
//     most D (plus its timer's lateness): a plain "ended less than D ago"
//     rule would make that replica skip its own next tick (its pass ended
//     only D − duration ago) and stretch the gap towards 2 D;
//   - two passes start at least 0.9 D apart, so the fleet lists at most
//     1/0.9 ≈ 1.11 times per D, however many replicas tick;
//   - when the last lister dies between passes, another replica's tick comes
//     within D after the 0.9 D, so the gap is at most 1.9 D; when it dies
//     mid-pass, within PassLease + D.
//
// The sink measures "recent" from when it recorded the last pass's end
// (its own clock: the database's on PostgreSQL, so replicas whose clocks
// disagree still agree), so the start is that end less the last pass's
// duration, which its holder measured (a difference on one clock); the
// returned minInterval for AcquirePass is D − D/10 − that duration, and 0
// (no interval check, the lease only) when the last pass took longer. A
// duration that is negative (a clock stepped back) counts as 0.
func fleetGap(interval time.Duration, last sink.PassRecord) time.Duration {
	if interval <= 0 {
		return 0
	}
	gap := interval - interval/fleetGapShare
	if !last.LastStart.IsZero() && !last.LastEnd.IsZero() {
		if d := last.LastEnd.Sub(last.LastStart); d > 0 {
			gap -= d
		}
	}
	return max(gap, 0)
}

// lease keeps one pass's pass lease alive: it renews it every renewEvery,
// each renewal bounded by renewEvery, and cancels the listing's context
// (with a cause wrapping ErrPassLost) when a renewal is fenced — another
// process took the lease over — or when the lease ran out by the local clock
// without a successful renewal.
type lease struct {
	p      *Poll
	cancel context.CancelCauseFunc
	stopc  chan struct{}
	done   chan struct{}

	// cur (the lease as last renewed) and lost (why it was lost) are
	// run's until done is closed.
	cur  sink.PassLease
	lost error
}

// hold starts renewing l, acquired no earlier than asked (by the local
// clock), and returns the context the listing runs under.
func (p *Poll) hold(ctx context.Context, l sink.PassLease, asked time.Time) (*lease, context.Context) {
	listCtx, cancel := context.WithCancelCause(ctx)
	h := &lease{p: p, cancel: cancel, stopc: make(chan struct{}), done: make(chan struct{}), cur: l}
	go h.run(context.WithoutCancel(ctx), asked.Add(p.cfg.PassLease))
	return h, listCtx
}

// run renews until stop. valid is when the lease runs out by the local
// clock: the time a successful acquisition or renewal was sent, plus the
// lease, so never later than the sink's own end of it.
func (h *lease) run(ctx context.Context, valid time.Time) {
	defer close(h.done)
	p := h.p
	every := p.cfg.RenewEvery
	ticks := p.cfg.renewTicks
	if ticks == nil {
		t := time.NewTicker(every)
		defer t.Stop()
		ticks = t.C
	}
	for {
		select {
		case <-h.stopc:
			return
		case <-ticks:
		}
		sent := p.cfg.Now()
		rctx, cancel := context.WithTimeout(ctx, every)
		nl, err := p.cfg.Sink.RenewPass(rctx, h.cur, p.cfg.PassLease)
		cancel()
		switch {
		case err == nil:
			h.cur = nl
			valid = sent.Add(p.cfg.PassLease)
			continue
		case errors.Is(err, sink.ErrFenced), errors.Is(err, sink.ErrNotFound):
			h.lose(fmt.Errorf("%w: another process took it over and lists now: %w", ErrPassLost, err))
			return
		case !p.cfg.Now().Before(valid):
			h.lose(fmt.Errorf("%w: it could not be renewed for %v and ran out (last error: %w)", ErrPassLost, p.cfg.PassLease, err))
			return
		}
		p.cfg.Logger.Warn("renewing the pass lease failed; the next renewal retries", "scope", p.scope,
			"valid_until", valid, "err", err)
	}
}

func (h *lease) lose(err error) {
	h.lost = err
	h.p.cfg.Logger.Warn("lost the pass lease: this pass stops listing, if it still is, and records nothing", "scope", h.p.scope, "err", err)
	h.cancel(err)
}

// stop ends the renewals and returns the lease as last renewed, and why it
// was lost (nil while still held).
func (h *lease) stop() (sink.PassLease, error) {
	close(h.stopc)
	<-h.done
	h.cancel(nil)
	return h.cur, h.lost
}
