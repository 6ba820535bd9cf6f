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
	Logger  *slog.Logger     // required (reconcile.NewPoll gives a discarding one by default)
}

// RecordPage records the listed terminal operations of one page, those
// that must commit in one commit (sink.RecordAll: a pass moves to the next
// page only once this page's keys are durable), and counts them: recorded
// for the first time, already known, or invalid — a name that can never be
// a key (spec §12): logged, counted, never recorded, never a reason to
// fail the pass. Only a database error is returned (the pass stops
// listing).
func (l Listed) RecordPage(ctx context.Context, ops []poller.Operation) (news, dups, invalid int, err error) {
	var sgs []sink.Sighting
	for _, op := range ops {
		key, err := canon.Key(op.Name)
		if err == nil {
			err = canon.CheckKey(key)
		}
		if op.Invalid != "" {
			err = fmt.Errorf("%w: %s", canon.ErrInvalidKey, op.Invalid)
		}
		if err != nil {
			l.Metrics.ObserveDelivery(sink.SourcePoll, metrics.OutcomeInvalid)
			l.Logger.Warn("listed operation has a name that cannot be a key; skipped", "name", canon.Quote(op.Name), "err", err)
			invalid++
			continue
		}
		sgs = append(sgs, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: op.Raw, State: op.State, FromAPI: true, EndTime: op.EndTime})
	}
	if len(sgs) == 0 {
		return 0, 0, invalid, nil
	}
	res, err := l.Sink.RecordAll(ctx, sgs)
	if err != nil {
		for range sgs {
			l.Metrics.ObserveDelivery(sink.SourcePoll, metrics.OutcomeUnavailable)
		}
		return 0, 0, invalid, err
	}
	for j, sg := range sgs {
		l.Metrics.ObserveDelivery(sink.SourcePoll, metrics.RecordOutcome(res[j]))
		logRecord(l.Logger, sg.Key, sink.SourcePoll, res[j])
		if res[j].Confirmed {
			l.Logger.Info("a key first seen by webhook is confirmed by the listing", "key", sg.Key, "batch_state", sg.State, "state", res[j].State)
		}
		if res[j].New {
			news++
		} else {
			dups++
		}
	}
	return news, dups, invalid, nil
}

// logRecord says what Record did with a sighting: at the default level for
// a key seen for the first time, so that the work shows as it happens
// (spec §6, "Logs"), and at debug for one already known: every pass lists
// the whole window again, and its duplicates, counted in the summary, would
// bury the news.
func logRecord(log *slog.Logger, key, source string, res sink.RecordResult) {
	switch {
	case res.New:
		log.Info("new key", "key", key, "source", source)
	default:
		log.Debug("known key", "key", key, "source", source, "state", res.State)
	}
}
