// Package webhook is gemrecon's optional webhook receiver (spec §6), the HTTP
// side only: it bounds and reads the body, verifies its signature — Standard
// Webhooks HMAC (v1) with the project's secrets, and, when configured, the
// dynamic (per-job) signatures of package webhook/dynamic — hands the
// verified body to the ingest path it is given (which turns it into a key,
// records the sighting durably, counts it and wakes the dispatcher: spec
// §9.1) with how it was verified, and turns ingest's answer into a status
// code — durable before any 2xx. With Sync it runs the effect inside the
// request. It also serves /healthz, /readyz and the /metrics it is given,
// and runs an http.Server with timeouts and a graceful drain. It builds
// neither the ingest path nor the metrics: the caller does (package serve's
// Receiver). The receiver's configuration rules — a verifier is required
// (ErrNoVerifier), dynamic verification does not go with InsecureNoVerify,
// the path and limits — are Config.Validate's.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/field"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// Defaults of Config.
const (
	DefaultPath       = "/webhook"
	DefaultMaxBody    = 1 << 20 // 1 MiB
	DefaultSyncWait   = 10 * time.Second
	DefaultRetryAfter = 5 * time.Second
	// KeysRetryAfter is the Retry-After of a 503 for a dynamically signed
	// request whose key set could not be fetched: the verifier fetches it
	// again at most once per dynamic.RefetchInterval, so a retry sooner
	// than that would meet the same failure.
	KeysRetryAfter = dynamic.RefetchInterval
)

// Dispatcher is what the receiver needs of *dispatch.Dispatcher: Kick wakes
// the background workers after a new sighting; RunKeyWithin claims one key
// and runs its effect now (Sync mode), confirming it with the API first
// within the given wait when it must, and reports the outcome as dispatch
// names it (dispatch.OutcomeDone, …).
type Dispatcher interface {
	Kick()
	RunKeyWithin(ctx context.Context, key string, confirmWait time.Duration) (dispatch.Outcome, error)
	// RunClaimWithin runs a claim granted where the key was recorded, at
	// asked (Sync mode), as RunKeyWithin runs the claim it makes.
	RunClaimWithin(ctx context.Context, c sink.Claim, asked time.Time, confirmWait time.Duration) (dispatch.Outcome, error)
}

// Sink is what the receiver needs of the sink beside the ingest path's
// Record: Get (a --sync request looks at the key's row) and Ping (/readyz).
type Sink interface {
	Get(ctx context.Context, key string) (sink.Entry, error)
	Ping(ctx context.Context) error
}

// Config configures NewHandler.
type Config struct {
	// Sink answers /readyz and a --sync request's look at its key (required).
	Sink Sink
	// Ingest records what the receiver verified (required): it counts in
	// Metrics and, unless Sync, kicks Dispatcher (serve.Receiver builds it).
	Ingest *ingest.Webhooks
	// Secrets are whsec_ secrets; a request passes if any verifies it.
	Secrets []string
	// Dynamic, when set, verifies the signatures of the Gemini API's
	// dynamic (per-job) webhooks — v1a Ed25519 and RS256 JWTs — against
	// its published key set (spec §6). A request passes when the HMAC
	// secrets or Dynamic verify it; HMAC is tried first, and a request
	// verified only by Dynamic is recorded as ingest.VerifiedDynamic (its
	// key must be confirmed with the API before it runs, spec §9.2).
	Dynamic *dynamic.Verifier
	// InsecureNoVerify accepts unsigned requests (Secrets are then not
	// checked); without it, a config with neither Secrets nor Dynamic is an
	// error, and with it Dynamic is one (a dynamic signature would prove
	// nothing when unsigned requests pass too).
	InsecureNoVerify bool
	// Path is where events are POSTed (default DefaultPath).
	Path string
	// MaxBody is the largest body accepted (default DefaultMaxBody); larger is 413.
	MaxBody int64
	// MaxUnverified caps the bytes of bodies read but not yet verified,
	// summed over every request (default DefaultMaxUnverified, at least
	// MaxBody): a request that would go over gets 503 with Retry-After
	// before its body is read.
	MaxUnverified int64
	// MaxConns caps the connections Serve keeps open (default
	// DefaultMaxConns), beside ProbeConns spare ones for the probes.
	MaxConns int
	// SecretSource says where Secrets came from — a flag, a file, the
	// environment, never their values — for the line that logs refused
	// signatures.
	SecretSource string
	// Sync runs the effect inside the request through Dispatcher.RunKey.
	Sync bool
	// SyncWait is how long a Sync request waits for a key that another live
	// holder has claimed before answering 202 (default DefaultSyncWait).
	SyncWait time.Duration
	// Dispatcher is kicked after each new sighting (may be nil in inbox
	// mode: something else dispatches); required with Sync.
	Dispatcher Dispatcher
	// Metrics receives the requests' counters and serves /metrics (required).
	Metrics *metrics.Metrics
	// Logger receives one line per rejected or failed request; nil discards.
	Logger *slog.Logger
	// RetryAfter is the Retry-After of a 503 (default DefaultRetryAfter).
	RetryAfter time.Duration
	// Now is the clock for signature timestamps and the refusals' log
	// lines; nil means time.Now.
	Now func() time.Time
}

