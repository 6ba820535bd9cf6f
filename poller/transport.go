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
	"slices"
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
	// kind says what the requests are for: kindList, …
	kind string
	// stream hands a successful body to the caller unread: never buffered,
	// never captured (a file download, download.go).
	stream bool
	// lastDelay is the server's delay (RetryInfo / Retry-After) on the last
	// refused answer handed back after the retry budget, 0 when it gave none.
	lastDelay time.Duration
}

// What a request is for, as errors name it (BodyTooLargeError.Kind).
const (
	kindList     = "list page"
	kindGet      = "get operation"
	kindProbe    = "credential probe (list page)"
	kindDownload = "files.get"
)

type traceKey struct{}

// withTrace returns ctx carrying a new trace of requests of kind.
func withTrace(ctx context.Context, kind string) (context.Context, *passTrace) {
	t := &passTrace{kind: kind}
	return context.WithValue(ctx, traceKey{}, t), t
}

// transport is the one place every HTTP request to the API passes
// through: it waits on the rate limiter, bounds each attempt by timeout,
// retries 429/5xx/transport errors with a bounded budget (honouring
// google.rpc.RetryInfo and Retry-After, else exponential backoff with
// jitter) and reads the body before handing it back (at most maxBody of it:
// a longer successful answer is a *BodyTooLargeError), except a download's
// (passTrace.stream).
type transport struct {
	base    http.RoundTripper
	limiter *rate.Limiter
	// cfg is the Poller's, defaults filled: MaxRetries, RequestTimeout
	// (one attempt; 0: none), Sleep, Logger, PageSize (a list page's, for
	// BodyTooLargeError) and maxBody, how much of one response the
	// transport buffers.
	cfg *Config
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
	// "credential probe (list page)", "files.get".
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
	limit := fmt.Sprintf("%d bytes", e.Limit)
	if e.Limit%(1<<20) == 0 {
		limit = fmt.Sprintf("%d MiB", e.Limit>>20)
	}
	s := fmt.Sprintf("the %s answer (HTTP %d) is larger than %s, the most gemrecon reads of one API response", e.Kind, e.Status, limit)
	if e.Length > 0 {
		s += fmt.Sprintf(" (Content-Length %d)", e.Length)
	}
	switch {
	case e.PageSize > 1:
		s += fmt.Sprintf("; lower --page-size (now %d) so that each page holds fewer operations", e.PageSize)
	case e.PageSize == 1:
		s += "; --page-size is already 1: one operation alone is larger than that"
	}
	return s
}

// Unwrap makes errors.Is match ErrBodyTooLarge.
func (e *BodyTooLargeError) Unwrap() error { return ErrBodyTooLarge }

func retryableStatus(code int) bool {
	return slices.Contains([]int{http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout}, code)
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	trace, _ := ctx.Value(traceKey{}).(*passTrace)
	if trace == nil {
		trace = &passTrace{kind: kindList}
	}
	for attempt := 0; ; attempt++ {
		if err := t.limiter.Wait(ctx); err != nil {
			return nil, fmt.Errorf("rate limiter: %w", err)
		}
		trace.requests.Add(1)
		resp, body, err := t.try(req, trace)
		var big *BodyTooLargeError
		if errors.As(err, &big) || err == nil && resp.StatusCode/100 == 2 {
			return resp, err
		}
		d, source := time.Duration(0), "backoff"
		// The query is left out: it never holds a key, and page tokens are noise.
		attrs := []slog.Attr{slog.String("url", req.URL.Scheme+"://"+req.URL.Host+req.URL.Path), slog.Int("attempt", attempt+1)}
		if err != nil {
			if ctx.Err() != nil || attempt >= t.cfg.MaxRetries {
				return nil, err
			}
			attrs = append(attrs, slog.String("error", err.Error()))
		} else {
			d, source = serverDelay(resp.Header, body, time.Now())
			// A delay beyond MaxServerWait is not waited here: the refusal
			// goes back to the caller, which says how long the server asked
			// for.
			if !retryableStatus(resp.StatusCode) || attempt >= t.cfg.MaxRetries || d > MaxServerWait {
				trace.lastDelay = max(d, 0)
				return resp, nil
			}
			attrs = append(attrs, slog.Int("status", resp.StatusCode))
		}
		if d <= 0 {
			d, source = backoff(attempt), "backoff"
		}
		t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "gemini request failed, retrying",
			append(attrs, slog.Duration("wait", d), slog.String("wait_from", source))...)
		trace.retries.Add(1)
		if err := t.cfg.Sleep(ctx, d); err != nil {
			return nil, err
		}
	}
}

