package geminifake

// The delivery engine: signed webhook events sent over real HTTP, at least
// once (redelivery with bounded exponential backoff on non-2xx and transport
// errors), with optional drops and duplicates drawn from a seeded source,
// and a record of every attempt.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	rand2 "math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/internal/ctxsleep"
)

// WebhookOptions configures a WebhookService's deliveries. Zero fields take
// the defaults named on each.
type WebhookOptions struct {
	// Client sends deliveries (default: one that does not follow redirects;
	// a 3xx is a failed attempt, as for any webhook sender).
	Client *http.Client
	// AttemptTimeout bounds one delivery attempt (default 10s: the API asks
	// receivers to answer "within a few seconds").
	AttemptTimeout time.Duration
	// MaxAttempts bounds the attempts of one message (default 12). A static
	// webhook whose message exhausts them is set to
	// disabled_due_to_failed_deliveries, as the API does after 24 h of
	// failures.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the wait before redelivery n+1:
	// BackoffBase·2^(n-1), at most BackoffMax (defaults 1s and 5m).
	BackoffBase, BackoffMax time.Duration
	// Sleep waits between attempts (default: a timer that stops when the
	// service is closed). Tests inject one to see the backoff without waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock of webhook-timestamp, event timestamps, create and
	// update times and secret expiry (default: the Server's Options.Now).
	Now func() time.Time
	// Drop is the probability that a message is lost: never sent, as if the
	// sender's queue lost it (only a poll pass will see that completion).
	Drop float64
	// Duplicate is the probability that a delivered message is sent once
	// more (same webhook-id, new timestamp and signature), as when an
	// acknowledgement is lost.
	Duplicate float64
	// Seed seeds the drop and duplicate decisions, drawn per message in the
	// order messages are queued (default: the Server's Options.Seed).
	Seed uint64
	// FullNames puts "batches/<id>" in a batch event's data.id instead of the
	// bare id (the guide's example has a bare id; which one the API sends is
	// not documented, so a receiver must take both).
	FullNames bool
	// RotationGrace is how long previous secrets stay valid after a rotation
	// without immediate revocation (default 24h).
	RotationGrace time.Duration
	// DynamicSigner signs the deliveries to a batch's WebhookConfig URIs
	// (dynamic.go); nil sends them unsigned.
	DynamicSigner Signer
	// DropIf, when set, drops every message whose event it accepts (on top
	// of Drop): a chosen delivery lost, for a story such as the demo's. It
	// runs with the service's lock held.
	DropIf func(Event) bool
	// OnAttempt, when set, sees every DeliveryAttempt as it is recorded. It
	// runs with the service's lock held: it must return quickly and must not
	// call the service.
	OnAttempt func(DeliveryAttempt)
}

func (ws *WebhookService) withDefaults(o WebhookOptions) WebhookOptions {
	if o.Client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		o.Client = &http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = 10 * time.Second
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 12
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = time.Second
	}
	if o.BackoffMax < o.BackoffBase {
		o.BackoffMax = max(5*time.Minute, o.BackoffBase)
	}
	if o.Sleep == nil {
		o.Sleep = ctxsleep.Sleep
	}
	if o.Now == nil {
		o.Now = ws.srv.opts.Now
	}
	if o.Seed == 0 {
		o.Seed = ws.srv.opts.Seed
	}
	if o.RotationGrace <= 0 {
		o.RotationGrace = defaultRotateGrace
	}
	return o
}

// SetOptions replaces the delivery options (the drop/duplicate source is
// reseeded). Messages already queued use the new options from their next
// attempt on.
func (ws *WebhookService) SetOptions(o WebhookOptions) error {
	for _, p := range []float64{o.Drop, o.Duplicate} {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("geminifake: drop and duplicate probabilities must be in [0, 1], got %v", p)
		}
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.opts = ws.withDefaults(o)
	ws.rng = rand2.New(rand2.NewPCG(ws.opts.Seed, 0x9e3779b97f4a7c15))
	return nil
}

// Event is one webhook event in the Gemini API's envelope:
// {"type":…,"version":"v1","timestamp":…,"data":{…}}.
type Event struct {
	Type      string
	Timestamp time.Time
	// Data is marshalled as the "data" object (nil: {}).
	Data any
}

// MarshalJSON renders the envelope, fields in the guide's order.
func (e Event) MarshalJSON() ([]byte, error) {
	data := e.Data
	if data == nil {
		data = struct{}{}
	}
	return json.Marshal(struct {
		Type      string `json:"type"`
		Version   string `json:"version"`
		Timestamp string `json:"timestamp"`
		Data      any    `json:"data"`
	}{e.Type, "v1", e.Timestamp.UTC().Format(time.RFC3339Nano), data})
}

