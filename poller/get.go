package poller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genai"
)

// Errors of Get and Download besides ErrAuth; match with errors.Is (and
// errors.As for *TransientError). Each answer falls in exactly one class:
//
//   - ErrNotFound: decisive, the API does not know the batch (or file).
//   - ErrAuth: the credential was refused; nothing is known of the batch.
//   - ErrTransient (*TransientError): no answer yet — try again later.
//   - ErrInvalidName: no request was sent; the name cannot be fetched.
//   - ErrUnexpected: an answer that decides nothing (another 4xx, a body
//     that is not the operation asked for, one larger than
//     MaxResponseBody: also an ErrBodyTooLarge).
var (
	// ErrNotFound: the API does not know the batch (or file): a 404, or a
	// 403 while the credential itself works — checked by one list request of
	// page size 1 (a batch of another project). A 403 whose probe is refused
	// too is ErrAuth, so a bad or revoked key never reads as "unknown".
	ErrNotFound = errors.New("unknown to the API")
	// ErrTransient: 408, 429, 5xx, a transport error or a timeout, once the
	// transport's retry budget is spent (or the caller's context ended).
	// The error is a *TransientError carrying the server's delay.
	ErrTransient = errors.New("the API did not answer")
	// ErrInvalidName: the name is not one this Poller can fetch (not
	// "batches/<id>" on the Gemini API, an id that would change the request
	// path, a Vertex job of another location). No request was sent.
	ErrInvalidName = errors.New("not a name the API can fetch")
	// ErrUnexpected: the API answered, but the answer decides nothing: a 4xx
	// other than 401/403/404/408/429, a body that could not be read as an
	// operation or was larger than MaxResponseBody (then also an
	// ErrBodyTooLarge, not retried), or an operation with another name than
	// the one asked for.
	ErrUnexpected = errors.New("unexpected answer from the API")
)

// TransientError is an ErrTransient: the request may succeed later.
type TransientError struct {
	// Op is what was asked: "get batches/x", "download files/y".
	Op string
	// Status is the last HTTP status (0: a transport error or timeout).
	Status int
	// RetryAfter is the server's delay from google.rpc.RetryInfo or the
	// Retry-After header on the last refused answer, 0 when it gave none.
	// The transport already waited it between its own retries; a caller
	// backing off should wait at least this long before asking again.
	RetryAfter time.Duration
	// Err is the underlying error (an API error, a transport error,
	// context.DeadlineExceeded, …).
	Err error
}

func (e *TransientError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "poller: %s: %v", e.Op, e.Err)
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (the server asks to retry in %v)", e.RetryAfter)
	}
	return b.String()
}

// Unwrap makes errors.Is match both ErrTransient and the cause (e.g.
// context.DeadlineExceeded).
func (e *TransientError) Unwrap() []error { return []error{ErrTransient, e.Err} }

// RequestCounts counts the HTTP requests a Poller has sent by purpose,
// retries included; their sum is Requests().
type RequestCounts struct {
	List     int64 // list pages (Pass)
	Get      int64 // Batches.Get (Get)
	Probe    int64 // credential probes after a 403 (Get, Download)
	Download int64 // file downloads (Download)
}

// RequestCounts returns how many requests of each kind this Poller sent.
func (p *Poller) RequestCounts() RequestCounts {
	t := p.transport
	return RequestCounts{
		List: t.byKind[kindList].Load(), Get: t.byKind[kindGet].Load(),
		Probe: t.byKind[kindProbe].Load(), Download: t.byKind[kindDownload].Load(),
	}
}

