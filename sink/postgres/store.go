package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/sink"
)

// The rows of package sink's state machine, as this schema keeps them: the
// payload in the key row, the first webhook body and the results file in
// gemrecon_key_extras. A time that does not apply is NULL.

const rowColumns = `key, state, attempts, token, coalesce(lease_owner, ''), lease_until, next_attempt_at, done_at,
	coalesce(last_error, ''), first_source, first_seen_at, confirmed, batch_state, needs_confirm, dead_reason,
	conflicts, retries, reruns, no_results, took_over, batch_end`

func scanRow(row pgx.Row) (sink.Row, error) {
	var (
		r                           sink.Row
		st                          string
		leaseUntil, next, done, end *time.Time
	)
	err := row.Scan(&r.Key, &st, &r.Attempts, &r.Token, &r.Owner, &leaseUntil, &next, &done, &r.LastError,
		&r.FirstSource, &r.FirstSeenAt, &r.Confirmed, &r.BatchState, &r.NeedsConfirm, &r.DeadReason, &r.Conflicts,
		&r.Retries, &r.Reruns, &r.NoResults, &r.TookOver, &end)
	r.State = sink.State(st)
	r.LeaseUntil, r.NextAttempt, r.DoneAt, r.FirstSeenAt = at(leaseUntil), at(next), at(done), r.FirstSeenAt.UTC()
	r.BatchEnd = at(end)
	return r, err
}

