package sqlite

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// leaseExpired is the last error of an attempt whose lease ran out.
const leaseExpired = "lease expired"

// keyRow is what a sighting needs to know about a stored key.
type keyRow struct {
	state        sink.State
	firstSource  string
	nextAttempt  int64
	leaseUntil   int64
	confirmed    bool
	batchState   string
	needsConfirm bool
}

// claimable reports whether a claim at now would be granted (or end in a
// takeover). A lease is live while now < lease_until: at lease_until it has
// expired.
func (r keyRow) claimable(now int64) bool {
	switch r.state {
	case sink.StatePending:
		return r.nextAttempt <= now
	case sink.StateClaimed:
		return r.leaseUntil <= now
	}
	return false
}

func hashPayload(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	h := sha256.Sum256(p)
	return h[:]
}

// checkLease refuses a lease that would be expired when granted; what and
// key (if any) say of what.
func checkLease(what, key string, lease time.Duration) error {
	if lease <= 0 {
		if key != "" {
			what += " " + sink.KeyText(key)
		}
		return fmt.Errorf("sqlite sink: %s: lease %v must be positive", what, lease)
	}
	return nil
}

// leaseEnd is now + lease in Unix nanoseconds, the stored lease_until. A
// sum past the int64 range ends at its last instant (in 2262) instead of
// wrapping around to a time long past, at which the lease would already be
// over and anyone could take the key over (TestConformance/LongestLease).
func leaseEnd(now int64, lease time.Duration) int64 {
	if int64(lease) > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + int64(lease)
}

func checkSighting(sg sink.Sighting) error {
	if sg.Key == "" {
		return errors.New("sqlite sink: record: empty key")
	}
	if err := sink.CheckKey(sg.Key); err != nil { // spec §12
		return err
	}
	if sg.Source == "" {
		return fmt.Errorf("sqlite sink: record %s: empty source", sink.KeyText(sg.Key))
	}
	return nil
}

// scanKeyRow reads the result of qKeyRow.
func scanKeyRow(row *sql.Row) (keyRow, bool, error) {
	var r keyRow
	var st string
	err := row.Scan(&st, &r.firstSource, &r.nextAttempt, &r.leaseUntil, &r.confirmed, &r.batchState, &r.needsConfirm)
	if errors.Is(err, sql.ErrNoRows) {
		return keyRow{}, false, nil
	}
	r.state = sink.State(st)
	return r, err == nil, err
}

// noteDuplicate buffers a known key's sighting and reports whether it is a
// conflict by meaning (spec §9.4): a terminal state that differs from the
// stored batch state. The stored state stays (the API's, once confirmed;
// else the first). A poll-first key's first webhook body is kept with the
// statistics, and a sighting that was not only dynamically verified lifts
// the need for confirmation.
func (s *Sink) noteDuplicate(sg sink.Sighting, r keyRow) bool {
	conflict := sink.StateConflict(r.batchState, sg.State)
	if conflict {
		s.log.Warn("sqlite sink: state conflict: a sighting's batch state differs from the stored one; the stored state stays",
			"db", s.path, "key", sg.Key, "source", sg.Source, "stored", r.batchState, "seen", sg.State, "confirmed", r.confirmed)
	}
	sd := sightingDelta{source: sg.Source, now: s.nowNS(), conflict: conflict, verified: r.needsConfirm && !sg.Dynamic}
	if sg.Source == sink.SourceWebhook && r.firstSource != sink.SourceWebhook && len(sg.Payload) > 0 {
		sd.webhook = sg.Payload
	}
	s.stats.add(sg.Key, sd)
	return conflict
}

// doneRow is the keyRow a done-cache entry stands for.
func doneRow(info doneInfo) keyRow {
	return keyRow{state: sink.StateDone, firstSource: info.firstSource, confirmed: info.confirmed, batchState: info.batchState}
}