// Handler serves the receiver's routes (NewHandler); Serve runs it.
type Handler struct {
	cfg      Config
	verifier *Verifier // nil when InsecureNoVerify or without Secrets
	metricsH http.Handler
	log      *slog.Logger
	// syncRuns is read-locked by each --sync request running its key, so
	// that Serve can wait for them after a forced drain by taking it. (A
	// sync.WaitGroup may not be Added to while Wait runs from zero, and a
	// request can reach runSync during the drain.)
	syncRuns sync.RWMutex
	// stopping is done once Serve's shutdown has begun (stopSync): a
	// --sync request's effect then gets the dispatcher's grace, as the
	// background workers' effects do.
	stopping context.Context
	stopSync context.CancelFunc
	// unverified is the bytes of bodies being read or verified
	// (readVerified); sigWarn and loadWarn space the WARN lines of
	// refusals.
	unverified        atomic.Int64
	sigWarn, loadWarn throttle
}

// NewHandler validates cfg and returns the receiver: POST cfg.Path, GET
// /healthz, GET /readyz (the sink answers Ping), GET /metrics. It refuses a
// config without a verifier (Secrets or Dynamic) unless InsecureNoVerify is
// set, and Dynamic together with InsecureNoVerify.
func NewHandler(cfg Config) (*Handler, error) {
	switch {
	case cfg.Sink == nil:
		return nil, errors.New("webhook: no sink")
	case cfg.Ingest == nil:
		return nil, errors.New("webhook: no ingest path")
	case cfg.Metrics == nil:
		return nil, errors.New("webhook: no metrics")
	case cfg.Sync && cfg.Dispatcher == nil:
		return nil, errors.New("webhook: sync mode needs a dispatcher")
	}
	cfg.Path = cmp.Or(cfg.Path, DefaultPath)
	cfg.MaxBody = cmp.Or(max(cfg.MaxBody, 0), DefaultMaxBody)
	cfg.SyncWait = cmp.Or(max(cfg.SyncWait, 0), DefaultSyncWait)
	cfg.RetryAfter = cmp.Or(max(cfg.RetryAfter, 0), DefaultRetryAfter)
	cfg.MaxUnverified = cmp.Or(max(cfg.MaxUnverified, 0), DefaultMaxUnverified)
	cfg.MaxConns = cmp.Or(max(cfg.MaxConns, 0), DefaultMaxConns)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Handler{cfg: cfg, log: cfg.Logger, metricsH: cfg.Metrics.Handler()}
	h.stopping, h.stopSync = context.WithCancel(context.Background())
	// With InsecureNoVerify the secrets are not checked (and Validate
	// refused Dynamic beside it).
	if len(cfg.Secrets) > 0 && !cfg.InsecureNoVerify {
		v, err := NewVerifier(cfg.Secrets, cfg.Now)
		if err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
		h.verifier = v
	}
	return h, nil
}

