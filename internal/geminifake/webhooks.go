package geminifake

// The WebhookService of the Gemini API (static webhooks, registered per
// project), in the shapes the Go SDK v1.79.1 sends and reads
// (google.golang.org/genai/interactions, webhooks.go and
// models/webhooks): snake_case JSON, paths under /v1beta/webhooks, the
// verbs ":ping" and ":rotateSigningSecret". The delivery of events to the
// registered URLs is in delivery.go.

import (
	"context"
	"crypto/rand"
	"encoding/base32"
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
	"sync"
	"time"
)

// Webhook states, as the API spells them.
const (
	WebhookEnabled                       = "enabled"
	WebhookDisabled                      = "disabled"
	WebhookDisabledDueToFailedDeliveries = "disabled_due_to_failed_deliveries"
)

// Revocation behaviours of RotateSigningSecret.
const (
	RevokeAfter24h     = "revoke_previous_secrets_after_h24"
	RevokeImmediately  = "revoke_previous_secrets_immediately"
	defaultRotateGrace = 24 * time.Hour
)

// PingEventType is the type of the event a ping sends. The real one is not
// documented (docs/gemini-api.md, "Ping"); this is a plausible stand-in that
// is not a batch type, which is all a receiver may rely on.
const PingEventType = "webhook.ping"

// subscribable lists the event types a webhook may subscribe to: the SDK's
// WebhookSubscribedEvent enum, plus batch.cancelled, which the guide's event
// catalogue lists but the enum lacks (a choice: the stand-in accepts it).
var subscribable = []string{
	"batch.succeeded", "batch.expired", "batch.failed", "batch.cancelled",
	"interaction.requires_action", "interaction.completed", "interaction.failed",
	"video.generated",
}

// SigningSecret is one of a webhook's signing secrets.
type SigningSecret struct {
	Secret string
	// ExpireTime is zero for a secret without an end (the current one);
	// after a rotation the previous ones expire here.
	ExpireTime time.Time
}

// Webhook is a registered static webhook, as the fake holds it.
type Webhook struct {
	ID               string
	Name             string
	URI              string
	SubscribedEvents []string
	State            string
	CreateTime       time.Time
	UpdateTime       time.Time
	// Secrets that are valid now, newest first.
	Secrets []SigningSecret
}

type hookEntry struct {
	w   Webhook
	seq uint64 // creation order, for paging
}

// ErrNoWebhook is returned for an unknown webhook id.
var ErrNoWebhook = errors.New("geminifake: no such webhook")

// WebhookService is the fake's WebhookService and its delivery engine. Get
// it with Server.Webhooks. All methods are safe for concurrent use.
//
// Lock order: Server.mu before WebhookService.mu (batch changes notify the
// service while holding the server's lock); the service never takes the
// server's lock.
type WebhookService struct {
	srv *Server

	mu     sync.Mutex
	opts   WebhookOptions
	rng    *rand2.Rand
	hooks  map[string]*hookEntry
	order  []*hookEntry // creation order
	seq    uint64
	record []DeliveryAttempt
	stats  DeliveryStats
	active int // messages whose delivery has not ended
	closed bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Webhooks returns the server's WebhookService, created with default
// WebhookOptions on first use.
func (s *Server) Webhooks() *WebhookService {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.webhooks == nil {
		ctx, cancel := context.WithCancel(context.Background())
		ws := &WebhookService{srv: s, hooks: map[string]*hookEntry{}, ctx: ctx, cancel: cancel}
		ws.opts = ws.withDefaults(WebhookOptions{})
		ws.rng = rand2.New(rand2.NewPCG(ws.opts.Seed, 0x9e3779b97f4a7c15))
		s.webhooks = ws
	}
	return s.webhooks
}

// closeWebhooks stops the delivery engine, if there is one (Server.Close).
func (s *Server) closeWebhooks() {
	s.mu.Lock()
	ws := s.webhooks
	s.mu.Unlock()
	if ws != nil {
		ws.Close()
	}
}

// newID returns n random bytes as lowercase base32 without padding.
func newID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// newSecret returns a Standard Webhooks secret: whsec_ and 32 random bytes
// in standard base64 (webhook.MinSecretBytes asks for at least 24).
func newSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// truncate shows enough of a secret to tell secrets apart, not to use one.
func truncateSecret(s string) string {
	const keep = len("whsec_") + 4
	if len(s) <= keep {
		return s
	}
	return s[:keep] + "…"
}

// validSecrets drops secrets expired at now; the caller holds mu.
func validSecrets(ss []SigningSecret, now time.Time) []SigningSecret {
	return slices.DeleteFunc(ss, func(s SigningSecret) bool {
		return !s.ExpireTime.IsZero() && !now.Before(s.ExpireTime)
	})
}

// APIError is an error the service answers with: an HTTP status and a
// Google-style message.
type APIError struct {
	Code    int
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("geminifake: %d %s: %s", e.Code, statusNames[e.Code], e.Message)
}

func badRequest(format string, a ...any) error {
	return &APIError{Code: http.StatusBadRequest, Message: fmt.Sprintf(format, a...)}
}

func checkEvents(events []string) error {
	if len(events) == 0 {
		return badRequest("subscribed_events must name at least one event.")
	}
	for i, e := range events {
		if !slices.Contains(subscribable, e) {
			return badRequest("Invalid value at 'webhook.subscribed_events[%d]' (type.googleapis.com/google.ai.generativelanguage.v1beta.Webhook.SubscribedEvent), %q", i, e)
		}
	}
	return nil
}

func checkURI(uri string) error {
	u, err := url.Parse(uri)
	if uri == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return badRequest("uri must be an absolute http or https URL, got %q.", uri)
	}
	return nil
}

