package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// drainState is one Drain's bookkeeping.
type drainState struct {
	mu   sync.Mutex
	sum  Summary
	errs []error
	// seen holds every key this Drain attempted or tried to claim: none is
	// attempted twice in one Drain, so a key whose retry comes due while
	// the Drain runs waits for the next one instead of looping. (One
	// exception, harmless: a holder stalled past its own lease may see the
	// key again in a batch claim after another holder took it over and
	// failed; that is a new attempt, and the stalled one is fenced.)
	seen map[string]bool
	// redue holds the seen keys that may be due again (failed with a retry
	// scheduled, fenced, or not claimable when tried). While it is empty a
	// batch claim cannot return a seen key, so Drain uses ClaimDue; after,
	// it lists due keys and claims the unseen ones one by one.
	redue map[string]bool
}

// job is one unit of work: a granted claim, or a key to claim first.
type job struct {
	claim     *sink.Claim
	claimedAt time.Time // by Config.Now, just before the claim (or its last renewal) was asked for
	key       string
}

// Drain claims and runs every key that is due now, up to Concurrency at a
// time, and returns when all have finished. No key runs twice in one Drain.
// When ctx is cancelled it stops claiming; running effects get Grace to
// finish, then are cancelled and recorded as retryable failures; Drain
// then returns ctx's error, wrapped. A sink error stops claiming too and is
// returned once the running effects have finished.
//
// Batch claims run ahead of the effects by up to Concurrency keys, so that
// the claim's commit overlaps the running effects' completions (they share
// the sink's group commits) instead of alternating with them. A claim
// granted ahead holds its key but has not started its effect: a crash then
// costs a takeover, never a duplicate effect.
func (d *Dispatcher) Drain(ctx context.Context) (Summary, error) {
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("dispatch: drain not started: %w", err)
	}
	runCtx, release := d.graceContext(ctx)
	defer release()

	conc := d.cfg.Concurrency
	st := &drainState{seen: map[string]bool{}, redue: map[string]bool{}}
	// finished is signalled (never blocking: a slot given back lets the next
	// effect start before this one's signal is read) when an effect ends.
	finished := make(chan struct{}, 1)
	var wg sync.WaitGroup
	var running atomic.Int64 // this Drain's effects; the slots are shared with TakeSlot's claims
	var ready []job          // granted ahead, waiting for a slot
	// waitOne waits until one of this Drain's effects finished, any slot
	// was given back or ctx is done (which the loops below check).
	waitOne := func() {
		select {
		case <-finished:
		case <-d.freed:
		case <-ctx.Done():
		}
	}
	startReady := func() {
		for len(ready) > 0 && d.takeSlot() {
			j := ready[0]
			ready = ready[1:]
			running.Add(1)
			wg.Go(func() {
				defer func() {
					d.giveSlot()
					running.Add(-1)
					select {
					case finished <- struct{}{}:
					default:
					}
				}()
				d.runJob(ctx, runCtx, st, j)
			})
		}
	}
	var claimErr error
	// Claim in batches of at least half the slots: each batch claim is one
	// commit, and a claim per freed slot would cost a commit per key.
	batch := max(1, conc/2)
	ahead := conc // not more: a claim held ahead is a key other processes cannot run
	for ctx.Err() == nil && d.brokenErr() == nil {
		startReady()
		if ctx.Err() != nil {
			break
		}
		busy := len(d.slots)
		want := conc + ahead - busy - len(ready)
		if busy > 0 && want < batch {
			waitOne()
			continue
		}
		jobs, err := d.next(ctx, st, want, conc-busy-len(ready))
		if err != nil {
			if ctx.Err() == nil {
				claimErr = err
			}
			break
		}
		ready = append(ready, jobs...)
		if len(jobs) == 0 {
			if running.Load() == 0 && len(ready) == 0 {
				break
			}
			if len(ready) > 0 && len(d.slots) < conc {
				continue // start what is ready
			}
			// Whatever finishes may have freed the way for more (another
			// holder's lease may expire meanwhile); look again after.
			waitOne()
		}
	}
	// A sink error: run what was claimed already. Shutdown or a broken
	// effect: hand it back.
	for len(ready) > 0 && ctx.Err() == nil && d.brokenErr() == nil {
		if len(d.slots) == conc {
			waitOne()
			continue
		}
		startReady()
	}
	for _, j := range ready {
		if j.claim != nil {
			d.giveBack(ctx, st, *j.claim)
		}
	}
	wg.Wait()

	st.mu.Lock()
	defer st.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return st.sum, fmt.Errorf("dispatch: drain interrupted: %w", err)
	}
	if berr := d.brokenErr(); berr != nil {
		return st.sum, berr
	}
	if claimErr != nil {
		st.errs = append(st.errs, claimErr)
	}
	return st.sum, errors.Join(st.errs...)
}

