package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The rows of package sink's state machine, as this schema keeps them:
// times in Unix nanoseconds (0: none), the bodies in gemrecon_payloads, and
// due_at — the time that matters in the key's state (next attempt, lease
// end, done time; 0 when dead) — kept for the due indexes.

const rowColumns = `key, state, attempts, token, lease_owner, lease_until, next_attempt_at, done_at, last_error,
	first_source, first_seen_at, confirmed, batch_state, needs_confirm, dead_reason, conflicts, retries, reruns, no_results,
	batch_end`

type scanner interface{ Scan(...any) error }

// scanRow scans a row of rowColumns, and then into extra the columns after them.
func scanRow(sc scanner, extra ...any) (sink.Row, error) {
	var (
		r                                  sink.Row
		st                                 string
		leaseUntil, next, done, first, end int64
	)
	err := sc.Scan(append([]any{&r.Key, &st, &r.Attempts, &r.Token, &r.Owner, &leaseUntil, &next, &done, &r.LastError,
		&r.FirstSource, &first, &r.Confirmed, &r.BatchState, &r.NeedsConfirm, &r.DeadReason, &r.Conflicts,
		&r.Retries, &r.Reruns, &r.NoResults, &end}, extra...)...)
	r.State = sink.State(st)
	r.LeaseUntil, r.NextAttempt, r.DoneAt, r.FirstSeenAt = fromNS(leaseUntil), fromNS(next), fromNS(done), fromNS(first)
	r.BatchEnd = fromNS(end)
	return r, err
}

// rowArgs are the stored values of r's mutable columns, ?2 to ?19 after the
// key; due_at is derived from the state.
func rowArgs(r sink.Row) []any {
	due := int64(0)
	switch r.State {
	case sink.StatePending:
		due = toNS(r.NextAttempt)
	case sink.StateClaimed:
		due = toNS(r.LeaseUntil)
	case sink.StateDone:
		due = toNS(r.DoneAt)
	}
	return []any{r.Key, string(r.State), r.Attempts, r.Token, r.Owner, toNS(r.LeaseUntil), toNS(r.NextAttempt),
		toNS(r.DoneAt), r.LastError, r.Confirmed, r.BatchState, r.NeedsConfirm, r.DeadReason, r.Conflicts,
		r.Retries, r.Reruns, r.NoResults, due, toNS(r.BatchEnd)}
}

// webhookExpr is the first webhook body: kept apart once the payload is the
// API's operation, and the payload itself while a webhook-first key is
// unconfirmed (each byte stored once).
const webhookExpr = `coalesce(p.webhook, CASE WHEN k.first_source = 'webhook' AND k.confirmed = 0 THEN p.payload END)`

// tx is one write of a batch (sink.Tx), on the writer connection inside
// the batch's transaction: what it loads cannot change before the commit.
type tx struct {
	db  *db
	now time.Time
}

func (t *tx) Now() time.Time { return t.now }

func (t *tx) exec(q string, args ...any) (sql.Result, error) {
	st, err := prepared(&t.db.wstmts, t.db.wconn, q)
	if err != nil {
		return nil, err
	}
	return st.Exec(args...)
}

func (t *tx) query(q string, args ...any) (*sql.Rows, error) {
	st, err := prepared(&t.db.wstmts, t.db.wconn, q)
	if err != nil {
		return nil, err
	}
	return st.Query(args...)
}

func (t *tx) Load(key string) (sink.Row, bool, error) {
	st, err := prepared(&t.db.wstmts, t.db.wconn, `SELECT `+rowColumns+` FROM gemrecon_keys WHERE key = ?`)
	if err != nil {
		return sink.Row{}, false, t.db.fail(err)
	}
	r, err := scanRow(st.QueryRow(key))
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Row{}, false, nil
	}
	return r, err == nil, t.db.fail(err)
}