// Get fetches one batch — the request the SDK's Batches.Get sends, GET
// {base}/{apiVersion}/batches/<id> — through the same HTTP client, rate
// limiter and retry rules as Pass (spec §9, confirmation: one rate limit
// per process for list, get and downloads), and reads the answer itself as
// Pass does (fromRaw). name is "batches/<id>" on the Gemini API; on Vertex
// a job's full name ("projects/P/locations/L/batchPredictionJobs/N") or
// its numeric id — the path is built from the client's own project and
// location and the name's last segment, so a full name of another location
// is refused with ErrInvalidName rather than fetched from the wrong place.
//
// The Operation is the API's: Raw exactly as sent (done, error, response,
// batchStats kept), State normalised, Terminal, CreateTime and EndTime.
// Unlike Pass, Get hands back non-terminal operations too. Errors: see
// ErrNotFound, ErrAuth, ErrTransient, ErrInvalidName, ErrUnexpected.
func (p *Poller) Get(ctx context.Context, name string) (Operation, error) {
	path, check, err := p.batchName(name)
	if err != nil {
		return Operation{}, err
	}
	op := "get " + truncate(name, 120)
	trace := &passTrace{kind: kindGet}
	body, err := p.call(context.WithValue(ctx, traceKey{}, trace), path, nil)
	if err != nil {
		if ctx.Err() != nil {
			return Operation{}, &TransientError{Op: op, Err: ctx.Err()}
		}
		var apiErr genai.APIError
		if errors.As(err, &apiErr) {
			return Operation{}, p.classify(ctx, op, apiErr, trace.lastDelay)
		}
		var big *BodyTooLargeError
		if errors.As(err, &big) {
			// An answer, too large to read: asking again gets the same one.
			return Operation{}, fmt.Errorf("poller: %s: %w: %w", op, ErrUnexpected, big)
		}
		// A transport failure (or a per-attempt timeout) after the retry
		// budget.
		return Operation{}, &TransientError{Op: op, Err: err}
	}
	o := fromRaw(body)
	if o.Invalid != "" {
		return Operation{}, fmt.Errorf("poller: %s: %w: the body is not an operation: %s", op, ErrUnexpected, o.Invalid)
	}
	if !check(o.Name) {
		return Operation{}, fmt.Errorf("poller: %s: %w: the API answered with %q", op, ErrUnexpected, truncate(o.Name, 120))
	}
	return o, nil
}

// batchName checks a name for Get and returns the request path, and a
// check that the answer is the batch asked for.
func (p *Poller) batchName(name string) (string, func(string) bool, error) {
	bad := func(why string) error {
		return fmt.Errorf("poller: get %q: %w: %s", truncate(name, 120), ErrInvalidName, why)
	}
	if p.cfg.Backend != BackendVertex {
		id, ok := strings.CutPrefix(name, "batches/")
		if !ok {
			return "", nil, bad(`want "batches/<id>"`)
		}
		if why := badID(id); why != "" {
			return "", nil, bad(why)
		}
		return name, func(got string) bool { return got == name }, nil
	}
	cc := p.client.ClientConfig()
	parts := strings.Split(name, "/")
	var id string
	switch {
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "locations" && parts[4] == "batchPredictionJobs":
		id = parts[5]
		if !strings.EqualFold(parts[3], cc.Location) {
			return "", nil, bad(fmt.Sprintf("a job of location %q; this client reaches %q", parts[3], cc.Location))
		}
		// A project may be written as its id or its number; only two
		// spellings of the same kind that differ prove another project.
		if numeric(parts[1]) == numeric(cc.Project) && parts[1] != cc.Project && cc.Project != "" {
			return "", nil, bad(fmt.Sprintf("a job of project %q; this client reaches %q", parts[1], cc.Project))
		}
	case len(parts) == 1 && numeric(name):
		id = name
	default:
		return "", nil, bad(`want "projects/P/locations/L/batchPredictionJobs/N" or a numeric job id`)
	}
	if why := badID(id); why != "" {
		return "", nil, bad(why)
	}
	return "batchPredictionJobs/" + id, func(got string) bool {
		i := strings.LastIndex(got, "/")
		return i >= 0 && got[i+1:] == id
	}, nil
}

