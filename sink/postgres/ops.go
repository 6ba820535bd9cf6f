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

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/sink"
)

// nowN is the current time for a statement whose parameter $N is the
// injected clock's reading, or NULL for the database clock (see nowArg).
const (
	now1 = `coalesce($1::timestamptz, now())`
	now2 = `coalesce($2::timestamptz, now())`
	now3 = `coalesce($3::timestamptz, now())`
	now5 = `coalesce($5::timestamptz, now())`
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
		first_seen_at, last_seen_at, next_attempt_at, payload, payload_sha256,
		confirmed, batch_state, needs_confirm)
	VALUES ($1, 'pending', $2, ARRAY[$2::text], 1, ` + now3 + `, ` + now3 + `, ` + now3 + `, $4, $5, $6, $7, $8)
	ON CONFLICT (key) DO NOTHING
	RETURNING state, first_source, confirmed, batch_state, needs_confirm
)
SELECT true, state, first_source, confirmed, batch_state, needs_confirm FROM ins
UNION ALL
SELECT false, state, first_source, confirmed, batch_state, needs_confirm FROM gemrecon_keys
WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// known is what a sighting of a stored key needs to know about it.
type known struct {
	state        sink.State
	firstSource  string
	confirmed    bool
	batchState   string
	needsConfirm bool
}

func checkSighting(sg sink.Sighting) error {
	if sg.Key == "" {
		return errors.New("postgres: record: empty key")
	}
	if err := sink.CheckKey(sg.Key); err != nil { // spec §12
		return err
	}
	if sg.Source == "" {
		return fmt.Errorf("postgres: record %s: empty source", canon.Quote(sg.Key))
	}
	return nil
}

// Record notes a sighting: a new key is inserted pending and due now in one
// durable commit; a known key's statistics are buffered (see Flush), except
// that the API's operation confirms a key not yet confirmed, in one
// statement (confirmSightingSQL).
func (s *Sink) Record(ctx context.Context, sg sink.Sighting) (sink.RecordResult, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, err
	}
	if r, ok := s.sightDone(ctx, sg); ok {
		return r, nil
	}
	var (
		isNew bool
		state string
		k     known
	)
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		for range maxRetries {
			err := c.QueryRow(ctx, recordSQL, sg.Key, sg.Source, s.nowArg(), sg.Payload, payloadHash(sg.Payload),
				sg.FromAPI, sg.State, sg.Dynamic && !sg.FromAPI).
				Scan(&isNew, &state, &k.firstSource, &k.confirmed, &k.batchState, &k.needsConfirm)
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return fmt.Errorf("postgres: record %s: key vanished under concurrent writes", canon.Quote(sg.Key))
	})
	if err != nil {
		return sink.RecordResult{}, fmt.Errorf("postgres: record %s: %w", canon.Quote(sg.Key), err)
	}
	k.state = sink.State(state)
	if isNew {
		return sink.RecordResult{New: true, State: k.state}, nil
	}
	if sg.FromAPI && !k.confirmed {
		return s.confirmSighting(ctx, sg, k)
	}
	return s.sightKnown(ctx, sg, k), nil
}

// terminalList is canon's terminal states as an SQL list, for conflicts
// decided inside a statement (sink.StateConflict).
const terminalList = `('SUCCEEDED', 'FAILED', 'CANCELLED', 'EXPIRED', 'PARTIALLY_SUCCEEDED')`

// conflictExpr is sink.StateConflict(stored, seen) in SQL.
func conflictExpr(stored, seen string) string {
	return `(` + stored + ` <> ` + seen + ` AND ` + stored + ` IN ` + terminalList + ` AND ` + seen + ` IN ` + terminalList + `)`
}

// confirmSightingSQL confirms a known key that is not confirmed with a
// sighting from the API (spec §9.2): the operation becomes the payload (a
// webhook-first key's body, its payload until now, moves to the extras
// table), the batch state is the API's (a differing terminal state is one
// conflict), a pending key is due now, and a key dead as unknown to the API
// is pending again, due now, with a fresh attempt budget. $1 key, $2
// operation, $3 its SHA-256, $4 state, $5 now. No row: confirmed meanwhile.
//
// The row is locked FOR NO KEY UPDATE (what the UPDATE takes), not FOR
// UPDATE: an insert of the key's extras row (NoteResults) takes FOR KEY
// SHARE on it when its foreign key is checked, after its own row is in the
// unique index, so a FOR UPDATE here, followed by wh's insert of the same
// extras row, deadlocked with it (TestConfirmingSightingBesideAForeignKeyCheck).
var confirmSightingSQL = `
WITH old AS (
	SELECT key, state, first_source, batch_state, dead_reason, payload,
		state = 'dead' AND dead_reason = '` + sink.DeadUnknownToAPI + `' AS revive
	FROM gemrecon_keys WHERE key = $1 AND NOT confirmed FOR NO KEY UPDATE
),
upd AS (
	UPDATE gemrecon_keys k SET
		confirmed = true, needs_confirm = false,
		batch_state = CASE WHEN $4 = '' THEN k.batch_state ELSE $4 END,
		conflicts = k.conflicts + CASE WHEN ` + conflictExpr("o.batch_state", "$4") + ` THEN 1 ELSE 0 END,
		payload = coalesce($2::bytea, k.payload),
		payload_sha256 = CASE WHEN $2::bytea IS NULL THEN k.payload_sha256 ELSE $3 END,
		state = CASE WHEN o.revive THEN 'pending' ELSE k.state END,
		attempts = CASE WHEN o.revive THEN 0 ELSE k.attempts END,
		dead_reason = CASE WHEN o.revive THEN '' ELSE k.dead_reason END,
		lease_owner = CASE WHEN o.revive THEN NULL ELSE k.lease_owner END,
		lease_until = CASE WHEN o.revive THEN NULL ELSE k.lease_until END,
		next_attempt_at = CASE WHEN o.revive THEN ` + now5 + `
			WHEN k.state = 'pending' THEN least(k.next_attempt_at, ` + now5 + `)
			ELSE k.next_attempt_at END
	FROM old o WHERE k.key = o.key
	RETURNING k.state, ` + conflictExpr("o.batch_state", "$4") + `, o.revive, k.batch_state
),
wh AS (
	INSERT INTO gemrecon_key_extras (key, webhook)
	SELECT key, payload FROM old WHERE first_source = 'webhook' AND payload IS NOT NULL AND $2::bytea IS NOT NULL
	ON CONFLICT (key) DO UPDATE SET webhook = coalesce(gemrecon_key_extras.webhook, excluded.webhook)
)
SELECT * FROM upd`