// DefaultConfig returns a Config with every setting at its default; the
// caller adds the Sink, the verifiers and what it changes, then checks it
// with Validate.
func DefaultConfig() Config {
	return Config{Path: DefaultPath, MaxBody: DefaultMaxBody, MaxUnverified: DefaultMaxUnverified, MaxConns: DefaultMaxConns,
		SyncWait: DefaultSyncWait, RetryAfter: DefaultRetryAfter}
}

// ErrNoVerifier is wrapped by Validate's error for a Config that verifies
// nothing and does not say it accepts unsigned requests.
var ErrNoVerifier = errors.New("no webhook verifier")

// Validate checks the settings as they will run (NewHandler fills zero
// fields with their defaults first), naming the field at fault (a
// field.Error): the path, the limits, and the verifier rules of spec §6 —
// at least one verifier (Secrets, Dynamic) unless InsecureNoVerify, and
// not Dynamic with InsecureNoVerify (a dynamic signature would prove
// nothing when unsigned requests pass too). It does not look at Sink and
// Dispatcher, so a command can check its flags before it opens anything.
func (c Config) Validate() error {
	const p = "webhook: "
	switch {
	case c.Path == "" || c.Path[0] != '/':
		return field.Errorf(p, "{Path} %q must start with /", c.Path)
	case strings.ContainsAny(c.Path, "?#"):
		return field.Errorf(p, "{Path} %q holds a query or a fragment, which is no part of the path a request is matched on: it would match no request (register the URL with its query if you like, and give only its path here)", c.Path)
	case c.Path == "/healthz" || c.Path == "/readyz" || c.Path == "/metrics":
		return field.Errorf(p, "{Path} %q is taken by a built-in endpoint", c.Path)
	case c.MaxBody <= 0:
		return field.Errorf(p, "{MaxBody} must be positive")
	case c.MaxUnverified < c.MaxBody:
		return field.Errorf(p, "{MaxUnverified} %d is below {MaxBody} %d: a body of the largest size could never be read", c.MaxUnverified, c.MaxBody)
	case c.MaxConns < 1:
		return field.Errorf(p, "{MaxConns} must be positive")
	case c.SyncWait < 0:
		return field.Errorf(p, "{SyncWait} must not be negative")
	case c.InsecureNoVerify && c.Dynamic != nil:
		return field.Errorf(p, "{InsecureNoVerify} accepts every request unverified, so {dynamic verification|Dynamic} would prove nothing: use one or the other")
	case !c.InsecureNoVerify && len(c.Secrets) == 0 && c.Dynamic == nil:
		return field.Errorf(p, "%w: set %s or {a secret file|Secrets} (whsec_…) for static webhooks, and/or {dynamic verification|Dynamic} for per-job ones, or pass {InsecureNoVerify} to accept unsigned requests", ErrNoVerifier, SecretEnv)
	}
	return nil
}

// response is a 2xx body: {"key","status"} for a recorded or non-terminal
// event, {"status":"ignored","type"} for one that is not a batch event,
// {"status":"invalid","error"} for a body that cannot be used. Its status
// is what ingest answered (metrics.OutcomeAccepted, OutcomeDuplicate,
// OutcomeDone, OutcomeIgnored, OutcomeInvalid), or, with Sync, OutcomeDone
// once the effect ran.
type response struct {
	Key    string `json:"key,omitempty"`
	Status string `json:"status"`
	Type   string `json:"type,omitempty"`
	Error  string `json:"error,omitempty"`
}

