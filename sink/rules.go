package sink

import (
	"fmt"
	"math"
	"time"
)

// The decisions of the state machine (spec §3), each made here once, as a
// pure function of a key's row and the time: the backends load the row
// (held against change from the read to the write), store what was decided,
// and decide nothing themselves. rules_test.go checks them without a
// database; sinktest checks that each backend stores them faithfully.

// Row is one key as the decisions read and write it. Times are zero when
// they do not apply (a lease end outside claimed, a next attempt outside
// pending).
type Row struct {
	Key          string
	State        State
	Attempts     int
	Token        int64
	Owner        string
	LeaseUntil   time.Time
	NextAttempt  time.Time
	DoneAt       time.Time
	LastError    string
	TookOver     bool
	FirstSource  string
	FirstSeenAt  time.Time
	Confirmed    bool
	BatchState   string
	NeedsConfirm bool
	DeadReason   string
	Conflicts    int64
	Retries      int
	// Reruns counts the operator's reruns of the key once done (spec §7):
	// an attempt of a key with Reruns > 0 is told it is a rerun.
	Reruns int
	// NoResults: the operator asked the next attempts to run without the
	// batch's results (retry --without-results, spec §9.5).
	NoResults bool
	// BatchEnd is when the batch ended, by the API's word (zero: unknown).
	BatchEnd time.Time
}

// leaseExpired is the last error of an attempt whose lease ran out.
const leaseExpired = "lease expired"

// LeaseEnd is now + lease, the stored end of a lease granted now. A sum past
// the range of time.Time's Unix nanoseconds ends there (in 2262) instead of
// wrapping around into the past, where the lease would already be over
// (conformance LongestLease).
func LeaseEnd(now time.Time, lease time.Duration) time.Time {
	if ns := now.UnixNano(); int64(lease) > math.MaxInt64-ns {
		return time.Unix(0, math.MaxInt64).UTC()
	}
	return now.Add(lease)
}

// claimable reports whether a claim at now would be granted, or end in a
// takeover: pending and due, or claimed under a lease that has expired (a
// lease is live while now < LeaseUntil).
func (r Row) claimable(now time.Time) bool {
	switch r.State {
	case StatePending:
		return !r.NextAttempt.After(now)
	case StateClaimed:
		return !r.LeaseUntil.After(now)
	}
	return false
}

// sightKind is what a sighting does to a key.
type sightKind int

const (
	sightDuplicate sightKind = iota // statistics only, buffered (no commit)
	sightNew                        // insert the key, pending and due now
	sightConfirm                    // the API's operation confirms the key, durably
)

// sighting decides what sighting sg does to the key whose row is r (found
// false: no such key), at now (spec §3 transitions 1, 12, 13; §9.2, §9.4).
// For sightConfirm it returns the row to store; for sightNew the row to
// insert. Conflict reports a terminal state that differs from the stored
// one.
func sighting(r Row, found bool, sg Sighting, now time.Time) (kind sightKind, out Row, conflict bool) {
	if !found {
		return sightNew, Row{Key: sg.Key, State: StatePending, NextAttempt: now, FirstSource: sg.Source,
			FirstSeenAt: now, Confirmed: sg.FromAPI, BatchState: sg.State, NeedsConfirm: sg.Dynamic && !sg.FromAPI,
			BatchEnd: sg.EndTime}, false
	}
	conflict = StateConflict(r.BatchState, sg.State)
	if !sg.FromAPI || r.Confirmed {
		return sightDuplicate, r, conflict
	}
	out = r
	out.Confirmed, out.NeedsConfirm, out.BatchEnd = true, false, sg.EndTime
	if sg.State != "" {
		out.BatchState = sg.State
	}
	if conflict {
		out.Conflicts++
	}
	switch {
	case r.State == StatePending && r.NextAttempt.After(now):
		out.NextAttempt = now
	case r.State == StateDead && r.DeadReason == DeadUnknownToAPI:
		// The API knows it after all: pending again, with a fresh budget.
		out.State, out.Attempts, out.DeadReason, out.NextAttempt = StatePending, 0, "", now
		out.Owner, out.LeaseUntil = "", time.Time{}
	}
	return sightConfirm, out, conflict
}

