package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The SQL of the hot paths. Each text is prepared once per connection (see
// prepared) instead of being parsed again on every call: parsing and planning
// cost as much CPU as the rest of a completion on the writer.
const (
	// The writer's transactions: BEGIN IMMEDIATE takes the write lock at
	// once (a deferred BEGIN could fail with SQLITE_BUSY_SNAPSHOT on its
	// first write, see ../shared/docs/storage.md).
	qBegin    = `BEGIN IMMEDIATE`
	qCommit   = `COMMIT`
	qRollback = `ROLLBACK`

	qSavepoint  = `SAVEPOINT op`
	qRollbackTo = `ROLLBACK TO op`
	qRelease    = `RELEASE op`

	qSavepointStats  = `SAVEPOINT stats`
	qRollbackToStats = `ROLLBACK TO stats`
	qReleaseStats    = `RELEASE stats`

	// qKeyRow is what a sighting of a known key needs: the key row alone
	// (no payload: conflicts are by state, spec §9.4).
	qKeyRow = `SELECT state, first_source, next_attempt_at, lease_until, confirmed, batch_state, needs_confirm
		FROM gemrecon_keys WHERE key = ?`

	qInsertKey = `INSERT INTO gemrecon_keys
		(key, state, first_source, sources, seen_count, first_seen_at, last_seen_at, next_attempt_at, due_at,
		 confirmed, batch_state, needs_confirm)
		VALUES (?1, 'pending', ?2, ',' || ?2 || ',', 1, ?3, ?3, ?3, ?3, ?4, ?5, ?6)
		ON CONFLICT (key) DO NOTHING`
	qInsertPayload = `INSERT INTO gemrecon_payloads (key, payload, payload_sha) VALUES (?, ?, ?)`
	// qInsertClaimed inserts a new key already claimed (RecordAndClaim):
	// one row and one index entry written once, instead of an insert as
	// pending and an update that moves it to claimed.
	qInsertClaimed = `INSERT INTO gemrecon_keys
		(key, state, first_source, sources, seen_count, first_seen_at, last_seen_at, next_attempt_at, due_at,
		 confirmed, batch_state, needs_confirm, token, attempts, lease_owner, lease_until)
		VALUES (?1, 'claimed', ?2, ',' || ?2 || ',', 1, ?3, ?3, 0, ?7, ?4, ?5, ?6, 1, 1, ?8, ?7)
		ON CONFLICT (key) DO NOTHING`

	// webhookExpr is the first webhook body: kept apart once the payload
	// is the API's operation, and the payload itself while a webhook-first
	// key is unconfirmed (each byte stored once).
	webhookExpr = `coalesce(p.webhook, CASE WHEN k.first_source = 'webhook' AND k.confirmed = 0 THEN p.payload END)`

	qClaimRow = `SELECT k.state, k.attempts, k.token, k.lease_until, k.next_attempt_at, p.payload, k.first_source,
		k.first_seen_at, k.confirmed, k.batch_state, k.needs_confirm, ` + webhookExpr + `, coalesce(p.results_file, '')
		FROM gemrecon_keys k LEFT JOIN gemrecon_payloads p ON p.key = k.key WHERE k.key = ?`
	qDeadExpired = `UPDATE gemrecon_keys SET state = 'dead', lease_owner = '', lease_until = 0,
		next_attempt_at = 0, due_at = 0, last_error = ?, dead_reason = '' WHERE key = ?`
	qClaim = `UPDATE gemrecon_keys SET state = 'claimed', token = ?1, attempts = ?2,
		lease_owner = ?3, lease_until = ?4, due_at = ?4, next_attempt_at = 0,
		last_error = CASE WHEN ?5 THEN ?6 ELSE last_error END
		WHERE key = ?7`

	// qDueKeys lists claimable keys oldest first: by the time they became
	// due (next attempt, or lease end for an expired claim), then first
	// sighting, then key. It reads one ordered range of the due index per
	// state and merges the two (MERGE (UNION ALL) in the plan): rows come
	// out one by one, and the caller stops reading after its limit. The
	// plain "state IN (...) ORDER BY due_at" went through a sorter instead.
	// There is no LIMIT parameter on purpose: SQLite plans with the bound
	// LIMIT value, so binding another limit (a dispatcher asks for 1 to
	// --concurrency keys) would re-prepare the statement every time.
	qDueKeys = `SELECT key, due_at, first_seen_at FROM gemrecon_keys WHERE state = 'pending' AND due_at <= ?1
		UNION ALL
		SELECT key, due_at, first_seen_at FROM gemrecon_keys WHERE state = 'claimed' AND due_at <= ?1
		ORDER BY 2, 3, 1`
	// qDueConfirmable is qDueKeys without the keys that need confirmation
	// (sink.SkipNeedsConfirm): a residual filter on the same index ranges.
	qDueConfirmable = `SELECT key, due_at, first_seen_at FROM gemrecon_keys WHERE state = 'pending' AND due_at <= ?1 AND needs_confirm = 0
		UNION ALL
		SELECT key, due_at, first_seen_at FROM gemrecon_keys WHERE state = 'claimed' AND due_at <= ?1 AND needs_confirm = 0
		ORDER BY 2, 3, 1`

	qFencedRow = `SELECT state, token FROM gemrecon_keys WHERE key = ?`
	qFencedInc = `INSERT INTO gemrecon_meta (name, value) VALUES ('fenced', 1)
		ON CONFLICT (name) DO UPDATE SET value = value + 1`

	qRenew = `UPDATE gemrecon_keys SET lease_until = ?1, due_at = ?1
		WHERE key = ?2 AND state = 'claimed' AND token = ?3`

	qComplete = `UPDATE gemrecon_keys SET state = 'done', done_at = ?1, due_at = ?1,
		lease_owner = '', lease_until = 0, next_attempt_at = 0
		WHERE key = ?2 AND state = 'claimed' AND token = ?3
		RETURNING first_source, confirmed, batch_state`

	qFailRow  = `SELECT attempts FROM gemrecon_keys WHERE key = ? AND state = 'claimed' AND token = ?`
	qFailDead = `UPDATE gemrecon_keys SET state = 'dead', lease_owner = '', lease_until = 0,
		next_attempt_at = 0, due_at = 0, last_error = ?, dead_reason = ? WHERE key = ?`
	qFailPending = `UPDATE gemrecon_keys SET state = 'pending', lease_owner = '', lease_until = 0,
		next_attempt_at = ?1, due_at = ?1, last_error = ?2 WHERE key = ?3`
	qFailUncounted = `UPDATE gemrecon_keys SET state = 'pending', lease_owner = '', lease_until = 0,
		next_attempt_at = ?1, due_at = ?1, last_error = ?2, attempts = ?3 WHERE key = ?4`

	qStatsSeen = `UPDATE gemrecon_keys SET
		seen_count = seen_count + ?1,
		last_seen_at = max(last_seen_at, ?2),
		conflicts = conflicts + ?3,
		sources = CASE WHEN instr(sources, ',' || ?4 || ',') > 0 THEN sources ELSE sources || ?4 || ',' END
		WHERE key = ?5`
	qStatsSource = `UPDATE gemrecon_keys SET
		sources = CASE WHEN instr(sources, ',' || ?1 || ',') > 0 THEN sources ELSE sources || ?1 || ',' END
		WHERE key = ?2`
	// A poll-first key's first webhook body, written lazily (written once).
	qStatsWebhook = `UPDATE gemrecon_payloads SET webhook = ?1 WHERE key = ?2 AND webhook IS NULL`
	// A sighting not verified only by a dynamic signature: the key no
	// longer needs confirmation (lazily: losing it is the safe direction).
	qStatsVerified = `UPDATE gemrecon_keys SET needs_confirm = 0 WHERE key = ?1 AND needs_confirm = 1`

	// Confirmation (spec §9.2): the key's row as the confirming write needs it.
	qConfirmRow = `SELECT state, token, first_source, confirmed, batch_state, dead_reason
		FROM gemrecon_keys WHERE key = ?`
	// The API's operation becomes the payload; a webhook-first key's body
	// (its payload until now) moves to webhook, once.
	qConfirmPayload = `INSERT INTO gemrecon_payloads (key, payload, payload_sha) VALUES (?1, ?2, ?3)
		ON CONFLICT (key) DO UPDATE SET
			webhook = CASE WHEN ?4 THEN coalesce(webhook, payload) ELSE webhook END,
			payload = excluded.payload, payload_sha = excluded.payload_sha`
	qConfirmKey = `UPDATE gemrecon_keys SET confirmed = 1, needs_confirm = 0,
		batch_state = CASE WHEN ?1 = '' THEN batch_state ELSE ?1 END, conflicts = conflicts + ?2
		WHERE key = ?3`
	qConfirmDue = `UPDATE gemrecon_keys SET next_attempt_at = ?1, due_at = ?1
		WHERE key = ?2 AND state = 'pending' AND next_attempt_at > ?1`
	qConfirmRevive = `UPDATE gemrecon_keys SET state = 'pending', attempts = 0, dead_reason = '',
		next_attempt_at = ?1, due_at = ?1, lease_owner = '', lease_until = 0
		WHERE key = ?2 AND state = 'dead' AND dead_reason = 'unknown_to_api'`
	qConflictInc = `UPDATE gemrecon_keys SET conflicts = conflicts + 1 WHERE key = ?`
	qNoteResults = `UPDATE gemrecon_payloads SET results_file = ?1 WHERE key = ?2`

	qGet = selectEntry + `WHERE k.key = ?`

	qPing = `SELECT count(*) FROM gemrecon_meta`
)

// writerQueries are prepared on the writer connection at Open.
func writerQueries() []string {
	return []string{
		qBegin, qCommit, qRollback,
		qSavepoint, qRollbackTo, qRelease,
		qSavepointStats, qRollbackToStats, qReleaseStats,
		qKeyRow, qInsertKey, qInsertPayload, qInsertClaimed,
		qClaimRow, qDeadExpired, qClaim, qDueKeys, qDueConfirmable,
		qFencedRow, qFencedInc, qRenew, qComplete,
		qFailRow, qFailDead, qFailPending, qFailUncounted,
		qStatsSeen, qStatsSource, qStatsWebhook, qStatsVerified,
		qConfirmRow, qConfirmPayload, qConfirmKey, qConfirmDue, qConfirmRevive, qConflictInc, qNoteResults,
	}
}

// readerQueries are prepared on the reader pool at Open (database/sql
// prepares them again, once, on each further connection of the pool).
func readerQueries() []string {
	return []string{qKeyRow, qDueKeys, qDueConfirmable, qGet, qPing}
}

// prepared is a set of statements prepared once on one pool.
type prepared map[string]*sql.Stmt

// preparer is what *sql.DB and *sql.Conn share: statements prepared on a
// *sql.Conn run on that connection only.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// prepare prepares queries on db.
func prepare(ctx context.Context, db preparer, queries []string) (prepared, error) {
	p := make(prepared, len(queries))
	for _, q := range queries {
		if _, ok := p[q]; ok {
			continue
		}
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("prepare %.40q…: %w", q, err)
		}
		p[q] = st
	}
	return p, nil
}