// BatchEventData is the data of a batch event (the guide's catalogue).
type BatchEventData struct {
	ID           string `json:"id"`
	ErrorCode    *int   `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// BatchEvent returns the event a Gemini API batch in a terminal state sends
// (batch.succeeded, batch.failed with error_code/error_message,
// batch.expired, batch.cancelled), stamped with its end time (or now when
// it has none); false for a Vertex job or a state that sends none.
func BatchEvent(b Batch, fullName bool, now time.Time) (Event, bool) {
	if !strings.HasPrefix(b.Name, "batches/") {
		return Event{}, false // Vertex AI has no push notifications
	}
	var typ string
	switch ShortState(b.State) {
	case "SUCCEEDED":
		typ = "batch.succeeded"
	case "FAILED":
		typ = "batch.failed"
	case "EXPIRED":
		typ = "batch.expired"
	case "CANCELLED":
		typ = "batch.cancelled"
	default:
		return Event{}, false
	}
	d := BatchEventData{ID: strings.TrimPrefix(b.Name, "batches/")}
	if fullName {
		d.ID = b.Name
	}
	if typ == "batch.failed" && b.Error != nil {
		code := b.Error.Code
		d.ErrorCode, d.ErrorMessage = &code, b.Error.Message
	}
	at := b.EndTime
	if at.IsZero() {
		at = now
	}
	return Event{Type: typ, Timestamp: at, Data: d}, true
}

// Signer produces the webhook-signature header value of one delivery
// attempt: static webhooks use HMACSigner; dynamic (per-job) deliveries
// plug in their own (v1a Ed25519 or a JWT).
type Signer interface {
	Sign(id string, ts time.Time, body []byte) string
}

// HMACSigner signs with Standard Webhooks' symmetric scheme: one
// "v1,<base64 HMAC-SHA256 of id.timestamp.body>" entry per secret,
// space-separated (during a rotation overlap every valid secret signs).
type HMACSigner struct {
	keys [][]byte
}

// NewHMACSigner parses whsec_ secrets. The error names the position of a bad
// secret, never its text.
func NewHMACSigner(secrets ...string) (*HMACSigner, error) {
	s := &HMACSigner{}
	for i, sec := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec, "whsec_"))
		if !strings.HasPrefix(sec, "whsec_") || err != nil || len(key) == 0 {
			return nil, fmt.Errorf("geminifake: secret #%d is not whsec_<base64>", i+1)
		}
		s.keys = append(s.keys, key)
	}
	return s, nil
}

// Sign implements Signer.
func (s *HMACSigner) Sign(id string, ts time.Time, body []byte) string {
	var out []string
	for _, k := range s.keys {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(id + "." + strconv.FormatInt(ts.Unix(), 10) + "."))
		m.Write(body)
		out = append(out, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(out, " ")
}

// Attempt outcomes.
const (
	// OutcomeDelivered: the receiver answered 2xx.
	OutcomeDelivered = "delivered"
	// OutcomeFailed: a non-2xx answer or a transport error; redelivered
	// unless it was the last attempt.
	OutcomeFailed = "failed"
	// OutcomeDuplicate: the deliberate second send of a delivered message.
	OutcomeDuplicate = "duplicate"
	// OutcomeDropped: the message was lost on purpose; nothing was sent.
	OutcomeDropped = "dropped"
	// OutcomeAbandoned: the message's webhook was deleted or disabled before
	// it was delivered; nothing was sent.
	OutcomeAbandoned = "abandoned"
)

// DeliveryAttempt is the record of one attempt to deliver a message (or of
// a message dropped or abandoned without one).
type DeliveryAttempt struct {
	MessageID string // the webhook-id, the same for every attempt of a message
	WebhookID string // the static webhook; "" for a Send
	URL       string
	EventType string
	Attempt   int // 1 for the first send of a message; 0 for a dropped one
	Time      time.Time
	Outcome   string
	Status    int    // the receiver's HTTP status; 0 when there was none
	Err       string // the transport error, or why nothing was sent
	Header    http.Header
	Body      []byte
}

// DeliveryStats counts what the engine did.
type DeliveryStats struct {
	Messages    int // messages queued
	Attempts    int // HTTP requests sent, duplicates included
	Delivered   int // messages that got a 2xx
	Failed      int // attempts answered non-2xx or lost to a transport error
	Redelivered int // attempts after a failed one
	Exhausted   int // messages given up after MaxAttempts
	Dropped     int // messages lost on purpose (never sent)
	Duplicates  int // extra sends of delivered messages
	Abandoned   int // messages whose webhook went away first
}

// Delivery is one event to send to a URL with a signer of the caller's
// choosing: how dynamic (per-job) webhooks are delivered.
type Delivery struct {
	URL    string
	Event  Event
	Signer Signer // nil: unsigned
}

type message struct {
	id        string
	webhookID string // static: the target and its secrets are looked up per attempt
	ping      bool   // sent whatever the webhook's state
	url       string // Send
	signer    Signer // Send
	event     Event
	body      []byte
	drop, dup bool
}

// Send queues a delivery and returns its message id (the webhook-id).
func (ws *WebhookService) Send(d Delivery) (string, error) {
	if err := checkURI(d.URL); err != nil {
		return "", err
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.enqueue(&message{url: d.URL, signer: d.Signer, event: d.Event}), nil
}

// enqueue starts a message's delivery; the caller holds mu.
func (ws *WebhookService) enqueue(m *message) string {
	m.id = "msg_" + newID(15)
	body, err := json.Marshal(m.event)
	if err != nil {
		body = []byte(`{"type":` + strconv.Quote(m.event.Type) + `}`)
	}
	m.body = body
	// Both draws happen for every message, so that one probability does not
	// shift the other's sequence.
	m.drop = ws.rng.Float64() < ws.opts.Drop
	m.dup = ws.rng.Float64() < ws.opts.Duplicate
	m.drop = m.drop || (ws.opts.DropIf != nil && ws.opts.DropIf(m.event)) // dynamic.go
	if ws.closed {
		return m.id
	}
	ws.stats.Messages++
	ws.active++
	ws.wg.Add(1)
	go ws.run(m)
	return m.id
}

// batchFinished queues the event of a batch that just reached a terminal
// state for every enabled webhook subscribed to it, or, when the batch has
// WebhookConfig URIs, for each of those instead (dynamic.go). Called by
// Server.Add and Server.Update (through noteBatch) with the server's lock
// held.
func (ws *WebhookService) batchFinished(b Batch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ev, ok := BatchEvent(b, ws.opts.FullNames, ws.opts.Now())
	if !ok {
		return
	}
	ev = withUserMetadata(ev, b) // dynamic.go
	if ws.sendDynamic(b, ev) {   // a webhookConfig's URIs replace the registered webhooks
		return
	}
	for _, e := range ws.order {
		if e.w.State == WebhookEnabled && slices.Contains(e.w.SubscribedEvents, ev.Type) {
			ws.enqueue(&message{webhookID: e.w.ID, event: ev})
		}
	}
}

// noteAdd is called by Server.Add, holding its lock, before b replaces e
// (nil for a new batch).
func (s *Server) noteAdd(e *entry, b Batch) {
	if e == nil {
		s.noteBatch(nil, b)
		return
	}
	old := e.b
	s.noteBatch(&old, b)
}

// noteUpdate is deferred by Server.Update with the batch as it was; e holds
// it as it is now.
func (s *Server) noteUpdate(old Batch, e *entry) { s.noteBatch(&old, e.b) }

// noteBatch sends the events of a batch entering a terminal state (a new
// batch added in one, or a change to a different state).
func (s *Server) noteBatch(old *Batch, b Batch) {
	ws := s.webhooks
	short := ShortState(b.State)
	if ws == nil || !terminal(short) || (old != nil && ShortState(old.State) == short) {
		return
	}
	ws.batchFinished(b)
}

// target resolves where and how a message's next attempt goes; why is set
// when it must not be sent any more.
func (ws *WebhookService) target(m *message) (uri string, signer Signer, opts WebhookOptions, why string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	opts = ws.opts
	if m.webhookID == "" {
		return m.url, m.signer, opts, ""
	}
	e, ok := ws.hooks[m.webhookID]
	switch {
	case !ok:
		return "", nil, opts, "webhook deleted"
	case !m.ping && e.w.State != WebhookEnabled:
		return "", nil, opts, "webhook " + e.w.State
	}
	e.w.Secrets = validSecrets(e.w.Secrets, opts.Now())
	secrets := make([]string, 0, len(e.w.Secrets))
	for _, s := range e.w.Secrets {
		secrets = append(secrets, s.Secret)
	}
	hs, err := NewHMACSigner(secrets...)
	if err != nil { // cannot happen: the service made these secrets
		return "", nil, opts, err.Error()
	}
	return e.w.URI, hs, opts, ""
}

func (ws *WebhookService) addRecord(a DeliveryAttempt) {
	limit := ws.srv.opts.RecordLimit
	if len(ws.record) >= limit {
		ws.record = slices.Delete(ws.record, 0, len(ws.record)-limit+1)
	}
	ws.record = append(ws.record, a)
	if ws.opts.OnAttempt != nil {
		ws.opts.OnAttempt(a)
	}
}

func (ws *WebhookService) note(m *message, n int, outcome, why string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	uri := m.url
	if e, ok := ws.hooks[m.webhookID]; ok {
		uri = e.w.URI
	}
	switch outcome {
	case OutcomeDropped:
		ws.stats.Dropped++
	case OutcomeAbandoned:
		ws.stats.Abandoned++
	}
	ws.addRecord(DeliveryAttempt{
		MessageID: m.id, WebhookID: m.webhookID, URL: uri, EventType: m.event.Type,
		Attempt: n, Time: ws.opts.Now(), Outcome: outcome, Err: why, Body: m.body,
	})
}

// run delivers one message: attempts until a 2xx, MaxAttempts, or Close.
func (ws *WebhookService) run(m *message) {
	defer func() {
		ws.mu.Lock()
		ws.active--
		ws.mu.Unlock()
		ws.wg.Done()
	}()
	if m.drop {
		ws.note(m, 0, OutcomeDropped, "dropped on purpose (WebhookOptions.Drop)")
		return
	}
	for n := 1; ; n++ {
		uri, signer, opts, why := ws.target(m)
		if why != "" {
			ws.note(m, n, OutcomeAbandoned, why)
			return
		}
		if ws.attempt(m, n, uri, signer, opts, false) {
			if m.dup {
				ws.attempt(m, n+1, uri, signer, opts, true)
			}
			return
		}
		if n >= opts.MaxAttempts {
			ws.exhausted(m)
			return
		}
		if opts.Sleep(ws.ctx, backoff(opts, n)) != nil || ws.ctx.Err() != nil {
			return // closed
		}
	}
}

// backoff is the wait after failed attempt n (1-based).
func backoff(o WebhookOptions, n int) time.Duration {
	d := o.BackoffBase
	for i := 1; i < n && d < o.BackoffMax; i++ {
		d *= 2
	}
	return min(d, o.BackoffMax)
}

func (ws *WebhookService) exhausted(m *message) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.stats.Exhausted++
	if e, ok := ws.hooks[m.webhookID]; ok && e.w.State == WebhookEnabled {
		e.w.State = WebhookDisabledDueToFailedDeliveries
		e.w.UpdateTime = ws.opts.Now().UTC()
	}
}

// attempt sends one HTTP request and records it; true on a 2xx.
func (ws *WebhookService) attempt(m *message, n int, uri string, signer Signer, opts WebhookOptions, dup bool) bool {
	at := opts.Now()
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "geminifake-webhooks/1")
	h.Set("webhook-id", m.id)
	h.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	if signer != nil {
		if sig := signer.Sign(m.id, at, m.body); sig != "" {
			h.Set("webhook-signature", sig)
		}
	}
	ctx, cancel := context.WithTimeout(ws.ctx, opts.AttemptTimeout)
	defer cancel()
	status, errText := 0, ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, uri, bytes.NewReader(m.body))
	if err == nil {
		req.Header = h.Clone()
		var resp *http.Response
		resp, err = opts.Client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			status = resp.StatusCode
		}
	}
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is in the record already
		}
		errText = err.Error()
	}
	ok := status >= 200 && status < 300
	outcome := OutcomeFailed
	switch {
	case dup:
		outcome = OutcomeDuplicate
	case ok:
		outcome = OutcomeDelivered
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.stats.Attempts++
	switch {
	case dup:
		ws.stats.Duplicates++
	case ok:
		ws.stats.Delivered++
	default:
		ws.stats.Failed++
	}
	if n > 1 && !dup {
		ws.stats.Redelivered++
	}
	ws.addRecord(DeliveryAttempt{
		MessageID: m.id, WebhookID: m.webhookID, URL: uri, EventType: m.event.Type, Attempt: n,
		Time: at, Outcome: outcome, Status: status, Err: errText, Header: h, Body: m.body,
	})
	return ok
}

// Attempts returns a copy of the delivery record, oldest first (bounded by
// Options.RecordLimit).
func (ws *WebhookService) Attempts() []DeliveryAttempt {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return slices.Clone(ws.record)
}

// Stats returns the delivery counters.
func (ws *WebhookService) Stats() DeliveryStats {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.stats
}

// Wait blocks until no message is being delivered (every one delivered,
// given up, dropped or abandoned) or ctx ends.
func (ws *WebhookService) Wait(ctx context.Context) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		ws.mu.Lock()
		n := ws.active
		ws.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close stops every delivery (an attempt in flight is cancelled) and waits
// for them; messages queued afterwards are not sent.
func (ws *WebhookService) Close() {
	ws.mu.Lock()
	ws.closed = true
	ws.cancel()
	ws.mu.Unlock()
	ws.wg.Wait()
}