// confirmSighting runs confirmSightingSQL. A key confirmed meanwhile makes
// the sighting a plain duplicate. A reply that is lost is an error (the
// statement is settled): running it again is harmless, the next sighting
// from the API does.
func (s *Sink) confirmSighting(ctx context.Context, sg sink.Sighting, k known) (sink.RecordResult, error) {
	var (
		state             string
		conflict, revived bool
		batch             string
	)
	var op any
	if len(sg.Payload) > 0 {
		op = sg.Payload
	}
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, confirmSightingSQL, sg.Key, op, payloadHash(sg.Payload), sg.State, s.nowArg()).
			Scan(&state, &conflict, &revived, &batch)
	})
	if errors.Is(err, pgx.ErrNoRows) { // confirmed (or purged) meanwhile
		return s.sightKnown(ctx, sg, k), nil
	}
	if err != nil {
		return sink.RecordResult{}, fmt.Errorf("postgres: record %s: confirming: %w", canon.Quote(sg.Key), err)
	}
	if conflict {
		s.log.Warn("postgres sink: state conflict: the API's batch state differs from the stored one; the API's wins",
			"key", sg.Key, "stored", k.batchState, "api", sg.State, "state", k.state)
	}
	if revived {
		s.log.Info("postgres sink: a key dead as unknown to the API was listed by the API: pending again, due now", "key", sg.Key)
	}
	st := sink.State(state)
	s.mu.Lock()
	s.bufferLocked(sg.Key, sg.Source, bufferedSighting{})
	if st == sink.StateDone {
		s.noteDoneLocked(sg.Key, k.firstSource, true, batch)
	}
	n := len(s.buf)
	s.mu.Unlock()
	s.maybeFlush(ctx, n)
	return sink.RecordResult{State: st, Confirmed: true, Conflict: conflict}, nil
}

// bufferedSighting is what one duplicate sighting adds besides its count.
type bufferedSighting struct {
	conflict bool
	webhook  []byte
	verified bool
}

// bufferLocked adds one duplicate sighting to the buffer. s.mu is held.
func (s *Sink) bufferLocked(key, source string, bs bufferedSighting) {
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
	if bs.conflict {
		b.conflicts++
	}
	if b.webhook == nil && bs.webhook != nil {
		b.webhook = bytes.Clone(bs.webhook) // the caller's buffer may be reused
	}
	b.verified = b.verified || bs.verified
}

// noteDoneLocked remembers a done key; s.mu is held.
func (s *Sink) noteDoneLocked(key, firstSource string, confirmed bool, batchState string) {
	if len(s.done) >= doneCacheMax {
		clear(s.done) // crude bound: the cache is an optimisation
	}
	s.done[key] = doneInfo{firstSource: firstSource, confirmed: confirmed, batchState: batchState}
}

func (s *Sink) maybeFlush(ctx context.Context, buffered int) {
	if buffered >= flushAt {
		_ = s.Flush(ctx) // statistics: on failure they stay buffered
	}
}

// flushSQL applies buffered statistics to many keys in one statement: the
// counters, a poll-first key's first webhook body (kept where none is yet)
// and the end of a need for confirmation.
//
// It locks the key rows first, in key order ("lk"; a locking SELECT locks
// rows as its ORDER BY yields them), and updates only rows it has locked:
// two flushes of overlapping keys from different processes (or a flush and
// a purge) then wait for each other instead of deadlocking, which an
// UPDATE … FROM in the join's order (no order is promised) did under load.
// The webhook upserts touch only extras of keys locked here. The lock is
// FOR NO KEY UPDATE (what the UPDATE takes): FOR UPDATE also blocks the
// FOR KEY SHARE of a foreign-key check, so NoteResults' first insert of a
// key's extras row, once in the unique index, waited for the flush while the
// flush's webhook upsert of that row waited for it: a deadlock
// (TestNoteResultsDuringAFlushOfItsKey).
const flushSQL = `
WITH d AS (
	SELECT * FROM jsonb_to_recordset($1::jsonb)
		AS d(k text, n bigint, last timestamptz, srcs jsonb, c bigint, w text, v boolean)
),
lk AS MATERIALIZED (
	SELECT k.key FROM gemrecon_keys k WHERE k.key IN (SELECT d.k FROM d) ORDER BY k.key FOR NO KEY UPDATE
),
upd AS (
	UPDATE gemrecon_keys k SET
		seen_count   = k.seen_count + d.n,
		last_seen_at = greatest(k.last_seen_at, coalesce(d.last, now())),
		sources      = k.sources || ARRAY(
			SELECT x.s FROM jsonb_array_elements_text(d.srcs) WITH ORDINALITY AS x(s, i)
			WHERE x.s <> ALL (k.sources) ORDER BY x.i),
		conflicts     = k.conflicts + d.c,
		needs_confirm = k.needs_confirm AND NOT coalesce(d.v, false)
	FROM d JOIN lk ON lk.key = d.k
	WHERE k.key = d.k
	RETURNING k.key
)
INSERT INTO gemrecon_key_extras (key, webhook)
SELECT d.k, decode(d.w, 'base64') FROM d JOIN upd ON upd.key = d.k WHERE d.w IS NOT NULL
ON CONFLICT (key) DO UPDATE SET webhook = coalesce(gemrecon_key_extras.webhook, excluded.webhook)`

