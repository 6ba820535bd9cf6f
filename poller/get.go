package poller

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	if e.RetryAfter > 0 {
		return fmt.Sprintf("poller: %s: %v (the server asks to retry in %v)", e.Op, e.Err, e.RetryAfter)
	}
	return fmt.Sprintf("poller: %s: %v", e.Op, e.Err)
}

// Unwrap makes errors.Is match both ErrTransient and the cause (e.g.
// context.DeadlineExceeded).
func (e *TransientError) Unwrap() []error { return []error{ErrTransient, e.Err} }

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
	tctx, trace := withTrace(ctx, kindGet)
	body, err := p.call(tctx, path, nil)
	var apiErr genai.APIError
	var big *BodyTooLargeError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return Operation{}, &TransientError{Op: op, Err: ctx.Err()}
	case errors.As(err, &apiErr):
		return Operation{}, p.classify(ctx, op, apiErr, trace.lastDelay)
	case errors.As(err, &big):
		// An answer, too large to read: asking again gets the same one.
		return Operation{}, fmt.Errorf("poller: %s: %w: %w", op, ErrUnexpected, big)
	default:
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
	bad := func(why string) (string, func(string) bool, error) {
		return "", nil, fmt.Errorf("poller: get %q: %w: %s", truncate(name, 120), ErrInvalidName, why)
	}
	id, path, check := "", name, func(got string) bool { return got == name }
	cc := p.client.ClientConfig()
	parts := strings.Split(name, "/")
	switch {
	case p.cfg.Backend != BackendVertex && (len(parts) < 2 || parts[0] != "batches"):
		return bad(`want "batches/<id>"`)
	case p.cfg.Backend != BackendVertex:
		id = name[len("batches/"):]
	case len(parts) == 6 && parts[0] == "projects" && parts[2] == "locations" && parts[4] == "batchPredictionJobs":
		id = parts[5]
		if !strings.EqualFold(parts[3], cc.Location) {
			return bad(fmt.Sprintf("a job of location %q; this client reaches %q", parts[3], cc.Location))
		}
		// A project may be written as its id or its number; only two
		// spellings of the same kind that differ prove another project.
		if numeric(parts[1]) == numeric(cc.Project) && parts[1] != cc.Project && cc.Project != "" {
			return bad(fmt.Sprintf("a job of project %q; this client reaches %q", parts[1], cc.Project))
		}
	case len(parts) == 1 && numeric(name):
		id = name
	default:
		return bad(`want "projects/P/locations/L/batchPredictionJobs/N" or a numeric job id`)
	}
	if why := badID(id); why != "" {
		return bad(why)
	}
	if p.cfg.Backend == BackendVertex {
		path, check = "batchPredictionJobs/"+id, func(got string) bool {
			i := strings.LastIndex(got, "/")
			return i >= 0 && got[i+1:] == id
		}
	}
	return path, check, nil
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