// giveBack hands back a claim granted ahead whose effect never started
// (shutdown, or a broken effect), so the key does not wait for its lease:
// a failure that uses up no attempt.
func (d *Dispatcher) giveBack(ctx context.Context, st *drainState, c sink.Claim) {
	wctx, cancel := writeContext(ctx)
	defer cancel()
	cause := "interrupted by shutdown before the effect started"
	if d.brokenErr() != nil {
		cause = "handed back before the effect started: the effect cannot run in this process any more"
	}
	state, err := d.cfg.Sink.Fail(wctx, c.Key, c.Token, sink.Failure{Cause: cause, NoAttempt: true})
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sum.Claimed++
	switch {
	case errors.Is(err, sink.ErrFenced):
		st.sum.Fenced++
	case err != nil:
		st.sum.Failed++
		st.errs = append(st.errs, fmt.Errorf("dispatch: give back %s: %w", c.Key, err))
	case state == sink.StateDead:
		st.sum.Dead++
	default:
		st.sum.HandedBack++ // no effect ran: not a failed one
	}
}

// next returns up to claims granted claims (batch mode), or up to keys
// keys to claim when their effect starts (listing mode, see redue).
func (d *Dispatcher) next(ctx context.Context, st *drainState, claims, keys int) ([]job, error) {
	d.outcomeMu.Lock()
	defer d.outcomeMu.Unlock()
	st.mu.Lock()
	nRedue := len(st.redue)
	st.mu.Unlock()

	wctx, cancel := writeContext(ctx)
	defer cancel()
	if nRedue == 0 {
		if claims <= 0 {
			return nil, nil
		}
		asked := d.cfg.Now() // the leases cannot have started earlier
		granted, err := d.cfg.Sink.ClaimDue(wctx, d.owner, d.cfg.Lease, claims, d.claimOpts())
		if err != nil {
			return nil, fmt.Errorf("dispatch: claim due keys: %w", err)
		}
		jobs := make([]job, len(granted))
		st.mu.Lock()
		for i := range granted {
			jobs[i] = job{claim: &granted[i], claimedAt: asked}
			if st.seen[granted[i].Key] {
				// Only after a stall past our own lease (see seen): a
				// granted claim is a new attempt; run it rather than
				// strand it.
				d.log.Warn("dispatch: a key came due twice in one drain", "key", granted[i].Key)
			}
			st.seen[granted[i].Key] = true
		}
		st.mu.Unlock()
		return jobs, nil
	}
	if keys <= 0 {
		return nil, nil
	}
	// Every seen key that may be due again could come first in the listing:
	// ask for that many more than there are free slots.
	due, err := d.cfg.Sink.Due(wctx, keys+nRedue, d.claimOpts())
	if err != nil {
		return nil, fmt.Errorf("dispatch: list due keys: %w", err)
	}
	var jobs []job
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, k := range due {
		if len(jobs) == keys {
			break
		}
		if st.seen[k] {
			continue
		}
		st.seen[k] = true
		jobs = append(jobs, job{key: k})
	}
	return jobs, nil
}

// runJob claims (when needed) and runs one job, and accounts for it.
func (d *Dispatcher) runJob(ctx, runCtx context.Context, st *drainState, j job) {
	if j.claim == nil {
		if ctx.Err() != nil || d.brokenErr() != nil {
			return // shutting down, or the effect broke: claim nothing more
		}
		j.claimedAt = d.cfg.Now()
		wctx, cancel := writeContext(ctx)
		c, err := d.cfg.Sink.Claim(wctx, j.key, d.owner, d.cfg.Lease, d.claimOpts())
		cancel()
		if err != nil {
			st.mu.Lock()
			st.redue[j.key] = true
			if !errors.Is(err, sink.ErrNotClaimable) && !errors.Is(err, sink.ErrNotFound) {
				st.errs = append(st.errs, fmt.Errorf("dispatch: claim %s: %w", j.key, err))
			}
			st.mu.Unlock()
			return
		}
		j.claim = &c
	}
	a := d.newAttempt(ctx, runCtx, *j.claim, j.claimedAt)
	var err error
	if j.key == "" && d.cfg.Now().Sub(j.claimedAt) > d.cfg.Lease/3 {
		// Granted ahead and kept waiting for a slot: renew before the
		// effect starts, so it gets its whole lease.
		err = a.renew(writeTimeout)
	}
	st.mu.Lock()
	st.sum.Claimed++
	if err != nil {
		if errors.Is(err, sink.ErrFenced) {
			st.sum.Fenced++
			a.log.Error("dispatch: FENCED: a claim waiting for a slot was taken over; its effect was not started")
		} else {
			// Not started: its lease will run out and another attempt
			// take over.
			st.sum.Failed++
			st.errs = append(st.errs, fmt.Errorf("dispatch: renew %s before its effect: %w", j.claim.Key, err))
		}
		st.redue[j.claim.Key] = true
		st.mu.Unlock()
		return
	}
	st.mu.Unlock()
	out, err := a.run(func(o Outcome) {
		// Under outcomeMu (shared): marks the key before a batch claim
		// can see it due again.
		if o == OutcomeRetry || o == OutcomeFenced || o == OutcomeUnconfirmed {
			st.mu.Lock()
			st.redue[j.claim.Key] = true
			st.mu.Unlock()
		}
	}, 0)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sum.add(out)
	if err != nil {
		st.errs = append(st.errs, err)
	}
}
