package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// What unauthenticated traffic may cost (spec §6, "Unauthenticated traffic
// is bounded"): a request is judged by its headers before its body is
// read; the bodies read but not yet verified share one budget of bytes;
// the open connections are capped, with a few spare ones for the probes.

// Defaults of Config's limits.
const (
	DefaultMaxUnverified = 64 << 20 // 64 MiB
	DefaultMaxConns      = 1024
)

// ProbeConns is how many connections Serve accepts beyond Config.MaxConns.
// Such a spare connection answers /healthz, /readyz and /metrics, and 503
// with Retry-After to anything else before its body is read; it is closed
// after one answer and reads for at most spareReadFor. A flood that fills
// MaxConns so leaves the probes an answer, and an orchestrator does not
// restart a receiver that is healthy, only busy.
const ProbeConns = 8

// spareReadFor bounds the time a spare connection may take to send its
// request, so that idle connections cannot hold the spares for long.
const spareReadFor = 2 * time.Second

// warnEvery spaces the WARN lines that sum up refused requests.
const warnEvery = 10 * time.Second

// checkHeaders refuses, before the body is read, a request that no body
// could make pass: what each enabled verifier's Check says (a signature
// header missing or malformed, a timestamp unreadable or outside the
// tolerance). With InsecureNoVerify nothing is checked.
func (h *Handler) checkHeaders(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.InsecureNoVerify {
		return true
	}
	var hmacErr, dynErr error
	if h.verifier != nil {
		if hmacErr = h.verifier.Check(r.Header); hmacErr == nil {
			return true
		}
	}
	if h.cfg.Dynamic != nil {
		if dynErr = h.cfg.Dynamic.Check(r.Header); dynErr == nil {
			return true
		}
	}
	h.refuseSignature(w, r, hmacErr, dynErr)
	return false
}

// readVerified reads the body and verifies it. Its bytes count among the
// unverified ones of every request until then (the declared length, or
// MaxBody for a chunked body): a request that would take them over
// MaxUnverified gets 503 with Retry-After before its body is read. It
// answers the request itself and returns false when the body cannot be
// read or verified.
func (h *Handler) readVerified(w http.ResponseWriter, r *http.Request) ([]byte, ingest.Verification, bool) {
	n := r.ContentLength
	if n < 0 {
		n = h.cfg.MaxBody
	}
	if h.unverified.Add(n) > h.cfg.MaxUnverified {
		h.unverified.Add(-n)
		h.overloaded(w, r, fmt.Sprintf("over the %d bytes of unverified bodies this receiver holds at once", h.cfg.MaxUnverified))
		return nil, 0, false
	}
	defer h.unverified.Add(-n)
	var body []byte
	var err error
	if r.ContentLength >= 0 { // at most MaxBody (serveEvent): read into its own size
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	}
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		h.reject(w, r, http.StatusRequestEntityTooLarge, metrics.OutcomeTooLarge,
			fmt.Sprintf("body is over the %d-byte limit", h.cfg.MaxBody))
		return nil, 0, false
	case err != nil:
		h.reject(w, r, http.StatusBadRequest, metrics.OutcomeBadRequest, "reading body: "+err.Error())
		return nil, 0, false
	}
	v, ok := h.verify(w, r, body)
	return body, v, ok
}

// overloaded answers 503 with Retry-After, the body unread: the sender
// retries. One WARN line per warnEvery sums them up.
func (h *Handler) overloaded(w http.ResponseWriter, r *http.Request, msg string) {
	h.cfg.Metrics.ObserveDelivery(sink.SourceWebhook, metrics.OutcomeOverloaded)
	h.log.Debug("webhook overloaded; answered 503", "reason", msg, "remote", r.RemoteAddr)
	if n, ok := h.loadWarn.note(h.cfg.Now()); ok {
		h.log.Warn("webhook: requests answered 503 before their body was read; senders retry", "refused", n, "reason", msg,
			"check", "a flood of unverified requests, or serve's --max-unverified-bytes and --max-connections too low for the traffic")
	}
	h.unavailable(w, msg+"; retry later")
}