// statusWriter remembers the status code for metrics and logs (every
// answer to an event is writeJSON's, which writes its header first).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// ServeHTTP serves the receiver's routes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if onSpareConn(r) {
		w.Header().Set("Connection", "close") // one answer: the spare is free again for the next probe
	}
	path := r.URL.Path
	probe := path == "/healthz" || path == "/readyz" || path == "/metrics"
	switch {
	case path == h.cfg.Path && r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: POST events here")
	case path == h.cfg.Path:
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.serveEvent(sw, r)
		h.cfg.Metrics.ObserveRequest(sw.code, time.Since(start))
	case probe && r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed")
	case path == "/healthz":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case path == "/readyz":
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := h.cfg.Sink.Ping(ctx); err != nil {
			h.log.Warn("readiness check failed", "err", err)
			h.unavailable(w, "database not ready: "+err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	case path == "/metrics":
		h.metricsH.ServeHTTP(w, r)
	default:
		if r.Method == http.MethodPost {
			// Most likely a webhook registered with another path than
			// --path: every delivery fails, and only this log says why.
			h.log.Info("webhook: POST to a path that receives no events; answered 404",
				"path", clip(path), "method", r.Method, "events_path", h.cfg.Path,
				"remote", r.RemoteAddr, "webhook_id", clip(r.Header.Get("webhook-id")))
		}
		writeError(w, http.StatusNotFound, "no such path: events go to POST "+h.cfg.Path)
	}
}

// unavailable answers 503 with Retry-After: the sender retries.
func (h *Handler) unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(int((h.cfg.RetryAfter+time.Second-1)/time.Second)))
	writeError(w, http.StatusServiceUnavailable, msg)
}

// utf8BOM is the UTF-8 encoding of U+FEFF, the byte order mark.
var utf8BOM = []byte("\xef\xbb\xbf")

// reject answers a request that records nothing.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, code int, outcome, msg string) {
	h.cfg.Metrics.ObserveDelivery(sink.SourceWebhook, outcome)
	h.log.Info("webhook rejected", "status", code, "reason", msg, "remote", r.RemoteAddr, "webhook_id", clip(r.Header.Get("webhook-id")))
	writeError(w, code, msg)
}