// Record notes a sighting: a new key is inserted durably (sharing a commit
// with whatever else is queued); a known key only touches buffered
// statistics, unless the sighting is the API's operation for a key not yet
// confirmed, which is confirmed durably (confirmSightingTx).
func (s *Sink) Record(ctx context.Context, sg sink.Sighting) (sink.RecordResult, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, err
	}
	if err := s.writable(); err != nil {
		return sink.RecordResult{}, err
	}
	if info, ok := s.done.get(sg.Key); ok && (info.confirmed || !sg.FromAPI) {
		c := s.noteDuplicate(sg, doneRow(info))
		return sink.RecordResult{State: sink.StateDone, Conflict: c}, nil
	}
	r, found, err := s.lookupKeyRow(ctx, sg.Key)
	if err != nil {
		return sink.RecordResult{}, s.fail(err)
	}
	if found && (r.confirmed || !sg.FromAPI) {
		c := s.knownRow(sg, r)
		return sink.RecordResult{State: r.state, Conflict: c}, nil
	}
	return s.submitRecord(ctx, sg)
}

// submitRecord runs recordTx on the writer.
func (s *Sink) submitRecord(ctx context.Context, sg sink.Sighting) (sink.RecordResult, error) {
	sha := hashPayload(sg.Payload)
	var done *doneInfo
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		rr, r, err := s.recordTx(tx, sg, sha)
		if err == nil && rr.Confirmed && rr.State == sink.StateDone {
			done = &doneInfo{firstSource: r.firstSource, confirmed: true, batchState: r.batchState}
		}
		return rr, err
	}, func(any) {
		if done != nil {
			s.done.update(sg.Key, *done)
		}
	})
	if err != nil {
		return sink.RecordResult{}, err
	}
	return v.(sink.RecordResult), nil
}

// knownRow buffers a duplicate of a stored key and caches it when done.
func (s *Sink) knownRow(sg sink.Sighting, r keyRow) bool {
	c := s.noteDuplicate(sg, r)
	if r.state == sink.StateDone {
		s.done.add(sg.Key, doneInfo{firstSource: r.firstSource, confirmed: r.confirmed, batchState: r.batchState})
	}
	return c
}

// recordTx inserts a new key as pending and due now — confirmed when the
// sighting is the API's, needing confirmation when it was only dynamically
// verified — or (another writer got there first, or the key is known and
// this sighting confirms it) deals with the known key.
func (s *Sink) recordTx(tx *sql.Conn, sg sink.Sighting, sha []byte) (sink.RecordResult, keyRow, error) {
	now := s.nowNS()
	needs := sg.Dynamic && !sg.FromAPI
	res, err := s.txExec(tx, qInsertKey, sg.Key, sg.Source, now, sg.FromAPI, sg.State, needs)
	if err != nil {
		return sink.RecordResult{}, keyRow{}, err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		if len(sg.Payload) > 0 {
			if _, err := s.txExec(tx, qInsertPayload, sg.Key, sg.Payload, sha); err != nil {
				return sink.RecordResult{}, keyRow{}, err
			}
		}
		return sink.RecordResult{New: true, State: sink.StatePending},
			keyRow{state: sink.StatePending, firstSource: sg.Source, nextAttempt: now,
				confirmed: sg.FromAPI, batchState: sg.State, needsConfirm: needs}, nil
	}
	r, _, err := scanKeyRow(s.txQueryRow(tx, qKeyRow, sg.Key))
	if err != nil {
		return sink.RecordResult{}, keyRow{}, err
	}
	if sg.FromAPI && !r.confirmed {
		return s.confirmSightingTx(tx, sg, sha)
	}
	c := s.knownRow(sg, r)
	return sink.RecordResult{State: r.state, Conflict: c}, r, nil
}

// confirmRow is what a confirming write reads of a key.
type confirmRow struct {
	state       sink.State
	token       int64
	firstSource string
	confirmed   bool
	batchState  string
	deadReason  string
}

func (s *Sink) readConfirmRow(tx *sql.Conn, key string) (confirmRow, bool, error) {
	var r confirmRow
	var st string
	err := s.txQueryRow(tx, qConfirmRow, key).Scan(&st, &r.token, &r.firstSource, &r.confirmed, &r.batchState, &r.deadReason)
	if errors.Is(err, sql.ErrNoRows) {
		return confirmRow{}, false, nil
	}
	r.state = sink.State(st)
	return r, err == nil, err
}

