package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// A webhook's completion that comes alone costs two commits (spec §3 "A
// claim in the commit that records"): where the key is recorded (package
// ingest), a free slot of this dispatcher is taken first (TakeSlot), the
// sink records the sighting and claims the key in one commit
// (sink.RecordAndClaim, with the dispatcher's own claim request), and the
// claim runs in that slot as a claim of Drain would. With no free slot the
// key is only recorded, and waits for a Drain.

// session is where claims made where keys are recorded run: under its
// context, with the dispatcher's grace once that is done (graceContext),
// until Run ends. Run opens one for the dispatcher's TakeSlot (serve's
// webhooks), and waits for its claims when it ends; the claims' outcomes
// are logged, not summed.
type session struct {
	d           *Dispatcher
	ctx, runCtx context.Context
	release     func()
	wg          sync.WaitGroup
}

// takeSlot takes a free slot for a claim made where a key is recorded: req
// is the claim to ask sink.RecordAndClaim for (this dispatcher's owner,
// lease and options), and hand starts a claim granted for it in the slot,
// or with nil gives the slot back. ok is false when no slot is free, the
// session's context is done or the effect broke: then the key is only
// recorded.
func (s *session) takeSlot() (req sink.ClaimRequest, hand func(*sink.Claim), ok bool) {
	d := s.d
	if s.ctx.Err() != nil || d.brokenErr() != nil || !d.takeSlot() {
		return req, nil, false
	}
	asked := d.cfg.Now() // the lease cannot start earlier
	s.wg.Add(1)
	hand = func(c *sink.Claim) {
		if c == nil {
			d.giveSlot()
			s.wg.Done()
			return
		}
		go func() {
			defer s.wg.Done()
			defer d.giveSlot()
			_, _ = d.newAttempt(s.ctx, s.runCtx, *c, asked).run(nil, 0)
		}()
	}
	return d.Request(), hand, true
}

// TakeSlot is the TakeSlot of the session Run keeps open (serve's
// webhooks); ok is false while Run is not running.
func (d *Dispatcher) TakeSlot() (sink.ClaimRequest, func(*sink.Claim), bool) {
	if s := d.live.Load(); s != nil {
		return s.takeSlot()
	}
	return sink.ClaimRequest{}, nil, false
}

// Now is the dispatcher's clock (Config.Now).
func (d *Dispatcher) Now() time.Time { return d.cfg.Now() }

// Inline is a claimer for keys whose claim the caller runs itself (serve
// --sync, RunClaimWithin): every key is claimed where it is recorded when
// it can be, and no slot is taken.
type Inline struct{ *Dispatcher }

// TakeSlot is the dispatcher's claim request, with no slot: the caller
// runs the claim.
func (i Inline) TakeSlot() (sink.ClaimRequest, func(*sink.Claim), bool) {
	return i.Request(), nil, true
}

// RunClaimWithin runs c, granted where its key was recorded at asked (by
// Now), as RunKeyWithin runs the claim it makes. Once ctx is done it runs
// nothing and hands the claim back without using an attempt.
func (d *Dispatcher) RunClaimWithin(ctx context.Context, c sink.Claim, asked time.Time, confirmWait time.Duration) (Outcome, error) {
	if err := errors.Join(ctx.Err(), d.brokenErr()); err != nil {
		d.giveBack(ctx, &drainState{}, c)
		return OutcomeSkipped, fmt.Errorf("dispatch: %s: %w", c.Key, err)
	}
	runCtx, release := d.graceContext(ctx)
	defer release()
	return d.newAttempt(ctx, runCtx, c, asked).run(nil, confirmWait)
}

// Request is the claim this dispatcher makes (sink.RecordAndClaim).
func (d *Dispatcher) Request() sink.ClaimRequest {
	return sink.ClaimRequest{Owner: d.owner, Lease: d.cfg.Lease, Opts: d.claimOpts()}
}

// takeSlot takes a free slot without waiting.
func (d *Dispatcher) takeSlot() bool {
	select {
	case d.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

// giveSlot gives a slot back and wakes whoever waits for one.
func (d *Dispatcher) giveSlot() {
	<-d.slots
	select {
	case d.freed <- struct{}{}:
	default:
	}
}
