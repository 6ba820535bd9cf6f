package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/sink"
)

// claimCompleter is an effect that completes its own claim: instead of
// running an Effect and then Sink.Complete, each attempt calls
// CompleteClaim, which does the effect's work and marks the key done,
// fenced on ev.Token, in one transaction. runClaim sees only this
// interface; the --sql effect (sqlEffect) is the one there is.
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
type claimCompleter interface {
	CompleteClaim(ctx context.Context, ev effect.Event) error
}

// sqlEffect is the --sql effect (spec §4): the sink runs the script and
// marks the key done in one transaction.
type sqlEffect struct {
	sink   sink.SQLCompleter
	script *sqlscript.Script
}

// newSQLEffect checks that cfg's sink can run a script in its own
// transaction (that Effect is not set too is Validate's).
func newSQLEffect(cfg Config) (claimCompleter, error) {
	sc, ok := cfg.Sink.(sink.SQLCompleter)
	if !ok {
		return nil, fmt.Errorf("dispatch: an SQL script needs a sink that runs SQL in its own transaction (sink.SQLCompleter); %T does not", cfg.Sink)
	}
	return sqlEffect{sink: sc, script: cfg.SQL}, nil
}

// CompleteClaim runs the script and marks the key done, in one transaction.
func (e sqlEffect) CompleteClaim(ctx context.Context, ev effect.Event) error {
	if err := e.sink.CompleteSQL(ctx, ev.Key, ev.Token, e.script.Text(), e.script.Params(ev)); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("sql script %s: %w", e.script.Path(), err)
	}
	return nil
}

// completeClaim renews the lease once and hands the attempt to the
// claimCompleter (see there).
func (d *Dispatcher) completeClaim(ctx context.Context, ev effect.Event) error {
	if err := d.cfg.Sink.Renew(ctx, ev.Key, ev.Token, d.cfg.Lease); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("renewing the lease before the effect's transaction: %w", err)
	}
	return d.completer.CompleteClaim(ctx, ev)
}
