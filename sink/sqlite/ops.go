package sqlite

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// leaseExpired is the last error of an attempt whose lease ran out.
const leaseExpired = "lease expired"

// keyRow is what a sighting needs to know about a stored key.
type keyRow struct {
	state       sink.State
	firstSource string
	sha         []byte
	nextAttempt int64
	leaseUntil  int64
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

// checkLease refuses a lease that would be expired when granted.
func checkLease(what string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("sqlite sink: %s: lease %v must be positive", what, lease)
	}
	return nil
}

func checkSighting(sg sink.Sighting) error {
	if sg.Key == "" {
		return errors.New("sqlite sink: record: empty key")
	}
	if err := sink.CheckKey(sg.Key); err != nil { // spec §12
		return err
	}
	if sg.Source == "" {
		return fmt.Errorf("sqlite sink: record %s: empty source", sg.Key)
	}
	return nil
}

// scanKeyRow reads the result of qKeyRow.
func scanKeyRow(row *sql.Row) (keyRow, bool, error) {
	var r keyRow
	var st string
	err := row.Scan(&st, &r.firstSource, &r.sha, &r.nextAttempt, &r.leaseUntil)
	if errors.Is(err, sql.ErrNoRows) {
		return keyRow{}, false, nil
	}
	r.state = sink.State(st)
	return r, err == nil, err
}

// noteDuplicate buffers a known key's sighting. A conflict is a non-empty
// payload from the first sighting's source whose SHA-256 differs from the
// stored first payload's: a webhook event and a listed operation are different
// documents for one completion, so differences across sources are expected.
func (s *Sink) noteDuplicate(sg sink.Sighting, firstSource string, storedSHA []byte) {
	conflict := false
	if sg.Source == firstSource && len(sg.Payload) > 0 && storedSHA != nil {
		conflict = !bytes.Equal(hashPayload(sg.Payload), storedSHA)
		if conflict {
			s.log.Warn("sqlite sink: payload conflict: a later sighting from the same source carries a different payload; the first one is kept",
				"db", s.path, "key", sg.Key, "source", sg.Source)
		}
	}
	s.stats.add(sg.Key, sg.Source, s.nowNS(), conflict)
}

// Record notes a sighting: a new key is inserted durably (sharing a commit
// with whatever else is queued); a known key only touches buffered statistics.
func (s *Sink) Record(ctx context.Context, sg sink.Sighting) (sink.RecordResult, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, err
	}
	if err := s.writable(); err != nil {
		return sink.RecordResult{}, err
	}
	if info, ok := s.done.get(sg.Key); ok {
		s.noteDuplicate(sg, info.firstSource, info.sha)
		return sink.RecordResult{State: sink.StateDone}, nil
	}
	r, found, err := scanKeyRow(s.readQueryRow(ctx, qKeyRow, sg.Key))
	if err != nil {
		return sink.RecordResult{}, s.fail(err)
	}
	if found {
		s.knownRow(sg, r)
		return sink.RecordResult{State: r.state}, nil
	}
	sha := hashPayload(sg.Payload)
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		rr, _, err := s.recordTx(tx, sg, sha)
		return rr, err
	}, nil)
	if err != nil {
		return sink.RecordResult{}, err
	}
	return v.(sink.RecordResult), nil
}

// knownRow buffers a duplicate of a stored key and caches it when done.
func (s *Sink) knownRow(sg sink.Sighting, r keyRow) {
	s.noteDuplicate(sg, r.firstSource, r.sha)
	if r.state == sink.StateDone {
		s.done.add(sg.Key, doneInfo{firstSource: r.firstSource, sha: r.sha})
	}
}

// recordTx inserts a new key as pending and due now, or (another writer got
// there first) notes a duplicate.
func (s *Sink) recordTx(tx *sql.Tx, sg sink.Sighting, sha []byte) (sink.RecordResult, keyRow, error) {
	now := s.nowNS()
	res, err := s.txExec(tx, qInsertKey, sg.Key, sg.Source, now)
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
			keyRow{state: sink.StatePending, firstSource: sg.Source, sha: sha, nextAttempt: now}, nil
	}
	r, _, err := scanKeyRow(s.txQueryRow(tx, qKeyRow, sg.Key))
	if err != nil {
		return sink.RecordResult{}, keyRow{}, err
	}
	s.knownRow(sg, r)
	return sink.RecordResult{State: r.state}, r, nil
}