type flushRow struct {
	Key       string     `json:"k"`
	N         int64      `json:"n"`
	Last      *time.Time `json:"last"`
	Sources   []string   `json:"srcs"`
	Conflicts int64      `json:"c"`
	Webhook   []byte     `json:"w,omitempty"` // base64 in JSON
	Verified  bool       `json:"v,omitempty"`
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
		r := flushRow{Key: k, N: b.n, Sources: b.sources, Conflicts: b.conflicts, Webhook: b.webhook, Verified: b.verified}
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
	if cur.webhook == nil {
		cur.webhook = b.webhook
	}
	cur.verified = cur.verified || b.verified
}

// claimTail ends a statement that begins with a CTE "old" choosing and
// locking rows (claimOneSQL, claimDueSQL), and claims those rows:
// pending → claimed, or an expired lease taken over (the expired attempt
// counts as failed, "lease expired"; if it was the last allowed attempt the
// key goes dead instead). Parameters: $1 now, $2 lease µs, $3 owner, $4 max
// attempts, $5 nonce, $6 the key or the limit (NULL: no limit), $7 skip
// keys that need confirmation (sink.SkipNeedsConfirm).
var claimTail = `),
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
		k.payload, k.first_source, k.took_over, o.due_at, k.first_seen_at,
		k.confirmed, k.batch_state, k.needs_confirm
)
SELECT upd.key, state, token, attempts, coalesce(lease_owner, ''), lease_until, payload, first_source, took_over,
	first_seen_at, confirmed, batch_state, needs_confirm, ` + webhookExpr("upd") + `, coalesce(x.results_file, '')
FROM upd LEFT JOIN gemrecon_key_extras x ON x.key = upd.key ORDER BY due_at, first_seen_at, upd.key`

// webhookExpr is the first webhook body of row r (joined with extras as
// x): kept apart once the payload is the API's operation, and the payload
// itself while a webhook-first key is unconfirmed (each byte stored once).
func webhookExpr(r string) string {
	return `coalesce(x.webhook, CASE WHEN ` + r + `.first_source = 'webhook' AND NOT ` + r + `.confirmed THEN ` + r + `.payload END)`
}

// claimableWhere: pending and due, or claimed under an expired lease (a
// lease is live while now < lease_until). $1 is now.
const claimableWhere = `((state = 'pending' AND next_attempt_at <= ` + now1 + `)
	OR (state = 'claimed' AND lease_until <= ` + now1 + `))`

// skipWhere leaves keys that need confirmation to another claimer when its
// parameter is true.
func skipWhere(param string) string { return `(NOT ` + param + `::boolean OR NOT needs_confirm)` }

// dueOrder is "oldest first": by the time a key became due (its next
// attempt, or its lease's end), then by first sighting — as sink/sqlite.
const (
	dueAt    = `CASE state WHEN 'pending' THEN next_attempt_at ELSE lease_until END`
	dueOrder = dueAt + `, first_seen_at, key`
)

