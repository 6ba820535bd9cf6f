package poller

import (
	"bytes"
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
	trace := &passTrace{kind: kindDownload, stream: true}
	req, err := p.request(context.WithValue(ctx, traceKey{}, trace), "files/"+id+":download", url.Values{"alt": {"media"}})
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
	arm, disarm := func() {}, func() {}
	if idle > 0 {
		timer := time.AfterFunc(time.Hour, func() { cancel(errStalled) })
		timer.Stop()
		defer timer.Stop()
		arm, disarm = func() { timer.Reset(idle) }, func() { timer.Stop() }
	}
	buf := make([]byte, downloadBuffer)
	var n int64
	for {
		arm()
		r, rerr := resp.Body.Read(buf)
		disarm()
		if r > 0 {
			wn, werr := w.Write(buf[:r])
			n += int64(wn)
			if werr == nil && wn < r {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return n, fmt.Errorf("poller: %s: after %d bytes: %w", op, n, werr)
			}
		}
		if rerr == io.EOF {
			if unframed(resp) {
				// The end of this body is only the connection closing: a
				// dropped connection looks the same. Ask the API how long
				// the file is.
				if err := p.checkSize(ctx, op, id, n); err != nil {
					return n, err
				}
			}
			return n, nil
		}
		if rerr != nil {
			return n, fail(fmt.Errorf("after %d bytes: %w", n, rerr))
		}
	}
}

// unframed reports an HTTP/1 response body delimited only by the end of
// the connection: no Content-Length, no chunked encoding (whose last chunk
// marks the end), and not decompressed by the transport (gzip has its own
// end). HTTP/2 and later frame every body.
func unframed(resp *http.Response) bool {
	return resp.ProtoMajor == 1 && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && !resp.Uncompressed
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
	trace := &passTrace{kind: kindDownload}
	body, err := p.call(context.WithValue(ctx, traceKey{}, trace), "files/"+id, nil)
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
	size, perr := int64(-1), json.Unmarshal(body, &f)
	if perr == nil {
		// An int64: a JSON string, or a number.
		size, perr = strconv.ParseInt(strings.Trim(string(f.SizeBytes), `"`), 10, 64)
	}
	if perr != nil || size < 0 {
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
		if e.Error.Code == 0 {
			e.Error.Code = resp.StatusCode
		}
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
	var raw struct {
		Metadata *struct {
			Output     *geminiOutput `json:"output"`
			EndTime    time.Time     `json:"endTime"`
			BatchStats struct {
				RequestCount int64 `json:"requestCount,string"`
			} `json:"batchStats"`
		} `json:"metadata"`
		Response   *geminiOutput `json:"response"`
		OutputInfo *struct {
			GcsOutputDirectory    string `json:"gcsOutputDirectory"`
			BigqueryOutputDataset string `json:"bigqueryOutputDataset"`
			BigqueryOutputTable   string `json:"bigqueryOutputTable"`
		} `json:"outputInfo"`
	}
	if err := json.Unmarshal(op.Raw, &raw); err != nil {
		return Results{}, fmt.Errorf("poller: results of %s: %w", truncate(op.Name, 120), err)
	}
	var r Results
	var fromMeta *geminiOutput
	if m := raw.Metadata; m != nil {
		fromMeta, r.Requests, r.EndTime = m.Output, m.BatchStats.RequestCount, m.EndTime
	}
	for _, out := range []*geminiOutput{fromMeta, raw.Response} {
		if out == nil {
			continue
		}
		if r.File == "" {
			r.File = out.ResponsesFile
		}
		if !r.HasInlined {
			for _, in := range []*inlined{out.InlinedResponses, out.InlinedEmbedContentResponses} {
				if in != nil && in.InlinedResponses != nil {
					r.Inlined, r.HasInlined = in.InlinedResponses, true
					break
				}
			}
		}
	}
	if oi := raw.OutputInfo; oi != nil {
		switch {
		case oi.GcsOutputDirectory != "":
			r.Location = oi.GcsOutputDirectory
		case oi.BigqueryOutputDataset != "" && oi.BigqueryOutputTable != "":
			r.Location = strings.TrimRight(oi.BigqueryOutputDataset, "/.") + "." + oi.BigqueryOutputTable
		default:
			r.Location = oi.BigqueryOutputDataset
		}
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

// untilHeaders bounds one attempt of a download by the timeout until its
// response headers arrive; the body is then bounded by Download's idle
// timer and the caller's context, not by a total time.
func (t timeoutTransport) untilHeaders(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	timer := time.AfterFunc(t.timeout, cancel)
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if !timer.Stop() {
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		return nil, fmt.Errorf("no response within %v: %w", t.timeout, context.DeadlineExceeded)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}