// recordClaim is RecordAndClaim's result inside the writer.
type recordClaim struct {
	rr sink.RecordResult
	c  sink.Claim
}

// RecordAndClaim records a sighting and claims the key in the same commit when
// it can be claimed now (see sink.RecordClaimer).
func (s *Sink) RecordAndClaim(ctx context.Context, sg sink.Sighting, owner string, lease time.Duration) (sink.RecordResult, sink.Claim, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if err := checkLease("record and claim "+sg.Key, lease); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if err := s.writable(); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if info, ok := s.done.get(sg.Key); ok {
		s.noteDuplicate(sg, info.firstSource, info.sha)
		return sink.RecordResult{State: sink.StateDone}, sink.Claim{},
			fmt.Errorf("sqlite sink: %s is done: %w", sg.Key, sink.ErrNotClaimable)
	}
	r, found, err := scanKeyRow(s.readQueryRow(ctx, qKeyRow, sg.Key))
	if err != nil {
		return sink.RecordResult{}, sink.Claim{}, s.fail(err)
	}
	if found && !r.claimable(s.nowNS()) {
		s.knownRow(sg, r)
		return sink.RecordResult{State: r.state}, sink.Claim{},
			fmt.Errorf("sqlite sink: %s is %s: %w", sg.Key, r.state, sink.ErrNotClaimable)
	}
	sha := hashPayload(sg.Payload)
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		rr, _, err := s.recordTx(tx, sg, sha)
		if err != nil {
			return nil, err
		}
		c, err := s.claimTx(tx, sg.Key, owner, lease)
		if err == nil {
			rr.State = sink.StateClaimed
		}
		return recordClaim{rr: rr, c: c}, err
	}, nil)
	rc, _ := v.(recordClaim)
	return rc.rr, rc.c, err
}

// Claim takes the key for one attempt.
func (s *Sink) Claim(ctx context.Context, key, owner string, lease time.Duration) (sink.Claim, error) {
	if err := checkLease("claim "+key, lease); err != nil {
		return sink.Claim{}, err
	}
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		return s.claimTx(tx, key, owner, lease)
	}, nil)
	if err != nil {
		return sink.Claim{}, err
	}
	return v.(sink.Claim), nil
}

// claimTx grants a claim on a pending and due key, or takes over a claimed key
// whose lease expired (lease_until <= now); the expired attempt counts as
// failed with "lease expired", and when it was the last allowed attempt the
// key goes dead instead.
func (s *Sink) claimTx(tx *sql.Tx, key, owner string, lease time.Duration) (sink.Claim, error) {
	now := s.nowNS()
	var (
		st                        string
		attempts                  int
		token, leaseUntil, nextAt int64
		payload                   []byte
		firstSource               string
	)
	err := s.txQueryRow(tx, qClaimRow, key).Scan(&st, &attempts, &token, &leaseUntil, &nextAt, &payload, &firstSource)
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: %w", key, sink.ErrNotFound)
	}
	if err != nil {
		return sink.Claim{}, err
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
				key, attempts, s.opt.MaxAttempts, sink.ErrNotClaimable)
		}
	case st == string(sink.StatePending):
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: pending, next attempt at %s: %w",
			key, fromNS(nextAt).Format(time.RFC3339Nano), sink.ErrNotClaimable)
	case st == string(sink.StateClaimed):
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: claimed under a live lease until %s: %w",
			key, fromNS(leaseUntil).Format(time.RFC3339Nano), sink.ErrNotClaimable)
	default:
		return sink.Claim{}, fmt.Errorf("sqlite sink: claim %s: %s: %w", key, st, sink.ErrNotClaimable)
	}
	until := now + int64(lease)
	if _, err := s.txExec(tx, qClaim, token+1, attempts+1, owner, until, takeover, leaseExpired, key); err != nil {
		return sink.Claim{}, err
	}
	return sink.Claim{
		Key:         key,
		Token:       token + 1,
		Attempt:     attempts + 1,
		Owner:       owner,
		LeaseUntil:  fromNS(until),
		Payload:     payload,
		FirstSource: firstSource,
		Takeover:    takeover,
	}, nil
}

