package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/sink"
)

// CompleteSQL runs script and marks the key done in one transaction, fenced
// on token (checked before the script, and again by the done mark after it): the --sql effect of spec §4, exactly once for writes to this
// same database. The script may hold several statements and uses named
// parameters (@key, @token, …) taken from params; json.RawMessage values are
// passed as text (cast them, e.g. @operation::jsonb). If the token is not
// current nothing runs and the error wraps sink.ErrFenced; if the script
// fails the transaction rolls back, the key stays claimed and the error is
// the script's (the caller's Fail decides what next). An outcome lost with
// the connection is read back like Complete's.
func (s *Sink) CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error {
	args := pgx.NamedArgs{}
	for k, v := range params {
		if raw, ok := v.(json.RawMessage); ok {
			v = string(raw)
		}
		args[k] = v
	}
	var info doneInfo
	var scriptErr error
	err := s.write(ctx, func(c *pgx.Conn) error {
		scriptErr = nil
		tx, err := c.Begin(ctx)
		if err != nil {
			return notCommitted{err}
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		// Check the token first, without locking the row: a stale holder
		// runs nothing, and the live holder's lease renewals are not
		// blocked behind a long script.
		var curState string
		var curToken int64
		err = tx.QueryRow(ctx, `SELECT state, token FROM gemrecon_keys WHERE key = $1`, key).Scan(&curState, &curToken)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && (curState != string(sink.StateClaimed) || curToken != token) {
			return notCommitted{errNotCurrent}
		}
		if err != nil {
			return notCommitted{err}
		}
		// The simple protocol runs a multi-statement script in one round
		// trip; pgx substitutes the named parameters as quoted literals.
		if _, err := tx.Exec(ctx, script, pgx.QueryExecModeSimpleProtocol, args); err != nil {
			scriptErr = err
			return notCommitted{err}
		}
		// Mark done only if the token is still current (a takeover while
		// the script ran makes this match nothing: everything rolls back).
		err = tx.QueryRow(ctx, `UPDATE gemrecon_keys
			SET state = 'done', done_at = `+now3+`, lease_owner = NULL, lease_until = NULL, next_attempt_at = NULL
			WHERE key = $1 AND state = 'claimed' AND token = $2 RETURNING first_source, confirmed, batch_state`,
			key, token, s.nowArg()).Scan(&info.firstSource, &info.confirmed, &info.batchState)
		if errors.Is(err, pgx.ErrNoRows) {
			return notCommitted{errNotCurrent}
		}
		if err != nil {
			return notCommitted{err}
		}
		return tx.Commit(ctx) // only an error here leaves the outcome unknown
	})
	switch {
	case scriptErr != nil:
		return fmt.Errorf("postgres: complete %s: sql script: %w", canon.Quote(key), withCtxErr(ctx, scriptErr))
	case errors.Is(err, errNotCurrent):
		// Count and explain the fenced outcome in its own statement.
		var cur current
		cerr := s.withConn(ctx, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, `WITH f AS (
					UPDATE gemrecon_counters SET value = value + 1
					WHERE name = 'fenced' AND EXISTS (SELECT 1 FROM gemrecon_keys WHERE key = $1)
					RETURNING value)
				SELECT cur.state, cur.token FROM (SELECT 1) AS one
				LEFT JOIN gemrecon_keys cur ON cur.key = $1`, key).Scan(&cur.state, &cur.token)
		})
		if cerr != nil {
			return fmt.Errorf("postgres: complete %s token %d: %w (and counting it failed: %v)", canon.Quote(key), token, sink.ErrFenced, cerr)
		}
		return s.fencedErr("complete", key, token, cur)
	case unknownOutcome(err):
		return s.completeReadBack(ctx, key, token, err)
	case err != nil:
		return fmt.Errorf("postgres: complete %s: %w", canon.Quote(key), withCtxErr(ctx, err))
	}
	s.mu.Lock()
	s.noteDoneLocked(key, info.firstSource, info.confirmed, info.batchState)
	s.mu.Unlock()
	return nil
}

// errNotCurrent marks a fenced miss inside CompleteSQL's transaction.
var errNotCurrent = errors.New("token not current")

// notCommitted wraps an error raised before COMMIT was sent: whatever it
// is, the transaction did not commit, so the outcome is known.
type notCommitted struct{ err error }

func (e notCommitted) Error() string { return e.err.Error() }
func (e notCommitted) Unwrap() error { return e.err }