// applyConfirmTx stores the API's operation and state for a key not yet
// confirmed (spec §9.2): the operation becomes the payload (a webhook-first
// key's body moves to webhook), the batch state is the API's, the key is
// confirmed and needs confirmation no more; a conflict (the stored terminal
// state differs) is counted and logged.
func (s *Sink) applyConfirmTx(tx *sql.Conn, key string, r confirmRow, op, sha []byte, state string) (bool, error) {
	if len(op) > 0 {
		if sha == nil {
			sha = hashPayload(op)
		}
		if _, err := s.txExec(tx, qConfirmPayload, key, op, sha, r.firstSource == sink.SourceWebhook); err != nil {
			return false, err
		}
	}
	conflict := sink.StateConflict(r.batchState, state)
	if _, err := s.txExec(tx, qConfirmKey, state, btoi(conflict), key); err != nil {
		return false, err
	}
	if conflict {
		s.log.Warn("sqlite sink: state conflict: the API's batch state differs from the stored one; the API's wins",
			"db", s.path, "key", key, "stored", r.batchState, "api", state, "state", r.state)
	}
	return conflict, nil
}

// confirmSightingTx confirms a known key with a sighting from the API: the
// listed operation is stored, a pending key is due now, and a key dead as
// unknown to the API is pending again, due now, with a fresh attempt budget.
func (s *Sink) confirmSightingTx(tx *sql.Conn, sg sink.Sighting, sha []byte) (sink.RecordResult, keyRow, error) {
	r, found, err := s.readConfirmRow(tx, sg.Key)
	if err != nil {
		return sink.RecordResult{}, keyRow{}, err
	}
	if !found { // purged meanwhile: nothing to confirm
		return sink.RecordResult{}, keyRow{}, fmt.Errorf("sqlite sink: record %s: %w", sink.KeyText(sg.Key), sink.ErrNotFound)
	}
	kr := keyRow{state: r.state, firstSource: r.firstSource, confirmed: true, batchState: r.batchState}
	if r.confirmed {
		c := s.knownRow(sg, kr)
		return sink.RecordResult{State: r.state, Conflict: c}, kr, nil
	}
	conflict, err := s.applyConfirmTx(tx, sg.Key, r, sg.Payload, sha, sg.State)
	if err != nil {
		return sink.RecordResult{}, keyRow{}, err
	}
	now := s.nowNS()
	st := r.state
	switch {
	case r.state == sink.StatePending:
		if _, err := s.txExec(tx, qConfirmDue, now, sg.Key); err != nil {
			return sink.RecordResult{}, keyRow{}, err
		}
	case r.state == sink.StateDead && r.deadReason == sink.DeadUnknownToAPI:
		if _, err := s.txExec(tx, qConfirmRevive, now, sg.Key); err != nil {
			return sink.RecordResult{}, keyRow{}, err
		}
		st = sink.StatePending
		s.log.Info("sqlite sink: a key dead as unknown to the API was listed by the API: pending again, due now",
			"db", s.path, "key", sg.Key)
	}
	if sg.State != "" {
		kr.batchState = sg.State
	}
	kr.state = st
	// The sighting's statistics (no conflict: counted in the row above).
	s.stats.add(sg.Key, sightingDelta{source: sg.Source, now: now})
	return sink.RecordResult{State: st, Confirmed: true, Conflict: conflict}, kr, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordClaim is RecordAndClaim's result inside the writer.
type recordClaim struct {
	rr sink.RecordResult
	c  sink.Claim
}

// RecordAndClaim records a sighting and claims the key in the same commit when
// it can be claimed now (see sink.RecordClaimer). It is the path of a sighting
// that is likely new, so it does not read the key first — a read transaction
// before the write cost about a sixth of a new completion's time — unless
// the row cache answers without one (rowCache): the INSERT in the writer's
// transaction finds a known key. A duplicate that the row cache does not
// answer therefore meets the writer, and its sighting's statistics go into
// that commit; when the writer cannot begin because another process holds
// the lock past the busy timeout, a read decides, as it did before: a key
// that cannot be claimed is refused and its sighting buffered.
func (s *Sink) RecordAndClaim(ctx context.Context, sg sink.Sighting, owner string, lease time.Duration) (sink.RecordResult, sink.Claim, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if err := checkLease("record and claim", sg.Key, lease); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if err := s.writable(); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if info, ok := s.done.get(sg.Key); ok && (info.confirmed || !sg.FromAPI) {
		c := s.noteDuplicate(sg, doneRow(info))
		return sink.RecordResult{State: sink.StateDone, Conflict: c}, sink.Claim{},
			fmt.Errorf("sqlite sink: %s is done: %w", sink.KeyText(sg.Key), sink.ErrNotClaimable)
	}
	r, found, _, _ := s.cachedRow(sg.Key)
	if found && !r.claimable(s.nowNS()) && (r.confirmed || !sg.FromAPI) {
		c := s.knownRow(sg, r)
		return sink.RecordResult{State: r.state, Conflict: c}, sink.Claim{},
			fmt.Errorf("sqlite sink: %s is %s: %w", sink.KeyText(sg.Key), r.state, sink.ErrNotClaimable)
	}
	sha := hashPayload(sg.Payload)
	var done *doneInfo
	var ran atomic.Bool
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		ran.Store(true)
		if !found {
			rc, inserted, err := s.insertClaimedTx(tx, sg, sha, owner, lease)
			if err != nil || inserted {
				return rc, err
			}
			// Another writer recorded it meanwhile: the ordinary path.
		}
		rr, r, err := s.recordTx(tx, sg, sha)
		if err != nil {
			return nil, err
		}
		if rr.Confirmed && rr.State == sink.StateDone {
			done = &doneInfo{firstSource: r.firstSource, confirmed: true, batchState: r.batchState}
		}
		c, err := s.claimTx(tx, sg.Key, owner, lease, sink.ClaimOptions{})
		if err == nil {
			rr.State = sink.StateClaimed
		}
		return recordClaim{rr: rr, c: c}, err
	}, func(any) {
		if done != nil {
			s.done.update(sg.Key, *done)
		}
	})
	var le *lockedError
	if err != nil && !ran.Load() && errors.As(err, &le) {
		// The writer could not begin (another process holds the lock): a
		// duplicate that cannot be claimed needs no write, and what a
		// read says of it is the answer it had before RecordAndClaim
		// stopped reading first (sink.RecordClaimer: ErrNotClaimable, the
		// sighting recorded).
		r, found, rerr := s.readKeyRow(ctx, sg.Key)
		if rerr == nil && found && !r.claimable(s.nowNS()) && (r.confirmed || !sg.FromAPI) {
			c := s.knownRow(sg, r)
			return sink.RecordResult{State: r.state, Conflict: c}, sink.Claim{},
				fmt.Errorf("sqlite sink: %s is %s: %w", sink.KeyText(sg.Key), r.state, sink.ErrNotClaimable)
		}
	}
	rc, _ := v.(recordClaim)
	return rc.rr, rc.c, err
}

