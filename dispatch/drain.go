package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
	claim *sink.Claim
	key   string
}

// Drain claims and runs every key that is due now, up to Concurrency at a
// time, and returns when all have finished. No key runs twice in one Drain.
// When ctx is cancelled it stops claiming; running effects get Grace to
// finish, then are cancelled and recorded as retryable failures; Drain
// then returns ctx's error, wrapped. A sink error stops claiming too and is
// returned once the running effects have finished.
func (d *Dispatcher) Drain(ctx context.Context) (Summary, error) {
	if err := ctx.Err(); err != nil {
		return Summary{}, fmt.Errorf("dispatch: drain not started: %w", err)
	}
	runCtx, release := d.graceContext(ctx)
	defer release()

	st := &drainState{seen: map[string]bool{}, redue: map[string]bool{}}
	finished := make(chan struct{}, d.cfg.Concurrency)
	var wg sync.WaitGroup
	running := 0
	waitOne := func() bool {
		select {
		case <-finished:
			running--
		case <-ctx.Done():
			return false
		}
		for { // and whatever else has finished meanwhile
			select {
			case <-finished:
				running--
			default:
				return true
			}
		}
	}
	var claimErr error
	// Claim in batches of at least half the slots while effects run: each
	// batch claim is one commit, and a claim per freed slot would cost a
	// commit per key.
	batch := max(1, d.cfg.Concurrency/2)
	for ctx.Err() == nil {
		if running > 0 && d.cfg.Concurrency-running < batch {
			if !waitOne() {
				break
			}
			continue
		}
		jobs, err := d.next(ctx, st, d.cfg.Concurrency-running)
		if err != nil {
			if ctx.Err() == nil {
				claimErr = err
			}
			break
		}
		if len(jobs) == 0 {
			if running == 0 {
				break
			}
			// Whatever finishes may have freed the way for more (another
			// holder's lease may expire meanwhile); look again after.
			if !waitOne() {
				break
			}
			continue
		}
		for _, j := range jobs {
			running++
			wg.Go(func() {
				defer func() { finished <- struct{}{} }()
				d.runJob(ctx, runCtx, st, j)
			})
		}
	}
	wg.Wait()

	st.mu.Lock()
	defer st.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return st.sum, fmt.Errorf("dispatch: drain interrupted: %w", err)
	}
	if claimErr != nil {
		st.errs = append(st.errs, claimErr)
	}
	return st.sum, errors.Join(st.errs...)
}

// next returns up to free jobs.
func (d *Dispatcher) next(ctx context.Context, st *drainState, free int) ([]job, error) {
	d.outcomeMu.Lock()
	defer d.outcomeMu.Unlock()
	st.mu.Lock()
	nRedue := len(st.redue)
	st.mu.Unlock()

	wctx, cancel := writeContext(ctx)
	defer cancel()
	if nRedue == 0 {
		claims, err := d.cfg.Sink.ClaimDue(wctx, d.cfg.Owner, d.cfg.Lease, free)
		if err != nil {
			return nil, fmt.Errorf("dispatch: claim due keys: %w", err)
		}
		jobs := make([]job, len(claims))
		st.mu.Lock()
		for i := range claims {
			jobs[i] = job{claim: &claims[i]}
			if st.seen[claims[i].Key] {
				// Only after a stall past our own lease (see seen): a
				// granted claim is a new attempt; run it rather than
				// strand it.
				d.log.Warn("dispatch: a key came due twice in one drain", "key", claims[i].Key)
			}
			st.seen[claims[i].Key] = true
		}
		st.mu.Unlock()
		return jobs, nil
	}
	// Every seen key that may be due again could come first in the listing:
	// ask for that many more than there are free slots.
	keys, err := d.cfg.Sink.Due(wctx, free+nRedue)
	if err != nil {
		return nil, fmt.Errorf("dispatch: list due keys: %w", err)
	}
	var jobs []job
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, k := range keys {
		if len(jobs) == free {
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
		if ctx.Err() != nil {
			return // shutting down: claim nothing more
		}
		wctx, cancel := writeContext(ctx)
		c, err := d.cfg.Sink.Claim(wctx, j.key, d.cfg.Owner, d.cfg.Lease)
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
	st.mu.Lock()
	st.sum.Claimed++
	st.mu.Unlock()
	out, err := d.runClaim(ctx, runCtx, *j.claim, func(o Outcome) {
		// Under outcomeMu (shared): marks the key before a batch claim
		// can see it due again.
		if o == OutcomeRetry || o == OutcomeFenced {
			st.mu.Lock()
			st.redue[j.claim.Key] = true
			st.mu.Unlock()
		}
	})
	st.mu.Lock()
	st.sum.add(out)
	if err != nil {
		st.errs = append(st.errs, err)
	}
	st.mu.Unlock()
}
