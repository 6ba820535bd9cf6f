package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/sink"
)

// nowN is the current time for a statement whose parameter $N is the
// injected clock's reading, or NULL for the database clock (see nowArg).
const (
	now1 = `coalesce($1::timestamptz, now())`
	now2 = `coalesce($2::timestamptz, now())`
	now3 = `coalesce($3::timestamptz, now())`
)

func payloadHash(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	h := sha256.Sum256(p)
	return h[:]
}

// recordSQL inserts a new key, or reads the known one without writing (a
// duplicate costs no commit). Zero rows means another transaction inserted
// the key after this statement's snapshot: run it again.
const recordSQL = `
WITH ins AS (
	INSERT INTO gemrecon_keys (key, state, first_source, sources, seen_count,
		first_seen_at, last_seen_at, next_attempt_at, payload, payload_sha256)
	VALUES ($1, 'pending', $2, ARRAY[$2::text], 1, ` + now3 + `, ` + now3 + `, ` + now3 + `, $4, $5)
	ON CONFLICT (key) DO NOTHING
	RETURNING state, first_source, payload_sha256
)
SELECT true, state, first_source, payload_sha256 FROM ins
UNION ALL
SELECT false, state, first_source, payload_sha256 FROM gemrecon_keys
WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// Record notes a sighting: a new key is inserted pending and due now in one
// durable commit; a known key's statistics are buffered (see Flush).
func (s *Sink) Record(ctx context.Context, sg sink.Sighting) (sink.RecordResult, error) {
	if sg.Key == "" {
		return sink.RecordResult{}, errors.New("postgres: record: empty key")
	}
	if err := sink.CheckKey(sg.Key); err != nil { // spec §12
		return sink.RecordResult{}, err
	}
	if sg.Source == "" {
		return sink.RecordResult{}, fmt.Errorf("postgres: record %q: empty source", sg.Key)
	}
	sha := payloadHash(sg.Payload)
	if s.sightDone(ctx, sg, sha) {
		return sink.RecordResult{State: sink.StateDone}, nil
	}

	var (
		isNew       bool
		state       string
		firstSource string
		storedSHA   []byte
	)
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		for range maxRetries {
			err := c.QueryRow(ctx, recordSQL, sg.Key, sg.Source, s.nowArg(), sg.Payload, sha).
				Scan(&isNew, &state, &firstSource, &storedSHA)
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return fmt.Errorf("postgres: record %q: key vanished under concurrent writes", sg.Key)
	})
	if err != nil {
		return sink.RecordResult{}, fmt.Errorf("postgres: record %q: %w", sg.Key, err)
	}
	st := sink.State(state)
	if isNew {
		return sink.RecordResult{New: true, State: st}, nil
	}
	s.sightKnown(ctx, sg, sha, st, firstSource, storedSHA)
	return sink.RecordResult{State: st}, nil
}

// bufferLocked adds one duplicate sighting to the buffer; same is false for
// a payload conflict. s.mu is held.
func (s *Sink) bufferLocked(key, source string, same bool) {
	b := s.buf[key]
	if b == nil {
		b = &sighting{}
		s.buf[key] = b
	}
	b.n++
	if !s.dbClock {
		if t := s.opt.Now(); t.After(b.last) {
			b.last = t
		}
	}
	if !slices.Contains(b.sources, source) {
		b.sources = append(b.sources, source)
	}
	if !same {
		b.conflicts++
		s.log.Warn("postgres sink: payload conflict: a later sighting from the same source carries a different payload; the first one is kept",
			"key", key, "source", source)
	}
}

// noteDoneLocked remembers a done key; s.mu is held.
func (s *Sink) noteDoneLocked(key, firstSource string, sha []byte) {
	if len(s.done) >= doneCacheMax {
		clear(s.done) // crude bound: the cache is an optimisation
	}
	s.done[key] = doneInfo{firstSource: firstSource, sha: sha}
}

func (s *Sink) maybeFlush(ctx context.Context, buffered int) {
	if buffered >= flushAt {
		_ = s.Flush(ctx) // statistics: on failure they stay buffered
	}
}

// flushSQL applies buffered statistics to many keys in one statement.
const flushSQL = `
UPDATE gemrecon_keys k SET
	seen_count   = k.seen_count + d.n,
	last_seen_at = greatest(k.last_seen_at, coalesce(d.last, now())),
	sources      = k.sources || ARRAY(
		SELECT x.s FROM jsonb_array_elements_text(d.srcs) WITH ORDINALITY AS x(s, i)
		WHERE x.s <> ALL (k.sources) ORDER BY x.i),
	conflicts    = k.conflicts + d.c