// Create registers a webhook and returns it with its signing secret, which
// is shown only this once (the API's new_signing_secret).
func (ws *WebhookService) Create(name, uri string, events []string) (Webhook, string, error) {
	if err := checkURI(uri); err != nil {
		return Webhook{}, "", err
	}
	if err := checkEvents(events); err != nil {
		return Webhook{}, "", err
	}
	secret := newSecret()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	now := ws.opts.Now().UTC()
	ws.seq++
	e := &hookEntry{seq: ws.seq, w: Webhook{
		ID: newID(10), Name: name, URI: uri, SubscribedEvents: slices.Clone(events),
		State: WebhookEnabled, CreateTime: now, UpdateTime: now,
		Secrets: []SigningSecret{{Secret: secret}},
	}}
	ws.hooks[e.w.ID] = e
	ws.order = append(ws.order, e)
	return ws.snapshot(e, now), secret, nil
}

// snapshot copies a webhook with only its valid secrets; the caller holds mu.
func (ws *WebhookService) snapshot(e *hookEntry, now time.Time) Webhook {
	e.w.Secrets = validSecrets(e.w.Secrets, now)
	w := e.w
	w.SubscribedEvents = slices.Clone(w.SubscribedEvents)
	w.Secrets = slices.Clone(w.Secrets)
	return w
}

// Get returns a webhook, or ErrNoWebhook.
func (ws *WebhookService) Get(id string) (Webhook, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	e, ok := ws.hooks[id]
	if !ok {
		return Webhook{}, ErrNoWebhook
	}
	return ws.snapshot(e, ws.opts.Now()), nil
}

// All returns every webhook in creation order.
func (ws *WebhookService) All() []Webhook {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	now := ws.opts.Now()
	out := make([]Webhook, 0, len(ws.order))
	for _, e := range ws.order {
		out = append(out, ws.snapshot(e, now))
	}
	return out
}

// WebhookUpdate names the fields an Update changes (nil: unchanged).
type WebhookUpdate struct {
	Name             *string
	URI              *string
	SubscribedEvents []string // nil: unchanged
	State            *string
}

