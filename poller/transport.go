package poller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// passTrace is the per-pass (or per-request) slot the transport fills,
// carried by the request's context.
type passTrace struct {
	requests atomic.Int64
	retries  atomic.Int64
	// kind says what the requests are for, to count them apart (the zero
	// value is a list page).
	kind reqKind
	// stream hands a successful body to the caller unread: never buffered,
	// never captured (a file download, download.go).
	stream bool
	// lastDelay is the server's delay (RetryInfo / Retry-After) on the last
	// refused answer handed back after the retry budget, 0 when it gave none.
	lastDelay time.Duration
}

// reqKind is what a request is for.
type reqKind int

const (
	kindList reqKind = iota
	kindGet
	kindProbe
	kindDownload
	numKinds
)

type traceKey struct{}

func traceFrom(ctx context.Context) *passTrace {
	t, _ := ctx.Value(traceKey{}).(*passTrace)
	return t
}

// transport is the one place every HTTP request to the API passes
// through: it waits on the rate limiter, retries 429/5xx/transport errors
// with a bounded budget (honouring google.rpc.RetryInfo and Retry-After,
// else exponential backoff with jitter) and reads the body before handing
// it back (at most maxBody of it: a longer successful answer is a
// *BodyTooLargeError), except a download's (passTrace.stream).
type transport struct {
	base       http.RoundTripper
	limiter    *rate.Limiter
	maxRetries int
	backoffMin time.Duration
	backoffMax time.Duration
	sleep      func(context.Context, time.Duration) error
	log        *slog.Logger
	// total counts every HTTP attempt made through this transport, byKind
	// the same attempts by what they were for.
	total  atomic.Int64
	byKind [numKinds]atomic.Int64
	// maxBody bounds how much of one response the transport buffers:
	// MaxResponseBody, except in tests (Config.maxBody), which would
	// otherwise need a 64 MiB page whose decoding takes seconds.
	maxBody int64
}

// MaxResponseBody is the most the poller reads of one API response (a list
// page, an operation): a successful answer any longer fails with a
// *BodyTooLargeError, never retried. A refused answer (an error status)
// is cut at this length instead: its status decides.
const MaxResponseBody = 64 << 20

// ErrBodyTooLarge: a successful answer was larger than MaxResponseBody
// (match with errors.Is; errors.As gives the *BodyTooLargeError). The same
// request would get the same answer, so it is never retried.
var ErrBodyTooLarge = errors.New("API response larger than the poller reads")

// BodyTooLargeError is an ErrBodyTooLarge.
type BodyTooLargeError struct {
	// Kind is what the request was for: "list page", "get operation",
	// "credential probe (list page)", "files.get" ("response" when unknown).
	Kind string
	// Status is the answer's HTTP status (2xx).
	Status int
	// Limit is the most the poller reads of one response, in bytes.
	Limit int64
	// Length is the answer's Content-Length when it gave one beyond Limit,
	// else 0 (more than Limit bytes arrived).
	Length int64
	// PageSize is the page size a list page asked for (0 for other kinds).
	PageSize int
}

func (e *BodyTooLargeError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "the %s answer (HTTP %d) is larger than %s, the most gemrecon reads of one API response",
		e.Kind, e.Status, byteSize(e.Limit))
	if e.Length > 0 {
		fmt.Fprintf(&b, " (Content-Length %d)", e.Length)
	}
	switch {
	case e.PageSize > 1:
		fmt.Fprintf(&b, "; lower --page-size (now %d) so that each page holds fewer operations", e.PageSize)
	case e.PageSize == 1:
		b.WriteString("; --page-size is already 1: one operation alone is larger than that")
	}
	return b.String()
}

// Unwrap makes errors.Is match ErrBodyTooLarge.
func (e *BodyTooLargeError) Unwrap() error { return ErrBodyTooLarge }