// insertClaimedTx inserts a new key already claimed by owner: token 1,
// attempt 1 (what recordTx then claimTx would write, in one row write).
// inserted is false when the key exists (nothing written).
func (s *Sink) insertClaimedTx(tx *sql.Conn, sg sink.Sighting, sha []byte, owner string, lease time.Duration) (recordClaim, bool, error) {
	now := s.nowNS()
	until := leaseEnd(now, lease)
	needs := sg.Dynamic && !sg.FromAPI
	res, err := s.txExec(tx, qInsertClaimed, sg.Key, sg.Source, now, sg.FromAPI, sg.State, needs, until, owner)
	if err != nil {
		return recordClaim{}, false, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return recordClaim{}, false, nil
	}
	c := sink.Claim{Key: sg.Key, Token: 1, Attempt: 1, Owner: owner, LeaseUntil: fromNS(until),
		FirstSource: sg.Source, FirstSeenAt: fromNS(now), Confirmed: sg.FromAPI, BatchState: sg.State, NeedsConfirm: needs}
	if len(sg.Payload) > 0 {
		if _, err := s.txExec(tx, qInsertPayload, sg.Key, sg.Payload, sha); err != nil {
			return recordClaim{}, false, err
		}
		c.Payload = sg.Payload
		if sg.Source == sink.SourceWebhook && !sg.FromAPI {
			c.Webhook = sg.Payload // webhookExpr: an unconfirmed webhook-first key's body
		}
	}
	return recordClaim{rr: sink.RecordResult{New: true, State: sink.StateClaimed}, c: c}, true, nil
}