var (
	claimOneSQL = `WITH old AS (SELECT key, state = 'claimed' AS takeover, ` + dueAt + ` AS due_at
		FROM gemrecon_keys WHERE key = $6 AND ` + claimableWhere + ` AND ` + skipWhere("$7") + ` FOR UPDATE` + claimTail
	claimDueSQL = `WITH old AS (SELECT key, state = 'claimed' AS takeover, ` + dueAt + ` AS due_at
		FROM gemrecon_keys WHERE ` + claimableWhere + ` AND ` + skipWhere("$7") + ` ORDER BY ` + dueOrder + ` LIMIT $6 FOR UPDATE SKIP LOCKED` + claimTail
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
		c := &r.claim
		if err := rows.Scan(&c.Key, &r.state, &c.Token, &c.Attempt, &c.Owner,
			&leaseUntil, &c.Payload, &c.FirstSource, &c.Takeover,
			&c.FirstSeenAt, &c.Confirmed, &c.BatchState, &c.NeedsConfirm, &c.Webhook, &c.ResultsFile); err != nil {
			rows.Close()
			return nil, err
		}
		if leaseUntil != nil {
			c.LeaseUntil = leaseUntil.UTC()
		}
		c.FirstSeenAt = c.FirstSeenAt.UTC()
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
func (s *Sink) Claim(ctx context.Context, key, owner string, lease time.Duration, opts ...sink.ClaimOption) (sink.Claim, error) {
	nc := nonce()
	skip := sink.ClaimOptionsOf(opts).SkipNeedsConfirm
	var got []claimRow
	err := s.write(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, claimOneSQL, s.nowArg(), micros(lease), owner, s.opt.MaxAttempts, nc, key, skip)
		if err != nil {
			return err
		}
		got, err = scanClaims(rows)
		return err
	})
	if unknownOutcome(err) {
		got, err = s.readBackClaims(ctx, nc)
		if err != nil {
			return sink.Claim{}, fmt.Errorf("postgres: claim %s: outcome unknown and not read back: %w", canon.Quote(key), err)
		}
		if len(got) == 0 {
			return sink.Claim{}, fmt.Errorf("postgres: claim %s: not claimed (the statement was cut off: %w)", canon.Quote(key), ctx.Err())
		}
	} else if err != nil {
		return sink.Claim{}, fmt.Errorf("postgres: claim %s: %w", canon.Quote(key), withCtxErr(ctx, err))
	}
	if len(got) == 1 && got[0].state == string(sink.StateClaimed) {
		s.freshExtras(ctx, got)
		return got[0].claim, nil
	}
	// Not claimed: tell unknown from unclaimable (including a takeover of
	// the last allowed attempt, which made the key dead).
	var exists bool
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)`, key).Scan(&exists)
	})
	if err != nil {
		return sink.Claim{}, fmt.Errorf("postgres: claim %s: %w", canon.Quote(key), err)
	}
	if !exists {
		return sink.Claim{}, fmt.Errorf("postgres: claim %s: %w", canon.Quote(key), sink.ErrNotFound)
	}
	return sink.Claim{}, fmt.Errorf("postgres: claim %s: %w", canon.Quote(key), sink.ErrNotClaimable)
}

// freshExtras re-reads the extras (first webhook body, results file) of
// claims that a claim statement may have joined from a stale snapshot. In
// READ COMMITTED a statement that waits for a row lock updates the row as
// the other transaction left it (RETURNING gives that version), but every
// other table it reads, the extras joined in claimTail included, comes
// from the snapshot taken when it started. A claim that waited for the
// confirming sighting of a webhook-first key (confirmSightingSQL: the API's
// operation becomes the payload, the webhook body moves to the extras)
// therefore got the confirmed row without the webhook body: the effect's
// event lacked it. ClaimDue, which skips locked rows, meets the same when
// that transaction commits after the statement's snapshot and before the
// statement locks the row: it then locks and claims the newest version
// without waiting. Such a claim is confirmed, first seen by webhook, and
// has no webhook body; a new statement sees what that transaction
// committed. A failure here leaves the claims as they are (the claim is
// made and must be handed over; its extras are only what they were).
func (s *Sink) freshExtras(ctx context.Context, rows []claimRow) {
	var keys []string
	for _, r := range rows {
		c := r.claim
		if r.state == string(sink.StateClaimed) && c.Confirmed && c.FirstSource == sink.SourceWebhook && c.Webhook == nil {
			keys = append(keys, c.Key)
		}
	}
	if len(keys) == 0 {
		return
	}
	type extras struct {
		webhook     []byte
		resultsFile string
	}
	fresh := map[string]extras{}
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		rs, err := c.Query(ctx, `SELECT key, webhook, results_file FROM gemrecon_key_extras WHERE key = ANY($1)`, keys)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var k string
			var x extras
			if err := rs.Scan(&k, &x.webhook, &x.resultsFile); err != nil {
				return err
			}
			fresh[k] = x
		}
		return rs.Err()
	})
	if err != nil {
		s.log.Warn("postgres sink: claimed keys' extras not read again; their effect events may lack the webhook body", "keys", len(keys), "err", err)
		return
	}
	for i := range rows {
		c := &rows[i].claim
		if x, ok := fresh[c.Key]; ok {
			if x.webhook != nil {
				c.Webhook = x.webhook
			}
			if c.ResultsFile == "" {
				c.ResultsFile = x.resultsFile
			}
		}
	}
}

// readBackClaims returns the claims a cut-off claim statement made, found by
// its nonce: after settle, the database's answer is final.
func (s *Sink) readBackClaims(ctx context.Context, nc int64) ([]claimRow, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	var got []claimRow
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, `SELECT k.key, state, token, attempts, coalesce(lease_owner, ''), lease_until,
			payload, first_source, took_over, first_seen_at, confirmed, batch_state, needs_confirm,
			`+webhookExpr("k")+`, coalesce(x.results_file, '')
			FROM gemrecon_keys k LEFT JOIN gemrecon_key_extras x ON x.key = k.key
			WHERE claim_nonce = $1 AND state = 'claimed' ORDER BY first_seen_at, k.key`, nc)
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
func (s *Sink) ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int, opts ...sink.ClaimOption) ([]sink.Claim, error) {
	skip := sink.ClaimOptionsOf(opts).SkipNeedsConfirm
	var out []sink.Claim
	for limit <= 0 || len(out) < limit {
		nc := nonce()
		var want any // NULL: LIMIT ALL
		if limit > 0 {
			want = limit - len(out)
		}
		var got []claimRow
		err := s.write(ctx, func(c *pgx.Conn) error {
			rows, err := c.Query(ctx, claimDueSQL, s.nowArg(), micros(lease), owner, s.opt.MaxAttempts, nc, want, skip)
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
		s.freshExtras(ctx, got)
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
		WHERE key = $1 AND state = 'claimed' AND token = $2 RETURNING first_source, confirmed, batch_state` +
		fencedMid + `upd.first_source, upd.confirmed, upd.batch_state` + fencedTail
	// $4 permanent, $5 max attempts, $6 backoff µs per attempt (1-based,
	// the last element serves any later attempt), $7 not-before as a delay
	// from now in µs (NULL: none; see Fail), $8 cause,
	// $9 uncounted (Failure.NoAttempt: attempts go back to their value before
	// the claim, the key to pending at $7 — now if that has passed — or
	// after the backoff of the restored count; never dead).
	failSQL = fencedHead + `UPDATE gemrecon_keys SET
			state = CASE WHEN NOT $9 AND ($4 OR attempts >= $5) THEN 'dead' ELSE 'pending' END,
			dead_reason = CASE WHEN NOT $9 AND ($4 OR attempts >= $5) THEN $10 ELSE '' END,
			attempts = CASE WHEN $9 THEN greatest(attempts - 1, 0) ELSE attempts END,
			next_attempt_at = CASE
				WHEN $9 AND $7::bigint IS NOT NULL THEN ` + now3 + ` + greatest($7::bigint, 0) * interval '1 microsecond'
				WHEN $9 THEN ` + now3 + `
					+ ($6::bigint[])[least(greatest(attempts - 1, 1), cardinality($6::bigint[]))] * interval '1 microsecond'
				WHEN $4 OR attempts >= $5 THEN NULL ELSE
				` + now3 + ` + greatest(
					($6::bigint[])[least(greatest(attempts, 1), cardinality($6::bigint[]))],
					coalesce($7::bigint, 0)) * interval '1 microsecond' END,
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
		return fmt.Errorf("postgres: %s %s token %d: %w", op, canon.Quote(key), token, sink.ErrNotFound)
	}
	s.log.Error("postgres sink: fenced outcome discarded: the claim's token is no longer current",
		"op", op, "key", key, "token", token, "current_token", *cur.token, "state", *cur.state)
	return fmt.Errorf("postgres: %s %s with token %d (current token %d, state %s): %w",
		op, canon.Quote(key), token, *cur.token, *cur.state, sink.ErrFenced)
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
		return fmt.Errorf("postgres: renew %s: %w", canon.Quote(key), err)
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
		return fmt.Errorf("postgres: complete %s: outcome unknown (%w) and not read back: %w", canon.Quote(key), err, rerr)
	case e.State == sink.StateDone && e.Token == token:
		s.mu.Lock()
		s.noteDoneLocked(key, e.FirstSource, e.Confirmed, e.BatchState)
		s.mu.Unlock()
		return nil
	case e.State == sink.StateClaimed && e.Token == token:
		return fmt.Errorf("postgres: complete %s: not applied (read back: still claimed): %w", canon.Quote(key), err)
	default:
		return fmt.Errorf("postgres: complete %s token %d: read back state %s token %d: %w", canon.Quote(key), token, e.State, e.Token, sink.ErrFenced)
	}
}

// Complete marks the claimed key done if token is current, else ErrFenced.
// A completion whose outcome is unknown is read back.
func (s *Sink) Complete(ctx context.Context, key string, token int64) error {
	var ok bool
	var cur current
	var firstSource, batchState *string
	var confirmed *bool
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, completeSQL, key, token, s.nowArg()).Scan(&ok, &firstSource, &confirmed, &batchState, &cur.state, &cur.token)
	})
	if unknownOutcome(err) {
		return s.completeReadBack(ctx, key, token, err)
	}
	if err != nil {
		return fmt.Errorf("postgres: complete %s: %w", canon.Quote(key), withCtxErr(ctx, err))
	}
	if !ok {
		return s.fencedErr("complete", key, token, cur)
	}
	s.mu.Lock()
	s.noteDoneLocked(key, deref(firstSource), confirmed != nil && *confirmed, deref(batchState))
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
	// NotBefore is a time by the caller's clock (its now plus a
	// Retry-After or a recheck delay), and next_attempt_at is compared with
	// the server's: the statement gets the delay from now, measured by the
	// sink's own idea of now (the injected clock, else this process's), and
	// adds it to the server's now. An absolute time handed over as it is
	// made a key wait longer, or not at all, by the difference of the clocks.
	var notBefore any
	if !f.NotBefore.IsZero() {
		notBefore = micros(f.NotBefore.Sub(s.opt.Now()))
	}
	cause := sink.TruncateError(f.Cause)
	var ok bool
	var cur current
	var state *string
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, failSQL, key, token, s.nowArg(), f.Permanent, s.opt.MaxAttempts, backoffs, notBefore, cause, f.NoAttempt, f.DeadReason).
			Scan(&ok, &state, &cur.state, &cur.token)
	})
	if unknownOutcome(err) {
		e, rerr := s.readBack(ctx, key)
		switch {
		case rerr != nil:
			return "", fmt.Errorf("postgres: fail %s: outcome unknown (%w) and not read back: %w", canon.Quote(key), err, rerr)
		case e.Token == token && e.State == sink.StateClaimed:
			return "", fmt.Errorf("postgres: fail %s: not applied (read back: still claimed): %w", canon.Quote(key), err)
		case e.Token == token && (e.State == sink.StatePending || e.State == sink.StateDead) && e.LastError == cause:
			return e.State, nil
		default:
			return "", fmt.Errorf("postgres: fail %s token %d: read back state %s token %d: %w", canon.Quote(key), token, e.State, e.Token, sink.ErrFenced)
		}
	}
	if err != nil {
		return "", fmt.Errorf("postgres: fail %s: %w", canon.Quote(key), withCtxErr(ctx, err))
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
//
// The state in the error is read by the same statement, from its snapshot:
// when the UPDATE waited for another transaction that changed or deleted
// the row, that snapshot still shows it dead. Such an answer (not updated,
// yet dead) is ambiguous, and the statement runs again with a fresh
// snapshot, which sees what the other transaction did (or, if the key is
// dead again by then, sends it back).
func (s *Sink) Retry(ctx context.Context, key string) error {
	const tries = 3
	var state *string
	var updated bool
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		for try := 0; try < tries; try++ {
			if err := c.QueryRow(ctx, `
				WITH upd AS (
					UPDATE gemrecon_keys SET state = 'pending', next_attempt_at = `+now2+`,
						attempts = 0, retries = retries + 1, lease_owner = NULL, lease_until = NULL, dead_reason = ''
					WHERE key = $1 AND state = 'dead' RETURNING key)
				SELECT EXISTS (SELECT 1 FROM upd), (SELECT state FROM gemrecon_keys WHERE key = $1)`,
				key, s.nowArg()).Scan(&updated, &state); err != nil {
				return err
			}
			if updated || state == nil || *state != string(sink.StateDead) {
				return nil
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("postgres: retry %s: %w", canon.Quote(key), err)
	case updated:
		return nil
	case state == nil:
		return fmt.Errorf("postgres: retry %s: %w", canon.Quote(key), sink.ErrNotFound)
	case *state == string(sink.StateDead):
		return fmt.Errorf("postgres: retry %s: changed by other transactions while it was retried, %d times: %w", canon.Quote(key), tries, sink.ErrNotDead)
	default:
		return fmt.Errorf("postgres: retry %s is %s: %w", canon.Quote(key), *state, sink.ErrNotDead)
	}
}

// Due lists keys that can be claimed now, oldest first.
func (s *Sink) Due(ctx context.Context, limit int, opts ...sink.ClaimOption) ([]string, error) {
	q := `SELECT key FROM gemrecon_keys WHERE ` + claimableWhere + ` AND ` + skipWhere("$2") + ` ORDER BY ` + dueOrder
	args := []any{s.nowArg(), sink.ClaimOptionsOf(opts).SkipNeedsConfirm}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	var keys []string
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		keys, err = pgx.AppendRows([]string(nil), rows, pgx.RowTo[string]) // nil when none, as before
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: due: %w", err)
	}
	return keys, nil
}

// entryColumns are read FROM entryFrom.
var entryColumns = `k.key, state, attempts, token, first_source, sources, seen_count, first_seen_at,
	last_seen_at, coalesce(lease_owner, ''), lease_until, next_attempt_at, done_at,
	coalesce(last_error, ''), conflicts, payload, confirmed, batch_state, needs_confirm, dead_reason,
	coalesce(x.results_file, ''), ` + webhookExpr("k")

const entryFrom = ` FROM gemrecon_keys k LEFT JOIN gemrecon_key_extras x ON x.key = k.key `

func scanEntry(row pgx.Row) (sink.Entry, error) {
	var e sink.Entry
	var state string
	var leaseUntil, next, done *time.Time
	err := row.Scan(&e.Key, &state, &e.Attempts, &e.Token, &e.FirstSource, &e.Sources, &e.SeenCount,
		&e.FirstSeenAt, &e.LastSeenAt, &e.LeaseOwner, &leaseUntil, &next, &done, &e.LastError,
		&e.Conflicts, &e.Payload, &e.Confirmed, &e.BatchState, &e.NeedsConfirm, &e.DeadReason, &e.ResultsFile, &e.Webhook)
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
		e, err = scanEntry(c.QueryRow(ctx, `SELECT `+entryColumns+entryFrom+`WHERE k.key = $1`, key))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return sink.Entry{}, fmt.Errorf("postgres: get %s: %w", canon.Quote(key), sink.ErrNotFound)
	}
	if err != nil {
		return sink.Entry{}, fmt.Errorf("postgres: get %s: %w", canon.Quote(key), err)
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
	q := `SELECT ` + entryColumns + entryFrom + `WHERE ($1 = '' OR state = $1) ORDER BY first_seen_at, k.key`
	args := []any{string(opt.State)}
	if opt.Limit > 0 {
		q += ` LIMIT $2`
		args = append(args, opt.Limit)
	}
	var out []sink.Entry
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		out, err = pgx.AppendRows([]sink.Entry(nil), rows, func(r pgx.CollectableRow) (sink.Entry, error) { return scanEntry(r) })
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: list: %w", err)
	}
	return out, nil
}

// countBy reads the (text, count) rows of q into m.
func countBy(ctx context.Context, tx pgx.Tx, q string, m map[string]int64) error {
	rows, err := tx.Query(ctx, q)
	if err != nil {
		return err
	}
	var k string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&k, &n}, func() error { m[k] = n; return nil })
	return err
}

// Stats summarises the sink from one snapshot. Latency percentiles are
// nearest-rank (percentile_disc) over done keys' done_at − first_seen_at.
func (s *Sink) Stats(ctx context.Context) (sink.Stats, error) {
	if err := s.Flush(ctx); err != nil {
		return sink.Stats{}, err
	}
	st := sink.Stats{
		ByState:      map[sink.State]int64{sink.StatePending: 0, sink.StateClaimed: 0, sink.StateDone: 0, sink.StateDead: 0},
		FirstSource:  map[string]int64{},
		DeadByReason: map[string]int64{sink.DeadEffect: 0, sink.DeadUnknownToAPI: 0},
	}
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		byState := map[string]int64{}
		for q, into := range map[string]map[string]int64{
			`SELECT state, count(*) FROM gemrecon_keys GROUP BY state`:               byState,
			`SELECT first_source, count(*) FROM gemrecon_keys GROUP BY first_source`: st.FirstSource,
			`SELECT CASE WHEN dead_reason = '' THEN '` + sink.DeadEffect + `' ELSE dead_reason END, count(*)
			FROM gemrecon_keys WHERE state = 'dead' GROUP BY 1`: st.DeadByReason,
		} {
			if err := countBy(ctx, tx, q, into); err != nil {
				return err
			}
		}
		for state, n := range byState {
			st.ByState[sink.State(state)] = n
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

// Purge deletes done rows done for longer than olderThan (see sink.Sink).
func (s *Sink) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	keys, err := s.PurgeKeys(ctx, olderThan)
	return int64(len(keys)), err
}

// PurgeKeys deletes done rows done for longer than olderThan (their extras
// go with them) and returns their keys. The cutoff is computed in the
// statement with the clock that wrote done_at (now1: the injected clock,
// else the server's now()), not with this process's clock, which may run
// ahead of the server's. done_at and now() are whole microseconds, so
// comparing with olderThan truncated to microseconds is exact.
func (s *Sink) PurgeKeys(ctx context.Context, olderThan time.Duration) ([]string, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("postgres: purge: negative age %v (want the time keys have been done for, e.g. 720h)", olderThan)
	}
	keys := []string{}
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		// Rows are locked in key order first, as flushSQL locks them, so
		// that a purge and a flush wait for each other, never deadlock.
		rows, err := c.Query(ctx, `
			WITH lk AS MATERIALIZED (
				SELECT key FROM gemrecon_keys
				WHERE state = 'done' AND done_at < `+now1+` - $2 * interval '1 microsecond' ORDER BY key FOR UPDATE)
			DELETE FROM gemrecon_keys k USING lk
			WHERE k.key = lk.key AND k.state = 'done' AND k.done_at < `+now1+` - $2 * interval '1 microsecond'
			RETURNING k.key`, s.nowArg(), micros(olderThan))
		if err != nil {
			return err
		}
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	// A purged key seen again must be new again: forget what was done.
	s.mu.Lock()
	clear(s.done)
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("postgres: purge: %w", err)
	}
	return keys, nil
}

// confirmSQL is Confirm: fenced on the claim's token; a key confirmed
// meanwhile keeps what it holds (a differing terminal state is still one
// conflict). $1 key, $2 token, $3 operation, $4 its SHA-256, $5 state.
var confirmSQL = `
WITH old AS (
	SELECT key, first_source, confirmed, batch_state, payload FROM gemrecon_keys
	WHERE key = $1 AND state = 'claimed' AND token = $2 FOR UPDATE
),
upd AS (
	UPDATE gemrecon_keys k SET
		confirmed = true, needs_confirm = false,
		batch_state = CASE WHEN o.confirmed OR $5 = '' THEN k.batch_state ELSE $5 END,
		conflicts = k.conflicts + CASE WHEN ` + conflictExpr("o.batch_state", "$5") + ` THEN 1 ELSE 0 END,
		payload = CASE WHEN o.confirmed OR $3::bytea IS NULL THEN k.payload ELSE $3 END,
		payload_sha256 = CASE WHEN o.confirmed OR $3::bytea IS NULL THEN k.payload_sha256 ELSE $4 END
	FROM old o WHERE k.key = o.key
	RETURNING ` + conflictExpr("o.batch_state", "$5") + ` AS conflict, o.batch_state
),
wh AS (
	INSERT INTO gemrecon_key_extras (key, webhook)
	SELECT key, payload FROM old
	WHERE NOT confirmed AND first_source = 'webhook' AND payload IS NOT NULL AND $3::bytea IS NOT NULL
	ON CONFLICT (key) DO UPDATE SET webhook = coalesce(gemrecon_key_extras.webhook, excluded.webhook)
),
fenced AS (
	UPDATE gemrecon_counters SET value = value + 1
	WHERE name = 'fenced' AND NOT EXISTS (SELECT 1 FROM upd)
		AND EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)
	RETURNING value
)
SELECT EXISTS (SELECT 1 FROM upd), coalesce((SELECT conflict FROM upd), false), (SELECT batch_state FROM upd),
	cur.state, cur.token