func numeric(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

// classify turns an API error of Get or Download into one class. delay is
// the server's delay on that answer (0: none).
func (p *Poller) classify(ctx context.Context, op string, e genai.APIError, delay time.Duration) error {
	what := describe(e)
	switch {
	case keyInvalid(e) || e.Code == http.StatusUnauthorized:
		return p.authError(op, what)
	case e.Code == http.StatusNotFound && strings.HasPrefix(e.Status, strconv.Itoa(e.Code)+" "):
		// Not the API's word on the batch: the API's own error document
		// ({"error":{"code","message","status"}}) has a canonical status
		// such as NOT_FOUND, while for any other body (an HTML page, JSON
		// without an "error") the SDK, like apiErrorOf, sets Status to the
		// HTTP status line, "404 Not Found": a proxy's or another server's
		// page. Dead at once as "unknown" would be wrong for every key.
		return fmt.Errorf("poller: %s: %w (%s: not the API's error answer; is --base-url the API, or is a proxy in between answering?)",
			op, ErrUnexpected, what)
	case e.Code == http.StatusNotFound:
		return fmt.Errorf("poller: %s: %w (%s)", op, ErrNotFound, what)
	case e.Code == http.StatusForbidden:
		return p.probe(ctx, op, what)
	case retryableStatus(e.Code) || e.Code >= 500:
		return &TransientError{Op: op, Status: e.Code, RetryAfter: delay, Err: errors.New(what)}
	}
	return fmt.Errorf("poller: %s: %w (%s)", op, ErrUnexpected, what)
}

// probe decides what a 403 means with one list request of page size 1: the
// credential lists, so the 403 is about the batch (of another project) and
// the batch is unknown to us; or the list is refused too, and the
// credential is at fault. A probe that gets no answer decides nothing.
func (p *Poller) probe(ctx context.Context, op, what string) error {
	tctx, trace := withTrace(ctx, kindProbe)
	_, err := p.call(tctx, p.collection(), url.Values{"pageSize": {"1"}})
	if err == nil || errors.Is(err, ErrBodyTooLarge) { // a page too large to read was answered too
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
	case errors.As(err, &pe) && !retryableStatus(pe.Code) && pe.Code < 500:
		return fmt.Errorf("poller: %s: %w (%s; the credential probe got %s)", op, ErrUnexpected, what, describe(pe))
	case errors.As(err, &pe):
		return &TransientError{Op: op, Status: pe.Code, RetryAfter: trace.lastDelay,
			Err: fmt.Errorf("%s; the credential probe got %s", what, describe(pe))}
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

// describe is e for a message: its code, its status without the code that
// an HTTP status line repeats ("NOT_FOUND", or "Not Found"), its message.
func describe(e genai.APIError) string {
	status := cmp.Or(strings.TrimPrefix(e.Status, strconv.Itoa(e.Code)+" "), http.StatusText(e.Code))
	return fmt.Sprintf("HTTP %d %s: %s", e.Code, status, truncate(e.Message, 200))
}

// downloadBuffer is the one buffer a download copies through: memory stays
// flat whatever the file's size.
const downloadBuffer = 256 << 10

// errStalled cancels a download whose body made no progress for
// Config.RequestTimeout.
var errStalled = errors.New("no data received")

// Download streams a file of the Gemini API ("files/<id>", e.g. a batch's
// responses file) to w and returns the bytes written. It sends the request
// the SDK's Files.Download sends — GET {base}/{apiVersion}/files/<id>:download?alt=media
// with the API key header — through the same transport as Pass and Get
// (rate limiter, retries of 429/5xx/transport errors before the body starts,
// request counting), but the body is copied to w through one fixed buffer as
// it arrives, never held (the SDK reads the whole file into memory).
//
// The whole download is bounded by ctx; Config.RequestTimeout bounds each
// attempt's wait for the response headers, and then each wait for more of
// the body (an idle timeout, not a total one: a large file may take longer,
// and time spent in w does not count). A failure after the body started is
// not retried here — w already holds part of the file — and comes back as
// a *TransientError; the caller starts again (results.Dir discards the
// partial file). An error from w is returned as it is, wrapped, and is not
// an ErrTransient. Refusals are classified as for Get (a 404 is
// ErrNotFound; a 403 is probed). Vertex AI has no files to download:
// ErrInvalidName.
//
// Redirects are followed (at most 10), and the API key header is dropped
// when one leads to another host. A body without framing of its own (no
// Content-Length, not chunked), which only the connection's end ends, is
// checked against the file's sizeBytes (checkSize); without one, the
// download ends with ErrSizeUnknown.
func (p *Poller) Download(ctx context.Context, file string, w io.Writer) (int64, error) {
	op := "download " + truncate(file, 120)
	if p.cfg.Backend == BackendVertex {
		return 0, fmt.Errorf("poller: %s: %w: Vertex AI writes results to outputInfo (Cloud Storage or BigQuery); there is nothing to download", op, ErrInvalidName)
	}
	id := strings.TrimPrefix(file, "files/")
	if why := badID(id); why != "" {
		return 0, fmt.Errorf("poller: %s: %w: %s", op, ErrInvalidName, why)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tctx, trace := withTrace(ctx, kindDownload)
	trace.stream = true
	req, err := p.request(tctx, "files/"+id+":download", url.Values{"alt": {"media"}})
	if err != nil {
		return 0, fmt.Errorf("poller: %s: %w", op, err)
	}
	idle := p.cfg.RequestTimeout
	fail := func(err error) error {
		if cause := context.Cause(ctx); cause != nil {
			if errors.Is(cause, errStalled) {
				err = fmt.Errorf("%w for %v, %w", errStalled, idle, err)
			} else {
				err = fmt.Errorf("%w, %w", cause, err)
			}
		}
		return &TransientError{Op: op, Err: err}
	}
	resp, err := p.httpc.Do(req)
	if errors.Is(err, errRedirects) {
		return 0, fmt.Errorf("poller: %s: %w: %v", op, ErrUnexpected, err)
	}
	if err != nil {
		return 0, fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return 0, p.classify(ctx, op, apiErrorOf(resp, body), trace.lastDelay)
	}
	// The idle timer runs only while waiting for data, not while w writes
	// (a slow disk is not a stalled download).
	body := &idleReader{r: resp.Body, idle: idle, timer: time.AfterFunc(time.Hour, func() { cancel(errStalled) })}
	body.timer.Stop()
	n, err := io.CopyBuffer(w, body, make([]byte, downloadBuffer))
	switch {
	case body.err != nil && body.err != io.EOF:
		return n, fail(fmt.Errorf("after %d bytes: %w", n, body.err))
	case err != nil:
		return n, fmt.Errorf("poller: %s: after %d bytes: %w", op, n, err)
	case resp.ProtoMajor == 1 && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && !resp.Uncompressed:
		// An HTTP/1 body delimited only by the end of the connection: no
		// Content-Length, no chunked encoding (whose last chunk marks the
		// end), and not decompressed by the transport (gzip has its own
		// end); HTTP/2 and later frame every body. A dropped connection
		// looks the same: ask the API how long the file is.
		return n, p.checkSize(ctx, op, id, n)
	}
	return n, nil
}

// idleReader reads r with timer armed for idle (when > 0) during each
// Read, and keeps the first read error.
type idleReader struct {
	r     io.Reader
	idle  time.Duration
	timer *time.Timer
	err   error
}

func (ir *idleReader) Read(p []byte) (int, error) {
	if ir.idle > 0 {
		ir.timer.Reset(ir.idle)
	}
	n, err := ir.r.Read(p)
	ir.timer.Stop()
	if ir.err == nil {
		ir.err = err
	}
	return n, err
}

// ErrSizeUnknown: a download's body had no length of its own (no
// Content-Length, not chunked) and the API gave no size to check it
// against (files.get failed — the error wraps why, so a 404 there is also
// an ErrNotFound — or its answer has no sizeBytes). Every byte received was
// written, but nothing in the answer tells the whole file from one cut
// short: the caller, who knows what the file should hold, decides (spec
// §9.5: the batch's request count).
var ErrSizeUnknown = errors.New("the download's length cannot be checked")

// checkSize compares the n bytes an unframed download received with the
// file's sizeBytes from files.get (GET {base}/{apiVersion}/files/<id>,
// through the same transport: limiter, retries, counted as a download
// request). A different size is a *TransientError (the caller starts
// again); no size is ErrSizeUnknown.
func (p *Poller) checkSize(ctx context.Context, op, id string, n int64) error {
	tctx, trace := withTrace(ctx, kindDownload)
	body, err := p.call(tctx, "files/"+id, nil)
	var apiErr genai.APIError
	if errors.As(err, &apiErr) {
		err = p.classify(ctx, "files.get "+truncate("files/"+id, 120), apiErr, trace.lastDelay)
	}
	if err != nil {
		return fmt.Errorf("poller: %s: %w after %d bytes without a length: %w", op, ErrSizeUnknown, n, err)
	}
	var f struct {
		SizeBytes json.RawMessage `json:"sizeBytes"`
	}
	_ = json.Unmarshal(body, &f) // a body that does not decode has no sizeBytes
	// An int64: a JSON string, or a number.
	size, err := strconv.ParseInt(strings.Trim(string(f.SizeBytes), `"`), 10, 64)
	if err != nil || size < 0 {
		return fmt.Errorf("poller: %s: %w after %d bytes without a length: files.get has no sizeBytes", op, ErrSizeUnknown, n)
	}
	if size != n {
		return &TransientError{Op: op, Err: fmt.Errorf("the body ended after %d bytes without a length (the connection closed), but the file has %d bytes (sizeBytes)", n, size)}
	}
	return nil
}

var errRedirects = errors.New("stopped after 10 redirects")

// dropKeyAcrossHosts follows up to 10 redirects, without the API key on
// another host (Go's client drops Authorization there, not custom headers).
func dropKeyAcrossHosts(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errRedirects
	}
	if !strings.EqualFold(req.URL.Host, via[0].URL.Host) {
		req.Header.Del("x-goog-api-key")
	}
	return nil
}

// apiErrorOf reads a refused answer as the SDK does (api_client.go
// newAPIError): the Google error body, else the status and the text.
func apiErrorOf(resp *http.Response, body []byte) genai.APIError {
	var e struct {
		Error *genai.APIError `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error != nil {
		e.Error.Code = cmp.Or(e.Error.Code, resp.StatusCode)
		return *e.Error
	}
	return genai.APIError{Code: resp.StatusCode, Status: resp.Status, Message: string(bytes.TrimSpace(body))}
}

// Results says where a batch's results are.
type Results struct {
	// File is the Gemini API responses file ("files/…"), to Download.
	File string
	// Inlined holds the Gemini API's inlined responses, each one JSON object
	// exactly as the API sent it ({"response": …, "metadata": …} or
	// {"error": …}). HasInlined tells an empty list from none.
	Inlined    []json.RawMessage
	HasInlined bool
	// Location is where Vertex AI wrote the results: the Cloud Storage
	// directory (outputInfo.gcsOutputDirectory, "gs://…"), or else the
	// BigQuery table ("bq://project.dataset.table", from
	// outputInfo.bigqueryOutputDataset and bigqueryOutputTable). Nothing
	// there can be downloaded through the API.
	Location string
	// Requests is metadata.batchStats.requestCount, the lines a complete
	// responses file holds (0: not given); EndTime is metadata.endTime
	// (zero: not given), from which the file is kept 48 h.
	Requests int64
	EndTime  time.Time
}

// ResultsOf reads where a batch operation's results are from its raw JSON
// (as listed or fetched): Gemini API metadata.output.responsesFile or
// metadata.output.inlinedResponses.inlinedResponses[] — for generateContent
// and embedding batches alike; inlinedEmbedContentResponses, where the SDK
// looks for an embedding batch's (go-genai #712), is read too —, falling
// back to the operation's response field, which carries the same output;
// Vertex outputInfo. It reads what is there whatever the state: the caller
// decides which states want results. An error means Raw is not a JSON
// object or a field has the wrong type.
func ResultsOf(op Operation) (Results, error) {
	var raw struct { // metadata and outputInfo are zero when absent
		Metadata struct {
			Output     *geminiOutput `json:"output"`
			EndTime    time.Time     `json:"endTime"`
			BatchStats struct {
				RequestCount int64 `json:"requestCount,string"`
			} `json:"batchStats"`
		} `json:"metadata"`
		Response   *geminiOutput `json:"response"`
		OutputInfo struct {
			GcsOutputDirectory    string `json:"gcsOutputDirectory"`
			BigqueryOutputDataset string `json:"bigqueryOutputDataset"`
			BigqueryOutputTable   string `json:"bigqueryOutputTable"`
		} `json:"outputInfo"`
	}
	if err := json.Unmarshal(op.Raw, &raw); err != nil {
		return Results{}, fmt.Errorf("poller: results of %s: %w", truncate(op.Name, 120), err)
	}
	m, oi := raw.Metadata, raw.OutputInfo
	r := Results{Requests: m.BatchStats.RequestCount, EndTime: m.EndTime}
	for _, out := range []*geminiOutput{m.Output, raw.Response} {
		if out == nil {
			continue
		}
		r.File = cmp.Or(r.File, out.ResponsesFile)
		for _, in := range []*inlined{out.InlinedResponses, out.InlinedEmbedContentResponses} {
			if !r.HasInlined && in != nil && in.InlinedResponses != nil {
				r.Inlined, r.HasInlined = in.InlinedResponses, true
			}
		}
	}
	switch {
	case oi.GcsOutputDirectory != "":
		r.Location = oi.GcsOutputDirectory
	case oi.BigqueryOutputDataset != "" && oi.BigqueryOutputTable != "":
		r.Location = strings.TrimRight(oi.BigqueryOutputDataset, "/.") + "." + oi.BigqueryOutputTable
	default:
		r.Location = oi.BigqueryOutputDataset
	}
	return r, nil
}

type geminiOutput struct {
	ResponsesFile                string   `json:"responsesFile"`
	InlinedResponses             *inlined `json:"inlinedResponses"`
	InlinedEmbedContentResponses *inlined `json:"inlinedEmbedContentResponses"`
}

type inlined struct {
	InlinedResponses []json.RawMessage `json:"inlinedResponses"`
}
