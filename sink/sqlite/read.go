package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

type rowsQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// scanKeys reads up to limit keys (limit < 0: all) of qDueKeys.
func scanKeys(rows *sql.Rows, err error, limit int) ([]string, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for (limit < 0 || len(keys) < limit) && rows.Next() {
		var k string
		var due, first int64
		if err := rows.Scan(&k, &due, &first); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// Due lists keys that can be claimed now, oldest first (limit <= 0: all).
func (s *Sink) Due(ctx context.Context, limit int, opts ...sink.ClaimOption) ([]string, error) {
	if limit <= 0 {
		limit = -1
	}
	rows, err := s.readQuery(ctx, dueQuery(sink.ClaimOptionsOf(opts)), s.nowNS())
	keys, err := scanKeys(rows, err, limit)
	return keys, s.fail(err)
}

const selectEntry = `SELECT k.key, k.state, k.attempts, k.token, k.first_source, k.sources, k.seen_count,
	k.first_seen_at, k.last_seen_at, k.lease_owner, k.lease_until, k.next_attempt_at, k.done_at, k.last_error,
	k.conflicts, p.payload, k.confirmed, k.batch_state, k.needs_confirm, k.dead_reason,
	coalesce(p.results_file, ''), ` + webhookExpr + `
	FROM gemrecon_keys k LEFT JOIN gemrecon_payloads p ON p.key = k.key `

func scanEntry(sc interface{ Scan(...any) error }) (sink.Entry, error) {
	var (
		e                                       sink.Entry
		st, sources                             string
		first, last, leaseUntil, nextAt, doneAt int64
	)
	err := sc.Scan(&e.Key, &st, &e.Attempts, &e.Token, &e.FirstSource, &sources, &e.SeenCount, &first, &last,
		&e.LeaseOwner, &leaseUntil, &nextAt, &doneAt, &e.LastError, &e.Conflicts, &e.Payload,
		&e.Confirmed, &e.BatchState, &e.NeedsConfirm, &e.DeadReason, &e.ResultsFile, &e.Webhook)
	if err != nil {
		return e, err
	}
	e.State = sink.State(st)
	e.Sources = splitSources(sources)
	e.FirstSeenAt, e.LastSeenAt = fromNS(first), fromNS(last)
	e.LeaseUntil, e.NextAttemptAt, e.DoneAt = fromNS(leaseUntil), fromNS(nextAt), fromNS(doneAt)
	return e, nil
}

func splitSources(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Get returns one key's entry, including sightings not yet written.
func (s *Sink) Get(ctx context.Context, key string) (sink.Entry, error) {
	e, err := scanEntry(s.readQueryRow(ctx, qGet, key))
	if errors.Is(err, sql.ErrNoRows) {
		return sink.Entry{}, fmt.Errorf("sqlite sink: %s: %w", sink.KeyText(key), sink.ErrNotFound)
	}
	if err != nil {
		return sink.Entry{}, s.fail(err)
	}
	if d, ok := s.stats.peek(key); ok {
		e.SeenCount += d.seen
		e.Conflicts += d.conflicts
		if t := fromNS(d.last); t.After(e.LastSeenAt) {
			e.LastSeenAt = t
		}
		for _, src := range d.sources {
			if !slices.Contains(e.Sources, src) {
				e.Sources = append(e.Sources, src)
			}
		}
	}
	return e, nil
}

// flushIfBuffered writes buffered statistics before an aggregate read.
func (s *Sink) flushIfBuffered(ctx context.Context) error {
	if s.wdb == nil || s.stats.len() == 0 {
		return nil
	}
	return s.Flush(ctx)
}

// List returns entries oldest first (by first sighting).
func (s *Sink) List(ctx context.Context, opt sink.ListOptions) ([]sink.Entry, error) {
	if opt.State != "" && !opt.State.Valid() {
		return nil, fmt.Errorf("sqlite sink: list: unknown state %q (want pending, claimed, done or dead)", opt.State)
	}
	if err := s.flushIfBuffered(ctx); err != nil {
		return nil, err
	}
	limit := opt.Limit
	if limit <= 0 {
		limit = -1
	}
	rows, err := s.rdb.QueryContext(ctx, selectEntry+`WHERE ?1 = '' OR k.state = ?1
		ORDER BY k.first_seen_at, k.key LIMIT ?2`, string(opt.State), limit)
	if err != nil {
		return nil, s.fail(err)
	}
	defer rows.Close()
	var out []sink.Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, s.fail(err)
		}
		out = append(out, e)
	}
	return out, s.fail(rows.Err())
}

// Stats summarises the sink; latency percentiles are nearest-rank over done
// keys' done_at − first_seen_at.
func (s *Sink) Stats(ctx context.Context) (sink.Stats, error) {
	if err := s.flushIfBuffered(ctx); err != nil {
		return sink.Stats{}, err
	}
	st := sink.Stats{
		ByState:      map[sink.State]int64{sink.StatePending: 0, sink.StateClaimed: 0, sink.StateDone: 0, sink.StateDead: 0},
		FirstSource:  map[string]int64{},
		DeadByReason: map[string]int64{sink.DeadEffect: 0, sink.DeadUnknownToAPI: 0},
	}
	// One read transaction so that every figure comes from one snapshot.
	tx, err := s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return st, s.fail(err)
	}
	defer tx.Rollback()
	if err := groupCount(ctx, tx, `SELECT state, count(*) FROM gemrecon_keys GROUP BY state`, func(k string, n int64) {
		st.ByState[sink.State(k)] = n
	}); err != nil {
		return st, s.fail(err)
	}
	if err := groupCount(ctx, tx, `SELECT first_source, count(*) FROM gemrecon_keys GROUP BY first_source`, func(k string, n int64) {
		st.FirstSource[k] = n
	}); err != nil {
		return st, s.fail(err)
	}
	if err := groupCount(ctx, tx, `SELECT CASE WHEN dead_reason = '' THEN '`+sink.DeadEffect+`' ELSE dead_reason END, count(*)
		FROM gemrecon_keys WHERE state = 'dead' GROUP BY 1`, func(k string, n int64) {
		st.DeadByReason[k] = n
	}); err != nil {
		return st, s.fail(err)
	}
	var oldest sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT coalesce(sum(seen_count - 1), 0), coalesce(sum(conflicts), 0),
		(SELECT min(first_seen_at) FROM gemrecon_keys WHERE state = 'pending'),
		coalesce((SELECT value FROM gemrecon_meta WHERE name = 'fenced'), 0)
		FROM gemrecon_keys`).Scan(&st.DuplicatesSuppressed, &st.Conflicts, &oldest, &st.Fenced); err != nil {
		return st, s.fail(err)
	}
	if oldest.Valid {
		st.OldestPendingAge = max(0, s.opt.Now().Sub(fromNS(oldest.Int64)))
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

// latencies sets the nearest-rank p50, p99 and maximum of done − first seen
// over the done keys (done of them), with one sort of the done rows (a
// window over them) instead of one ORDER BY … OFFSET query per quantile.
func latencies(ctx context.Context, q rowsQuerier, done int64, st *sink.Stats) error {
	rank := func(p float64) int64 { // 1-based
		idx := int64(math.Ceil(p*float64(done))) - 1
		return min(max(idx, 0), done-1) + 1
	}
	r50, r99, rMax := rank(0.50), rank(0.99), rank(1)
	rows, err := q.QueryContext(ctx, `SELECT rn, l FROM (SELECT done_at - first_seen_at AS l,
			row_number() OVER (ORDER BY done_at - first_seen_at) AS rn
			FROM gemrecon_keys WHERE state = 'done')
		WHERE rn IN (?1, ?2, ?3)`, r50, r99, rMax)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var rn, l int64
		if err := rows.Scan(&rn, &l); err != nil {
			return err
		}
		// Ranks may coincide (few done keys): test each.
		if rn == r50 {
			st.LatencyP50 = time.Duration(l)
		}
		if rn == r99 {
			st.LatencyP99 = time.Duration(l)
		}
		if rn == rMax {
			st.LatencyMax = time.Duration(l)
		}
	}
	return rows.Err()
}

func groupCount(ctx context.Context, q rowsQuerier, query string, f func(string, int64)) error {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return err
		}
		f(k, n)
	}
	return rows.Err()
}

// MaxLookback returns the longest lookback any poll noted.
func (s *Sink) MaxLookback(ctx context.Context) (time.Duration, bool, bool, error) {
	var d, forever sql.NullInt64
	err := s.rdb.QueryRowContext(ctx, `SELECT
		(SELECT value FROM gemrecon_meta WHERE name = 'max_lookback_ns'),
		(SELECT value FROM gemrecon_meta WHERE name = 'lookback_forever')`).Scan(&d, &forever)
	if err != nil {
		return 0, false, false, s.fail(err)
	}
	return time.Duration(d.Int64), forever.Int64 == 1, d.Valid || forever.Valid, nil
}