FROM jsonb_to_recordset($1::jsonb) AS d(k text, n bigint, last timestamptz, srcs jsonb, c bigint)
WHERE k.key = d.k`

type flushRow struct {
	Key       string     `json:"k"`
	N         int64      `json:"n"`
	Last      *time.Time `json:"last"`
	Sources   []string   `json:"srcs"`
	Conflicts int64      `json:"c"`
}

// Flush writes buffered sighting statistics now, in one statement. On
// failure they stay buffered.
func (s *Sink) Flush(ctx context.Context) error {
	s.mu.Lock()
	if len(s.buf) == 0 {
		s.mu.Unlock()
		return nil
	}
	taken := s.buf
	s.buf = make(map[string]*sighting)
	s.mu.Unlock()

	rows := make([]flushRow, 0, len(taken))
	for k, b := range taken {
		r := flushRow{Key: k, N: b.n, Sources: b.sources, Conflicts: b.conflicts}
		if !b.last.IsZero() {
			t := b.last
			r.Last = &t
		}
		rows = append(rows, r)
	}
	doc, err := json.Marshal(rows)
	if err == nil {
		// Statistics are additive: they are buffered again only when the
		// update certainly rolled back; after an unknown outcome they are
		// dropped rather than maybe counted twice.
		err = s.write(ctx, func(c *pgx.Conn) error {
			_, err := c.Exec(ctx, flushSQL, doc)
			return err
		})
	}
	if err != nil && !unknownOutcome(err) {
		s.mu.Lock()
		for k, b := range taken {
			s.mergeLocked(k, b)
		}
		s.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("postgres: flush sighting statistics: %w", err)
	}
	return nil
}

func (s *Sink) mergeLocked(key string, b *sighting) {
	cur := s.buf[key]
	if cur == nil {
		s.buf[key] = b
		return
	}
	cur.n += b.n
	cur.conflicts += b.conflicts
	if b.last.After(cur.last) {
		cur.last = b.last
	}
	for _, src := range b.sources {
		if !slices.Contains(cur.sources, src) {
			cur.sources = append(cur.sources, src)
		}
	}
}

// claimTail ends a statement that begins with a CTE "old" choosing and
// locking rows (claimOneSQL, claimDueSQL), and claims those rows:
// pending → claimed, or an expired lease taken over (the expired attempt
// counts as failed, "lease expired"; if it was the last allowed attempt the
// key goes dead instead). Parameters: $1 now, $2 lease µs, $3 owner, $4 max
// attempts, $5 nonce, $6 the key or the limit (NULL: no limit).
const claimTail = `),
upd AS (
	UPDATE gemrecon_keys k SET
		state           = CASE WHEN o.takeover AND k.attempts >= $4 THEN 'dead' ELSE 'claimed' END,
		token           = CASE WHEN o.takeover AND k.attempts >= $4 THEN k.token ELSE k.token + 1 END,
		attempts        = CASE WHEN o.takeover AND k.attempts >= $4 THEN k.attempts ELSE k.attempts + 1 END,
		lease_owner     = CASE WHEN o.takeover AND k.attempts >= $4 THEN NULL ELSE $3 END,
		lease_until     = CASE WHEN o.takeover AND k.attempts >= $4 THEN NULL
		                       ELSE ` + now1 + ` + $2 * interval '1 microsecond' END,
		claim_nonce     = $5,
		took_over       = o.takeover,
		next_attempt_at = NULL,
		last_error      = CASE WHEN o.takeover THEN 'lease expired' ELSE k.last_error END
	FROM old o
	WHERE k.key = o.key
	RETURNING k.key, k.state, k.token, k.attempts, k.lease_owner, k.lease_until,
		k.payload, k.first_source, k.took_over, o.due_at, k.first_seen_at
)
SELECT key, state, token, attempts, coalesce(lease_owner, ''), lease_until, payload, first_source, took_over
FROM upd ORDER BY due_at, first_seen_at, key`

// claimableWhere: pending and due, or claimed under an expired lease (a
// lease is live while now < lease_until). $1 is now.
const claimableWhere = `((state = 'pending' AND next_attempt_at <= ` + now1 + `)
	OR (state = 'claimed' AND lease_until <= ` + now1 + `))`

// dueOrder is "oldest first": by the time a key became due (its next
// attempt, or its lease's end), then by first sighting — as sink/sqlite.
const (
	dueAt    = `CASE state WHEN 'pending' THEN next_attempt_at ELSE lease_until END`
	dueOrder = dueAt + `, first_seen_at, key`
)

const (
	claimOneSQL = `WITH old AS (SELECT key, state = 'claimed' AS takeover, ` + dueAt + ` AS due_at
		FROM gemrecon_keys WHERE key = $6 AND ` + claimableWhere + ` FOR UPDATE` + claimTail
	claimDueSQL = `WITH old AS (SELECT key, state = 'claimed' AS takeover, ` + dueAt + ` AS due_at
		FROM gemrecon_keys WHERE ` + claimableWhere + ` ORDER BY ` + dueOrder + ` LIMIT $6 FOR UPDATE SKIP LOCKED` + claimTail
)

// claimRow is one row of claimTail.
type claimRow struct {
	claim sink.Claim
	state string
}

func scanClaims(rows pgx.Rows) ([]claimRow, error) {
	var out []claimRow
	for rows.Next() {
		var r claimRow
		var leaseUntil *time.Time
		if err := rows.Scan(&r.claim.Key, &r.state, &r.claim.Token, &r.claim.Attempt, &r.claim.Owner,
			&leaseUntil, &r.claim.Payload, &r.claim.FirstSource, &r.claim.Takeover); err != nil {
			rows.Close()
			return nil, err
		}
		if leaseUntil != nil {
			r.claim.LeaseUntil = leaseUntil.UTC()
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func nonce() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	n := int64(0)
	for _, x := range b {
		n = n<<8 | int64(x)
	}
	if n < 0 {
		n = -n
	}
	return n
}

// Claim takes the key for one attempt, in one autocommit statement.
func (s *Sink) Claim(ctx context.Context, key, owner string, lease time.Duration) (sink.Claim, error) {
	nc := nonce()
	var got []claimRow
	err := s.write(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, claimOneSQL, s.nowArg(), micros(lease), owner, s.opt.MaxAttempts, nc, key)
		if err != nil {
			return err
		}
		got, err = scanClaims(rows)
		return err
	})
	if unknownOutcome(err) {
		got, err = s.readBackClaims(ctx, nc)
		if err != nil {
			return sink.Claim{}, fmt.Errorf("postgres: claim %q: outcome unknown and not read back: %w", key, err)
		}
		if len(got) == 0 {
			return sink.Claim{}, fmt.Errorf("postgres: claim %q: not claimed (the statement was cut off: %w)", key, ctx.Err())
		}
	} else if err != nil {
		return sink.Claim{}, fmt.Errorf("postgres: claim %q: %w", key, withCtxErr(ctx, err))
	}
	if len(got) == 1 && got[0].state == string(sink.StateClaimed) {
		return got[0].claim, nil
	}
	// Not claimed: tell unknown from unclaimable (including a takeover of
	// the last allowed attempt, which made the key dead).
	var exists bool
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)`, key).Scan(&exists)
	})
	if err != nil {
		return sink.Claim{}, fmt.Errorf("postgres: claim %q: %w", key, err)
	}
	if !exists {
		return sink.Claim{}, fmt.Errorf("postgres: claim %q: %w", key, sink.ErrNotFound)
	}
	return sink.Claim{}, fmt.Errorf("postgres: claim %q: %w", key, sink.ErrNotClaimable)
}