// refuseSignature answers 401 for a request that no enabled scheme
// verifies, with the reasons of the HMAC verifier (hmacErr) and the
// dynamic one (dynErr), either nil when it is not enabled. One WARN line
// per warnEvery sums them up, saying where the secrets came from, how far
// the request's webhook-timestamp is from this host's clock, and what to
// check; each is a debug line.
func (h *Handler) refuseSignature(w http.ResponseWriter, r *http.Request, hmacErr, dynErr error) {
	var why []string
	if hmacErr != nil {
		why = append(why, "signature: "+hmacErr.Error())
	}
	if dynErr != nil && (hmacErr == nil || !errors.Is(dynErr, dynamic.ErrNoEntry)) {
		why = append(why, "dynamic signature: "+dynErr.Error())
	}
	msg := strings.Join(why, "; ")
	h.cfg.Metrics.ObserveDelivery(sink.SourceWebhook, metrics.OutcomeUnverified)
	h.log.Debug("webhook rejected", "status", http.StatusUnauthorized, "reason", msg, "remote", r.RemoteAddr,
		"webhook_id", clip(r.Header.Get("webhook-id")))
	if n, ok := h.sigWarn.note(h.cfg.Now()); ok {
		age := "none" // how far webhook-timestamp lies before this host's clock
		if sec, err := strconv.ParseInt(r.Header.Get(dynamic.HeaderTimestamp), 10, 64); err == nil {
			age = h.cfg.Now().Sub(time.Unix(sec, 0)).Round(time.Second).String()
		}
		attrs := []any{"refused", n, "reason", clip(msg), "secrets", h.cfg.SecretSource}
		if h.cfg.Dynamic != nil {
			attrs = append(attrs, "jwks_url", h.cfg.Dynamic.URL())
		}
		h.log.Warn("webhook: deliveries refused for their signature; answered 401", append(attrs,
			"timestamp_age", age, "check", signatureHint(hmacErr, dynErr),
			"remote", r.RemoteAddr, "webhook_id", clip(r.Header.Get("webhook-id")))...)
	}
	writeError(w, http.StatusUnauthorized, msg)
}

// signatureHint says what to check for a refused signature.
func signatureHint(hmacErr, dynErr error) string {
	switch err := cmp.Or(hmacErr, dynErr); {
	case errors.Is(err, ErrUnsigned), errors.Is(err, dynamic.ErrNoEntry):
		return "the request has no webhook-id, webhook-timestamp or webhook-signature: is the sender the Gemini API's webhook, and does every proxy on the way keep those headers?"
	case errors.Is(err, ErrBadTimestamp), errors.Is(err, ErrStale), errors.Is(err, ErrFuture):
		return "this host's clock (NTP): webhook-timestamp must lie within 5m of it, and a redelivery may carry its first attempt's time"
	case hmacErr == nil:
		return "that the delivery comes from a per-job webhook of the Gemini API, whose keys are at the key set URL"
	}
	return "that the webhook's signing secret is among these (gemrecon webhooks list shows the webhooks; rotate gives a new secret), and that nothing on the way rewrites the body"
}

// throttle lets one log line through per warnEvery and counts the events
// in between, so that a flood costs a line per period, not one per request.
type throttle struct {
	mu   sync.Mutex
	last time.Time
	n    int
}

// note counts one event and reports whether a line is due, with the count
// of events since the last line (this one included).
func (t *throttle) note(now time.Time) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n++
	if !t.last.IsZero() && now.Sub(t.last) < warnEvery {
		return 0, false
	}
	n := t.n
	t.n, t.last = 0, now
	return n, true
}

// spareConn is the request context key that marks a request on a spare
// connection (limitListener).
type spareConn struct{}

func onSpareConn(r *http.Request) bool { return r.Context().Value(spareConn{}) != nil }

// limitListener keeps at most max + ProbeConns connections open: beyond
// that Accept waits for one to close (the kernel's backlog holds the
// others). A connection accepted while max were open is spare.
type limitListener struct {
	net.Listener
	max   int
	slots chan struct{} // one per open connection
	done  chan struct{} // closed by Close
	once  sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	lc := &limitConn{Conn: c, l: l}
	if len(l.slots) > l.max {
		lc.spareUntil = time.Now().Add(spareReadFor)
	}
	return lc, nil
}

// Close may be called more than once: net/http's Serve, Shutdown and Close
// each close the listener, and no document promises that they ask only once.
func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// connContext marks the requests of a spare connection (http.Server's
// ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitConn); ok && !lc.spareUntil.IsZero() {
		return context.WithValue(ctx, spareConn{}, true)
	}
	return ctx
}

// limitConn gives its slot back when closed.
type limitConn struct {
	net.Conn
	l          *limitListener
	spareUntil time.Time // zero unless spare
	once       sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.slots })
	return err
}

// SetReadDeadline keeps a spare connection's reads within spareUntil.
func (c *limitConn) SetReadDeadline(t time.Time) error {
	// (A zero deadline is left alone: http.Server clears it for its
	// background read while a handler runs, and a read that timed out then
	// would cancel the request.)
	if !c.spareUntil.IsZero() && t.After(c.spareUntil) {
		t = c.spareUntil
	}
	return c.Conn.SetReadDeadline(t)
}

// CloseWrite lets http.Server half-close before it closes a connection
// whose body it left unread, so that its early answer reaches the sender
// instead of being lost to a reset.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