// try sends one attempt. The answer comes back read (resp.Body replaced,
// body its bytes) within timeout; a download's 2xx comes back unread, the
// timeout covering only the wait for its headers (its body has Download's
// idle timer instead).
func (t *transport) try(req *http.Request, trace *passTrace) (*http.Response, []byte, error) {
	ctx, cancel := req.Context(), context.CancelFunc(func() {})
	stop := func() bool { return true }
	switch {
	case t.cfg.RequestTimeout > 0 && trace.stream:
		ctx, cancel = context.WithCancel(ctx)
		stop = time.AfterFunc(t.cfg.RequestTimeout, cancel).Stop
	case t.cfg.RequestTimeout > 0:
		ctx, cancel = context.WithTimeout(ctx, t.cfg.RequestTimeout)
	}
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if !stop() {
		err = fmt.Errorf("no response within %v: %w", t.cfg.RequestTimeout, context.DeadlineExceeded)
	}
	if err == nil && trace.stream && resp.StatusCode/100 == 2 {
		resp.Body = cancelBody{resp.Body, cancel}
		return resp, nil, nil
	}
	defer cancel()
	return t.read(resp, err, trace)
}

// cancelBody releases an attempt's context when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error {
	defer b.cancel()
	return b.ReadCloser.Close()
}

// read reads an answer's body, at most maxBody of it: a longer 2xx is a
// *BodyTooLargeError (not transient: the same request gets the same
// answer), a longer refusal is cut (its status decides).
func (t *transport) read(resp *http.Response, err error, trace *passTrace) (*http.Response, []byte, error) {
	if err != nil {
		if resp != nil {
			resp.Body.Close()
		}
		return nil, nil, err
	}
	defer resp.Body.Close()
	ok := resp.StatusCode/100 == 2
	tooLarge := func(length int64) error {
		e := &BodyTooLargeError{Kind: trace.kind, Status: resp.StatusCode, Limit: t.cfg.maxBody, Length: length}
		if trace.kind == kindList {
			e.PageSize = t.cfg.PageSize
		}
		return e
	}
	if ok && resp.ContentLength > t.cfg.maxBody {
		return nil, nil, tooLarge(resp.ContentLength)
	}
	// One byte more than the limit tells a body of exactly the limit from
	// a longer one.
	body, err := io.ReadAll(io.LimitReader(resp.Body, t.cfg.maxBody+1))
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("reading response body: %w", err)
	case int64(len(body)) > t.cfg.maxBody && ok:
		return nil, nil, tooLarge(0)
	case int64(len(body)) > t.cfg.maxBody:
		body = body[:t.cfg.maxBody]
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp, body, nil
}

// backoff is exponential from DefaultBackoffMin, capped at
// DefaultBackoffMax, with "equal jitter": half fixed, half random, so a
// retry never comes back at once.
func backoff(attempt int) time.Duration {
	d := DefaultBackoffMin
	for i := 0; i < attempt && d < DefaultBackoffMax; i++ {
		d *= 2
	}
	half := min(d, DefaultBackoffMax) / 2
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
// error body (a google.protobuf.Duration's JSON form: "31s", "1.500s") and
// the Retry-After header (seconds or an HTTP date), 0 if neither is
// present, at most MaxServerDelay.
func serverDelay(h http.Header, body []byte, now time.Time) (time.Duration, string) {
	var d time.Duration
	source := ""
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseFloat(v, 64); err == nil {
			d, source = seconds(secs), "Retry-After"
		} else if t, err := http.ParseTime(v); err == nil {
			d, source = t.Sub(now), "Retry-After" // Sub saturates
		}
	}
	var e struct {
		Error struct {
			Details []struct {
				Type       string `json:"@type"`
				RetryDelay string `json:"retryDelay"`
			} `json:"details"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	for _, det := range e.Error.Details {
		num, isSecs := strings.CutSuffix(det.RetryDelay, "s")
		secs, err := strconv.ParseFloat(num, 64)
		if strings.HasSuffix(det.Type, "google.rpc.RetryInfo") && isSecs && err == nil && seconds(secs) > d {
			d, source = seconds(secs), "RetryInfo"
		}
	}
	return min(d, MaxServerDelay), source
}

// seconds converts a number of seconds to a duration in [0,
// MaxServerDelay], capped before the conversion (a float beyond int64's
// range converts to whatever the CPU makes of it); NaN is 0.
func seconds(secs float64) time.Duration {
	if secs >= MaxServerDelay.Seconds() {
		return MaxServerDelay
	}
	if !(secs > 0) {
		return 0
	}
	return time.Duration(secs * float64(time.Second))
}