// at is a nullable time as the rows hold it (zero: none).
func at(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// null is a time to store: NULL when zero.
func null(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// rowArgs are r's mutable columns as $1 (the key) to $19.
func rowArgs(r sink.Row) []any {
	return []any{r.Key, string(r.State), r.Attempts, r.Token, nullText(r.Owner), null(r.LeaseUntil), null(r.NextAttempt),
		null(r.DoneAt), nullText(r.LastError), r.Confirmed, r.BatchState, r.NeedsConfirm, r.DeadReason, r.Conflicts,
		r.Retries, r.Reruns, r.NoResults, r.TookOver, null(r.BatchEnd)}
}

// webhookExpr is the first webhook body of row r (joined with extras as
// x): kept apart once the payload is the API's operation, and the payload
// itself while a webhook-first key is unconfirmed (each byte stored once).
func webhookExpr(r string) string {
	return `coalesce(x.webhook, CASE WHEN ` + r + `.first_source = 'webhook' AND NOT ` + r + `.confirmed THEN ` + r + `.payload END)`
}

// pgTx is one write transaction (sink.Tx). Every row it reads is locked FOR
// UPDATE until it ends. FOR UPDATE also blocks the FOR KEY SHARE that the
// foreign-key check of an insert into gemrecon_key_extras takes; every
// transaction here that writes a key's extras locks the key row first, so
// they wait for each other in that order and cannot deadlock.
type pgTx struct {
	tx  pgx.Tx
	ctx context.Context
	now time.Time
}

func (t *pgTx) Now() time.Time { return t.now }

func (t *pgTx) exec(q string, args ...any) error {
	_, err := t.tx.Exec(t.ctx, q, args...)
	return err
}

func (t *pgTx) Load(key string) (sink.Row, bool, error) {
	r, err := scanRow(t.tx.QueryRow(t.ctx, `SELECT `+rowColumns+` FROM gemrecon_keys WHERE key = $1 FOR UPDATE`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return sink.Row{}, false, nil
	}
	return r, err == nil, err
}

// claimableWhere: pending and due, or claimed under an expired lease, at $1;
// keys that need confirmation are left out when $2 is true. dueOrder is
// "oldest first": by the time a key became due, then first sighting.
const (
	claimableWhere = `((state = 'pending' AND next_attempt_at <= $1) OR (state = 'claimed' AND lease_until <= $1))
		AND (NOT $2::boolean OR NOT needs_confirm)`
	dueOrder = `CASE state WHEN 'pending' THEN next_attempt_at ELSE lease_until END, first_seen_at, key`
)

func limitArg(limit int) any {
	if limit <= 0 {
		return nil // LIMIT NULL: no limit
	}
	return limit
}

func (t *pgTx) Due(limit int, skipNeedsConfirm bool) ([]sink.Row, error) {
	rows, err := t.tx.Query(t.ctx, `SELECT `+rowColumns+` FROM gemrecon_keys WHERE `+claimableWhere+`
		ORDER BY `+dueOrder+` LIMIT $3 FOR UPDATE SKIP LOCKED`, t.now, skipNeedsConfirm, limitArg(limit))
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (sink.Row, error) { return scanRow(r) })
}

func (t *pgTx) Insert(r sink.Row, payload []byte) (bool, error) {
	var sha []byte
	if len(payload) > 0 {
		sha = sink.PayloadHash(payload)
	} else {
		payload = nil
	}
	tag, err := t.tx.Exec(t.ctx, `INSERT INTO gemrecon_keys (key, state, attempts, token, lease_owner, lease_until,
		next_attempt_at, done_at, last_error, confirmed, batch_state, needs_confirm, dead_reason, conflicts, retries,
		reruns, no_results, took_over, batch_end, first_source, sources, seen_count, first_seen_at, last_seen_at, payload,
		payload_sha256)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, ARRAY[$20::text], 1,
			$21, $21, $22, $23)
		ON CONFLICT (key) DO NOTHING`, append(rowArgs(r), r.FirstSource, r.FirstSeenAt, payload, sha)...)
	return tag.RowsAffected() == 1, err
}

func (t *pgTx) Update(r sink.Row) error {
	return t.exec(`UPDATE gemrecon_keys SET state = $2, attempts = $3, token = $4, lease_owner = $5, lease_until = $6,
		next_attempt_at = $7, done_at = $8, last_error = $9, confirmed = $10, batch_state = $11, needs_confirm = $12,
		dead_reason = $13, conflicts = $14, retries = $15, reruns = $16, no_results = $17, took_over = $18, batch_end = $19
		WHERE key = $1`, rowArgs(r)...)
}

func (t *pgTx) Bodies(key string) (payload, webhook []byte, resultsFile string, err error) {
	err = t.tx.QueryRow(t.ctx, `SELECT k.payload, `+webhookExpr("k")+`, coalesce(x.results_file, '')
		FROM gemrecon_keys k LEFT JOIN gemrecon_key_extras x ON x.key = k.key WHERE k.key = $1`, key).Scan(&payload, &webhook, &resultsFile)
	return payload, webhook, resultsFile, err
}

func (t *pgTx) SetOperation(key string, op []byte, moveWebhook bool) error {
	if moveWebhook {
		if err := t.exec(`INSERT INTO gemrecon_key_extras (key, webhook)
			SELECT key, payload FROM gemrecon_keys WHERE key = $1 AND payload IS NOT NULL
			ON CONFLICT (key) DO UPDATE SET webhook = coalesce(gemrecon_key_extras.webhook, excluded.webhook)`, key); err != nil {
			return err
		}
	}
	return t.exec(`UPDATE gemrecon_keys SET payload = $2, payload_sha256 = $3 WHERE key = $1`, key, op, sink.PayloadHash(op))
}

func (t *pgTx) SetResults(key, file string) error {
	return t.exec(`INSERT INTO gemrecon_key_extras (key, results_file) VALUES ($1, $2)
		ON CONFLICT (key) DO UPDATE SET results_file = excluded.results_file`, key, file)
}

func (t *pgTx) CountFenced() error {
	return t.exec(`UPDATE gemrecon_counters SET value = value + 1 WHERE name = 'fenced'`)
}

// applyStatsSQL adds buffered statistics to many keys in one statement. It
// locks the key rows first, in key order (a locking SELECT locks rows as
// its ORDER BY yields them): two flushes of overlapping keys, or a flush and
// a purge, from any processes, then wait for each other instead of
// deadlocking.
const applyStatsSQL = `
WITH d AS (
	SELECT * FROM jsonb_to_recordset($1::jsonb) AS d(k text, n bigint, srcs jsonb, c bigint, w text, v boolean)
),
lk AS MATERIALIZED (
	SELECT k.key FROM gemrecon_keys k WHERE k.key IN (SELECT d.k FROM d) ORDER BY k.key FOR UPDATE
),
upd AS (
	UPDATE gemrecon_keys k SET
		seen_count    = k.seen_count + d.n,
		last_seen_at  = greatest(k.last_seen_at, $2),
		sources       = k.sources || ARRAY(
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

type statsRow struct {
	Key       string   `json:"k"`
	N         int64    `json:"n"`
	Sources   []string `json:"srcs"`
	Conflicts int64    `json:"c"`
	Webhook   []byte   `json:"w,omitempty"` // base64 in JSON
	Verified  bool     `json:"v,omitempty"`
}

func (t *pgTx) ApplyStats(ds map[string]*sink.Delta) error {
	rows := make([]statsRow, 0, len(ds))
	for k, d := range ds {
		rows = append(rows, statsRow{Key: k, N: d.N, Sources: d.Sources, Conflicts: d.Conflicts, Webhook: d.Webhook, Verified: d.Verified})
	}
	doc, err := json.Marshal(rows)
	if err != nil {
		return err
	}
	return t.exec(applyStatsSQL, doc, t.now)
}

func (t *pgTx) Purge(before time.Time) ([]string, error) {
	// Locked in key order first, as applyStatsSQL locks them.
	rows, err := t.tx.Query(t.ctx, `
		WITH lk AS MATERIALIZED (
			SELECT key FROM gemrecon_keys WHERE state = 'done' AND done_at < $1 ORDER BY key FOR UPDATE)
		DELETE FROM gemrecon_keys k USING lk
		WHERE k.key = lk.key AND k.state = 'done' AND k.done_at < $1
		RETURNING k.key`, before)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func (t *pgTx) NoteLookback(d time.Duration) error {
	return t.exec(`INSERT INTO gemrecon_lookback (id, max_micros, forever) VALUES (1, $1, $2)
		ON CONFLICT (id) DO UPDATE SET
			max_micros = greatest(gemrecon_lookback.max_micros, excluded.max_micros),
			forever = gemrecon_lookback.forever OR excluded.forever`, d.Microseconds(), d == 0)
}

const passColumns = `scope, last_start, last_end, coalesce(last_holder, ''), last_success, last_full_scan,
	coalesce(holder, ''), held_until, token, ended_at, unfinished, oldest_unfinished`

func scanPass(row pgx.Row) (sink.PassRow, error) {
	var (
		r                                                sink.PassRow
		start, end, success, full, held, endedAt, oldest *time.Time
	)
	err := row.Scan(&r.Scope, &start, &end, &r.LastHolder, &success, &full, &r.Holder, &held, &r.Token, &endedAt,
		&r.Unfinished, &oldest)
	r.LastStart, r.LastEnd, r.LastSuccess, r.LastFullScan = at(start), at(end), at(success), at(full)
	r.HeldUntil, r.EndedAt, r.OldestUnfinished = at(held), at(endedAt), at(oldest)
	return r, err
}

func (t *pgTx) LoadPass(scope string) (sink.PassRow, bool, error) {
	load := func() (sink.PassRow, error) {
		return scanPass(t.tx.QueryRow(t.ctx, `SELECT `+passColumns+` FROM gemrecon_passes WHERE scope = $1 FOR UPDATE`, scope))
	}
	r, err := load()
	if errors.Is(err, pgx.ErrNoRows) {
		// FOR UPDATE locks no row of a scope that has no record yet: the
		// scope's advisory lock, held to the transaction's end, makes
		// concurrent first acquisitions take turns (two scopes whose
		// hashes collide only take turns too). Read again under it: at
		// READ COMMITTED the statement sees a record that the previous
		// holder of the lock committed.
		h := fnv.New64a()
		h.Write([]byte("gemrecon_passes\x00" + scope))
		if err := t.exec(`SELECT pg_advisory_xact_lock($1)`, int64(h.Sum64())); err != nil {
			return sink.PassRow{}, false, err
		}
		r, err = load()
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return sink.PassRow{}, false, nil
	}
	return r, err == nil, err
}

func (t *pgTx) StorePass(r sink.PassRow) error {
	return t.exec(`INSERT INTO gemrecon_passes (scope, last_start, last_end, last_holder, last_success, last_full_scan,
		holder, held_until, token, ended_at, unfinished, oldest_unfinished)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT (scope) DO UPDATE SET last_start = $2, last_end = $3, last_holder = $4, last_success = $5,
			last_full_scan = $6, holder = $7, held_until = $8, token = $9, ended_at = $10, unfinished = $11,
			oldest_unfinished = $12`,
		r.Scope, null(r.LastStart), null(r.LastEnd), nullText(r.LastHolder), null(r.LastSuccess), null(r.LastFullScan),
		nullText(r.Holder), null(r.HeldUntil), r.Token, null(r.EndedAt), r.Unfinished, null(r.OldestUnfinished))
}

// Exec runs an --sql script in the transaction: the simple protocol runs a
// multi-statement script in one round trip, and pgx substitutes the named
// parameters as quoted literals; json.RawMessage values are passed as text
// (cast them, e.g. @operation::jsonb).
func (t *pgTx) Exec(script string, params map[string]any) error {
	args := pgx.NamedArgs{}
	for k, v := range params {
		if raw, ok := v.(json.RawMessage); ok {
			v = string(raw)
		}
		args[k] = v
	}
	if _, err := t.tx.Exec(t.ctx, script, pgx.QueryExecModeSimpleProtocol, args); err != nil {
		return fmt.Errorf("sql script: %w", withCtxErr(t.ctx, err))
	}
	return nil
}

func (t *pgTx) AddHistory(key string, a sink.Attempt, keep int) error {
	if err := t.exec(`INSERT INTO gemrecon_history (key, seq, kind, token, command, holder, started, ended, outcome, error)
		SELECT $1, coalesce(max(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8, $9 FROM gemrecon_history WHERE key = $1`,
		key, a.Kind, a.Token, a.Command, a.Holder, a.Start, null(a.End), a.Outcome, a.Error); err != nil || keep <= 0 {
		return err
	}
	return t.exec(`WITH gone AS (
			DELETE FROM gemrecon_history WHERE key = $1
				AND seq <= (SELECT max(seq) FROM gemrecon_history WHERE key = $1) - $2 RETURNING 1)
		UPDATE gemrecon_keys SET history_dropped = history_dropped + (SELECT count(*) FROM gone)
		WHERE key = $1 AND EXISTS (SELECT 1 FROM gone)`, key, keep)
}

func (t *pgTx) EndAttempt(key string, token int64, end time.Time, outcome, errText string) error {
	return t.exec(`UPDATE gemrecon_history SET ended = $1, outcome = $2, error = $3
		WHERE key = $4 AND token = $5 AND kind = 'attempt' AND outcome = 'running'`, end, outcome, errText, key, token)
}

// withCtxErr makes an error caused by the context's end (the server
// cancelled the statement on request) match ctx.Err() too.
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return errors.Join(cerr, err)
	}
	return err
}

// The reads, each on a pooled connection.

func (s *pg) Peek(ctx context.Context, key string) (sink.Row, bool, error) {
	var r sink.Row
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var err error
		r, err = scanRow(c.QueryRow(ctx, `SELECT `+rowColumns+` FROM gemrecon_keys WHERE key = $1`, key))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return sink.Row{}, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("postgres: %w", err)
	}
	return r, true, nil
}

// entryColumns are read FROM entryFrom.
var entryColumns = `k.key, state, attempts, token, first_source, sources, seen_count, first_seen_at,
	last_seen_at, coalesce(lease_owner, ''), lease_until, next_attempt_at, done_at,
	coalesce(last_error, ''), conflicts, payload, confirmed, batch_state, needs_confirm, dead_reason,
	coalesce(x.results_file, ''), reruns, history_dropped, batch_end, ` + webhookExpr("k")

const entryFrom = ` FROM gemrecon_keys k LEFT JOIN gemrecon_key_extras x ON x.key = k.key `

func scanEntry(row pgx.Row) (sink.Entry, error) {
	var e sink.Entry
	var state string
	var leaseUntil, next, done, end *time.Time
	err := row.Scan(&e.Key, &state, &e.Attempts, &e.Token, &e.FirstSource, &e.Sources, &e.SeenCount,
		&e.FirstSeenAt, &e.LastSeenAt, &e.LeaseOwner, &leaseUntil, &next, &done, &e.LastError,
		&e.Conflicts, &e.Payload, &e.Confirmed, &e.BatchState, &e.NeedsConfirm, &e.DeadReason, &e.ResultsFile,
		&e.Reruns, &e.Dropped, &end, &e.Webhook)
	e.BatchEnd = at(end)
	e.State = sink.State(state)
	e.FirstSeenAt, e.LastSeenAt = e.FirstSeenAt.UTC(), e.LastSeenAt.UTC()
	e.LeaseUntil, e.NextAttemptAt, e.DoneAt = at(leaseUntil), at(next), at(done)
	return e, err
}

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// read returns what fn reads on a pooled connection (withConn); with
// snapshot, inside one read-only transaction at REPEATABLE READ. Its error
// says what was read.
func read[T any](ctx context.Context, s *pg, what string, snapshot bool, fn func(q querier) (T, error)) (T, error) {
	var v T
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var q querier = c
		if snapshot {
			tx, err := c.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			q = tx
		}
		var err error
		v, err = fn(q)
		return err
	})
	if err != nil {
		return v, fmt.Errorf("postgres: %s: %w", what, err)
	}
	return v, nil
}

// Entry reads a key and its history from one snapshot.
func (s *pg) Entry(ctx context.Context, key string) (sink.Entry, error) {
	e, err := read(ctx, s, "get "+sink.KeyText(key), true, func(q querier) (sink.Entry, error) {
		e, err := scanEntry(q.QueryRow(ctx, `SELECT `+entryColumns+entryFrom+`WHERE k.key = $1`, key))
		if err != nil {
			return e, err
		}
		rows, err := q.Query(ctx, `SELECT kind, token, command, holder, started, ended, outcome, error
			FROM gemrecon_history WHERE key = $1 ORDER BY seq`, key)
		if err != nil {
			return e, err
		}
		e.History, err = pgx.AppendRows(e.History, rows, func(r pgx.CollectableRow) (sink.Attempt, error) {
			var a sink.Attempt
			var end *time.Time
			err := r.Scan(&a.Kind, &a.Token, &a.Command, &a.Holder, &a.Start, &end, &a.Outcome, &a.Error)
			a.Start, a.End = a.Start.UTC(), at(end)
			return a, err
		})
		return e, err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return e, sink.ErrNotFound
	}
	return e, err
}

func (s *pg) Entries(ctx context.Context, o sink.ListOptions) ([]sink.Entry, error) {
	return read(ctx, s, "list", false, func(q querier) ([]sink.Entry, error) {
		rows, err := q.Query(ctx, `SELECT `+entryColumns+entryFrom+`WHERE ($1 = '' OR state = $1)
			ORDER BY first_seen_at, k.key LIMIT $2`, string(o.State), limitArg(o.Limit))
		if err != nil {
			return nil, err
		}
		return pgx.AppendRows([]sink.Entry(nil), rows, func(r pgx.CollectableRow) (sink.Entry, error) { return scanEntry(r) })
	})
}

func (s *pg) DueKeys(ctx context.Context, limit int, skipNeedsConfirm bool) ([]string, error) {
	now, err := s.Now(ctx)
	if err != nil {
		return nil, err
	}
	return read(ctx, s, "due", false, func(q querier) ([]string, error) {
		rows, err := q.Query(ctx, `SELECT key FROM gemrecon_keys WHERE `+claimableWhere+` ORDER BY `+dueOrder+` LIMIT $3`,
			now, skipNeedsConfirm, limitArg(limit))
		if err != nil {
			return nil, err
		}
		return pgx.AppendRows([]string(nil), rows, pgx.RowTo[string]) // nil when none
	})
}

// microsDuration converts microseconds as PostgreSQL computes them (NULL:
// none) to a duration.
func microsDuration(us *float64) time.Duration {
	if us == nil {
		return 0
	}
	return time.Duration(*us * float64(time.Microsecond))
}

// Stats summarises the sink from one snapshot. Latency percentiles are
// nearest-rank (percentile_disc) over done keys' done_at − first_seen_at.
func (s *pg) Stats(ctx context.Context) (sink.Stats, error) {
	now, err := s.Now(ctx)
	if err != nil {
		return sink.NewStats(), err
	}
	return read(ctx, s, "stats", true, func(tx querier) (sink.Stats, error) {
		st := sink.NewStats() // afresh if withConn runs this again
		rows, err := tx.Query(ctx, `SELECT state, first_source, dead_reason, count(*) FROM gemrecon_keys GROUP BY 1, 2, 3`)
		if err != nil {
			return st, err
		}
		var state, source, dead string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&state, &source, &dead, &n}, func() error {
			st.AddKeys(sink.State(state), source, dead, n)
			return nil
		}); err != nil {
			return st, err
		}
		var oldest, p50, p99, max *float64
		err = tx.QueryRow(ctx, `SELECT
				coalesce(sum(seen_count - 1), 0)::bigint,
				coalesce(sum(conflicts), 0)::bigint,
				(SELECT value FROM gemrecon_counters WHERE name = 'fenced'),
				extract(epoch FROM $1 - min(first_seen_at) FILTER (WHERE state = 'pending')) * 1e6,
				percentile_disc(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - first_seen_at) * 1e6)
					FILTER (WHERE state = 'done'),
				percentile_disc(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - first_seen_at) * 1e6)
					FILTER (WHERE state = 'done'),
				(max(extract(epoch FROM done_at - first_seen_at)) FILTER (WHERE state = 'done')) * 1e6,
				count(*) FILTER (WHERE state <> 'done' AND batch_state = 'SUCCEEDED' AND batch_end > $2 AND batch_end <= $3)
			FROM gemrecon_keys`, now, now.Add(-sink.ResultsKept), now.Add(sink.ResultsWarning-sink.ResultsKept)).
			Scan(&st.DuplicatesSuppressed, &st.Conflicts, &st.Fenced, &oldest, &p50, &p99, &max, &st.ResultsExpiring)
		if err != nil {
			return st, err
		}
		st.OldestPendingAge = microsDuration(oldest)
		st.LatencyP50, st.LatencyP99, st.LatencyMax = microsDuration(p50), microsDuration(p99), microsDuration(max)
		st.Passes, err = passRecords(ctx, tx)
		return st, err
	})
}

func (s *pg) PassRecords(ctx context.Context) ([]sink.PassRecord, error) {
	return read(ctx, s, "pass records", false, func(q querier) ([]sink.PassRecord, error) { return passRecords(ctx, q) })
}

// passRecords reads every scope's record, ordered by scope in byte order
// (COLLATE "C", as sink/sqlite orders them); never nil.
func passRecords(ctx context.Context, q querier) ([]sink.PassRecord, error) {
	rows, err := q.Query(ctx, `SELECT `+passColumns+` FROM gemrecon_passes ORDER BY scope COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (sink.PassRecord, error) {
		p, err := scanPass(r)
		return p.PassRecord, err
	})
	if recs == nil {
		recs = []sink.PassRecord{}
	}
	return recs, err
}

func (s *pg) MaxLookback(ctx context.Context) (d time.Duration, forever bool, ok bool, err error) {
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
func (s *pg) Ping(ctx context.Context) error {
	_, err := read(ctx, s, "ping", false, func(q querier) (recovery bool, err error) {
		var ro string
		if err := q.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&recovery, &ro); err != nil {
			return recovery, err
		}
		if !s.opt.ReadOnly && (recovery || ro == "on") {
			return recovery, errors.New("database is read-only")
		}
		return recovery, nil
	})
	return err
}
