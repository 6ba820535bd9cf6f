// Package ingest turns sightings of a completion into recorded keys, for
// both sources (spec §9.1): a verified webhook body (webhook.go, called by
// package webhook) and a listed operation (listed.go, called by the pass
// loop of package reconcile). Each path is the canonical key (canon), the
// check of what a key may be (spec §12), sink.Record, the deliveries
// metrics, a line for each new key (logRecord), and, for webhooks, waking
// dispatch. No command or handler records a sighting any other way.
package ingest

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
)

// Listed is the poll path of spec §9.1: a listed terminal operation → its
// canonical key → the key rule of spec §12 → Record (source poll, the
// operation as the API sent it, its state, and that it comes from the API:
// a listed operation confirms a key a webhook saw first, spec §9.2) → the
// deliveries metric. Poll passes use it, and so does anything else that
// lists (demo).
type Listed struct {
	Sink    Recorder
	Metrics *metrics.Metrics // nil counts nothing
	Logger  *slog.Logger     // nil: discard
}

// ListedOutcome is what Record did with one operation.
type ListedOutcome struct {
	// Invalid: the name can never be a key (spec §12): logged, counted,
	// never recorded.
	Invalid bool
	Key     string
	Result  sink.RecordResult
}

// Record records one listed terminal operation. Only a database error is
// returned (the pass stops listing); a name that cannot be a key is an
// Invalid outcome.
func (l Listed) Record(ctx context.Context, op poller.Operation) (ListedOutcome, error) {
	key, err := canon.Key(op.Name)
	if err == nil {
		err = canon.CheckKey(key)
	}
	if op.Invalid != "" {
		err = fmt.Errorf("%w: %s", canon.ErrInvalidKey, op.Invalid)
	}
	if err != nil {
		l.Metrics.ObserveDelivery(sink.SourcePoll, metrics.OutcomeInvalid)
		if l.Logger != nil {
			l.Logger.Warn("listed operation has a name that cannot be a key; skipped",
				"name", canon.Quote(op.Name), "err", err)
		}
		return ListedOutcome{Invalid: true}, nil
	}
	res, err := l.Sink.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: op.Raw, State: op.State, FromAPI: true})
	if err != nil {
		l.Metrics.ObserveDelivery(sink.SourcePoll, metrics.OutcomeUnavailable)
		return ListedOutcome{Key: key}, err
	}
	l.Metrics.ObserveRecord(sink.SourcePoll, res)
	logRecord(l.Logger, key, sink.SourcePoll, res)
	if res.Confirmed && l.Logger != nil {
		l.Logger.Info("a key first seen by webhook is confirmed by the listing", "key", key, "batch_state", op.State, "state", res.State)
	}
	return ListedOutcome{Key: key, Result: res}, nil
}

// logRecord says what Record did with a sighting: at the default level for
// a key seen for the first time, so that the work shows as it happens
// (spec §6, "Logs"), and at debug for one already known: every pass lists
// the whole window again, and its duplicates, counted in the summary, would
// bury the news.
func logRecord(log *slog.Logger, key, source string, res sink.RecordResult) {
	switch {
	case log == nil:
	case res.New:
		log.Info("new key", "key", key, "source", source)
	default:
		log.Debug("known key", "key", key, "source", source, "state", res.State)
	}
}