// ClaimDue claims up to limit due keys (limit <= 0: all), oldest first.
func (s *Sink) ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int) ([]sink.Claim, error) {
	if err := checkLease("claim due", lease); err != nil {
		return nil, err
	}
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		var claims []sink.Claim
		for {
			want := -1
			if limit > 0 {
				want = limit - len(claims)
				if want <= 0 {
					break
				}
			}
			rows, err := s.txQuery(tx, qDueKeys, s.nowNS())
			keys, err := scanKeys(rows, err, want)
			if err != nil {
				return nil, err
			}
			if len(keys) == 0 {
				break
			}
			skipped := 0
			for _, k := range keys {
				c, err := s.claimTx(tx, k, owner, lease)
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

// fencedTx explains why a token-checked write matched no row: ErrNotFound when
// the key is unknown, else ErrFenced, counted durably and logged.
func (s *Sink) fencedTx(tx *sql.Tx, what, key string, token int64) error {
	var st string
	var cur int64
	err := s.txQueryRow(tx, qFencedRow, key).Scan(&st, &cur)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite sink: %s %s: %w", what, key, sink.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if _, err := s.txExec(tx, qFencedInc); err != nil {
		return err
	}
	s.log.Error("sqlite sink: fenced outcome discarded: the claim's token is no longer current",
		"db", s.path, "op", what, "key", key, "token", token, "current_token", cur, "state", st)
	return fmt.Errorf("sqlite sink: %s %s with token %d (current token %d, state %s): %w", what, key, token, cur, st, sink.ErrFenced)
}

// Renew extends a claim's lease to now+lease while its token is current.
func (s *Sink) Renew(ctx context.Context, key string, token int64, lease time.Duration) error {
	if err := checkLease("renew "+key, lease); err != nil {
		return err
	}
	_, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		res, err := s.txExec(tx, qRenew, s.nowNS()+int64(lease), key, token)
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
	_, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		var info doneInfo
		err := s.txQueryRow(tx, qComplete, s.nowNS(), key, token).Scan(&info.firstSource)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, s.fencedTx(tx, "complete", key, token)
		}
		if err != nil {
			return nil, err
		}
		err = s.txQueryRow(tx, qPayloadSHA, key).Scan(&info.sha)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
		return info, err
	}, func(v any) { s.done.add(key, v.(doneInfo)) })
	return err
}

// Fail ends a claimed attempt: back to pending after backoff (and not before
// f.NotBefore), or dead when permanent or the attempts are exhausted.
func (s *Sink) Fail(ctx context.Context, key string, token int64, f sink.Failure) (sink.State, error) {
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
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
			_, err := s.txExec(tx, qFailDead, cause, key)
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
func (s *Sink) failUncountedTx(tx *sql.Tx, key string, attempts int, f sink.Failure, cause string) (sink.State, error) {
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

// Retry moves a dead key to pending, due now. Its attempts restart from zero
// (a fresh budget); the retries column counts operator retries and the last
// error stays until the next attempt ends.
func (s *Sink) Retry(ctx context.Context, key string) error {
	_, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		res, err := tx.ExecContext(context.Background(), `UPDATE gemrecon_keys SET state = 'pending', attempts = 0,
			retries = retries + 1, next_attempt_at = ?1, due_at = ?1, lease_owner = '', lease_until = 0
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
			return nil, fmt.Errorf("sqlite sink: retry %s: %w", key, sink.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("sqlite sink: retry %s: state is %s: %w", key, st, sink.ErrNotDead)
	}, nil)
	return err
}

// Purge deletes done rows whose done time is before doneBefore.
func (s *Sink) Purge(ctx context.Context, doneBefore time.Time) (int64, error) {
	v, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
		bg, before := context.Background(), toNS(doneBefore)
		if _, err := tx.ExecContext(bg, `DELETE FROM gemrecon_payloads WHERE key IN
			(SELECT key FROM gemrecon_keys WHERE state = 'done' AND due_at < ?)`, before); err != nil {
			return nil, err
		}
		res, err := tx.ExecContext(bg, `DELETE FROM gemrecon_keys WHERE state = 'done' AND due_at < ?`, before)
		if err != nil {
			return nil, err
		}
		return res.RowsAffected()
	}, func(any) { s.done.reset() })
	if err != nil {
		return 0, err
	}
	return v.(int64), nil
}

// NoteLookback records a poll's lookback (0 = forever) for MaxLookback.
func (s *Sink) NoteLookback(ctx context.Context, lookback time.Duration) error {
	if lookback < 0 {
		return fmt.Errorf("sqlite sink: negative lookback %v", lookback)
	}
	_, err := s.submit(ctx, func(tx *sql.Tx) (any, error) {
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
