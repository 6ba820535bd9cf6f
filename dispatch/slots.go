package dispatch

import (
	"context"
	"errors"
	"sync"

	"github.com/gemrecon/gemrecon/sink"
)

// A completion that comes alone costs two commits (spec §3 "A claim in the
// commit that records"): where a key is recorded (package ingest), a free
// slot of this dispatcher is taken first (TakeSlot), the sink records the
// sighting and claims the key in one commit (sink.RecordAndClaim, with the
// dispatcher's own claim request), and the claim runs in that slot as a
// claim of Drain would. With no free slot the key is only recorded, and
// waits for a Drain.

// live is where the claims handed to TakeSlot's slots run: under ctx, with
// the dispatcher's grace once it is done (graceContext), counted apart from
// any Drain until Live's stop.
type live struct {
	ctx, runCtx context.Context
	wg          sync.WaitGroup
	mu          sync.Mutex
	sum         Summary
	errs        []error
}

// Live makes TakeSlot hand out slots whose claims run under ctx (serve's
// workers, Run; a poll pass, for its listing and drain) until stop is
// called. stop waits for those claims — the grace applies once ctx is done
// — and returns what they did.
func (d *Dispatcher) Live(ctx context.Context) (stop func() (Summary, error)) {
	runCtx, release := d.graceContext(ctx)
	l := &live{ctx: ctx, runCtx: runCtx}
	d.liveMu.Lock()
	prev := d.live
	d.live = l
	d.liveMu.Unlock()
	return func() (Summary, error) {
		d.liveMu.Lock()
		if d.live == l {
			d.live = prev
		}
		d.liveMu.Unlock()
		l.wg.Wait()
		release()
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.sum, errors.Join(l.errs...)
	}
}

// TakeSlot takes a free slot for a claim made where a key is recorded: req
// is the claim to ask sink.RecordAndClaim for (this dispatcher's owner,
// lease and options), and hand starts a claim granted for it in the slot,
// or with nil gives the slot back. ok is false when no slot is free, none
// is live (Live), the live context is done or the effect broke: then the
// key is only recorded.
func (d *Dispatcher) TakeSlot() (req sink.ClaimRequest, hand func(*sink.Claim), ok bool) {
	d.liveMu.Lock()
	l := d.live
	d.liveMu.Unlock()
	if l == nil || l.ctx.Err() != nil || d.brokenErr() != nil {
		return req, nil, false
	}
	select {
	case d.slots <- struct{}{}:
	default:
		return req, nil, false
	}
	asked := d.cfg.Now() // the lease cannot start earlier
	l.wg.Add(1)
	hand = func(c *sink.Claim) {
		if c == nil {
			d.giveSlot()
			l.wg.Done()
			return
		}
		go func() {
			defer l.wg.Done()
			defer d.giveSlot()
			out, err := d.runClaim(l.ctx, l.runCtx, *c, asked, nil, 0)
			l.mu.Lock()
			defer l.mu.Unlock()
			l.sum.Claimed++
			l.sum.add(out)
			if err != nil {
				l.errs = append(l.errs, err)
			}
		}()
	}
	return d.Request(), hand, true
}

// Request is the claim this dispatcher makes (sink.RecordAndClaim).
func (d *Dispatcher) Request() sink.ClaimRequest {
	return sink.ClaimRequest{Owner: d.cfg.Owner, Lease: d.cfg.Lease, Opts: d.claimOpts()}
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

// Add adds what o did to s (a Drain's summary and a Live's).
func (s *Summary) Add(o Summary) {
	s.Claimed += o.Claimed
	s.OK += o.OK
	s.Failed += o.Failed
	s.Dead += o.Dead
	s.Fenced += o.Fenced
	s.Unconfirmed += o.Unconfirmed
	s.HandedBack += o.HandedBack
}