FROM (SELECT 1) AS one LEFT JOIN gemrecon_keys cur ON cur.key = $1`

// Confirm stores the API's answer for a claimed key, fenced on token (see
// sink.Sink). A reply that is lost is settled and the row read back.
func (s *Sink) Confirm(ctx context.Context, key string, token int64, c sink.Confirmation) error {
	var op any
	if len(c.Operation) > 0 {
		op = c.Operation
	}
	var ok, conflict bool
	var stored *string
	var cur current
	err := s.write(ctx, func(cn *pgx.Conn) error {
		return cn.QueryRow(ctx, confirmSQL, key, token, op, payloadHash(c.Operation), c.State).
			Scan(&ok, &conflict, &stored, &cur.state, &cur.token)
	})
	if unknownOutcome(err) {
		e, rerr := s.readBack(ctx, key)
		switch {
		case rerr != nil:
			return fmt.Errorf("postgres: confirm %s: outcome unknown (%w) and not read back: %w", canon.Quote(key), err, rerr)
		case e.Token == token && e.State == sink.StateClaimed && e.Confirmed:
			return nil
		case e.Token == token && e.State == sink.StateClaimed:
			return fmt.Errorf("postgres: confirm %s: not applied (read back: not confirmed): %w", canon.Quote(key), err)
		default:
			return fmt.Errorf("postgres: confirm %s token %d: read back state %s token %d: %w", canon.Quote(key), token, e.State, e.Token, sink.ErrFenced)
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: confirm %s: %w", canon.Quote(key), withCtxErr(ctx, err))
	}
	if !ok {
		return s.fencedErr("confirm", key, token, cur)
	}
	if conflict {
		s.log.Warn("postgres sink: state conflict: the API's batch state differs from the stored one",
			"key", key, "stored", deref(stored), "api", c.State)
	}
	return nil
}

// noteResultsSQL is NoteResults, fenced on the token. $1 key, $2 token, $3 file.
//
// The fence reads the key row FOR KEY SHARE ("cur"): a locking read is
// checked again against the row's latest version, and holds the row until
// the write commits, so that a takeover (claims lock FOR UPDATE) either
// commits first and is seen, or waits. A plain read was the statement's
// snapshot, never checked again: when the upsert then waited for the
// extras row and a takeover committed meanwhile, the stale holder's file
// was written anyway (TestNoteResultsFencedAfterATakeover). FOR KEY SHARE
// does not wait for the updates that leave the token alone (a renewal, a
// flush), and is what the extras row's foreign-key check takes anyway.
const noteResultsSQL = `
WITH cur AS (
	SELECT key FROM gemrecon_keys WHERE key = $1 AND state = 'claimed' AND token = $2 FOR KEY SHARE
),
upd AS (
	INSERT INTO gemrecon_key_extras (key, results_file)
	SELECT key, $3 FROM cur
	ON CONFLICT (key) DO UPDATE SET results_file = excluded.results_file
	RETURNING key
),
fenced AS (
	UPDATE gemrecon_counters SET value = value + 1
	WHERE name = 'fenced' AND NOT EXISTS (SELECT 1 FROM upd)
		AND EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)
	RETURNING value
)
SELECT EXISTS (SELECT 1 FROM upd), cur.state, cur.token
FROM (SELECT 1) AS one LEFT JOIN gemrecon_keys cur ON cur.key = $1`

// NoteResults records where the claimed key's results were written, fenced
// on token. Writing it twice is harmless, so a lost reply is an error only.
func (s *Sink) NoteResults(ctx context.Context, key string, token int64, file string) error {
	var ok bool
	var cur current
	err := s.write(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, noteResultsSQL, key, token, file).Scan(&ok, &cur.state, &cur.token)
	})
	if err != nil {
		return fmt.Errorf("postgres: note results %s: %w", canon.Quote(key), withCtxErr(ctx, err))
	}
	if !ok {
		return s.fencedErr("note results", key, token, cur)
	}
	return nil
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
// claimed now. Parameters as recordSQL, then $9 owner, $10 lease µs, $11
// nonce.
const recordClaimSQL = `
WITH ins AS (
	INSERT INTO gemrecon_keys (key, state, first_source, sources, seen_count,
		first_seen_at, last_seen_at, payload, payload_sha256, confirmed, batch_state, needs_confirm,
		attempts, token, lease_owner, lease_until, claim_nonce)
	VALUES ($1, 'claimed', $2, ARRAY[$2::text], 1, ` + now3 + `, ` + now3 + `, $4, $5, $6, $7, $8,
		1, 1, $9, ` + now3 + ` + $10 * interval '1 microsecond', $11)
	ON CONFLICT (key) DO NOTHING
	RETURNING state, first_source, confirmed, batch_state, needs_confirm, lease_until, first_seen_at
)
SELECT true, state, first_source, confirmed, batch_state, needs_confirm, lease_until, first_seen_at, false FROM ins
UNION ALL
SELECT false, state, first_source, confirmed, batch_state, needs_confirm, lease_until, first_seen_at,
	(state = 'pending' AND next_attempt_at <= ` + now3 + `) OR (state = 'claimed' AND lease_until <= ` + now3 + `)