// Claim takes the key for one attempt.
func (s *Sink) Claim(ctx context.Context, key, owner string, lease time.Duration, opts ...sink.ClaimOption) (sink.Claim, error) {
	if err := checkLease("claim", key, lease); err != nil {
		return sink.Claim{}, err
	}
	o := sink.ClaimOptionsOf(opts)
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		return s.claimTx(tx, key, owner, lease, o)
	}, nil)
	if err != nil {
		return sink.Claim{}, err
	}
	return v.(sink.Claim), nil
}

// claimTx grants a claim on a pending and due key, or takes over a claimed key
// whose lease expired (lease_until <= now); the expired attempt counts as
// failed with "lease expired", and when it was the last allowed attempt the
// key goes dead instead. With o.SkipNeedsConfirm a key that needs
// confirmation is not claimable (it is another claimer's).
func (s *Sink) claimTx(tx *sql.Conn, key, owner string, lease time.Duration, o sink.ClaimOptions) (sink.Claim, error) {
	now := s.nowNS()
	var (
		st                        string
		attempts                  int
		token, leaseUntil, nextAt int64
		payload                   []byte
		firstSource               string
		firstSeen                 int64
		c                         sink.Claim
	)
	err := s.txQueryRow(tx, qClaimRow, key).Scan(&st, &attempts, &token, &leaseUntil, &nextAt, &payload, &firstSource,
		&firstSeen, &c.Confirmed, &c.BatchState, &c.NeedsConfirm, &c.Webhook, &c.ResultsFile)
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: %w", sink.KeyText(key), sink.ErrNotFound)
	}
	if err != nil {
		return sink.Claim{}, err
	}
	if o.SkipNeedsConfirm && c.NeedsConfirm {
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: needs confirmation, which this claimer cannot give: %w", sink.KeyText(key), sink.ErrNotClaimable)
	}
	takeover := false
	switch {
	case st == string(sink.StatePending) && nextAt <= now:
	case st == string(sink.StateClaimed) && leaseUntil <= now:
		takeover = true
		if attempts >= s.opt.MaxAttempts {
			if _, err := s.txExec(tx, qDeadExpired, leaseExpired, key); err != nil {
				return sink.Claim{}, err
			}
			s.log.Warn("sqlite sink: lease expired on the last attempt; key is dead", "db", s.path, "key", key, "attempts", attempts)
			return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: attempt %d of %d outlived its lease, key is now dead: %w",
				sink.KeyText(key), attempts, s.opt.MaxAttempts, sink.ErrNotClaimable)
		}
	case st == string(sink.StatePending):
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: pending, next attempt at %s: %w",
			sink.KeyText(key), fromNS(nextAt).Format(time.RFC3339Nano), sink.ErrNotClaimable)
	case st == string(sink.StateClaimed):
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: claimed under a live lease until %s: %w",
			sink.KeyText(key), fromNS(leaseUntil).Format(time.RFC3339Nano), sink.ErrNotClaimable)
	default:
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: %s: %w", sink.KeyText(key), st, sink.ErrNotClaimable)
	}
	until := leaseEnd(now, lease)
	if _, err := s.txExec(tx, qClaim, token+1, attempts+1, owner, until, takeover, leaseExpired, key); err != nil {
		return sink.Claim{}, err
	}
	c.Key, c.Token, c.Attempt, c.Owner = key, token+1, attempts+1, owner
	c.LeaseUntil, c.Payload, c.FirstSource, c.Takeover = fromNS(until), payload, firstSource, takeover
	c.FirstSeenAt = fromNS(firstSeen)
	return c, nil
}