// duplicate is what a sighting of a known key adds to the buffered
// statistics (spec §3, "Sightings, payloads and conflicts"): the count,
// a conflict, a poll-first key's first webhook body, and the end of a need
// for confirmation when the sighting was not only dynamically verified.
func duplicate(r Row, sg Sighting, conflict bool) Delta {
	d := Delta{N: 1, Sources: []string{sg.Source}, Verified: r.NeedsConfirm && !sg.Dynamic}
	if conflict {
		d.Conflicts = 1
	}
	if sg.Source == SourceWebhook && r.FirstSource != SourceWebhook && len(sg.Payload) > 0 {
		d.Webhook = sg.Payload
	}
	return d
}

// claim decides a claim of r by owner at now (transitions 3–5). It returns
// the claimed row, or an error wrapping ErrNotClaimable — with the row to
// store when a takeover of the last allowed attempt made the key dead
// (store is true then).
func claim(r Row, owner string, lease time.Duration, now time.Time, maxAttempts int, o ClaimOptions) (out Row, store bool, err error) {
	takeover := false
	switch {
	case o.SkipNeedsConfirm && r.NeedsConfirm:
		return r, false, fmt.Errorf("needs confirmation, which this claimer cannot give: %w", ErrNotClaimable)
	case r.State == StatePending && !r.NextAttempt.After(now):
	case r.State == StateClaimed && !r.LeaseUntil.After(now):
		takeover = true
		if r.Attempts >= maxAttempts {
			out = r
			out.State, out.LastError, out.DeadReason, out.Owner, out.LeaseUntil = StateDead, leaseExpired, "", "", time.Time{}
			return out, true, fmt.Errorf("attempt %d of %d outlived its lease, key is now dead: %w", r.Attempts, maxAttempts, ErrNotClaimable)
		}
	case r.State == StatePending:
		return r, false, fmt.Errorf("pending, next attempt at %s: %w", r.NextAttempt.Format(time.RFC3339Nano), ErrNotClaimable)
	case r.State == StateClaimed:
		return r, false, fmt.Errorf("claimed under a live lease until %s: %w", r.LeaseUntil.Format(time.RFC3339Nano), ErrNotClaimable)
	default:
		return r, false, fmt.Errorf("%s: %w", r.State, ErrNotClaimable)
	}
	out = r
	out.State, out.Token, out.Attempts, out.Owner = StateClaimed, r.Token+1, r.Attempts+1, owner
	out.LeaseUntil, out.NextAttempt, out.TookOver = LeaseEnd(now, lease), time.Time{}, takeover
	if takeover {
		out.LastError = leaseExpired
	}
	return out, true, nil
}

// fence refuses a write with token unless it is the current claim's
// (spec §3 "Fencing tokens"): the caller counts and logs the refusal.
func fence(r Row, token int64) error {
	if r.State != StateClaimed || r.Token != token {
		return fmt.Errorf("with token %d (current token %d, state %s): %w", token, r.Token, r.State, ErrFenced)
	}
	return nil
}

// complete decides the done of transition 6.
func complete(r Row, now time.Time) Row {
	r.State, r.DoneAt, r.Owner, r.LeaseUntil, r.NextAttempt = StateDone, now, "", time.Time{}, time.Time{}
	return r
}

// fail decides transitions 7–9 for the failure f of the current claim at
// now. delay is f.NotBefore as a wait from the caller's now (a time handed
// over as it is would move by the difference of the clocks), negative or
// zero when it has passed; hasDelay tells it apart from none.
func fail(r Row, f Failure, delay time.Duration, hasDelay bool, now time.Time, o Options) Row {
	r.LastError, r.Owner, r.LeaseUntil = TruncateError(f.Cause), "", time.Time{}
	switch {
	case f.NoAttempt:
		// Not the effect's fault: the attempt is given back, and the key
		// never goes dead for it.
		r.Attempts = max(r.Attempts-1, 0)
		r.State, r.NextAttempt = StatePending, now.Add(Backoff(r.Attempts, o.RetryBase, o.RetryMax, o.Rand))
		if hasDelay {
			r.NextAttempt = now.Add(max(delay, 0))
		}
	case f.Permanent || r.Attempts >= o.MaxAttempts:
		r.State, r.DeadReason, r.NextAttempt = StateDead, f.DeadReason, time.Time{}
	default:
		wait := Backoff(r.Attempts, o.RetryBase, o.RetryMax, o.Rand)
		if hasDelay {
			wait = max(wait, delay)
		}
		r.State, r.NextAttempt = StatePending, now.Add(wait)
	}
	return r
}