FROM gemrecon_keys
WHERE key = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

var _ sink.RecordClaimer = (*Sink)(nil)

// RecordAndClaim records a sighting and claims the key when it can be
// claimed now (sink.RecordClaimer). A new key is inserted already claimed,
// in one commit; a known, claimable key is claimed by Claim (after the
// API's sighting confirmed it, if it does); a sighting of a key that
// cannot be claimed costs no commit and returns ErrNotClaimable.
func (s *Sink) RecordAndClaim(ctx context.Context, sg sink.Sighting, owner string, lease time.Duration) (sink.RecordResult, sink.Claim, error) {
	if err := checkSighting(sg); err != nil {
		return sink.RecordResult{}, sink.Claim{}, err
	}
	if r, ok := s.sightDone(ctx, sg); ok {
		return r, sink.Claim{}, fmt.Errorf("postgres: record and claim %s: done: %w", canon.Quote(sg.Key), sink.ErrNotClaimable)
	}

	nc := nonce()
	var (
		isNew, claimable bool
		state            string
		k                known
		leaseUntil       *time.Time
		firstSeen        time.Time
	)
	needs := sg.Dynamic && !sg.FromAPI
	err := s.write(ctx, func(c *pgx.Conn) error {
		for range maxRetries {
			err := c.QueryRow(ctx, recordClaimSQL, sg.Key, sg.Source, s.nowArg(), sg.Payload, payloadHash(sg.Payload),
				sg.FromAPI, sg.State, needs, owner, micros(lease), nc).
				Scan(&isNew, &state, &k.firstSource, &k.confirmed, &k.batchState, &k.needsConfirm, &leaseUntil, &firstSeen, &claimable)
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return fmt.Errorf("key vanished under concurrent writes: %w", pgx.ErrNoRows) // a known outcome
	})
	if unknownOutcome(err) {
		got, rerr := s.readBackClaims(ctx, nc)
		if rerr != nil || len(got) != 1 {
			return sink.RecordResult{}, sink.Claim{}, fmt.Errorf("postgres: record and claim %s: outcome unknown (%w), read back: %v claims, %v", canon.Quote(sg.Key), err, len(got), rerr)
		}
		return sink.RecordResult{New: got[0].claim.Token == 1, State: sink.StateClaimed}, got[0].claim, nil
	}
	if err != nil {
		return sink.RecordResult{}, sink.Claim{}, fmt.Errorf("postgres: record and claim %s: %w", canon.Quote(sg.Key), err)
	}
	if isNew {
		c := sink.Claim{Key: sg.Key, Token: 1, Attempt: 1, Owner: owner, Payload: sg.Payload, FirstSource: sg.Source,
			FirstSeenAt: firstSeen.UTC(), Confirmed: sg.FromAPI, BatchState: sg.State, NeedsConfirm: needs}
		if sg.Source == sink.SourceWebhook && !sg.FromAPI {
			c.Webhook = sg.Payload
		}
		if leaseUntil != nil {
			c.LeaseUntil = leaseUntil.UTC()
		}
		return sink.RecordResult{New: true, State: sink.StateClaimed}, c, nil
	}
	k.state = sink.State(state)
	var rr sink.RecordResult
	if sg.FromAPI && !k.confirmed {
		if rr, err = s.confirmSighting(ctx, sg, k); err != nil {
			return rr, sink.Claim{}, err
		}
		claimable = claimable || rr.State == sink.StatePending // due now, or revived
	} else {
		rr = s.sightKnown(ctx, sg, k)
	}
	if !claimable {
		return rr, sink.Claim{}, fmt.Errorf("postgres: record and claim %s: %s: %w", canon.Quote(sg.Key), rr.State, sink.ErrNotClaimable)
	}
	c, err := s.Claim(ctx, sg.Key, owner, lease)
	if err != nil {
		return rr, sink.Claim{}, err
	}
	rr.State = sink.StateClaimed
	return rr, c, nil
}

// sighting returns what one duplicate sighting of k adds to the buffer: a
// conflict by meaning (spec §9.4; logged), a poll-first key's webhook body,
// the end of a need for confirmation.
func (s *Sink) sighting(sg sink.Sighting, k known) bufferedSighting {
	bs := bufferedSighting{conflict: sink.StateConflict(k.batchState, sg.State), verified: k.needsConfirm && !sg.Dynamic}
	if bs.conflict {
		s.log.Warn("postgres sink: state conflict: a sighting's batch state differs from the stored one; the stored state stays",
			"key", sg.Key, "source", sg.Source, "stored", k.batchState, "seen", sg.State, "confirmed", k.confirmed)
	}
	if sg.Source == sink.SourceWebhook && k.firstSource != sink.SourceWebhook && len(sg.Payload) > 0 {
		bs.webhook = sg.Payload
	}
	return bs
}

// sightDone answers a sighting of a key this process knows is done from
// memory: its statistics are buffered (no round trip) and it reports true
// — unless the sighting is the API's for a done key not yet confirmed,
// which Record confirms.
func (s *Sink) sightDone(ctx context.Context, sg sink.Sighting) (sink.RecordResult, bool) {
	s.mu.Lock()
	di, isDone := s.done[sg.Key]
	if isDone && sg.FromAPI && !di.confirmed {
		s.mu.Unlock()
		return sink.RecordResult{}, false
	}
	var bs bufferedSighting
	if isDone {
		bs = s.sighting(sg, known{state: sink.StateDone, firstSource: di.firstSource, confirmed: di.confirmed, batchState: di.batchState})
		s.bufferLocked(sg.Key, sg.Source, bs)
	}
	n := len(s.buf)
	s.mu.Unlock()
	if isDone {
		s.maybeFlush(ctx, n)
	}
	return sink.RecordResult{State: sink.StateDone, Conflict: bs.conflict}, isDone
}

// sightKnown buffers a sighting of a key the database already held, and
// remembers it in memory if it is done.
func (s *Sink) sightKnown(ctx context.Context, sg sink.Sighting, k known) sink.RecordResult {
	bs := s.sighting(sg, k)
	s.mu.Lock()
	s.bufferLocked(sg.Key, sg.Source, bs)
	if k.state == sink.StateDone {
		s.noteDoneLocked(sg.Key, k.firstSource, k.confirmed, k.batchState)
	}
	n := len(s.buf)
	s.mu.Unlock()
	s.maybeFlush(ctx, n)
	return sink.RecordResult{State: k.state, Conflict: bs.conflict}
}
