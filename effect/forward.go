package effect

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Forward headers (spec §4).
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderFencingToken   = "Gemrecon-Fencing-Token"
)

// MaxRetryAfter caps a Retry-After the forward target asks for, so that a
// buggy or hostile answer cannot park a key for years.
const MaxRetryAfter = 24 * time.Hour

// bodySnippet bounds how much of a failed response's body an error keeps.
const bodySnippet = 512

// BodyWait bounds how long the body of an answer is read once its status
// line arrived (for a failure's snippet, and to reuse the connection): the
// status decides, so a body that stalls or never ends must not hold the
// attempt until the effect timeout.
const BodyWait = 2 * time.Second

// Forward POSTs the event document to a URL (spec §4 --forward), with the
// key as Idempotency-Key and the fencing token as Gemrecon-Fencing-Token, and
// signs it per Standard Webhooks when a secret is set. 2xx is success; 408,
// 409, 425, 429, 5xx and transport errors are retryable (Retry-After is
// honoured); any other status is permanent.
type Forward struct {
	url    string
	wh     *standardwebhooks.Webhook
	client *http.Client
	// Now stamps webhook-timestamp (NewForward sets time.Now).
	Now func() time.Time
}

// NewForward returns a Forward effect. secret is a Standard Webhooks secret
// ("whsec_" + base64), or "" to send unsigned. A nil client means
// http.DefaultClient (the effect's context bounds every request). Redirects
// are not followed: a 3xx answer is a permanent failure.
func NewForward(rawURL, secret string, client *http.Client) (*Forward, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("forward: bad URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("forward: URL %q must be http:// or https:// with a host", u.Redacted())
	}
	// Never follow redirects: a 302 or 303 would turn the POST into a GET
	// whose 2xx would pass for a delivered event. A 3xx is answered as
	// permanent (fix the URL).
	c := *cmp.Or(client, http.DefaultClient)
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	f := &Forward{url: rawURL, client: &c, Now: time.Now}
	if secret != "" {
		if !strings.HasPrefix(secret, "whsec_") {
			return nil, errors.New("forward: the signing secret must start with whsec_ (a Standard Webhooks secret)")
		}
		wh, err := standardwebhooks.NewWebhook(secret)
		if err != nil || len(strings.TrimPrefix(secret, "whsec_")) == 0 {
			// The library's error is about base64 positions only, but
			// say nothing that could echo the secret.
			return nil, errors.New("forward: the signing secret is not valid base64 after whsec_")
		}
		f.wh = wh
	}
	return f, nil
}

// MessageID is the webhook-id of the delivery of one attempt: stable for a
// key and token, so a receiver can deduplicate a resent attempt, and
// distinct between attempts.
func MessageID(key string, token int64) string {
	sum := sha256.Sum256([]byte(key + "\x00" + strconv.FormatInt(token, 10)))
	return "msg_" + hex.EncodeToString(sum[:16])
}

// Run POSTs ev once.
func (f *Forward) Run(ctx context.Context, ev Event) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return Permanent(fmt.Errorf("forward: encode event document: %w", err))
	}
	if !validHeaderValue(ev.Key) {
		return Permanent(fmt.Errorf("forward: key %q cannot be sent as an HTTP header", ev.Key))
	}
	// The request's own context, so that reading the answer's body can be
	// cut short without touching ctx.
	reqCtx, stop := context.WithCancel(ctx)
	defer stop()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, f.url, bytes.NewReader(body))
	if err != nil {
		return Permanent(fmt.Errorf("forward: %w", err))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderIdempotencyKey, ev.Key)
	req.Header.Set(HeaderFencingToken, strconv.FormatInt(ev.Token, 10))
	if f.wh != nil {
		ts := f.Now()
		id := MessageID(ev.Key, ev.Token)
		sig, err := f.wh.Sign(id, ts, body)
		if err != nil {
			return Permanent(errors.New("forward: signing failed"))
		}
		req.Header.Set(standardwebhooks.HeaderWebhookID, id)
		req.Header.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
		req.Header.Set(standardwebhooks.HeaderWebhookSignature, sig)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		// Transport errors are retryable; net/http already strips a
		// password from the URL in its error.
		return fmt.Errorf("forward: %w", err)
	}
	defer resp.Body.Close()
	// The answer is in the status line; its body gets BodyWait at most.
	cut := time.AfterFunc(BodyWait, stop)
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, bodySnippet+1))
	// Drain a little more so the connection can be reused.
	_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	cut.Stop()

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	ferr := &StatusError{Code: resp.StatusCode, Body: clip(snippet), Location: resp.Header.Get("Location")}
	if !retryableStatus(resp.StatusCode) {
		return Permanent(ferr)
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), f.Now()); ok {
		return WithRetryAfter(ferr, d)
	}
	return ferr
}

// StatusError is a forward target's non-2xx answer.
type StatusError struct {
	Code     int
	Body     string // the start of the response body, bounded
	Location string // a redirect's target, which is not followed
}

// Error says the status and the start of the body.
func (e *StatusError) Error() string {
	s := fmt.Sprintf("forward: HTTP %d %s", e.Code, http.StatusText(e.Code))
	if e.Location != "" {
		s += " (redirect to " + e.Location + ", not followed: point the forward URL at it)"
	}
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// retryableStatus: the statuses spec §4 retries; every other non-2xx is
// the target refusing this document for good.
func retryableStatus(code int) bool {
	return code >= 500 || slices.Contains([]int{http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests}, code)
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	var d time.Duration
	if secs, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && secs == secs {
		// Beyond int64's range is a very long delay (RFC 9111 §1.2.2),
		// capped like any other: capped before the conversion.
		d = time.Duration(max(0, min(secs, MaxRetryAfter.Seconds())) * float64(time.Second))
	} else if t, err := http.ParseTime(strings.TrimSpace(v)); err == nil {
		d = t.Sub(now)
	}
	d = min(max(d, 0), MaxRetryAfter)
	return d, d > 0
}

// clip makes a short, single-line, valid UTF-8 snippet of a response body.
func clip(b []byte) string {
	cut := len(b) > bodySnippet
	if cut {
		b = b[:bodySnippet]
	}
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(b), "")), " ")
	if cut {
		s += "…"
	}
	return s
}

// validHeaderValue rejects control characters, which net/http would refuse
// (a key of no known shape is kept as given, spec §2).
func validHeaderValue(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f })
}
