package ingest

import (
	"context"
	"errors"
	"log/slog"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
)

// The webhook path of spec §9.1: a verified event body → canon → the key
// rule of spec §12 → Record (source webhook, with the state canon computed
// and how the body was verified) → the deliveries metrics → a kick for
// dispatch. The HTTP layer (package webhook) verifies, calls Event and turns
// the Answer into a status code; it records nothing itself.

// Verification says how a webhook body was verified.
type Verification int

const (
	// VerifiedStatic: a static webhook's HMAC (v1) signature.
	VerifiedStatic Verification = iota
	// Unverified: accepted without a signature (--insecure-no-verify).
	Unverified
	// VerifiedDynamic: only a dynamic (JWKS) signature verified it: proof
	// that Google sent it, not that the batch is this project's. A key seen
	// only that way needs confirmation (spec §6, §9.2).
	VerifiedDynamic
)

// Recorder is what the ingest paths need of the sink: Record.
type Recorder interface {
	Record(ctx context.Context, s sink.Sighting) (sink.RecordResult, error)
}

// Kicker wakes the dispatcher after a sighting of a key that is not done.
type Kicker interface{ Kick() }

// WebhookConfig configures Webhooks.
type WebhookConfig struct {
	// Sink records the sightings (required).
	Sink Recorder
	// Metrics counts deliveries, ignored and invalid events; nil counts
	// nothing.
	Metrics *metrics.Metrics
	// Kicker, when set, is kicked after each sighting of a key that is not
	// done (nil: serve --sync runs the key itself).
	Kicker Kicker
	// Logger receives what is worth a line (default: discard).
	Logger *slog.Logger
}

// Webhooks turns webhook event bodies into recorded keys.
type Webhooks struct{ cfg WebhookConfig }

// NewWebhooks checks cfg and returns the webhook path.
func NewWebhooks(cfg WebhookConfig) (*Webhooks, error) {
	if cfg.Sink == nil {
		return nil, errors.New("ingest: the webhook path needs a sink")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Webhooks{cfg: cfg}, nil
}

// AnswerKind is what became of one event body.
type AnswerKind int

const (
	// Recorded: the sighting is durable (Answer.Result, Answer.Outcome).
	Recorded AnswerKind = iota
	// Ignored: not a batch event (Answer.Type), or not a completion
	// (Answer.Key): nothing recorded.
	Ignored
	// Invalid: a body that cannot be used (Answer.Err, Answer.Reason):
	// nothing recorded, and no retry can fix it.
	Invalid
	// Unavailable: the database refused the write (Answer.Err): the sender
	// should retry.
	Unavailable
)

// Answer is what Event did with one body, for the HTTP layer to answer.
type Answer struct {
	Kind AnswerKind
	// Key is the canonical key (Recorded, Unavailable, and Ignored for a
	// batch event that is not a completion).
	Key string
	// Type is the event's type ("" when it has none).
	Type string
	// State is the batch state canon read from the body ("" when none).
	State string
	// Result is the sink's answer (Recorded).
	Result sink.RecordResult
	// Outcome is the deliveries metric's outcome: accepted, duplicate or
	// done (Recorded), ignored, invalid or unavailable.
	Outcome string
	// Err says why the body is Invalid or the database Unavailable;
	// Reason is the invalid reason (metrics.Invalid*).
	Err    error
	Reason string
}

// Event handles one verified event body (spec §6): an event whose type is
// not batch.* is ignored whatever else it holds, a body without a usable
// name is invalid, an event that says it is not a completion is ignored,
// and anything else is recorded with source webhook — carrying the state
// canon computed and, for a body verified only by a dynamic signature, the
// need for confirmation — counted, and the dispatcher kicked.
func (w *Webhooks) Event(ctx context.Context, body []byte, v Verification) Answer {
	m := w.cfg.Metrics
	ev, err := canon.FromEvent(body)
	if ev.HasType && !canon.IsBatchType(ev.Type) {
		m.ObserveIgnored(ev.Type, true)
		return Answer{Kind: Ignored, Type: ev.Type, Outcome: metrics.OutcomeIgnored}
	}
	if err != nil {
		return w.invalid(ev, err)
	}
	if !ev.Terminal {
		m.ObserveIgnored(ev.Type, ev.HasType)
		return Answer{Kind: Ignored, Key: ev.Key, Type: ev.Type, State: ev.State, Outcome: metrics.OutcomeIgnored}
	}
	res, err := w.cfg.Sink.Record(ctx, sink.Sighting{
		Key:     ev.Key,
		Source:  sink.SourceWebhook,
		Payload: ev.Operation,
		State:   ev.State,
		Dynamic: v == VerifiedDynamic,
	})
	if errors.Is(err, canon.ErrInvalidKey) {
		return w.invalid(ev, err) // canon refused it already; the sink's own check, should they ever differ
	}
	if err != nil {
		m.ObserveDelivery(sink.SourceWebhook, metrics.OutcomeUnavailable)
		return Answer{Kind: Unavailable, Key: ev.Key, Type: ev.Type, State: ev.State, Outcome: metrics.OutcomeUnavailable, Err: err}
	}
	outcome := metrics.RecordOutcome(res)
	m.ObserveDelivery(sink.SourceWebhook, outcome)
	logRecord(w.cfg.Logger, ev.Key, sink.SourceWebhook, res)
	if res.Conflict {
		w.cfg.Logger.Warn("webhook: the event's batch state differs from the stored one (a conflict; the stored state stays)",
			"key", ev.Key, "state", ev.State)
	}
	if res.State != sink.StateDone && w.cfg.Kicker != nil {
		w.cfg.Kicker.Kick()
	}
	return Answer{Kind: Recorded, Key: ev.Key, Type: ev.Type, State: ev.State, Result: res, Outcome: outcome}
}

// invalid counts a body that cannot be used.
func (w *Webhooks) invalid(ev canon.Event, err error) Answer {
	reason := InvalidReason(err)
	w.cfg.Metrics.ObserveInvalid(reason)
	return Answer{Kind: Invalid, Type: ev.Type, Outcome: metrics.OutcomeInvalid, Err: err, Reason: reason}
}

// InvalidReason maps canon's error classes to the reasons of
// gemrecon_webhook_invalid_total.
func InvalidReason(err error) string {
	var nn *canon.NoNameError
	switch {
	case errors.As(err, &nn):
		return metrics.InvalidNoName
	case errors.Is(err, canon.ErrInvalidKey):
		return metrics.InvalidName
	case errors.Is(err, canon.ErrFieldType):
		return metrics.InvalidFieldType
	case errors.Is(err, canon.ErrEnvelope):
		return metrics.InvalidEnvelope
	case errors.Is(err, canon.ErrNotJSON), errors.Is(err, canon.ErrNotObject):
		return metrics.InvalidJSON
	}
	return metrics.InvalidOther
}