// ClaimDue claims up to limit due keys (limit <= 0: all), oldest first.
func (s *Sink) ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int, opts ...sink.ClaimOption) ([]sink.Claim, error) {
	if err := checkLease("claim due", "", lease); err != nil {
		return nil, err
	}
	o := sink.ClaimOptionsOf(opts)
	due := dueQuery(o)
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		var claims []sink.Claim
		for {
			want := -1
			if limit > 0 {
				want = limit - len(claims)
				if want <= 0 {
					break
				}
			}
			rows, err := s.txQuery(tx, due, s.nowNS())
			keys, err := scanKeys(rows, err, want)
			if err != nil {
				return nil, err
			}
			if len(keys) == 0 {
				break
			}
			skipped := 0
			for _, k := range keys {
				c, err := s.claimTx(tx, k, owner, lease, o)
				if errors.Is(err, sink.ErrNotClaimable) {
					skipped++ // a takeover that ended dead
					continue
				}
				if err != nil {
					return nil, err
				}
				claims = append(claims, c)
			}
			if skipped == 0 {
				break
			}
		}
		return claims, nil
	}, nil)
	if err != nil {
		return nil, err
	}
	return v.([]sink.Claim), nil
}

// dueQuery is the due-keys query for these claim options.
func dueQuery(o sink.ClaimOptions) string {
	if o.SkipNeedsConfirm {
		return qDueConfirmable
	}
	return qDueKeys
}

// fencedTx explains why a token-checked write matched no row: ErrNotFound when
// the key is unknown, else ErrFenced, counted durably and logged.
func (s *Sink) fencedTx(tx *sql.Conn, what, key string, token int64) error {
	var st string
	var cur int64
	err := s.txQueryRow(tx, qFencedRow, key).Scan(&st, &cur)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite sink: %s %s: %w", what, sink.KeyText(key), sink.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if _, err := s.txExec(tx, qFencedInc); err != nil {
		return err
	}
	s.log.Error("sqlite sink: fenced outcome discarded: the claim's token is no longer current",
		"db", s.path, "op", what, "key", key, "token", token, "current_token", cur, "state", st)
	return fmt.Errorf("sqlite sink: %s %s with token %d (current token %d, state %s): %w", what, sink.KeyText(key), token, cur, st, sink.ErrFenced)
}

// Renew extends a claim's lease to now+lease while its token is current.
func (s *Sink) Renew(ctx context.Context, key string, token int64, lease time.Duration) error {
	if err := checkLease("renew", key, lease); err != nil {
		return err
	}
	_, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		res, err := s.txExec(tx, qRenew, leaseEnd(s.nowNS(), lease), key, token)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil, s.fencedTx(tx, "renew", key, token)
		}
		return nil, nil
	}, nil)
	return err
}

// Complete marks a claimed key done when token is current.
func (s *Sink) Complete(ctx context.Context, key string, token int64) error {
	_, err := s.submitOp(&op{ctx: ctx, fn: func(tx *sql.Conn) (any, error) {
		info, found, scanErr, err := s.completeTx(tx, key, token)
		switch {
		case err != nil:
			return nil, err
		case !found:
			return nil, s.fencedTx(tx, "complete", key, token)
		case scanErr != nil:
			return nil, scanErr
		}
		return info, nil
	}, alone: func(tx *sql.Conn) (any, bool, error) {
		info, found, scanErr, err := s.completeTx(tx, key, token)
		if err != nil || scanErr != nil {
			return nil, found && err == nil, err // done or not, nothing for the done cache
		}
		return info, found, nil
	}, onCommit: func(v any) {
		if info, ok := v.(doneInfo); ok {
			s.done.add(key, info)
		}
	}})
	return err
}