// readBackClaims returns the claims a cut-off claim statement made, found by
// its nonce: after settle, the database's answer is final.
func (s *Sink) readBackClaims(ctx context.Context, nc int64) ([]claimRow, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	var got []claimRow
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT key, state, token, attempts, coalesce(lease_owner, ''), lease_until,
			payload, first_source, took_over
			FROM gemrecon_keys WHERE claim_nonce = $1 AND state = 'claimed' ORDER BY first_seen_at, key`, nc)
		if err != nil {
			return err
		}
		got, err = scanClaims(rows)
		return err
	})
	return got, err
}

// ClaimDue claims up to limit due keys (limit <= 0: all), oldest first,
// skipping rows that other claimers hold locked.
func (s *Sink) ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int) ([]sink.Claim, error) {
	var out []sink.Claim
	for limit <= 0 || len(out) < limit {
		nc := nonce()
		var want any // NULL: LIMIT ALL
		if limit > 0 {
			want = limit - len(out)
		}
		var got []claimRow
		err := s.write(ctx, func(c *pgx.Conn) error {
			rows, err := c.Query(ctx, claimDueSQL, s.nowArg(), micros(lease), owner, s.opt.MaxAttempts, nc, want)
			if err != nil {
				return err
			}
			got, err = scanClaims(rows)
			return err
		})
		if unknownOutcome(err) {
			var rerr error
			got, rerr = s.readBackClaims(ctx, nc)
			if rerr != nil {
				return out, fmt.Errorf("postgres: claim due: outcome unknown (%w) and not read back: %w", err, rerr)
			}
			if len(got) == 0 {
				return out, fmt.Errorf("postgres: claim due: nothing claimed (the statement was cut off: %w)", err)
			}
			// The read-back is the database's final answer: these are ours.
			for _, r := range got {
				out = append(out, r.claim)
			}
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("postgres: claim due: %w", err)
		}
		claimed := 0
		for _, r := range got {
			if r.state == string(sink.StateClaimed) {
				out = append(out, r.claim)
				claimed++
			}
		}
		// Rows that went dead (takeover of the last attempt) used up part
		// of the limit: look again, unless nothing more was due.
		if len(got) == 0 || claimed == len(got) {
			break
		}
	}
	return out, nil
}

// fencedHead + UPDATE … RETURNING + fencedMid + upd columns + fencedTail
// wraps a fenced update (CTE "upd", which returns its rows) so
// that a miss increments the durable fenced counter in the same statement.
// The result: whether upd matched, the upd columns, and the key's state and
// token as the statement found them (NULL: no such key).
const (
	fencedHead = `WITH upd AS (`
	fencedMid  = `),
fenced AS (
	UPDATE gemrecon_counters SET value = value + 1
	WHERE name = 'fenced' AND NOT EXISTS (SELECT 1 FROM upd)
		AND EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)
	RETURNING value
)
SELECT EXISTS (SELECT 1 FROM upd), `
	fencedTail = `, cur.state, cur.token