// clip bounds a sender-controlled string for a log line or a response body:
// at most canon.MaxQuoted bytes, cut at a character boundary. (slog and
// encoding/json escape what they write.)
func clip(s string) string {
	if len(s) <= canon.MaxQuoted {
		return s
	}
	cut := canon.MaxQuoted
	for cut > canon.MaxQuoted-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func (h *Handler) serveEvent(w http.ResponseWriter, r *http.Request) {
	// 1. What the connection and the headers decide, before a byte of the
	// body is read (spec §6): a spare connection, a declared length over
	// the limit, a signature no body could make pass.
	if onSpareConn(r) {
		h.overloaded(w, r, fmt.Sprintf("over the %d open connections this receiver keeps", h.cfg.MaxConns))
		return
	}
	if r.ContentLength > h.cfg.MaxBody {
		h.reject(w, r, http.StatusRequestEntityTooLarge, metrics.OutcomeTooLarge,
			fmt.Sprintf("body of %d bytes is over the %d-byte limit", r.ContentLength, h.cfg.MaxBody))
		return
	}
	if !h.checkHeaders(w, r) {
		return
	}

	// 2. The body, bounded, and its signature, over the exact bytes
	// received.
	body, verification, ok := h.readVerified(w, r)
	if !ok {
		return
	}

	// A UTF-8 byte order mark before the JSON is nobody's promise either
	// way (RFC 8259 §8.1 lets a receiver ignore one): the signature was
	// checked over the bytes as sent; the event is read, and stored,
	// without it.
	body = bytes.TrimPrefix(body, utf8BOM)

	// 3. Everything else is ingest's (spec §9.1): what the body is (an
	// event that is not a batch event is ignored whatever else it holds; a
	// verified body without a usable name is answered 200, no retry can
	// fix it), the key, the durable record before any 2xx, the metrics and
	// the kick.
	a := h.cfg.Ingest.Event(r.Context(), body, verification)
	switch a.Kind {
	case ingest.Ignored:
		if a.Key == "" {
			// At info, unlike a completion's line: such events are rare on
			// gemrecon's endpoint, and `webhooks ping` tells the user to
			// look for its test event in this log.
			h.log.Info("webhook ignored: not a batch event; answered 200, nothing recorded",
				"type", clip(a.Type), "webhook_id", clip(r.Header.Get("webhook-id")))
		} else {
			h.log.Debug("webhook ignored: not a completion", "key", a.Key, "type", clip(a.Type), "state", a.State)
		}
		writeJSON(w, http.StatusOK, response{Key: a.Key, Status: metrics.OutcomeIgnored, Type: clip(a.Type)})
		return
	case ingest.Invalid:
		// 200, so that the sender does not retry for a day what no retry
		// can fix (and does not disable the webhook), recorded nowhere
		// (ingest counted it), logged at error level (spec §6).
		h.log.Error("webhook: a verified body cannot be used; answered 200 invalid and recorded nothing",
			"reason", a.Reason, "err", a.Err.Error(), "remote", r.RemoteAddr, "webhook_id", clip(r.Header.Get("webhook-id")))
		writeJSON(w, http.StatusOK, response{Status: metrics.OutcomeInvalid, Error: a.Err.Error()})
		return
	case ingest.Unavailable:
		h.log.Warn("webhook: recording failed; answering 503 so the sender retries", "key", a.Key, "err", a.Err)
		h.unavailable(w, "database unavailable, retry later: "+a.Err.Error())
		return
	}
	if h.cfg.Sync && a.Result.State != sink.StateDone {
		h.runSync(w, r, a)
		return
	}
	code := http.StatusAccepted
	if h.cfg.Sync { // done already: the effect has run
		code = http.StatusOK
	}
	writeJSON(w, code, response{Key: a.Key, Status: a.Outcome})
}

// verify checks the request's signature (spec §6) and says how it was
// verified; when no enabled scheme verifies it, it answers the request and
// returns false. The rules, in order:
//   - --insecure-no-verify: every request passes, Unverified.
//   - HMAC (v1) with the configured secrets: a match is VerifiedStatic —
//     the project's own secret, so no extra confirmation is needed.
//   - dynamic (v1a, RS256 JWT) against the key set: a match is
//     VerifiedDynamic. A request with no v1a or JWT entry at all
//     (dynamic.ErrNoEntry) is decided without touching the key set: 401
//     with the HMAC verifier's error, so HMAC traffic never depends on the
//     JWKS. A key set that cannot be fetched (dynamic.ErrUnavailable) is
//     503 with Retry-After KeysRetryAfter, counted as jwks_unavailable (not
//     the database's unavailable): the sender retries. Anything else is 401.
func (h *Handler) verify(w http.ResponseWriter, r *http.Request, body []byte) (ingest.Verification, bool) {
	if h.cfg.InsecureNoVerify {
		return ingest.Unverified, true
	}
	var hmacErr, dynErr error
	if h.verifier != nil {
		if hmacErr = h.verifier.Verify(body, r.Header); hmacErr == nil {
			return ingest.VerifiedStatic, true
		}
	}
	if h.cfg.Dynamic != nil {
		var res dynamic.Result
		if res, dynErr = h.cfg.Dynamic.Verify(r.Context(), body, r.Header); dynErr == nil {
			h.log.Debug("webhook verified by a dynamic signature; its key is confirmed with the API before it runs",
				"scheme", res.Scheme, "kid", clip(res.KeyID), "webhook_id", clip(r.Header.Get("webhook-id")))
			return ingest.VerifiedDynamic, true
		}
	}
	if errors.Is(dynErr, dynamic.ErrUnavailable) {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(h.cfg.RetryAfter, KeysRetryAfter)/time.Second)))
		h.reject(w, r, http.StatusServiceUnavailable, metrics.OutcomeJWKSUnavailable,
			"dynamic signature: "+dynErr.Error()+"; retry later")
	} else {
		h.refuseSignature(w, r, hmacErr, dynErr)
	}
	return 0, false
}