// completeTx runs qComplete and reads its rows to their end: found says
// whether it changed the key, info is what it returned unless scanErr says
// that could not be read. Read to the end, because in autocommit mode
// (op.alone) the commit happens in the step after the last row, and that
// step reports its outcome (a reset, which ends a statement read only in
// part, is not documented to).
func (s *Sink) completeTx(tx *sql.Conn, key string, token int64) (info doneInfo, found bool, scanErr, err error) {
	rows, err := s.txQuery(tx, qComplete, s.nowNS(), key, token)
	if err != nil {
		return info, false, nil, err
	}
	for rows.Next() {
		found = true
		scanErr = rows.Scan(&info.firstSource, &info.confirmed, &info.batchState)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return info, false, nil, err
	}
	return info, found, scanErr, nil
}

// Fail ends a claimed attempt: back to pending after backoff (and not before
// f.NotBefore), or dead when permanent or the attempts are exhausted.
func (s *Sink) Fail(ctx context.Context, key string, token int64, f sink.Failure) (sink.State, error) {
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		var attempts int
		err := s.txQueryRow(tx, qFailRow, key, token).Scan(&attempts)
		if errors.Is(err, sql.ErrNoRows) {
			return sink.State(""), s.fencedTx(tx, "fail", key, token)
		}
		if err != nil {
			return nil, err
		}
		cause := sink.TruncateError(f.Cause)
		if f.NoAttempt {
			return s.failUncountedTx(tx, key, attempts, f, cause)
		}
		if f.Permanent || attempts >= s.opt.MaxAttempts {
			_, err := s.txExec(tx, qFailDead, cause, f.DeadReason, key)
			return sink.StateDead, err
		}
		now := s.opt.Now()
		delay := sink.Backoff(attempts, s.opt.RetryBase, s.opt.RetryMax, s.opt.Rand)
		if !f.NotBefore.IsZero() {
			delay = max(delay, f.NotBefore.Sub(now))
		}
		_, err = s.txExec(tx, qFailPending, now.Add(delay).UnixNano(), cause, key)
		return sink.StatePending, err
	}, nil)
	st, _ := v.(sink.State)
	return st, err
}

// failUncountedTx ends an attempt that does not count (Failure.NoAttempt):
// the attempt counter goes back to what it was before the claim, and the key
// to pending — never dead, Permanent ignored — at f.NotBefore (due now if
// that has passed), or when it is zero after the backoff of the restored
// count. The token keeps its value: the next claim increments it.
func (s *Sink) failUncountedTx(tx *sql.Conn, key string, attempts int, f sink.Failure, cause string) (sink.State, error) {
	attempts = max(attempts-1, 0)
	now := s.opt.Now()
	next := now.Add(sink.Backoff(attempts, s.opt.RetryBase, s.opt.RetryMax, s.opt.Rand))
	if !f.NotBefore.IsZero() {
		next = f.NotBefore
		if next.Before(now) {
			next = now
		}
	}
	_, err := s.txExec(tx, qFailUncounted, next.UnixNano(), cause, attempts, key)
	return sink.StatePending, err
}

// Confirm stores the API's answer for a claimed key, fenced on token (see
// sink.Sink).
func (s *Sink) Confirm(ctx context.Context, key string, token int64, c sink.Confirmation) error {
	_, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		r, found, err := s.readConfirmRow(tx, key)
		if err != nil {
			return nil, err
		}
		if !found || r.state != sink.StateClaimed || r.token != token {
			return nil, s.fencedTx(tx, "confirm", key, token)
		}
		if r.confirmed { // a poll sighting confirmed it meanwhile: it keeps what it holds
			if sink.StateConflict(r.batchState, c.State) {
				s.log.Warn("sqlite sink: state conflict: the API's batch state differs from the stored one",
					"db", s.path, "key", key, "stored", r.batchState, "api", c.State)
				_, err := s.txExec(tx, qConflictInc, key)
				return nil, err
			}
			return nil, nil
		}
		_, err = s.applyConfirmTx(tx, key, r, c.Operation, nil, c.State)
		return nil, err
	}, nil)
	return err
}

