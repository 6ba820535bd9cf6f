package sink

import "context"

// SQLCompleter is an optional capability of a Sink whose keys live in the
// same database as the user's tables: the --sql effect of spec §4 (the
// transactional inbox of docs/design.md §1). Both backends implement it.
//
// CompleteSQL runs script and marks the key done in ONE transaction, fenced
// on token:
//   - the key is re-checked first (state claimed and token current); when it
//     is not current nothing runs, the error wraps ErrFenced and the fenced
//     counter is incremented durably (ErrNotFound for an unknown key);
//   - script may hold several statements separated by semicolons and uses the
//     named parameters @name for every name in params (json.RawMessage values
//     are bound as text);
//   - when a statement fails, everything the script wrote is rolled back, the
//     key stays claimed under token, and the script's error is returned (the
//     caller's Fail decides what next);
//   - on success the script's writes and the done mark commit together.
//
// The script must not control the transaction itself (BEGIN, COMMIT,
// ROLLBACK, SAVEPOINT): sqlscript.Load rejects those.
type SQLCompleter interface {
	CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error
}