FROM (SELECT 1) AS one LEFT JOIN upd ON true LEFT JOIN gemrecon_keys cur ON cur.key = $1`
)

const (
	renewSQL = fencedHead + `UPDATE gemrecon_keys
		SET lease_until = ` + now3 + ` + $4 * interval '1 microsecond'
		WHERE key = $1 AND state = 'claimed' AND token = $2 RETURNING lease_until` +
		fencedMid + `upd.lease_until` + fencedTail
	completeSQL = fencedHead + `UPDATE gemrecon_keys
		SET state = 'done', done_at = ` + now3 + `,
			lease_owner = NULL, lease_until = NULL, next_attempt_at = NULL
		WHERE key = $1 AND state = 'claimed' AND token = $2 RETURNING first_source, payload_sha256` +
		fencedMid + `upd.first_source, upd.payload_sha256` + fencedTail
	// $4 permanent, $5 max attempts, $6 backoff µs per attempt (1-based,
	// the last element serves any later attempt), $7 not-before, $8 cause,
	// $9 uncounted (Failure.NoAttempt: attempts go back to their value before
	// the claim, the key to pending at $7 — now if that has passed — or
	// after the backoff of the restored count; never dead).
	failSQL = fencedHead + `UPDATE gemrecon_keys SET
			state = CASE WHEN NOT $9 AND ($4 OR attempts >= $5) THEN 'dead' ELSE 'pending' END,
			attempts = CASE WHEN $9 THEN greatest(attempts - 1, 0) ELSE attempts END,
			next_attempt_at = CASE
				WHEN $9 AND $7::timestamptz IS NOT NULL THEN greatest(` + now3 + `, $7::timestamptz)
				WHEN $9 THEN ` + now3 + `
					+ ($6::bigint[])[least(greatest(attempts - 1, 1), cardinality($6::bigint[]))] * interval '1 microsecond'
				WHEN $4 OR attempts >= $5 THEN NULL ELSE
				greatest(` + now3 + `
					+ ($6::bigint[])[least(greatest(attempts, 1), cardinality($6::bigint[]))] * interval '1 microsecond',
					$7::timestamptz) END,
			last_error = $8, lease_owner = NULL, lease_until = NULL
		WHERE key = $1 AND state = 'claimed' AND token = $2 RETURNING state` +
		fencedMid + `upd.state` + fencedTail
)

// current is a key's state and token as a fenced statement found them.
type current struct {
	state *string
	token *int64
}

// fencedErr is the error of a token-checked write that matched no row:
// ErrNotFound when the key is unknown (not counted), else ErrFenced (counted
// by the statement itself, and logged loudly here).
func (s *Sink) fencedErr(op, key string, token int64, cur current) error {
	if cur.state == nil || cur.token == nil {
		return fmt.Errorf("postgres: %s %q token %d: %w", op, key, token, sink.ErrNotFound)
	}
	s.log.Error("postgres sink: fenced outcome discarded: the claim's token is no longer current",
		"op", op, "key", key, "token", token, "current_token", *cur.token, "state", *cur.state)
	return fmt.Errorf("postgres: %s %q with token %d (current token %d, state %s): %w",
		op, key, token, *cur.token, *cur.state, sink.ErrFenced)
}

// Renew extends a live lease, fenced on the token.
func (s *Sink) Renew(ctx context.Context, key string, token int64, lease time.Duration) error {
	var ok bool
	var cur current
	var until *time.Time
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, renewSQL, key, token, s.nowArg(), micros(lease)).Scan(&ok, &until, &cur.state, &cur.token)
	})
	if err != nil {
		// A renewal cut off is harmless to repeat; report it.
		return fmt.Errorf("postgres: renew %q: %w", key, err)
	}
	if !ok {
		return s.fencedErr("renew", key, token, cur)
	}
	return nil
}

// completeReadBack settles a Complete (or CompleteSQL) whose reply was lost:
// the row says whether it committed.
func (s *Sink) completeReadBack(ctx context.Context, key string, token int64, err error) error {
	e, rerr := s.readBack(ctx, key)
	switch {
	case rerr != nil:
		return fmt.Errorf("postgres: complete %q: outcome unknown (%w) and not read back: %w", key, err, rerr)
	case e.State == sink.StateDone && e.Token == token:
		s.mu.Lock()
		s.noteDoneLocked(key, e.FirstSource, payloadHash(e.Payload))
		s.mu.Unlock()
		return nil
	case e.State == sink.StateClaimed && e.Token == token:
		return fmt.Errorf("postgres: complete %q: not applied (read back: still claimed): %w", key, err)
	default:
		return fmt.Errorf("postgres: complete %q token %d: read back state %s token %d: %w", key, token, e.State, e.Token, sink.ErrFenced)
	}
}

// Complete marks the claimed key done if token is current, else ErrFenced.
// A completion whose outcome is unknown is read back.
func (s *Sink) Complete(ctx context.Context, key string, token int64) error {
	var ok bool
	var cur current
	var firstSource *string
	var sha []byte
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, completeSQL, key, token, s.nowArg()).Scan(&ok, &firstSource, &sha, &cur.state, &cur.token)
	})
	if unknownOutcome(err) {
		return s.completeReadBack(ctx, key, token, err)
	}
	if err != nil {
		return fmt.Errorf("postgres: complete %q: %w", key, withCtxErr(ctx, err))
	}
	if !ok {
		return s.fencedErr("complete", key, token, cur)
	}
	s.mu.Lock()
	s.noteDoneLocked(key, deref(firstSource), sha)
	s.mu.Unlock()
	return nil
}

// withCtxErr makes an error caused by the context's end (the server
// cancelled the statement on request) match ctx.Err() too.
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	return err
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// readBack reads one row after an unknown outcome, with its own deadline.
func (s *Sink) readBack(ctx context.Context, key string) (sink.Entry, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	return s.get(ctx, key)
}

// Fail ends an attempt: back to pending after backoff, or dead when
// permanent or when attempts reached MaxAttempts. Fenced like Complete.
func (s *Sink) Fail(ctx context.Context, key string, token int64, f sink.Failure) (sink.State, error) {
	r := s.opt.Rand()
	fixed := func() float64 { return r }
	n := s.opt.MaxAttempts
	if n < 1 {
		n = 1
	}
	backoffs := make([]int64, n)
	for i := range backoffs {
		backoffs[i] = micros(sink.Backoff(i+1, s.opt.RetryBase, s.opt.RetryMax, fixed))
	}
	var notBefore any
	if !f.NotBefore.IsZero() {
		notBefore = f.NotBefore
	}
	cause := sink.TruncateError(f.Cause)
	var ok bool
	var cur current
	var state *string
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, failSQL, key, token, s.nowArg(), f.Permanent, s.opt.MaxAttempts, backoffs, notBefore, cause, f.NoAttempt).
			Scan(&ok, &state, &cur.state, &cur.token)
	})
	if unknownOutcome(err) {
		e, rerr := s.readBack(ctx, key)
		switch {
		case rerr != nil:
			return "", fmt.Errorf("postgres: fail %q: outcome unknown (%w) and not read back: %w", key, err, rerr)
		case e.Token == token && e.State == sink.StateClaimed:
			return "", fmt.Errorf("postgres: fail %q: not applied (read back: still claimed): %w", key, err)
		case e.Token == token && (e.State == sink.StatePending || e.State == sink.StateDead) && e.LastError == cause:
			return e.State, nil
		default:
			return "", fmt.Errorf("postgres: fail %q token %d: read back state %s token %d: %w", key, token, e.State, e.Token, sink.ErrFenced)
		}
	}
	if err != nil {
		return "", fmt.Errorf("postgres: fail %q: %w", key, withCtxErr(ctx, err))
	}
	if !ok {
		return "", s.fencedErr("fail", key, token, cur)
	}
	return sink.State(deref(state)), nil
}

// Retry moves a dead key to pending, due now, with a fresh attempt budget
// (attempts restart from zero, as in sink/sqlite); the token keeps growing,
// retries counts operator retries and the last error stays until the next
// attempt ends.
func (s *Sink) Retry(ctx context.Context, key string) error {
	var state *string
	var updated bool
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `
			WITH upd AS (
				UPDATE gemrecon_keys SET state = 'pending', next_attempt_at = `+now2+`,
					attempts = 0, retries = retries + 1, lease_owner = NULL, lease_until = NULL
				WHERE key = $1 AND state = 'dead' RETURNING key)
			SELECT EXISTS (SELECT 1 FROM upd), (SELECT state FROM gemrecon_keys WHERE key = $1)`,
			key, s.nowArg()).Scan(&updated, &state)
	})
	switch {
	case err != nil:
		return fmt.Errorf("postgres: retry %q: %w", key, err)
	case updated:
		return nil
	case state == nil:
		return fmt.Errorf("postgres: retry %q: %w", key, sink.ErrNotFound)
	default:
		return fmt.Errorf("postgres: retry %q is %s: %w", key, *state, sink.ErrNotDead)
	}
}

// Due lists keys that can be claimed now, oldest first.
func (s *Sink) Due(ctx context.Context, limit int) ([]string, error) {
	q := `SELECT key FROM gemrecon_keys WHERE ` + claimableWhere + ` ORDER BY ` + dueOrder
	args := []any{s.nowArg()}
	if limit > 0 {
		q += ` LIMIT $2`
		args = append(args, limit)
	}
	var keys []string
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		keys = keys[:0]
		rows, err := c.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				rows.Close()
				return err
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: due: %w", err)
	}
	return keys, nil
}

const entryColumns = `key, state, attempts, token, first_source, sources, seen_count, first_seen_at,
	last_seen_at, coalesce(lease_owner, ''), lease_until, next_attempt_at, done_at,
	coalesce(last_error, ''), conflicts, payload`

func scanEntry(row pgx.Row) (sink.Entry, error) {
	var e sink.Entry
	var state string
	var leaseUntil, next, done *time.Time
	err := row.Scan(&e.Key, &state, &e.Attempts, &e.Token, &e.FirstSource, &e.Sources, &e.SeenCount,
		&e.FirstSeenAt, &e.LastSeenAt, &e.LeaseOwner, &leaseUntil, &next, &done, &e.LastError,
		&e.Conflicts, &e.Payload)
	if err != nil {
		return e, err
	}
	e.State = sink.State(state)
	e.FirstSeenAt = e.FirstSeenAt.UTC()
	e.LastSeenAt = e.LastSeenAt.UTC()
	if leaseUntil != nil {
		e.LeaseUntil = leaseUntil.UTC()
	}
	if next != nil {
		e.NextAttemptAt = next.UTC()
	}
	if done != nil {
		e.DoneAt = done.UTC()
	}
	return e, nil
}

// Get returns one key's entry (buffered statistics flushed first), or
// ErrNotFound.
func (s *Sink) Get(ctx context.Context, key string) (sink.Entry, error) {
	if err := s.Flush(ctx); err != nil {
		return sink.Entry{}, err
	}
	return s.get(ctx, key)
}

func (s *Sink) get(ctx context.Context, key string) (sink.Entry, error) {
	var e sink.Entry
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var err error
		e, err = scanEntry(c.QueryRow(ctx, `SELECT `+entryColumns+` FROM gemrecon_keys WHERE key = $1`, key))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return sink.Entry{}, fmt.Errorf("postgres: get %q: %w", key, sink.ErrNotFound)
	}
	if err != nil {
		return sink.Entry{}, fmt.Errorf("postgres: get %q: %w", key, err)
	}
	return e, nil
}

// List returns entries, oldest first.
func (s *Sink) List(ctx context.Context, opt sink.ListOptions) ([]sink.Entry, error) {
	if opt.State != "" && !opt.State.Valid() {
		return nil, fmt.Errorf("postgres: list: unknown state %q (want pending, claimed, done or dead)", opt.State)
	}
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	q := `SELECT ` + entryColumns + ` FROM gemrecon_keys WHERE ($1 = '' OR state = $1) ORDER BY first_seen_at, key`
	args := []any{string(opt.State)}
	if opt.Limit > 0 {
		q += ` LIMIT $2`
		args = append(args, opt.Limit)
	}
	var out []sink.Entry
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		out = out[:0]
		rows, err := c.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			e, err := scanEntry(rows)
			if err != nil {
				return err
			}
			out = append(out, e)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: list: %w", err)
	}
	return out, nil
}

// Stats summarises the sink from one snapshot. Latency percentiles are
// nearest-rank (percentile_disc) over done keys' done_at − first_seen_at.
func (s *Sink) Stats(ctx context.Context) (sink.Stats, error) {
	if err := s.Flush(ctx); err != nil {
		return sink.Stats{}, err
	}
	st := sink.Stats{
		ByState:     map[sink.State]int64{sink.StatePending: 0, sink.StateClaimed: 0, sink.StateDone: 0, sink.StateDead: 0},
		FirstSource: map[string]int64{},
	}
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		rows, err := tx.Query(ctx, `SELECT state, count(*) FROM gemrecon_keys GROUP BY state`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var state string
			var n int64
			if err := rows.Scan(&state, &n); err != nil {
				rows.Close()
				return err
			}
			st.ByState[sink.State(state)] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT first_source, count(*) FROM gemrecon_keys GROUP BY first_source`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var src string
			var n int64
			if err := rows.Scan(&src, &n); err != nil {
				rows.Close()
				return err
			}
			st.FirstSource[src] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		var oldest, p50, p99, max *float64
		err = tx.QueryRow(ctx, `SELECT
				coalesce(sum(seen_count - 1), 0)::bigint,
				coalesce(sum(conflicts), 0)::bigint,
				(SELECT value FROM gemrecon_counters WHERE name = 'fenced'),
				extract(epoch FROM `+now1+` - min(first_seen_at) FILTER (WHERE state = 'pending')) * 1e6,
				percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - first_seen_at) * 1e6)
					FILTER (WHERE state = 'done'),
				percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - first_seen_at) * 1e6)
					FILTER (WHERE state = 'done'),
				(max(extract(epoch FROM done_at - first_seen_at)) FILTER (WHERE state = 'done')) * 1e6
			FROM gemrecon_keys`, s.nowArg()).
			Scan(&st.DuplicatesSuppressed, &st.Conflicts, &st.Fenced, &oldest, &p50, &p99, &max)
		if err != nil {
			return err
		}
		st.OldestPendingAge = microsDuration(oldest)
		st.LatencyP50 = microsDuration(p50)
		st.LatencyP99 = microsDuration(p99)
		st.LatencyMax = microsDuration(max)
		if st.Passes, err = passRecords(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return sink.Stats{}, fmt.Errorf("postgres: stats: %w", err)
	}
	return st, nil
}

