package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/sink"
)

// The --sql effect (spec §4) completes its own claim: instead of running
// an Effect and then Sink.Complete, each attempt calls completeClaim, which
// has the sink (Dispatcher.completer, a sink.SQLCompleter) run the script
// and mark the key done, fenced on ev.Token, in one transaction.
//
// Success is OutcomeDone, an error wrapping sink.ErrFenced OutcomeFenced
// (nothing of the work was written), and any other error a failure recorded
// with Fail like an effect's: retryable, including constraint violations
// (the data the script depends on may be fixed: a CHECK on the user's
// table, say), so a script that can never succeed goes dead after
// MaxAttempts. A failure whose transaction committed all the same (its
// answer was lost, the context ended during the commit) is found by Fail's
// fencing: the key is done with this claim's token (recordFailure).
//
// The lease is renewed once, just before the transaction, instead of
// periodically while it runs: a fresh lease outlasts the transaction (it is
// longer than EffectTimeout, which cancels the script on PostgreSQL, and on
// SQLite nobody can take the key over while the script holds the write
// lock), and a periodic renewal queued behind the transaction's own commit
// would find the key done and be counted as a fenced outcome.

// completeClaim renews the lease once, then runs the script and marks the
// key done, in one transaction.
func (d *Dispatcher) completeClaim(ctx context.Context, ev effect.Event) error {
	if err := d.cfg.Sink.Renew(ctx, ev.Key, ev.Token, d.cfg.Lease); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("renewing the lease before the effect's transaction: %w", err)
	}
	q := d.cfg.SQL
	if err := d.completer.CompleteSQL(ctx, ev.Key, ev.Token, q.Text(), q.Params(ev)); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("sql script %s: %w", q.Path(), err)
	}
	return nil
}