// byteSize writes n in MiB or KiB when it is a whole number of them, else
// in bytes.
func byteSize(n int64) string {
	switch {
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n > 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// tooLarge is the error of a 2xx answer beyond the limit.
func (t *transport) tooLarge(req *http.Request, trace *passTrace, status int, length int64) error {
	e := &BodyTooLargeError{Kind: "response", Status: status, Limit: t.maxBody, Length: length}
	if trace != nil {
		switch trace.kind {
		case kindList:
			e.Kind = "list page"
			e.PageSize, _ = strconv.Atoi(req.URL.Query().Get("pageSize"))
		case kindGet:
			e.Kind = "get operation"
		case kindProbe:
			e.Kind = "credential probe (list page)"
		case kindDownload:
			e.Kind = "files.get"
		}
	}
	return e
}

func retryableStatus(code int) bool {
	switch code {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	trace := traceFrom(ctx)
	for attempt := 0; ; attempt++ {
		if err := t.limiter.Wait(ctx); err != nil {
			return nil, fmt.Errorf("rate limiter: %w", err)
		}
		r := req
		if attempt > 0 {
			r = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = body
			}
		}
		t.total.Add(1)
		if trace != nil {
			trace.requests.Add(1)
			t.byKind[trace.kind].Add(1)
		}
		resp, err := t.base.RoundTrip(r)
		ok := err == nil && resp.StatusCode >= 200 && resp.StatusCode < 300
		if ok && trace != nil && trace.stream {
			return resp, nil // a download: the caller streams the body
		}
		if ok && resp.ContentLength > t.maxBody {
			resp.Body.Close()
			return nil, t.tooLarge(req, trace, resp.StatusCode, resp.ContentLength)
		}
		var body []byte
		if err == nil {
			// One byte more than the limit tells a body of exactly the
			// limit from a longer one.
			body, err = io.ReadAll(io.LimitReader(resp.Body, t.maxBody+1))
			resp.Body.Close()
			if err != nil {
				err = fmt.Errorf("reading response body: %w", err)
			} else if int64(len(body)) > t.maxBody {
				if ok {
					// Not a transient failure: the same request gets the
					// same answer, so it is not retried.
					return nil, t.tooLarge(req, trace, resp.StatusCode, 0)
				}
				body = body[:t.maxBody] // a refusal: its status decides
			}
		}
		if err != nil {
			if ctx.Err() != nil || attempt >= t.maxRetries {
				return nil, err
			}
			d := t.backoff(attempt)
			t.log.LogAttrs(ctx, slog.LevelWarn, "gemini request failed, retrying",
				slog.String("url", redactURL(req)), slog.String("error", err.Error()),
				slog.Int("attempt", attempt+1), slog.Duration("wait", d))
			if trace != nil {
				trace.retries.Add(1)
			}
			if err := t.sleep(ctx, d); err != nil {
				return nil, err
			}
			continue
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		d, source := serverDelay(resp.Header, body, time.Now())
		// A delay beyond MaxServerWait is not waited here: the refusal goes
		// back to the caller, which says how long the server asked for.
		if !retryableStatus(resp.StatusCode) || attempt >= t.maxRetries || d > MaxServerWait {
			if trace != nil {
				trace.lastDelay = max(d, 0)
			}
			return resp, nil
		}
		if d <= 0 {
			d, source = t.backoff(attempt), "backoff"
		}
		t.log.LogAttrs(ctx, slog.LevelWarn, "gemini request refused, retrying",
			slog.String("url", redactURL(req)), slog.Int("status", resp.StatusCode),
			slog.Int("attempt", attempt+1), slog.Duration("wait", d), slog.String("wait_from", source))
		if trace != nil {
			trace.retries.Add(1)
		}
		if err := t.sleep(ctx, d); err != nil {
			return nil, err
		}
	}
}

// backoff is exponential from backoffMin, capped at backoffMax, with "equal
// jitter": half fixed, half random, so a retry never comes back at once.
func (t *transport) backoff(attempt int) time.Duration {
	d := t.backoffMin
	for i := 0; i < attempt && d < t.backoffMax; i++ {
		d *= 2
	}
	d = min(d, t.backoffMax)
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(half+1)
}

// MaxServerWait is the longest server delay (RetryInfo, Retry-After) a
// request waits for between its own retries. A longer one ends the request
// with the refusal: a pass does not sit for hours holding its pass lease
// (and a cron slot); the error says how long the server asked for, and the
// next pass, or a confirmation's backoff, waits for it.
const MaxServerWait = 5 * time.Minute

// MaxServerDelay caps a server delay as read: a value beyond it (however
// large, beyond any duration included) is read as MaxServerDelay, a very
// long delay, never as a short one.
const MaxServerDelay = 24 * time.Hour

// serverDelay returns the longer of google.rpc.RetryInfo.retryDelay in the
// error body and the Retry-After header (seconds or an HTTP date), 0 if
// neither is present, at most MaxServerDelay.
func serverDelay(h http.Header, body []byte, now time.Time) (time.Duration, string) {
	var d time.Duration
	source := ""
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil && secs >= 0 {
			d, source = secondsDelay(secs), "Retry-After"
		} else if t, err := http.ParseTime(v); err == nil {
			d, source = t.Sub(now), "Retry-After" // Sub saturates
		}
	}
	if ri := retryInfoDelay(body); ri > d {
		d, source = ri, "RetryInfo"
	}
	return min(d, MaxServerDelay), source
}

// secondsDelay converts a non-negative number of seconds to a duration,
// capped at MaxServerDelay before the conversion (a float beyond int64's
// range converts to whatever the CPU makes of it).
func secondsDelay(secs float64) time.Duration {
	if secs >= MaxServerDelay.Seconds() {
		return MaxServerDelay
	}
	return time.Duration(secs * float64(time.Second))
}

func retryInfoDelay(body []byte) time.Duration {
	var e struct {
		Error struct {
			Details []struct {
				Type       string `json:"@type"`
				RetryDelay string `json:"retryDelay"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return 0
	}
	for _, det := range e.Error.Details {
		if strings.HasSuffix(det.Type, "google.rpc.RetryInfo") && det.RetryDelay != "" {
			if d, err := parseProtoDuration(det.RetryDelay); err == nil {
				return d
			}
		}
	}
	return 0
}

// parseProtoDuration parses a google.protobuf.Duration's JSON form ("31s",
// "1.500s"); Go's own form ("1m30s") is accepted too.
func parseProtoDuration(s string) (time.Duration, error) {
	if num, ok := strings.CutSuffix(s, "s"); ok {
		if f, err := strconv.ParseFloat(num, 64); err == nil {
			if !(f >= 0) { // negative, or NaN
				return 0, errors.New("negative duration")
			}
			return secondsDelay(f), nil
		}
	}
	return time.ParseDuration(s)
}

// redactURL drops the query: it never holds a key (the SDK sends the key as
// a header), but page tokens are noise in logs.
func redactURL(r *http.Request) string {
	u := *r.URL
	u.RawQuery = ""
	return u.String()
}