func microsDuration(f *float64) time.Duration {
	if f == nil || *f < 0 {
		return 0
	}
	return time.Duration(*f+0.5) * time.Microsecond
}

// Purge deletes done rows whose done time is before doneBefore.
func (s *Sink) Purge(ctx context.Context, doneBefore time.Time) (int64, error) {
	var n int64
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		tag, err := c.Exec(ctx, `DELETE FROM gemrecon_keys WHERE state = 'done' AND done_at < $1`, doneBefore)
		n = tag.RowsAffected()
		return err
	})
	// A purged key seen again must be new again: forget what was done.
	s.mu.Lock()
	clear(s.done)
	s.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("postgres: purge: %w", err)
	}
	return n, nil
}

// NoteLookback records that a poll used this lookback (0 = forever).
func (s *Sink) NoteLookback(ctx context.Context, lookback time.Duration) error {
	if lookback < 0 {
		return fmt.Errorf("postgres: note lookback %v: negative", lookback)
	}
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `INSERT INTO gemrecon_lookback (id, max_micros, forever) VALUES (1, $1, $2)
			ON CONFLICT (id) DO UPDATE SET
				max_micros = greatest(gemrecon_lookback.max_micros, excluded.max_micros),
				forever = gemrecon_lookback.forever OR excluded.forever`, micros(lookback), lookback == 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("postgres: note lookback: %w", err)
	}
	return nil
}