// confirm decides a Confirm of the claimed key (spec §9.2): the API's state
// and operation are stored unless a poll sighting confirmed the key
// meanwhile, which keeps what it holds. apply says whether the operation
// becomes the payload.
func confirm(r Row, c Confirmation) (out Row, apply, conflict bool) {
	conflict = StateConflict(r.BatchState, c.State)
	out = r
	if conflict {
		out.Conflicts++
	}
	if r.Confirmed {
		return out, false, conflict
	}
	out.Confirmed, out.NeedsConfirm, out.BatchEnd = true, false, c.EndTime
	if c.State != "" {
		out.BatchState = c.State
	}
	return out, true, conflict
}

// RetryOptions say which operator action Retry is (spec §7).
type RetryOptions struct {
	// Rerun sends a done key back instead of a dead one: its effect runs
	// once more, and knows it is a rerun.
	Rerun bool
	// WithoutResults: the next attempts run without the batch's results
	// (they expired, spec §9.5).
	WithoutResults bool
	// By names who asked (user@host), for the key's history.
	By string
}

// retry decides transition 10 (and a rerun of a done key): pending, due now,
// with a fresh attempt budget; the token keeps its value, so the next claim
// takes the next one.
func retry(r Row, o RetryOptions, now time.Time) (Row, error) {
	switch {
	case o.Rerun && r.State != StateDone:
		return r, fmt.Errorf("state is %s: %w", r.State, ErrNotDone)
	case !o.Rerun && r.State != StateDead:
		return r, fmt.Errorf("state is %s: %w", r.State, ErrNotDead)
	}
	r.State, r.Attempts, r.NextAttempt, r.Owner, r.LeaseUntil, r.DeadReason = StatePending, 0, now, "", time.Time{}, ""
	r.NoResults = r.NoResults || o.WithoutResults
	if o.Rerun {
		r.Reruns++
	} else {
		r.Retries++
	}
	return r, nil
}

// PassRow is a scope's pass record as the decisions of spec §5.5 read it,
// with the sink-clock time its last pass was recorded (the minimum interval
// between passes is measured from it).
type PassRow struct {
	PassRecord
	EndedAt time.Time
}

// acquirePass decides AcquirePass at now: another owner's live lease is
// ErrPassHeld; with minInterval > 0 a pass recorded less than minInterval
// ago is ErrPassRecent (a recorded time ahead of now, a clock that went
// back, is not recent); otherwise the lease is taken and its token
// incremented.
func acquirePass(r PassRow, owner string, lease, minInterval time.Duration, now time.Time) (PassRow, error) {
	if r.Holder != "" && r.Holder != owner && now.Before(r.HeldUntil) {
		return r, fmt.Errorf("held by %s until %s (token %d): %w", r.Holder, r.HeldUntil.Format(time.RFC3339Nano), r.Token, ErrPassHeld)
	}
	if ago := now.Sub(r.EndedAt); minInterval > 0 && !r.EndedAt.IsZero() && ago >= 0 && ago < minInterval {
		return r, fmt.Errorf("the last pass ended %v ago, less than %v: %w", ago, minInterval, ErrPassRecent)
	}
	r.Holder, r.HeldUntil, r.Token = owner, LeaseEnd(now, lease), r.Token+1
	return r, nil
}

// passFence refuses a renewal or an end by a lease that is not the current
// one (taken over, or already ended).
func passFence(r PassRow, found bool, l PassLease) error {
	switch {
	case !found:
		return fmt.Errorf("no pass record: %w", ErrNotFound)
	case r.Token != l.Token || r.Holder != l.Owner:
		holder := r.Holder
		if holder == "" {
			holder = "nobody"
		}
		return fmt.Errorf("by %s with token %d: the lease is now held by %s (token %d): %w", l.Owner, l.Token, holder, r.Token, ErrFenced)
	}
	return nil
}

// endPass records a pass's outcome at now, and releases the lease when the
// pass held one.
func endPass(r PassRow, l PassLease, o PassOutcome, now time.Time) PassRow {
	r.LastStart, r.LastEnd, r.LastHolder, r.EndedAt = o.Start, o.End, l.Owner, now
	if o.Success {
		r.LastSuccess = o.End
	}
	if o.FullScan {
		r.LastFullScan = o.Start
	}
	if o.Unfinished != nil {
		r.Unfinished, r.OldestUnfinished = o.Unfinished, o.OldestUnfinished
	}
	if l.Token != 0 {
		r.Holder, r.HeldUntil = "", time.Time{}
	}
	return r
}