// Update changes a webhook's fields. State may be set to enabled or
// disabled (which also re-enables a webhook disabled for failed deliveries).
func (ws *WebhookService) Update(id string, u WebhookUpdate) (Webhook, error) {
	if u.URI != nil {
		if err := checkURI(*u.URI); err != nil {
			return Webhook{}, err
		}
	}
	if u.SubscribedEvents != nil {
		if err := checkEvents(u.SubscribedEvents); err != nil {
			return Webhook{}, err
		}
	}
	if u.State != nil && *u.State != WebhookEnabled && *u.State != WebhookDisabled {
		return Webhook{}, badRequest("state may be set to %q or %q, not %q.", WebhookEnabled, WebhookDisabled, *u.State)
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	e, ok := ws.hooks[id]
	if !ok {
		return Webhook{}, ErrNoWebhook
	}
	if u.Name != nil {
		e.w.Name = *u.Name
	}
	if u.URI != nil {
		e.w.URI = *u.URI
	}
	if u.SubscribedEvents != nil {
		e.w.SubscribedEvents = slices.Clone(u.SubscribedEvents)
	}
	if u.State != nil {
		e.w.State = *u.State
	}
	now := ws.opts.Now().UTC()
	e.w.UpdateTime = now
	return ws.snapshot(e, now), nil
}

// Delete removes a webhook; deliveries still queued for it are abandoned.
func (ws *WebhookService) Delete(id string) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	e, ok := ws.hooks[id]
	if !ok {
		return ErrNoWebhook
	}
	delete(ws.hooks, id)
	ws.order = slices.DeleteFunc(ws.order, func(x *hookEntry) bool { return x == e })
	return nil
}

// RotateSigningSecret adds a new signing secret and returns it. With
// immediately, every previous secret is revoked now; otherwise previous
// secrets that had no end yet expire after WebhookOptions.RotationGrace
// (24 h), and both are valid (and sign deliveries) until then.
func (ws *WebhookService) RotateSigningSecret(id string, immediately bool) (string, error) {
	secret := newSecret()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	e, ok := ws.hooks[id]
	if !ok {
		return "", ErrNoWebhook
	}
	now := ws.opts.Now().UTC()
	prev := validSecrets(e.w.Secrets, now)
	if immediately {
		prev = nil
	}
	for i := range prev {
		if prev[i].ExpireTime.IsZero() {
			prev[i].ExpireTime = now.Add(ws.opts.RotationGrace)
		}
	}
	e.w.Secrets = append([]SigningSecret{{Secret: secret}}, prev...)
	e.w.UpdateTime = now
	return secret, nil
}

// Ping sends a PingEventType event to the webhook (whatever its subscribed
// events and state: a ping is the user's explicit test) and returns the
// message id. The delivery is asynchronous, with redelivery like any event.
func (ws *WebhookService) Ping(id string) (string, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if _, ok := ws.hooks[id]; !ok {
		return "", ErrNoWebhook
	}
	ev := Event{Type: PingEventType, Timestamp: ws.opts.Now(), Data: map[string]string{"webhook_id": id}}
	return ws.enqueue(&message{webhookID: id, ping: true, event: ev}), nil
}

// --- HTTP ---

// webhookJSON is a Webhook as the API renders it (models/webhooks/webhook.go).
type webhookJSON struct {
	ID               string       `json:"id"`
	Name             string       `json:"name,omitempty"`
	URI              string       `json:"uri"`
	SubscribedEvents []string     `json:"subscribed_events"`
	State            string       `json:"state"`
	NewSigningSecret string       `json:"new_signing_secret,omitempty"`
	SigningSecrets   []secretJSON `json:"signing_secrets,omitempty"`
	CreateTime       string       `json:"create_time"`
	UpdateTime       string       `json:"update_time"`
}

type secretJSON struct {
	TruncatedSecret string `json:"truncated_secret"`
	ExpireTime      string `json:"expire_time,omitempty"`
}

func renderWebhook(w Webhook, newSecret string) webhookJSON {
	out := webhookJSON{
		ID: w.ID, Name: w.Name, URI: w.URI, SubscribedEvents: w.SubscribedEvents, State: w.State,
		NewSigningSecret: newSecret, CreateTime: ts(w.CreateTime), UpdateTime: ts(w.UpdateTime),
	}
	for _, s := range w.Secrets {
		out.SigningSecrets = append(out.SigningSecrets, secretJSON{TruncatedSecret: truncateSecret(s.Secret), ExpireTime: optTS(s.ExpireTime)})
	}
	return out
}