// badID says why an id cannot be the last segment of a request path: it
// is joined into the path as already escaped (url.URL.JoinPath), so "?"
// would start a query, "%41" would arrive as "A", and "." or ".." would
// name another resource. Other characters ("#", a space, non-ASCII) are
// escaped on the way and arrive intact.
func badID(id string) string {
	switch {
	case id == "":
		return "an empty id"
	case id == "." || id == "..":
		return "the id is a dot segment"
	case strings.ContainsAny(id, "/?%"):
		return `the id holds "/", "?" or "%"`
	case strings.ContainsFunc(id, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return "the id holds a control character"
	}
	return ""
}

func numeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// classify turns an API error of Get or Download into one class. delay is
// the server's delay on that answer (0: none).
func (p *Poller) classify(ctx context.Context, op string, e genai.APIError, delay time.Duration) error {
	what := describe(e)
	switch {
	case keyInvalid(e) || e.Code == http.StatusUnauthorized:
		return p.authError(op, what)
	case e.Code == http.StatusNotFound && !fromAPI(e):
		// Not the API's word on the batch: a proxy's or another server's
		// page. Dead at once as "unknown" would be wrong for every key.
		return fmt.Errorf("poller: %s: %w (%s: not the API's error answer; is --base-url the API, or is a proxy in between answering?)",
			op, ErrUnexpected, what)
	case e.Code == http.StatusNotFound:
		return fmt.Errorf("poller: %s: %w (%s)", op, ErrNotFound, what)
	case e.Code == http.StatusForbidden:
		return p.probe(ctx, op, what)
	case e.Code == http.StatusRequestTimeout || retryableStatus(e.Code) || e.Code >= 500:
		return &TransientError{Op: op, Status: e.Code, RetryAfter: delay, Err: errors.New(what)}
	}
	return fmt.Errorf("poller: %s: %w (%s)", op, ErrUnexpected, what)
}

// probe decides what a 403 means with one list request of page size 1: the
// credential lists, so the 403 is about the batch (of another project) and
// the batch is unknown to us; or the list is refused too, and the
// credential is at fault. A probe that gets no answer decides nothing.
func (p *Poller) probe(ctx context.Context, op, what string) error {
	trace := &passTrace{kind: kindProbe}
	_, err := p.call(context.WithValue(ctx, traceKey{}, trace), p.collection(), url.Values{"pageSize": {"1"}})
	if err == nil {
		return fmt.Errorf("poller: %s: %w (%s, while the same credential lists batches: a batch of another project)",
			op, ErrNotFound, what)
	}
	var pe genai.APIError
	switch {
	case ctx.Err() != nil:
		return &TransientError{Op: op, Status: http.StatusForbidden,
			Err: fmt.Errorf("%s; the credential probe did not finish: %w", what, ctx.Err())}
	case errors.As(err, &pe) && (keyInvalid(pe) || pe.Code == http.StatusUnauthorized || pe.Code == http.StatusForbidden):
		return p.authError(op, what+"; listing batches is refused too: "+describe(pe))
	case errors.As(err, &pe) && pe.Code != http.StatusRequestTimeout && !retryableStatus(pe.Code) && pe.Code < 500:
		return fmt.Errorf("poller: %s: %w (%s; the credential probe got %s)", op, ErrUnexpected, what, describe(pe))
	case errors.As(err, &pe):
		return &TransientError{Op: op, Status: pe.Code, RetryAfter: trace.lastDelay,
			Err: fmt.Errorf("%s; the credential probe got %s", what, describe(pe))}
	case errors.Is(err, ErrBodyTooLarge):
		// The probe's page was too large to read: the credential works.
		return fmt.Errorf("poller: %s: %w (%s, while the same credential lists batches: a batch of another project)",
			op, ErrNotFound, what)
	}
	return &TransientError{Op: op, Err: fmt.Errorf("%s; the credential probe failed: %w", what, err)}
}

func (p *Poller) authError(op, what string) error {
	if p.cfg.Backend == BackendVertex && p.cfg.APIKey == "" {
		return fmt.Errorf("%w (%s: %s): vertex: %s", ErrAuth, op, what, vertexCredHint)
	}
	return fmt.Errorf("%w (%s: %s): check the Gemini API key in GEMINI_API_KEY (or GOOGLE_API_KEY, which wins when both are set)",
		ErrAuth, op, what)
}

// keyInvalid reports the Gemini API's answer to a key it does not know:
// 400 INVALID_ARGUMENT with reason API_KEY_INVALID.
func keyInvalid(e genai.APIError) bool {
	return (e.Code == http.StatusBadRequest || e.Code == http.StatusForbidden) &&
		(strings.Contains(e.Message, "API key not valid") || strings.Contains(fmt.Sprint(e.Details), "API_KEY_INVALID"))
}

func describe(e genai.APIError) string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Code, statusWord(e), truncate(e.Message, 200))
}

// fromAPI reports whether e was read from the API's own error document
// ({"error":{"code","message","status"}}), whose status is a canonical code
// such as NOT_FOUND. For any other body (an HTML page, JSON without an
// "error") the SDK, like apiErrorOf, sets Status to the HTTP status line,
// "404 Not Found".
func fromAPI(e genai.APIError) bool {
	return !strings.HasPrefix(e.Status, strconv.Itoa(e.Code)+" ")
}

// statusWord is e's status for a message, without the code that an HTTP
// status line repeats: "NOT_FOUND", or "Not Found".
func statusWord(e genai.APIError) string {
	status := strings.TrimPrefix(e.Status, strconv.Itoa(e.Code)+" ")
	if status == "" {
		status = http.StatusText(e.Code)
	}
	return status
}