func (p prepared) close() error {
	var errs []error
	for q, st := range p {
		errs = append(errs, st.Close())
		delete(p, q)
	}
	return errors.Join(errs...)
}

// txStmt returns q, prepared on the writer connection (tx), or nil when q
// was not prepared (the caller then runs the text). Only the holder of wmu
// calls it.
func (s *Sink) txStmt(tx *sql.Conn, q string) *sql.Stmt {
	if ps, ok := s.wprep[q]; ok && tx == s.wconn {
		return ps
	}
	s.unprepared.Add(1)
	return nil
}

// txExec runs q inside tx with the prepared statement.
func (s *Sink) txExec(tx *sql.Conn, q string, args ...any) (sql.Result, error) {
	if st := s.txStmt(tx, q); st != nil {
		return st.ExecContext(context.Background(), args...)
	}
	return tx.ExecContext(context.Background(), q, args...)
}

// txQueryRow runs q inside tx with the prepared statement.
func (s *Sink) txQueryRow(tx *sql.Conn, q string, args ...any) *sql.Row {
	if st := s.txStmt(tx, q); st != nil {
		return st.QueryRowContext(context.Background(), args...)
	}
	return tx.QueryRowContext(context.Background(), q, args...)
}

// txQuery runs q inside tx with the prepared statement.
func (s *Sink) txQuery(tx *sql.Conn, q string, args ...any) (*sql.Rows, error) {
	if st := s.txStmt(tx, q); st != nil {
		return st.QueryContext(context.Background(), args...)
	}
	return tx.QueryContext(context.Background(), q, args...)
}

// readQueryRow runs q on the reader pool with the prepared statement.
func (s *Sink) readQueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st, ok := s.rprep[q]; ok {
		return st.QueryRowContext(ctx, args...)
	}
	s.unprepared.Add(1)
	return s.rdb.QueryRowContext(ctx, q, args...)
}

// readQuery runs q on the reader pool with the prepared statement.
func (s *Sink) readQuery(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st, ok := s.rprep[q]; ok {
		return st.QueryContext(ctx, args...)
	}
	s.unprepared.Add(1)
	return s.rdb.QueryContext(ctx, q, args...)
}