// serveWebhooks answers the WebhookService paths; false if the path is not
// one of them.
func (s *Server) serveWebhooks(w http.ResponseWriter, r *http.Request) bool {
	// The SDK percent-encodes the id (':' included), so the verb is found
	// in the escaped path.
	p := r.URL.EscapedPath()
	const base = "/v1beta/webhooks"
	if p != base && !strings.HasPrefix(p, base+"/") {
		return false
	}
	if !s.checkKey(w, r, false) {
		return true
	}
	ws := s.Webhooks()
	if p == base {
		switch r.Method {
		case http.MethodGet:
			ws.httpList(w, r)
		case http.MethodPost:
			ws.httpCreate(w, r)
		default:
			writeError(w, http.StatusMethodNotAllowed, "webhooks: want GET or POST")
		}
		return true
	}
	rest := strings.TrimPrefix(p, base+"/")
	rawID, verb, hasVerb := strings.Cut(rest, ":")
	id, err := url.PathUnescape(rawID)
	if err != nil || id == "" || strings.Contains(rawID, "/") {
		writeError(w, http.StatusNotFound, "geminifake: no such path "+p)
		return true
	}
	switch {
	case !hasVerb && r.Method == http.MethodGet:
		wh, err := ws.Get(id)
		writeResult(w, err, func() any { return renderWebhook(wh, "") })
	case !hasVerb && r.Method == http.MethodPatch:
		ws.httpUpdate(w, r, id)
	case !hasVerb && r.Method == http.MethodDelete:
		writeResult(w, ws.Delete(id), func() any { return struct{}{} })
	case hasVerb && verb == "ping" && r.Method == http.MethodPost:
		if _, err := readObject(r, nil); err != nil {
			writeResult(w, err, nil)
			return true
		}
		_, err := ws.Ping(id)
		writeResult(w, err, func() any { return struct{}{} })
	case hasVerb && verb == "rotateSigningSecret" && r.Method == http.MethodPost:
		ws.httpRotate(w, r, id)
	case hasVerb && verb != "ping" && verb != "rotateSigningSecret":
		writeError(w, http.StatusNotFound, "geminifake: no such method "+verb)
	default:
		writeError(w, http.StatusMethodNotAllowed, "webhooks/"+rest+": method "+r.Method+" not allowed")
	}
	return true
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(v)
}

// writeResult writes render() or the error as the API would.
func writeResult(w http.ResponseWriter, err error, render func() any) {
	var ae *APIError
	switch {
	case errors.Is(err, ErrNoWebhook):
		writeError(w, http.StatusNotFound, "Requested entity was not found.")
	case errors.As(err, &ae):
		writeError(w, ae.Code, ae.Message)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, render())
	}
}

// fieldNames maps the JSON names the API accepts (proto JSON takes both the
// snake_case and the lowerCamelCase spelling) to the snake_case one.
var fieldNames = map[string]string{
	"name": "name", "uri": "uri", "state": "state",
	"subscribed_events": "subscribed_events", "subscribedEvents": "subscribed_events",
	"revocation_behavior": "revocation_behavior", "revocationBehavior": "revocation_behavior",
	// Output-only fields: accepted and ignored, as Google APIs do.
	"id": "", "create_time": "", "createTime": "", "update_time": "", "updateTime": "",
	"signing_secrets": "", "signingSecrets": "", "new_signing_secret": "", "newSigningSecret": "",
}

// readObject reads a JSON object body (an empty body is {}) and returns its
// fields by snake_case name, refusing names outside allowed (and unknown
// names) with 400 as the API does.
func readObject(r *http.Request, allowed []string) (map[string]json.RawMessage, error) {
	raw, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return nil, badRequest("Invalid JSON payload received: %v", err)
	}
	if len(strings.TrimSpace(string(raw))) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var in map[string]json.RawMessage
	if err := json.Unmarshal(raw, &in); err != nil || in == nil {
		return nil, badRequest("Invalid JSON payload received. Expected an object.")
	}
	out := map[string]json.RawMessage{}
	for k, v := range in {
		n, known := fieldNames[k]
		if !known || (n != "" && !slices.Contains(allowed, n)) {
			return nil, badRequest("Invalid JSON payload received. Unknown name %q: Cannot find field.", k)
		}
		if n != "" {
			out[n] = v
		}
	}
	return out, nil
}

func decodeField(fields map[string]json.RawMessage, name string, into any) error {
	v, ok := fields[name]
	if !ok || string(v) == "null" {
		return nil
	}
	if err := json.Unmarshal(v, into); err != nil {
		return badRequest("Invalid value at %q: %v", name, err)
	}
	return nil
}