// NoteResults records where the claimed key's results were written, fenced
// on token.
func (s *Sink) NoteResults(ctx context.Context, key string, token int64, file string) error {
	_, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		var attempts int
		err := s.txQueryRow(tx, qFailRow, key, token).Scan(&attempts)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, s.fencedTx(tx, "note results", key, token)
		}
		if err != nil {
			return nil, err
		}
		_, err = s.txExec(tx, qNoteResults, file, key)
		return nil, err
	}, nil)
	return err
}

// Retry moves a dead key to pending, due now. Its attempts restart from zero
// (a fresh budget); the retries column counts operator retries and the last
// error stays until the next attempt ends.
func (s *Sink) Retry(ctx context.Context, key string) error {
	_, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		res, err := tx.ExecContext(context.Background(), `UPDATE gemrecon_keys SET state = 'pending', attempts = 0,
			retries = retries + 1, next_attempt_at = ?1, due_at = ?1, lease_owner = '', lease_until = 0, dead_reason = ''
			WHERE key = ?2 AND state = 'dead'`, s.nowNS(), key)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil, nil
		}
		var st string
		err = tx.QueryRowContext(context.Background(), `SELECT state FROM gemrecon_keys WHERE key = ?`, key).Scan(&st)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("sqlite sink: retry %s: %w", sink.KeyText(key), sink.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sqlite sink: retry %s: state is %s: %w", sink.KeyText(key), st, sink.ErrNotDead)
	}, nil)
	return err
}

// Purge deletes done rows done for longer than olderThan (see sink.Sink).
func (s *Sink) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	keys, err := s.PurgeKeys(ctx, olderThan)
	return int64(len(keys)), err
}

// PurgeKeys deletes done rows done for longer than olderThan and returns
// their keys. The cutoff is read from the sink's clock when the writer runs
// the statement: the clock that wrote the done times (due_at of a done row).
func (s *Sink) PurgeKeys(ctx context.Context, olderThan time.Duration) ([]string, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("sqlite sink: purge: negative age %v (want the time keys have been done for, e.g. 720h)", olderThan)
	}
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		bg, now := context.Background(), s.nowNS()
		before := now - int64(olderThan)
		if before > now { // overflow: nothing is that old
			before = math.MinInt64
		}
		if _, err := tx.ExecContext(bg, `DELETE FROM gemrecon_payloads WHERE key IN
			(SELECT key FROM gemrecon_keys WHERE state = 'done' AND due_at < ?)`, before); err != nil {
			return nil, err
		}
		rows, err := tx.QueryContext(bg, `DELETE FROM gemrecon_keys WHERE state = 'done' AND due_at < ? RETURNING key`, before)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		keys := []string{}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
		return keys, rows.Err()
	}, func(any) { s.done.reset() })
	if err != nil {
		return nil, err
	}
	return v.([]string), nil
}

// NoteLookback records a poll's lookback (0 = forever) for MaxLookback.
func (s *Sink) NoteLookback(ctx context.Context, lookback time.Duration) error {
	if lookback < 0 {
		return fmt.Errorf("sqlite sink: negative lookback %v", lookback)
	}
	_, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		bg := context.Background()
		if _, err := tx.ExecContext(bg, `INSERT INTO gemrecon_meta (name, value) VALUES ('max_lookback_ns', ?1)
			ON CONFLICT (name) DO UPDATE SET value = max(value, ?1)`, int64(lookback)); err != nil {
			return nil, err
		}
		if lookback == 0 {
			_, err := tx.ExecContext(bg, `INSERT INTO gemrecon_meta (name, value) VALUES ('lookback_forever', 1)
				ON CONFLICT (name) DO UPDATE SET value = 1`)
			return nil, err
		}
		return nil, nil
	}, nil)
	return err
}

// Ping checks that the database answers a read and, unless the sink is
// read-only, that the writer can begin and commit a transaction (a file
// locked by another process beyond the busy timeout fails here).
func (s *Sink) Ping(ctx context.Context) error {
	if err := s.Broken(); err != nil {
		return err
	}
	var n int64
	if err := s.readQueryRow(ctx, qPing).Scan(&n); err != nil {
		return s.fail(err)
	}
	if s.wdb == nil {
		return nil
	}
	_, err := s.submit(ctx, nil, nil)
	return err
}