// MaxLookback returns the longest lookback ever noted.
func (s *Sink) MaxLookback(ctx context.Context) (d time.Duration, forever bool, ok bool, err error) {
	var us int64
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT max_micros, forever FROM gemrecon_lookback WHERE id = 1`).Scan(&us, &forever)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, false, nil
	}
	if err != nil {
		return 0, false, false, fmt.Errorf("postgres: max lookback: %w", err)
	}
	return time.Duration(us) * time.Microsecond, forever, true, nil
}

// Ping checks that the database answers and, unless read-only, accepts
// writes (not a standby, not a read-only transaction default).
func (s *Sink) Ping(ctx context.Context) error {
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var recovery bool
		var ro string
		if err := c.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&recovery, &ro); err != nil {
			return err
		}
		if s.opt.ReadOnly {
			return nil
		}
		if recovery || ro == "on" {
			return errors.New("database is read-only")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("postgres: ping: %w", err)
	}
	return nil
}

// recordClaimSQL inserts a new key already claimed (one commit for record
// and claim), or reads a known key without writing, with whether it can be
// claimed now. Parameters as recordSQL, then $6 owner, $7 lease µs, $8 nonce.
const recordClaimSQL = `
WITH ins AS (
	INSERT INTO gemrecon_keys (key, state, first_source, sources, seen_count,
		first_seen_at, last_seen_at, payload, payload_sha256,
		attempts, token, lease_owner, lease_until, claim_nonce)
	VALUES ($1, 'claimed', $2, ARRAY[$2::text], 1, ` + now3 + `, ` + now3 + `, $4, $5,
		1, 1, $6, ` + now3 + ` + $7 * interval '1 microsecond', $8)
	ON CONFLICT (key) DO NOTHING
	RETURNING state, first_source, payload_sha256, lease_until
)
SELECT true, state, first_source, payload_sha256, lease_until, false FROM ins
UNION ALL
SELECT false, state, first_source, payload_sha256, lease_until,
	(state = 'pending' AND next_attempt_at <= ` + now3 + `) OR (state = 'claimed' AND lease_until <= ` + now3 + `)
FROM gemrecon_keys
WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

var _ sink.RecordClaimer = (*Sink)(nil)

// RecordAndClaim records a sighting and claims the key when it can be
// claimed now (sink.RecordClaimer). A new key is inserted already claimed,
// in one commit; a known, claimable key is claimed by Claim; a sighting of a
// key that cannot be claimed costs no commit and returns ErrNotClaimable.
func (s *Sink) RecordAndClaim(ctx context.Context, sg sink.Sighting, owner string, lease time.Duration) (sink.RecordResult, sink.Claim, error) {
	if sg.Key == "" {
		return sink.RecordResult{}, sink.Claim{}, errors.New("postgres: record: empty key")
	}
	if err := sink.CheckKey(sg.Key); err != nil { // spec §12
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if sg.Source == "" {
		return sink.RecordResult{}, sink.Claim{}, fmt.Errorf("postgres: record %q: empty source", sg.Key)
	}
	sha := payloadHash(sg.Payload)
	if s.sightDone(ctx, sg, sha) {
		return sink.RecordResult{State: sink.StateDone}, sink.Claim{},
			fmt.Errorf("postgres: record and claim %q: done: %w", sg.Key, sink.ErrNotClaimable)
	}

	nc := nonce()
	var (
		isNew, claimable bool
		state            string
		firstSource      string
		storedSHA        []byte
		leaseUntil       *time.Time
	)
	err := s.write(ctx, func(c *pgx.Conn) error {
		for range maxRetries {
			err := c.QueryRow(ctx, recordClaimSQL, sg.Key, sg.Source, s.nowArg(), sg.Payload, sha,
				owner, micros(lease), nc).Scan(&isNew, &state, &firstSource, &storedSHA, &leaseUntil, &claimable)
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return fmt.Errorf("key vanished under concurrent writes")
	})
	if unknownOutcome(err) {
		got, rerr := s.readBackClaims(ctx, nc)
		if rerr != nil || len(got) != 1 {
			return sink.RecordResult{}, sink.Claim{}, fmt.Errorf("postgres: record and claim %q: outcome unknown (%w), read back: %v claims, %v", sg.Key, err, len(got), rerr)
		}
		return sink.RecordResult{New: got[0].claim.Token == 1, State: sink.StateClaimed}, got[0].claim, nil
	}
	if err != nil {
		return sink.RecordResult{}, sink.Claim{}, fmt.Errorf("postgres: record and claim %q: %w", sg.Key, err)
	}
	if isNew {
		c := sink.Claim{Key: sg.Key, Token: 1, Attempt: 1, Owner: owner, Payload: sg.Payload, FirstSource: sg.Source}
		if leaseUntil != nil {
			c.LeaseUntil = leaseUntil.UTC()
		}
		return sink.RecordResult{New: true, State: sink.StateClaimed}, c, nil
	}
	st := sink.State(state)
	s.sightKnown(ctx, sg, sha, st, firstSource, storedSHA)
	rr := sink.RecordResult{State: st}
	if !claimable {
		return rr, sink.Claim{}, fmt.Errorf("postgres: record and claim %q: %s: %w", sg.Key, st, sink.ErrNotClaimable)
	}
	c, err := s.Claim(ctx, sg.Key, owner, lease)
	if err != nil {
		return rr, sink.Claim{}, err
	}
	return sink.RecordResult{State: sink.StateClaimed}, c, nil
}

// sameDoc reports whether a sighting is not a payload conflict: a conflict
// is a non-empty payload from the first sighting's source whose SHA-256
// differs from the first payload's (a webhook event and a listed operation
// are different documents for one completion).
func sameDoc(source string, sha []byte, firstSource string, firstSHA []byte) bool {
	return source != firstSource || sha == nil || firstSHA == nil || bytes.Equal(sha, firstSHA)
}

// sightDone answers a sighting of a key this process knows is done from
// memory: its statistics are buffered (no round trip) and it reports true.
func (s *Sink) sightDone(ctx context.Context, sg sink.Sighting, sha []byte) bool {
	s.mu.Lock()
	di, isDone := s.done[sg.Key]
	if isDone {
		s.bufferLocked(sg.Key, sg.Source, sameDoc(sg.Source, sha, di.firstSource, di.sha))
	}
	n := len(s.buf)
	s.mu.Unlock()
	if isDone {
		s.maybeFlush(ctx, n)
	}
	return isDone
}

// sightKnown buffers a sighting of a key the database already held, and
// remembers it in memory if it is done.
func (s *Sink) sightKnown(ctx context.Context, sg sink.Sighting, sha []byte, st sink.State, firstSource string, storedSHA []byte) {
	s.mu.Lock()
	s.bufferLocked(sg.Key, sg.Source, sameDoc(sg.Source, sha, firstSource, storedSHA))
	if st == sink.StateDone {
		s.noteDoneLocked(sg.Key, firstSource, storedSHA)
	}
	n := len(s.buf)
	s.mu.Unlock()
	s.maybeFlush(ctx, n)
}
