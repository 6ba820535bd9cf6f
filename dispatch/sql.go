package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/sink"
)

// The --sql effect (spec §4): instead of running an Effect and then
// Complete, each attempt hands the script to the sink's CompleteSQL, which
// runs it and marks the key done in one transaction fenced on the claim's
// token. Success is OutcomeDone, a fenced token OutcomeFenced (nothing of the
// script was written), and any other error a failure recorded with Fail like
// an effect's: retryable, including constraint violations (the data the
// script depends on may be fixed: a CHECK on the user's table, say), so a script
// that can never succeed goes dead after --max-attempts.
//
// The lease is renewed once, just before the transaction, instead of
// periodically while it runs: a fresh lease outlasts the transaction (it is
// longer than --effect-timeout, which cancels the script on PostgreSQL, and
// on SQLite nobody can take the key over while the script holds the write
// lock), and a periodic renewal queued behind the transaction's own commit
// would find the key done and be counted as a fenced outcome.

// checkSQL validates the --sql parts of cfg.
func checkSQL(cfg Config) error {
	if cfg.SQL == nil {
		return nil
	}
	if cfg.Effect != nil {
		return errors.New("dispatch: an effect and --sql are exclusive: give one")
	}
	if _, ok := cfg.Sink.(sink.SQLCompleter); !ok {
		return fmt.Errorf("dispatch: --sql needs a sink that runs SQL in its own transaction (sink.SQLCompleter); %T does not", cfg.Sink)
	}
	return nil
}

// runSQL runs the script and marks the key done, in one transaction.
func (d *Dispatcher) runSQL(ctx context.Context, ev effect.Event) error {
	sc := d.cfg.Sink.(sink.SQLCompleter) // checked by New
	if err := d.cfg.Sink.Renew(ctx, ev.Key, ev.Token, d.cfg.Lease); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("--sql %s: renewing the lease before the transaction: %w", d.cfg.SQL.Path(), err)
	}
	if err := sc.CompleteSQL(ctx, ev.Key, ev.Token, d.cfg.SQL.Script(), d.cfg.SQL.Params(ev)); err != nil {
		if errors.Is(err, sink.ErrFenced) {
			return err
		}
		return fmt.Errorf("--sql %s: %w", d.cfg.SQL.Path(), err)
	}
	return nil
}

// sqlOutcome logs and names the outcome of a CompleteSQL that committed
// (runErr nil) or was fenced.
func (d *Dispatcher) sqlOutcome(log *slog.Logger, runErr error, elapsed time.Duration) Outcome {
	if runErr == nil {
		log.Debug("dispatch: --sql done", "duration", elapsed)
		return OutcomeDone
	}
	log.Error("dispatch: FENCED: the key was taken over before this attempt's SQL committed; nothing of it was written", "err", runErr)
	return OutcomeFenced
}