// dueQuery lists claimable keys oldest first: by the time they became due
// (next attempt, or lease end for an expired claim), then first sighting,
// then key. It reads one ordered range of each partial due index and
// merges the two.
func dueQuery(cols string, skipNeedsConfirm bool) string {
	skip := ""
	if skipNeedsConfirm {
		skip = ` AND needs_confirm = 0`
	}
	return `SELECT ` + cols + `, due_at, first_seen_at AS f FROM gemrecon_keys WHERE state = 'pending' AND due_at <= ?1` + skip + `
		UNION ALL
		SELECT ` + cols + `, due_at, first_seen_at AS f FROM gemrecon_keys WHERE state = 'claimed' AND due_at <= ?1` + skip + `
		ORDER BY due_at, f, key LIMIT ?2`
}

func limitArg(limit int) int {
	if limit <= 0 {
		return -1
	}
	return limit
}

func (t *tx) Due(limit int, skipNeedsConfirm bool) ([]sink.Row, error) {
	rows, err := t.query(dueQuery(rowColumns, skipNeedsConfirm), toNS(t.now), limitArg(limit))
	return collect(rows, err, func(sc scanner) (sink.Row, error) {
		var due, first int64 // the order's columns
		return scanRow(sc, &due, &first)
	})
}

// collect scans every row of rows (or returns err) with scan, and closes
// rows; nil when there is none.
func collect[T any](rows *sql.Rows, err error, scan func(scanner) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// scanKey scans a row of one key.
func scanKey(sc scanner) (k string, err error) { return k, sc.Scan(&k) }

func (t *tx) Insert(r sink.Row, payload []byte) (bool, error) {
	res, err := t.exec(`INSERT INTO gemrecon_keys (key, state, attempts, token, lease_owner, lease_until, next_attempt_at,
		done_at, last_error, confirmed, batch_state, needs_confirm, dead_reason, conflicts, retries, reruns, no_results, due_at,
		batch_end, first_source, sources, seen_count, first_seen_at, last_seen_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ',' || ?20 || ',', 1, ?21, ?21)
		ON CONFLICT (key) DO NOTHING`, append(rowArgs(r), r.FirstSource, toNS(r.FirstSeenAt))...)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	if len(payload) > 0 {
		_, err = t.exec(`INSERT INTO gemrecon_payloads (key, payload, payload_sha) VALUES (?, ?, ?)`, r.Key, payload, sink.PayloadHash(payload))
	}
	return true, err
}

func (t *tx) Update(r sink.Row) error {
	_, err := t.exec(`UPDATE gemrecon_keys SET state = ?2, attempts = ?3, token = ?4, lease_owner = ?5, lease_until = ?6,
		next_attempt_at = ?7, done_at = ?8, last_error = ?9, confirmed = ?10, batch_state = ?11, needs_confirm = ?12,
		dead_reason = ?13, conflicts = ?14, retries = ?15, reruns = ?16, no_results = ?17, due_at = ?18, batch_end = ?19
		WHERE key = ?1`, rowArgs(r)...)
	return err
}

func (t *tx) Bodies(key string) (payload, webhook []byte, resultsFile string, err error) {
	st, err := prepared(&t.db.wstmts, t.db.wconn, `SELECT p.payload, `+webhookExpr+`, coalesce(p.results_file, '')
		FROM gemrecon_keys k LEFT JOIN gemrecon_payloads p ON p.key = k.key WHERE k.key = ?`)
	if err == nil {
		err = st.QueryRow(key).Scan(&payload, &webhook, &resultsFile)
	}
	return payload, webhook, resultsFile, err
}

func (t *tx) SetOperation(key string, op []byte, moveWebhook bool) error {
	_, err := t.exec(`INSERT INTO gemrecon_payloads (key, payload, payload_sha) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET
			webhook = CASE WHEN ?4 THEN coalesce(webhook, payload) ELSE webhook END,
			payload = excluded.payload, payload_sha = excluded.payload_sha`, key, op, sink.PayloadHash(op), moveWebhook)
	return err
}

func (t *tx) SetResults(key, file string) error {
	_, err := t.exec(`UPDATE gemrecon_payloads SET results_file = ? WHERE key = ?`, file, key)
	return err
}

func (t *tx) CountFenced() error {
	_, err := t.exec(`INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 1) ON CONFLICT (name) DO UPDATE SET value = value + 1`)
	return err
}

func (t *tx) ApplyStats(ds map[string]*sink.Delta) error {
	for k, d := range ds {
		if _, err := t.exec(`UPDATE gemrecon_keys SET seen_count = seen_count + ?1, last_seen_at = max(last_seen_at, ?2),
			conflicts = conflicts + ?3, needs_confirm = needs_confirm AND NOT ?4 WHERE key = ?5`,
			d.N, toNS(t.now), d.Conflicts, d.Verified, k); err != nil {
			return err
		}
		for _, src := range d.Sources {
			if _, err := t.exec(`UPDATE gemrecon_keys SET sources = sources || ?1 || ','
				WHERE key = ?2 AND instr(sources, ',' || ?1 || ',') = 0`, src, k); err != nil {
				return err
			}
		}
		if d.Webhook != nil {
			if _, err := t.exec(`UPDATE gemrecon_payloads SET webhook = ?1 WHERE key = ?2 AND webhook IS NULL`, d.Webhook, k); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *tx) Purge(before time.Time) ([]string, error) {
	cut := before.UnixNano()
	if _, err := t.exec(`DELETE FROM gemrecon_payloads WHERE key IN
		(SELECT key FROM gemrecon_keys WHERE state = 'done' AND done_at < ?)`, cut); err != nil {
		return nil, err
	}
	rows, err := t.query(`DELETE FROM gemrecon_keys WHERE state = 'done' AND done_at < ? RETURNING key`, cut)
	return collect(rows, err, scanKey)
}

func (t *tx) NoteLookback(d time.Duration) error {
	if _, err := t.exec(`INSERT INTO gemrecon_meta (name, value) VALUES ('max_lookback_ns', ?1)
		ON CONFLICT (name) DO UPDATE SET value = max(value, ?1)`, int64(d)); err != nil || d != 0 {
		return err
	}
	_, err := t.exec(`INSERT INTO gemrecon_meta (name, value) VALUES ('lookback_forever', 1) ON CONFLICT (name) DO UPDATE SET value = 1`)
	return err
}

const passColumns = `scope, last_start, last_end, last_holder, last_success, last_full_scan, holder, held_until, token, ended_at,
	unfinished, oldest_unfinished`

func scanPass(sc scanner) (sink.PassRow, error) {
	var (
		r                                              sink.PassRow
		start, end, success, full, held, ended, oldest int64
		unfinished                                     string
	)
	err := sc.Scan(&r.Scope, &start, &end, &r.LastHolder, &success, &full, &r.Holder, &held, &r.Token, &ended, &unfinished, &oldest)
	r.LastStart, r.LastEnd, r.LastSuccess, r.LastFullScan = fromNS(start), fromNS(end), fromNS(success), fromNS(full)
	r.HeldUntil, r.EndedAt, r.OldestUnfinished = fromNS(held), fromNS(ended), fromNS(oldest)
	if err == nil && unfinished != "" {
		err = json.Unmarshal([]byte(unfinished), &r.Unfinished)
	}
	return r, err
}

func (t *tx) LoadPass(scope string) (sink.PassRow, bool, error) {
	r, err := scanPass(t.db.wconn.QueryRowContext(context.Background(), `SELECT `+passColumns+` FROM gemrecon_passes WHERE scope = ?`, scope))
	if errors.Is(err, sql.ErrNoRows) {
		return sink.PassRow{}, false, nil
	}
	return r, err == nil, err
}

func (t *tx) StorePass(r sink.PassRow) error {
	unfinished := ""
	if r.Unfinished != nil {
		b, err := json.Marshal(r.Unfinished)
		if err != nil {
			return err
		}
		unfinished = string(b)
	}
	_, err := t.exec(`INSERT INTO gemrecon_passes (`+passColumns+`) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
		ON CONFLICT (scope) DO UPDATE SET last_start = ?2, last_end = ?3, last_holder = ?4, last_success = ?5,
			last_full_scan = ?6, holder = ?7, held_until = ?8, token = ?9, ended_at = ?10, unfinished = ?11, oldest_unfinished = ?12`,
		r.Scope, toNS(r.LastStart), toNS(r.LastEnd), r.LastHolder, toNS(r.LastSuccess), toNS(r.LastFullScan),
		r.Holder, toNS(r.HeldUntil), r.Token, toNS(r.EndedAt), unfinished, toNS(r.OldestUnfinished))
	return err
}

// Exec runs an --sql script inside the write's savepoint: the driver
// prepares and steps its statements one after the other and binds the named
// parameters (@key, …) in every one; json.RawMessage values are bound as
// text. A failing statement rolls the savepoint back: the done mark and the
// script's writes go, and nothing of the other writes of the batch.
func (t *tx) Exec(script string, params map[string]any) error {
	args := make([]any, 0, len(params))
	for k, v := range params {
		if raw, ok := v.(json.RawMessage); ok {
			v = string(raw)
		}
		args = append(args, sql.Named(k, v))
	}
	if _, err := t.db.wconn.ExecContext(context.Background(), script, args...); err != nil { // a user's script: not kept prepared
		return fmt.Errorf("sql script: %w", err)
	}
	return nil
}

func (t *tx) AddHistory(key string, a sink.Attempt, keep int) error {
	if _, err := t.exec(`INSERT INTO gemrecon_history (key, seq, kind, token, command, holder, started, ended, outcome, error)
		SELECT ?1, coalesce(max(seq), 0) + 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 FROM gemrecon_history WHERE key = ?1`,
		key, a.Kind, a.Token, a.Command, a.Holder, toNS(a.Start), toNS(a.End), a.Outcome, a.Error); err != nil || keep <= 0 {
		return err
	}
	res, err := t.exec(`DELETE FROM gemrecon_history WHERE key = ?1
		AND seq <= (SELECT max(seq) FROM gemrecon_history WHERE key = ?1) - ?2`, key, keep)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		_, err = t.exec(`UPDATE gemrecon_keys SET history_dropped = history_dropped + ? WHERE key = ?`, n, key)
	}
	return err
}

func (t *tx) EndAttempt(key string, token int64, end time.Time, outcome, errText string) error {
	_, err := t.exec(`UPDATE gemrecon_history SET ended = ?1, outcome = ?2, error = ?3
		WHERE key = ?4 AND token = ?5 AND kind = 'attempt' AND outcome = 'running'`, toNS(end), outcome, errText, key, token)
	return err
}

// The reads, on the reader pool.

// Peek reads under no context once ctx is checked: a read of one key by its
// primary key is short, and a context that can end costs the database/sql
// and driver goroutines that watch it more than the read.
func (s *db) Peek(ctx context.Context, key string) (sink.Row, bool, error) {
	if err := cmp.Or(ctx.Err(), s.Broken()); err != nil {
		return sink.Row{}, false, err
	}
	st, err := prepared(&s.rstmts, s.rdb, `SELECT state, confirmed, batch_state, needs_confirm, first_source FROM gemrecon_keys WHERE key = ?`)
	if err != nil {
		return sink.Row{}, false, s.fail(err)
	}
	r := sink.Row{Key: key}
	err = st.QueryRow(key).Scan(&r.State, &r.Confirmed, &r.BatchState, &r.NeedsConfirm, &r.FirstSource)
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Row{}, false, nil
	}
	return r, err == nil, s.fail(err)
}

const selectEntry = `SELECT k.key, k.state, k.attempts, k.token, k.first_source, k.sources, k.seen_count,
	k.first_seen_at, k.last_seen_at, k.lease_owner, k.lease_until, k.next_attempt_at, k.done_at, k.last_error,
	k.conflicts, p.payload, k.confirmed, k.batch_state, k.needs_confirm, k.dead_reason,
	coalesce(p.results_file, ''), k.reruns, k.history_dropped, k.batch_end, ` + webhookExpr + `
	FROM gemrecon_keys k LEFT JOIN gemrecon_payloads p ON p.key = k.key `

func scanEntry(sc scanner) (sink.Entry, error) {
	var (
		e                                            sink.Entry
		st, sources                                  string
		first, last, leaseUntil, nextAt, doneAt, end int64
	)
	err := sc.Scan(&e.Key, &st, &e.Attempts, &e.Token, &e.FirstSource, &sources, &e.SeenCount, &first, &last,
		&e.LeaseOwner, &leaseUntil, &nextAt, &doneAt, &e.LastError, &e.Conflicts, &e.Payload,
		&e.Confirmed, &e.BatchState, &e.NeedsConfirm, &e.DeadReason, &e.ResultsFile, &e.Reruns, &e.Dropped, &end, &e.Webhook)
	e.BatchEnd = fromNS(end)
	e.State = sink.State(st)
	e.Sources = strings.FieldsFunc(sources, func(r rune) bool { return r == ',' })
	e.FirstSeenAt, e.LastSeenAt = fromNS(first), fromNS(last)
	e.LeaseUntil, e.NextAttemptAt, e.DoneAt = fromNS(leaseUntil), fromNS(nextAt), fromNS(doneAt)
	return e, err
}

// Entry reads a key and its history in one read transaction.
func (s *db) Entry(ctx context.Context, key string) (sink.Entry, error) {
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return sink.Entry{}, s.fail(err)
	}
	defer tx.Rollback()
	e, err := scanEntry(tx.QueryRowContext(ctx, selectEntry+`WHERE k.key = ?`, key))
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Entry{}, sink.ErrNotFound
	}
	if err != nil {
		return e, s.fail(err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT kind, token, command, holder, started, ended, outcome, error
		FROM gemrecon_history WHERE key = ? ORDER BY seq`, key)
	e.History, err = collect(rows, err, func(sc scanner) (a sink.Attempt, err error) {
		var start, end int64
		err = sc.Scan(&a.Kind, &a.Token, &a.Command, &a.Holder, &start, &end, &a.Outcome, &a.Error)
		a.Start, a.End = fromNS(start), fromNS(end)
		return a, err
	})
	return e, s.fail(err)
}

func (s *db) Entries(ctx context.Context, o sink.ListOptions) ([]sink.Entry, error) {
	rows, err := s.rdb.QueryContext(ctx, selectEntry+`WHERE ?1 = '' OR k.state = ?1
		ORDER BY k.first_seen_at, k.key LIMIT ?2`, string(o.State), limitArg(o.Limit))
	es, err := collect(rows, err, scanEntry)
	return es, s.fail(err)
}

func (s *db) DueKeys(ctx context.Context, limit int, skipNeedsConfirm bool) ([]string, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT key FROM (`+dueQuery("key", skipNeedsConfirm)+`)`, toNS(s.opt.Now()), limitArg(limit))
	keys, err := collect(rows, err, scanKey)
	return keys, s.fail(err)
}