func (ws *WebhookService) httpCreate(w http.ResponseWriter, r *http.Request) {
	fields, err := readObject(r, []string{"name", "uri", "subscribed_events"})
	if err != nil {
		writeResult(w, err, nil)
		return
	}
	var name, uri string
	var events []string
	for _, err := range []error{
		decodeField(fields, "name", &name), decodeField(fields, "uri", &uri),
		decodeField(fields, "subscribed_events", &events),
	} {
		if err != nil {
			writeResult(w, err, nil)
			return
		}
	}
	wh, secret, err := ws.Create(name, uri, events)
	writeResult(w, err, func() any { return renderWebhook(wh, secret) })
}

func (ws *WebhookService) httpUpdate(w http.ResponseWriter, r *http.Request, id string) {
	fields, err := readObject(r, []string{"name", "uri", "subscribed_events", "state"})
	if err != nil {
		writeResult(w, err, nil)
		return
	}
	// update_mask names the fields to change; without one, every field in
	// the body changes.
	var paths []string
	if m := r.URL.Query().Get("update_mask"); m != "" {
		for _, f := range strings.Split(m, ",") {
			n, ok := fieldNames[strings.TrimSpace(f)]
			if !ok || n == "" || n == "revocation_behavior" {
				writeResult(w, badRequest("update_mask: unknown field %q.", f), nil)
				return
			}
			paths = append(paths, n)
		}
	} else {
		for k := range fields {
			paths = append(paths, k)
		}
	}
	var u WebhookUpdate
	for _, p := range paths {
		var err error
		switch p {
		case "name":
			u.Name = new(string)
			err = decodeField(fields, p, u.Name)
		case "uri":
			u.URI = new(string)
			err = decodeField(fields, p, u.URI)
		case "subscribed_events":
			u.SubscribedEvents = []string{}
			err = decodeField(fields, p, &u.SubscribedEvents)
		case "state":
			u.State = new(string)
			err = decodeField(fields, p, u.State)
		}
		if err != nil {
			writeResult(w, err, nil)
			return
		}
	}
	wh, err := ws.Update(id, u)
	writeResult(w, err, func() any { return renderWebhook(wh, "") })
}

func (ws *WebhookService) httpRotate(w http.ResponseWriter, r *http.Request, id string) {
	fields, err := readObject(r, []string{"revocation_behavior"})
	if err != nil {
		writeResult(w, err, nil)
		return
	}
	behavior := RevokeAfter24h
	if err := decodeField(fields, "revocation_behavior", &behavior); err != nil {
		writeResult(w, err, nil)
		return
	}
	if behavior != RevokeAfter24h && behavior != RevokeImmediately {
		writeResult(w, badRequest("Invalid value at 'revocation_behavior', %q.", behavior), nil)
		return
	}
	secret, err := ws.RotateSigningSecret(id, behavior == RevokeImmediately)
	writeResult(w, err, func() any { return map[string]string{"secret": secret} })
}

// httpList pages over the webhooks in creation order; the page token is the
// creation number of the last one served, so deletions between pages skip
// nothing.
func (ws *WebhookService) httpList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	size := 50
	if v := q.Get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "Invalid value at 'page_size' (TYPE_INT32), \""+v+"\"")
			return
		}
		if n > 0 {
			size = min(n, 1000)
		}
	}
	var after uint64
	if t := q.Get("page_token"); t != "" {
		raw, err := base64.RawURLEncoding.DecodeString(t)
		n, perr := strconv.ParseUint(strings.TrimPrefix(string(raw), "wh:"), 10, 64)
		if err != nil || perr != nil || !strings.HasPrefix(string(raw), "wh:") {
			writeError(w, http.StatusBadRequest, "Invalid page token.")
			return
		}
		after = n
	}
	ws.mu.Lock()
	now := ws.opts.Now()
	var items []webhookJSON
	var last uint64
	next := ""
	for _, e := range ws.order {
		if e.seq <= after {
			continue
		}
		if len(items) == size {
			next = base64.RawURLEncoding.EncodeToString([]byte("wh:" + strconv.FormatUint(last, 10)))
			break
		}
		items = append(items, renderWebhook(ws.snapshot(e, now), ""))
		last = e.seq
	}
	ws.mu.Unlock()
	out := map[string]any{}
	if len(items) > 0 { // an empty list is {}, as Google APIs answer it
		out["webhooks"] = items
	}
	if next != "" {
		out["next_page_token"] = next
	}
	writeJSON(w, out)
}
