package ingest

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

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

// Recorder is what the ingest paths need of the sink.
type Recorder interface {
	Record(ctx context.Context, s sink.Sighting) (sink.RecordResult, error)
	RecordAll(ctx context.Context, s []sink.Sighting) ([]sink.RecordResult, error)
	RecordAndClaim(ctx context.Context, s sink.Sighting, req sink.ClaimRequest) (sink.RecordResult, *sink.Claim, error)
}

// Claimer gives out effect slots for keys claimed in the commit that
// records them (spec §3 "A claim in the commit that records"): the
// dispatcher's TakeSlot. hand starts a granted claim in the slot (nil:
// gives the slot back); a nil hand means the caller runs the claim itself
// (serve --sync). ok is false when no slot is free: the key is only
// recorded.
type Claimer interface {
	TakeSlot() (req sink.ClaimRequest, hand func(*sink.Claim), ok bool)
	// Now is the claimer's clock: a claim's lease is counted from just
	// before it was asked for.
	Now() time.Time
}

// record records sg, and claims its key in the same commit when c gives a
// slot. It returns the claim, and when it was asked for, only when the
// caller is to run it (a nil hand).
func record(ctx context.Context, r Recorder, c Claimer, sg sink.Sighting) (sink.RecordResult, *sink.Claim, time.Time, error) {
	var (
		req  sink.ClaimRequest
		hand func(*sink.Claim)
		ok   bool
	)
	if c != nil {
		req, hand, ok = c.TakeSlot()
	}
	if !ok {
		res, err := r.Record(ctx, sg)
		return res, nil, time.Time{}, err
	}
	asked := c.Now()
	res, claim, err := r.RecordAndClaim(ctx, sg, req)
	if hand == nil {
		return res, claim, asked, err
	}
	hand(claim)
	return res, nil, time.Time{}, err
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
	// done and was not claimed where it was recorded (nil: serve --sync runs
	// the key itself).
	Kicker Kicker
	// Claimer, when set, claims a key in the commit that records it.
	Claimer Claimer
	// Logger receives what is worth a line (default: discard).
	Logger *slog.Logger
}

// Webhooks turns webhook event bodies into recorded keys.
type Webhooks struct{ cfg WebhookConfig }

// NewWebhooks returns the webhook path. cfg.Sink is required: a receiver
// without one is webhook.NewHandler's refusal (serve.Receiver gives both
// the same sink).
func NewWebhooks(cfg WebhookConfig) *Webhooks {
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return &Webhooks{cfg: cfg}
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
	// Claim is the claim granted where the key was recorded, for the
	// caller to run (a Claimer whose hand is nil: serve --sync), asked for
	// at Asked by the Claimer's clock.
	Claim *sink.Claim
	Asked time.Time
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
	res, claim, asked, err := record(ctx, w.cfg.Sink, w.cfg.Claimer, sink.Sighting{
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
	if res.State != sink.StateDone && res.State != sink.StateClaimed && w.cfg.Kicker != nil {
		w.cfg.Kicker.Kick()
	}
	return Answer{Kind: Recorded, Key: ev.Key, Type: ev.Type, State: ev.State, Result: res, Outcome: outcome, Claim: claim, Asked: asked}
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