// runSync runs the key's effect in the request: 200 once done, 500 when the
// effect failed in this request (the sender retries), 202 when another live
// holder has it past SyncWait, and 202 "dead" for a key that was dead
// before the request (nothing ran, and a redelivery cannot change that).
func (h *Handler) runSync(w http.ResponseWriter, r *http.Request, a ingest.Answer) {
	key := a.Key
	h.syncRuns.RLock()
	defer h.syncRuns.RUnlock()
	ctx := r.Context()
	// The effect is not cancelled when the sender hangs up (its own request
	// timeout): a half-run effect is worse than an unread answer, and the
	// sender's retry finds the key done. dispatch's effect timeout bounds it.
	// The server's shutdown does end it: runCtx is done once it begins
	// (h.stopping), and dispatch gives the effect its grace, then kills it
	// and records a retryable failure, as for the background workers'
	// effects, so the key is not left claimed behind an effect nothing
	// supervises.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	defer context.AfterFunc(h.stopping, stop)()
	if h.stopping.Err() != nil {
		stop() // at once, not in AfterFunc's goroutine: claim nothing now
	}
	deadline := time.Now().Add(h.cfg.SyncWait)
	pause := 10 * time.Millisecond
	// Each break answers 202 with the key as recorded: it is durable, and
	// the background workers, its holder or the next process finish it.
loop:
	for {
		var out dispatch.Outcome
		var err error
		if c := a.Claim; c != nil { // granted where it was recorded: run it
			a.Claim = nil
			out, err = h.cfg.Dispatcher.RunClaimWithin(runCtx, *c, a.Asked, max(time.Until(deadline), time.Millisecond))
		} else {
			out, err = h.cfg.Dispatcher.RunKeyWithin(runCtx, key, max(time.Until(deadline), time.Millisecond))
		}
		switch {
		case err != nil && runCtx.Err() != nil: // shutting down before the key could be claimed
			break loop
		case err != nil:
			h.log.Warn("webhook sync: dispatch failed", "key", key, "err", err)
			h.unavailable(w, "dispatch failed, retry later: "+err.Error())
			return
		case out == dispatch.OutcomeDone:
			writeJSON(w, http.StatusOK, response{Key: key, Status: metrics.OutcomeDone})
			return
		case out == dispatch.OutcomeRetry || out == dispatch.OutcomeDead:
			writeJSON(w, http.StatusInternalServerError, response{Key: key, Status: string(out), Error: "the effect failed (" + string(out) + ")"})
			return
		case out == dispatch.OutcomeUnconfirmed:
			// The API did not confirm the batch within --sync-wait (not
			// finished, or no answer): the key goes on as in inbox mode.
			h.cfg.Dispatcher.Kick()
			break loop
		}
		// busy, fenced or skipped: someone else holds the key, or it is not
		// due. Look at the row: done or dead settles it; otherwise wait.
		e, err := h.cfg.Sink.Get(ctx, key)
		switch {
		case err != nil:
		case e.State == sink.StateDone:
			writeJSON(w, http.StatusOK, response{Key: key, Status: metrics.OutcomeDone})
			return
		case e.State == sink.StateDead:
			// Dead before this request: nothing ran in it, and no
			// delivery can change that until an operator's retry
			// (which runs the key without one). A 500 would only make
			// the sender retry for 24 h and perhaps disable the
			// webhook (spec §6's reason to answer an unusable body
			// 2xx): 202 — the sighting is durable — saying so.
			h.log.Warn("webhook sync: the key is dead; answered 202 without running it (gemrecon retry runs it again)", "key", key, "last_error", e.LastError)
			writeJSON(w, http.StatusAccepted, response{Key: key, Status: string(sink.StateDead),
				Error: "the key is dead (nothing ran; `gemrecon retry` runs it again): " + e.LastError})
			return
		case e.State == sink.StatePending && e.NextAttemptAt.After(sink.NowOf(ctx, h.cfg.Sink).Add(pause)):
			// Backing off after a failed attempt: nothing to wait for
			// here; the background workers retry it when due.
			break loop
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			h.cfg.Dispatcher.Kick()
			break loop
		}
		select {
		case <-ctx.Done():
			break loop
		case <-runCtx.Done(): // shutting down
			break loop
		case <-time.After(min(pause, remaining)):
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
	writeJSON(w, http.StatusAccepted, response{Key: key, Status: a.Outcome})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"encoding response"}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
