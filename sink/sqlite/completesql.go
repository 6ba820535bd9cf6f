package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
)

// CompleteSQL runs script and marks the key done in one transaction, fenced
// on token: the --sql effect of spec §4 (see sink.SQLCompleter).
//
// It goes through the single writer like every other write, so it shares a
// group commit with whatever else is queued, inside its own savepoint:
//   - the done mark is written first, only if the key is claimed under token;
//     otherwise nothing runs, the fenced counter is incremented durably (it
//     is a domain error: the savepoint is kept) and the error wraps
//     sink.ErrFenced;
//   - the whole script is then handed to one Exec: the driver prepares and
//     steps its statements one after the other (SQLite's own parser splits
//     them) and binds the named parameters (@key, …) in every statement;
//     json.RawMessage values are bound as text;
//   - a failing statement makes the writer roll back to the savepoint, which
//     discards the done mark and every earlier statement of the script, and
//     nothing of the other operations in the same group commit.
//
// The outcome is always known when CompleteSQL returns: it waits for the
// writer even when ctx ends (a caller that stopped waiting could not tell
// whether the done mark committed). A ctx that ended before the operation's
// turn makes it a no-op: the token is still checked (ErrFenced wins), then
// the done mark is rolled back and ctx's error returned. The script itself
// is never interrupted: SQLite may roll back a whole transaction that is
// interrupted mid-write, which would take the other callers' operations of
// the group commit with it. A slow script holds the database's write lock
// (and this process's writer) for as long as it runs.
// A script whose own conflict clause rolls back the whole transaction (OR
// ROLLBACK, RAISE(ROLLBACK)) fails every operation of its group commit with
// an error: none of them is committed, and each caller is told so.
func (s *Sink) CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error {
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	args := make([]any, 0, len(names))
	for _, k := range names {
		v := params[k]
		if raw, ok := v.(json.RawMessage); ok {
			v = string(raw)
		}
		args = append(args, sql.Named(k, v))
	}
	_, err := s.submit(context.WithoutCancel(ctx), func(tx *sql.Conn) (any, error) {
		var info doneInfo
		bg := context.Background()
		err := tx.QueryRowContext(bg, `UPDATE gemrecon_keys SET state = 'done', done_at = ?1, due_at = ?1,
			lease_owner = '', lease_until = 0, next_attempt_at = 0
			WHERE key = ?2 AND state = 'claimed' AND token = ?3
			RETURNING first_source, confirmed, batch_state`, s.nowNS(), key, token).Scan(&info.firstSource, &info.confirmed, &info.batchState)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, s.fencedTx(tx, "complete", key, token)
		}
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("complete %s: sql script not started: %w", key, err)
		}
		if _, err := tx.ExecContext(bg, script, args...); err != nil {
			return nil, fmt.Errorf("complete %s: sql script: %w", key, err)
		}
		return info, nil
	}, func(v any) { s.done.add(key, v.(doneInfo)) })
	return err
}