// Stats summarises the sink from one read snapshot; latency percentiles are
// nearest-rank over done keys' done_at − first_seen_at.
func (s *db) Stats(ctx context.Context) (sink.Stats, error) {
	st := sink.NewStats()
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return st, s.fail(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT state, first_source, dead_reason, count(*) FROM gemrecon_keys GROUP BY 1, 2, 3`)
	if _, err := collect(rows, err, func(sc scanner) (n int64, err error) {
		var state, source, dead string
		if err = sc.Scan(&state, &source, &dead, &n); err == nil {
			st.AddKeys(sink.State(state), source, dead, n)
		}
		return n, err
	}); err != nil {
		return st, s.fail(err)
	}
	var oldest sql.NullInt64
	now := s.opt.Now()
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(sum(seen_count - 1), 0), coalesce(sum(conflicts), 0),
		(SELECT min(first_seen_at) FROM gemrecon_keys WHERE state = 'pending'),
		coalesce((SELECT value FROM gemrecon_meta WHERE name = 'fenced'), 0),
		(SELECT count(*) FROM gemrecon_keys WHERE state <> 'done' AND batch_state = 'SUCCEEDED'
			AND batch_end > ?1 AND batch_end <= ?2)
		FROM gemrecon_keys`, now.Add(-sink.ResultsKept).UnixNano(), now.Add(sink.ResultsWarning-sink.ResultsKept).UnixNano()).
		Scan(&st.DuplicatesSuppressed, &st.Conflicts, &oldest, &st.Fenced, &st.ResultsExpiring); err != nil {
		return st, s.fail(err)
	}
	if oldest.Valid {
		st.OldestPendingAge = max(0, now.Sub(fromNS(oldest.Int64)))
	}
	if done := st.ByState[sink.StateDone]; done > 0 {
		if err := latencies(ctx, tx, done, &st); err != nil {
			return st, s.fail(err)
		}
	}
	if st.Passes, err = passRecords(ctx, tx); err != nil {
		return st, s.fail(err)
	}
	return st, nil
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// latencies sets the nearest-rank p50, p99 and maximum of done − first seen
// over the done keys (done of them), with one sort of the done rows.
func latencies(ctx context.Context, q querier, done int64, st *sink.Stats) error {
	rank := func(p float64) int64 { // 1-based
		return min(max(int64(math.Ceil(p*float64(done)))-1, 0), done-1) + 1
	}
	r50, r99, rMax := rank(0.50), rank(0.99), rank(1)
	rows, err := q.QueryContext(ctx, `SELECT rn, l FROM (SELECT done_at - first_seen_at AS l,
			row_number() OVER (ORDER BY done_at - first_seen_at) AS rn
			FROM gemrecon_keys WHERE state = 'done')
		WHERE rn IN (?1, ?2, ?3)`, r50, r99, rMax)
	_, err = collect(rows, err, func(sc scanner) (rn int64, err error) {
		var l int64
		err = sc.Scan(&rn, &l)
		for _, p := range []struct {
			rank int64
			d    *time.Duration
		}{{r50, &st.LatencyP50}, {r99, &st.LatencyP99}, {rMax, &st.LatencyMax}} {
			if rn == p.rank { // ranks may coincide (few done keys)
				*p.d = time.Duration(l)
			}
		}
		return rn, err
	})
	return err
}

func (s *db) PassRecords(ctx context.Context) ([]sink.PassRecord, error) {
	recs, err := passRecords(ctx, s.rdb)
	return recs, s.fail(err)
}

// passRecords reads every record through q, ordered by scope; never nil.
func passRecords(ctx context.Context, q querier) ([]sink.PassRecord, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+passColumns+` FROM gemrecon_passes ORDER BY scope`)
	recs, err := collect(rows, err, func(sc scanner) (sink.PassRecord, error) {
		r, err := scanPass(sc)
		return r.PassRecord, err
	})
	if recs == nil && err == nil {
		recs = []sink.PassRecord{}
	}
	return recs, err
}

func (s *db) MaxLookback(ctx context.Context) (time.Duration, bool, bool, error) {
	var d, forever sql.NullInt64
	err := s.rdb.QueryRowContext(ctx, `SELECT
		(SELECT value FROM gemrecon_meta WHERE name = 'max_lookback_ns'),
		(SELECT value FROM gemrecon_meta WHERE name = 'lookback_forever')`).Scan(&d, &forever)
	if err != nil {
		return 0, false, false, s.fail(err)
	}
	return time.Duration(d.Int64), forever.Int64 == 1, d.Valid || forever.Valid, nil
}

// Ping checks that the database answers a read and, unless the sink is
// read-only, that the writer can begin and commit a transaction (a file
// locked by another process beyond the busy timeout fails here).
func (s *db) Ping(ctx context.Context) error {
	if err := s.Broken(); err != nil {
		return err
	}
	var n int64
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM gemrecon_meta`).Scan(&n); err != nil {
		return s.fail(err)
	}
	if s.wdb == nil {
		return nil
	}
	return s.Write(ctx, func(sink.Tx) error { return nil })
}
