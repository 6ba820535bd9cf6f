// Package geminifake is a local stand-in for the Gemini batch API, both the
// Gemini API backend (GET /v1beta/batches, long-running operations) and the
// Vertex AI backend (GET /v1beta1/projects/P/locations/L/batchPredictionJobs),
// served over real HTTP in the exact shapes the google.golang.org/genai SDK
// reads (see docs/gemini-api.md).
//
// It owns the fake's batches (added and changed at runtime with times the
// caller sets), API key checks, opaque page tokens over a listing order the
// caller picks (by default a deterministic shuffle: results are not sorted
// by time, as the API promises no order; or newest first, oldest first, or
// two newest-first runs joined end to end), injectable faults (429 with
// google.rpc.RetryInfo and/or Retry-After, 5xx, slow or malformed responses,
// a repeating page token, the Vertex decoding traps; downloads that are
// paced, stalled, cut short or sent without a length: files.go) and a
// record of every request. It does not import "testing", so `gemrecon demo` can run it too.
package geminifake

import (
	"bufio"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures a Server. The zero value serves without any key check.
type Options struct {
	// APIKey, when set, must arrive in the x-goog-api-key header: a missing
	// key gets 403 PERMISSION_DENIED, a different one 401 UNAUTHENTICATED.
	APIKey string
	// BearerToken, when set, must arrive as "Authorization: Bearer <token>" on
	// the Vertex endpoints (an x-goog-api-key equal to APIKey is accepted
	// too, as in Vertex express mode). Missing or wrong → 401 UNAUTHENTICATED.
	BearerToken string
	// Seed picks the deterministic shuffle of list results (OrderShuffled),
	// and which run a batch falls in (OrderTwoRuns).
	Seed uint64
	// Order is the listing order (default OrderShuffled).
	Order Order
	// DefaultPageSize is used when a list request has no pageSize (default 50).
	DefaultPageSize int
	// MaxPageSize caps pageSize (default 1000).
	MaxPageSize int
	// VertexNumericCounters renders Vertex completionStats counters as JSON
	// numbers instead of strings: a trap that makes the SDK's List fail.
	VertexNumericCounters bool
	// VertexErrorDetailsObjects renders a Vertex job's error.details as an
	// array of objects: a trap, the SDK types details as []string.
	VertexErrorDetailsObjects bool
	// Now stamps recorded requests (default time.Now).
	Now func() time.Time
	// RecordLimit bounds the request record, oldest dropped first
	// (default 100000), so a long-running demo does not grow without end.
	RecordLimit int
}

// Order is how the fake orders list results. The real API documents no
// order (docs/gemini-api.md), so a client must be correct under each of these.
type Order int

// Listing orders. Ties (equal createTime) are broken by name.
const (
	// OrderShuffled lists in a deterministic shuffle of the names (by
	// Options.Seed): an order unrelated to age.
	OrderShuffled Order = iota
	// OrderNewestFirst lists by createTime, newest first.
	OrderNewestFirst
	// OrderOldestFirst lists by createTime, oldest first.
	OrderOldestFirst
	// OrderTwoRuns lists two newest-first runs joined end to end: the batches
	// of run 0 newest first, then those of run 1 newest first. A batch's run
	// is RunOf(name): a deterministic coin toss by Options.Seed.
	OrderTwoRuns
)

// String names the order as the tests and the demo print it.
func (o Order) String() string {
	switch o {
	case OrderShuffled:
		return "shuffled"
	case OrderNewestFirst:
		return "newest-first"
	case OrderOldestFirst:
		return "oldest-first"
	case OrderTwoRuns:
		return "two-runs"
	}
	return "Order(" + strconv.Itoa(int(o)) + ")"
}

// Orders lists every listing order.
var Orders = []Order{OrderShuffled, OrderNewestFirst, OrderOldestFirst, OrderTwoRuns}

// Status is a google.rpc.Status, the error of a failed batch.
type Status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// Batch is one batch operation held by the fake. Its Name decides the
// backend it is listed on: "batches/<id>" for the Gemini API,
// "projects/<P>/locations/<L>/batchPredictionJobs/<id>" for Vertex.
type Batch struct {
	Name string `json:"name"`
	// State in any spelling: "SUCCEEDED", "BATCH_STATE_SUCCEEDED" or
	// "JOB_STATE_SUCCEEDED"; it is rendered in the backend's own spelling.
	// An unknown state is rendered unchanged.
	State       string    `json:"state"`
	DisplayName string    `json:"displayName,omitempty"`
	Model       string    `json:"model,omitempty"`
	CreateTime  time.Time `json:"createTime"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
	EndTime     time.Time `json:"endTime,omitzero"`
	// Error is rendered as the operation's (Gemini) or job's (Vertex) error.
	Error *Status `json:"error,omitempty"`
	// Counters: Gemini batchStats / Vertex completionStats.
	RequestCount    int64 `json:"requestCount,omitempty"`
	SuccessfulCount int64 `json:"successfulCount,omitempty"`
	FailedCount     int64 `json:"failedCount,omitempty"`
	// ResponsesFile is the Gemini output file; Vertex gets a GCS directory.
	ResponsesFile string `json:"responsesFile,omitempty"`
	// InlinedResponses, when non-nil, are a succeeded Gemini batch's inlined
	// responses (one JSON object each), rendered as the API does under
	// metadata.output.inlinedResponses.inlinedResponses (files.go).
	InlinedResponses []json.RawMessage `json:"inlinedResponses,omitempty"`
	// WebhookConfig, when set, is the batch's per-job (dynamic) webhook
	// configuration (dynamic.go).
	WebhookConfig *WebhookConfig `json:"webhookConfig,omitempty"`
	// Type is the Gemini operation's metadata @type after
	// "…generativelanguage.v1main.": "" for GenerateContentBatch,
	// EmbedContentBatch (asyncBatchEmbedContent), or any other name.
	Type string `json:"type,omitempty"`
	// Raw, when set, is rendered as the operation instead of the fields
	// above (list and get alike; Name still places it): a shape the API
	// may send and the SDK cannot map, such as null or a metadata.output
	// that is a string.
	Raw json.RawMessage `json:"raw,omitempty"`
}

// GeminiName returns the Gemini API name of the batch with this id.
func GeminiName(id string) string { return "batches/" + id }

// VertexName returns the Vertex name of the job with this id.
func VertexName(project, location, id string) string {
	return "projects/" + project + "/locations/" + location + "/batchPredictionJobs/" + id
}

// ShortState strips a BATCH_STATE_ or JOB_STATE_ prefix.
func ShortState(s string) string {
	s = strings.TrimPrefix(s, "BATCH_STATE_")
	return strings.TrimPrefix(s, "JOB_STATE_")
}

// terminal reports whether a (short) state ends a batch on either backend.
func terminal(short string) bool {
	switch short {
	case "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED":
		return true
	}
	return false
}

// Fault changes how the fake answers one request. The zero Fault answers
// normally, so a queue {}, {Status: 503} faults the second request.
type Fault struct {
	// Status, when non-zero, answers with this HTTP status and a Google-style
	// error body instead of the resource.
	Status int
	// Message is the error message (default: a message for the status).
	Message string
	// RetryDelay adds a google.rpc.RetryInfo detail with this retryDelay.
	RetryDelay time.Duration
	// RetryAfter, when set, is sent as the Retry-After header.
	RetryAfter string
	// Delay holds the response this long (or until the client gives up).
	Delay time.Duration
	// Body, when set, replaces the response body (with Status, or 200): a
	// malformed page such as `{"operations":[{`.
	Body string
	// RepeatToken answers the page normally but returns the request's own
	// pageToken as nextPageToken: the API loops.
	RepeatToken bool
	// DropPageToken answers a list request as if it carried no pageToken
	// (a proxy or gateway that drops the query parameter: the first page
	// again), with a next page token minted for this response alone, as an
	// API whose tokens hold a nonce or a time would: the tokens never
	// repeat, the pages do.
	DropPageToken bool
}

// Request is what the fake recorded of one request.
type Request struct {
	Time   time.Time
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Status int // the status answered
	seq    uint64
}

type entry struct {
	b   Batch
	key sortKey
}

// sortKey places an entry in the listing: entries are listed by (a, b, c),
// then by name. Page tokens carry the last sortKey and name served.
type sortKey struct{ a, b, c uint64 }

func (k sortKey) cmp(o sortKey) int {
	switch {
	case k.a != o.a:
		return cmpU(k.a, o.a)
	case k.b != o.b:
		return cmpU(k.b, o.b)
	}
	return cmpU(k.c, o.c)
}

func cmpU(x, y uint64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// Server is the fake API: an http.Handler with runtime controls. All methods
// are safe for concurrent use.
type Server struct {
	opts  Options
	extra extraState // files, denied names, get-only states (files.go); guarded by mu

	mu       sync.Mutex
	byName   map[string]*entry
	order    []*entry // sorted by (key, name) when !dirty
	listing  Order
	dirty    bool
	faults   []Fault
	hook     func(*http.Request) *Fault
	requests []Request
	seq      uint64
	minted   uint64 // tokens minted by DropPageToken

	srv *http.Server
	ln  net.Listener

	webhooks *WebhookService // created on first use (webhooks.go)

	creates createState // batches.create (create.go); guarded by mu
}

// New returns a fake with no batches.
func New(opts Options) *Server {
	if opts.DefaultPageSize <= 0 {
		opts.DefaultPageSize = 50
	}
	if opts.MaxPageSize <= 0 {
		opts.MaxPageSize = 1000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RecordLimit <= 0 {
		opts.RecordLimit = 100000
	}
	return &Server{opts: opts, byName: map[string]*entry{}, listing: opts.Order}
}

// Start serves the fake on addr ("127.0.0.1:0" when empty) in a goroutine
// and returns its base URL ("http://127.0.0.1:PORT/"), to pass as the SDK's
// HTTPOptions.BaseURL.
func (s *Server) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("geminifake: listen: %w", err)
	}
	s.mu.Lock()
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	srv := s.srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return s.URL(), nil
}

// URL returns the base URL of a started server, "" before Start.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return "http://" + s.ln.Addr().String() + "/"
}

// Close stops a started server, dropping open connections, and stops
// webhook deliveries.
func (s *Server) Close() error {
	s.closeWebhooks()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// shuffleKey is the name's place in the shuffle: FNV-1a of seed and name,
// mixed by splitmix64's finaliser (FNV alone barely moves its high bits
// between names that differ in their last bytes, so sequential names would
// list in nearly their own order, and so in age order when created in
// sequence).
func (s *Server) shuffleKey(name string) uint64 {
	h := fnv.New64a()
	var seed [8]byte
	for i := range seed {
		seed[i] = byte(s.opts.Seed >> (8 * i))
	}
	h.Write(seed[:])
	h.Write([]byte(name))
	x := h.Sum64()
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// RunOf returns the run (0 or 1) a batch of this name is listed in under
// OrderTwoRuns.
func (s *Server) RunOf(name string) int { return int(s.shuffleKey(name) >> 63) }

// keyOf places a batch in the current listing order; the caller holds mu.
func (s *Server) keyOf(b Batch) sortKey {
	// createTime as two unsigned numbers in time order: seconds with the
	// sign bit flipped (so negative Unix times sort first), then nanoseconds.
	sec := uint64(b.CreateTime.Unix()) ^ (1 << 63)
	nsec := uint64(b.CreateTime.Nanosecond())
	switch s.listing {
	case OrderNewestFirst:
		return sortKey{a: ^sec, b: ^nsec}
	case OrderOldestFirst:
		return sortKey{a: sec, b: nsec}
	case OrderTwoRuns:
		return sortKey{a: uint64(s.RunOf(b.Name)), b: ^sec, c: ^nsec}
	}
	return sortKey{a: s.shuffleKey(b.Name)}
}

// SetOrder changes the listing order from the next list request on (a
// listing already under way continues from its token's position in the new
// order, as a real API's would after a change on its side).
func (s *Server) SetOrder(o Order) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listing = o
	for _, e := range s.order {
		e.key = s.keyOf(e.b)
	}
	s.dirty = true
}

// Add adds batches, or replaces those with the same name.
func (s *Server) Add(bs ...Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range bs {
		s.noteAdd(s.byName[b.Name], b) // webhook events (delivery.go)
		if e, ok := s.byName[b.Name]; ok {
			e.b = b
			e.key = s.keyOf(b)
			s.dirty = true
			continue
		}
		e := &entry{b: b, key: s.keyOf(b)}
		s.byName[b.Name] = e
		s.order = append(s.order, e)
		s.dirty = true
	}
}

// Remove deletes a batch (as if it aged out of the listing); false if unknown.
func (s *Server) Remove(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byName[name]
	if !ok {
		return false
	}
	delete(s.byName, name)
	s.order = slices.DeleteFunc(s.order, func(x *entry) bool { return x == e })
	return true
}

// SetState changes a batch's state; a terminal state with a zero end time
// is not given one (set it with Update). It returns false for an unknown name.
func (s *Server) SetState(name, state string) bool {
	return s.Update(name, func(b *Batch) { b.State = state })
}

// Update changes a batch in place (its name must not change); false if unknown.
func (s *Server) Update(name string, fn func(*Batch)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byName[name]
	if !ok {
		return false
	}
	defer s.noteUpdate(e.b, e) // webhook events (delivery.go)
	fn(&e.b)
	e.b.Name = name
	if k := s.keyOf(e.b); k != e.key { // a new createTime moves it in a time order
		e.key = k
		s.dirty = true
	}
	return true
}

// Batch returns a copy of the named batch.
func (s *Server) Batch(name string) (Batch, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.byName[name]
	if !ok {
		return Batch{}, false
	}
	return e.b, true
}

// Len returns how many batches the fake holds.
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byName)
}

// InjectFault queues faults; each request (list or get) consumes the next
// one, in order.
func (s *Server) InjectFault(fs ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, fs...)
}

// SetHook installs a per-request hook consulted when the fault queue is
// empty; it returns the fault for the request or nil. nil removes it.
func (s *Server) SetHook(h func(*http.Request) *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = h
}

// PendingFaults returns how many queued faults are not consumed yet.
func (s *Server) PendingFaults() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.faults)
}

// Requests returns a copy of every request recorded so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ResetRequests forgets the recorded requests.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

// ServeHTTP answers the Gemini and Vertex batch endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	s.mu.Lock()
	if len(s.requests) >= s.opts.RecordLimit {
		s.requests = slices.Delete(s.requests, 0, len(s.requests)-s.opts.RecordLimit+1)
	}
	s.requests = append(s.requests, Request{
		Time: s.opts.Now(), Method: r.Method, Path: r.URL.Path,
		Query: r.URL.Query(), Header: r.Header.Clone(), seq: s.seq + 1,
	})
	s.seq++
	seq := s.seq
	var f *Fault
	if len(s.faults) > 0 {
		f = &s.faults[0]
		s.faults = s.faults[1:]
	} else if s.hook != nil {
		hook := s.hook
		s.mu.Unlock()
		f = hook(r)
		s.mu.Lock()
	}
	s.mu.Unlock()
	s.serve(rec, r, f)
	s.mu.Lock()
	// The record may have shifted (RecordLimit): find it by sequence number.
	for i := len(s.requests) - 1; i >= 0; i-- {
		if s.requests[i].seq == seq {
			s.requests[i].Status = rec.status
			break
		}
	}
	s.mu.Unlock()
}

type recorder struct {
	http.ResponseWriter
	status int
}

// Flush sends what is buffered (paced and stalled downloads, files.go):
// without it the embedded ResponseWriter's http.Flusher would be hidden.
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands over the connection (a download served raw, files.go).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := r.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, http.ErrNotSupported
	}
	return h.Hijack()
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

var statusNames = map[int]string{
	400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
	404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 429: "RESOURCE_EXHAUSTED",
	500: "INTERNAL", 501: "NOT_IMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
	504: "DEADLINE_EXCEEDED",
}

// writeError writes a Google-style error body:
// {"error":{"code","message","status","details":[…]}}.
func writeError(w http.ResponseWriter, code int, msg string, details ...map[string]any) {
	if msg == "" {
		msg = http.StatusText(code)
	}
	body := map[string]any{"code": code, "message": msg, "status": statusNames[code]}
	if len(details) > 0 {
		body["details"] = details
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": body})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, f *Fault) {
	if f != nil && f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if f != nil && f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	if f != nil && f.Status != 0 && f.Body == "" {
		var details []map[string]any
		if f.Status == http.StatusTooManyRequests {
			details = append(details, map[string]any{
				"@type": "type.googleapis.com/google.rpc.QuotaFailure",
				"violations": []any{map[string]any{
					"quotaMetric": "generativelanguage.googleapis.com/batch_requests",
					"quotaId":     "BatchRequestsPerMinutePerProject",
				}},
			})
		}
		if f.RetryDelay > 0 {
			details = append(details, map[string]any{
				"@type":      "type.googleapis.com/google.rpc.RetryInfo",
				"retryDelay": durationString(f.RetryDelay),
			})
		}
		msg := f.Message
		if msg == "" && f.Status == http.StatusTooManyRequests {
			msg = "You exceeded your current quota, please check your plan and billing details."
		}
		writeError(w, f.Status, msg, details...)
		return
	}
	if f != nil && f.Body != "" {
		code := f.Status
		if code == 0 {
			code = http.StatusOK
		}
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(f.Body))
		return
	}
	// Batches and files are served on v1 too (the SDK's default from
	// v1.78.0); the WebhookService is on v1beta only, as on the API.
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/"); ok && !strings.HasPrefix(rest, "webhooks") {
		r.URL.Path, r.URL.RawPath = "/v1beta/"+rest, ""
	}
	if s.serveWebhooks(w, r) { // webhooks.go
		return
	}
	if s.serveCreate(w, r) { // create.go
		return
	}
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "only GET is served by geminifake")
		return
	}
	p := r.URL.Path
	switch {
	case p == "/v1beta/batches" || strings.HasPrefix(p, "/v1beta/batches/"):
		if !s.checkKey(w, r, false) {
			return
		}
		if p == "/v1beta/batches" {
			s.list(w, r, f, "batches/", "operations", s.renderGemini)
			return
		}
		s.getBatch(w, "batches/"+strings.TrimPrefix(p, "/v1beta/batches/"), s.renderGemini)
	case strings.HasPrefix(p, "/v1beta/files/"):
		s.serveFile(w, r) // files.go
	case strings.HasPrefix(p, "/v1beta1/projects/"):
		parts := strings.Split(strings.TrimPrefix(p, "/v1beta1/"), "/")
		// projects P locations L batchPredictionJobs [ID]
		if len(parts) < 5 || len(parts) > 6 || parts[2] != "locations" || parts[4] != "batchPredictionJobs" {
			writeError(w, http.StatusNotFound, "geminifake: no such path "+p)
			return
		}
		if !s.checkKey(w, r, true) {
			return
		}
		prefix := VertexName(parts[1], parts[3], "")
		if len(parts) == 5 {
			s.list(w, r, f, prefix, "batchPredictionJobs", s.renderVertex)
			return
		}
		s.getBatch(w, prefix+parts[5], s.renderVertex)
	default:
		writeError(w, http.StatusNotFound, "geminifake: no such path "+p)
	}
}

func (s *Server) checkKey(w http.ResponseWriter, r *http.Request, vertex bool) bool {
	key := r.Header.Get("x-goog-api-key")
	if vertex && s.opts.BearerToken != "" {
		if s.opts.APIKey != "" && key == s.opts.APIKey {
			return true
		}
		if r.Header.Get("Authorization") != "Bearer "+s.opts.BearerToken {
			writeError(w, http.StatusUnauthorized, "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.")
			return false
		}
		return true
	}
	if s.opts.APIKey == "" {
		return true
	}
	switch key {
	case s.opts.APIKey:
		return true
	case "":
		writeError(w, http.StatusForbidden, "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.")
	default:
		writeError(w, http.StatusUnauthorized, "API key not valid. Please pass a valid API key.")
	}
	return false
}

// page tokens are opaque to clients: base64 of the last key and name served.
func encodeToken(e *entry) string {
	k := e.key
	raw := strconv.FormatUint(k.a, 16) + "." + strconv.FormatUint(k.b, 16) + "." + strconv.FormatUint(k.c, 16) + ":" + e.b.Name
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeToken(t string) (sortKey, string, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil {
		return sortKey{}, "", false
	}
	k, name, ok := strings.Cut(string(raw), ":")
	if !ok {
		return sortKey{}, "", false
	}
	parts := strings.Split(k, ".")
	if len(parts) != 3 {
		return sortKey{}, "", false
	}
	var n [3]uint64
	for i, p := range parts {
		if n[i], err = strconv.ParseUint(p, 16, 64); err != nil {
			return sortKey{}, "", false
		}
	}
	return sortKey{n[0], n[1], n[2]}, name, true
}

// cmpEntry orders entries by key, then name.
func cmpEntry(e *entry, key sortKey, name string) int {
	if c := e.key.cmp(key); c != 0 {
		return c
	}
	return strings.Compare(e.b.Name, name)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, f *Fault, prefix, field string, render func(Batch) any) {
	q := r.URL.Query()
	size := s.opts.DefaultPageSize
	if v := q.Get("pageSize"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "Invalid value at 'page_size' (TYPE_INT32), \""+v+"\"")
			return
		}
		if n > 0 {
			size = n
		}
	}
	size = min(size, s.opts.MaxPageSize)
	token := q.Get("pageToken")
	if f != nil && f.DropPageToken {
		token = ""
	}
	var (
		fromKey  sortKey
		fromName string
	)
	if token != "" {
		var ok bool
		fromKey, fromName, ok = decodeToken(token)
		if !ok {
			writeError(w, http.StatusBadRequest, "Invalid page token.")
			return
		}
	}
	s.mu.Lock()
	if s.dirty {
		slices.SortFunc(s.order, func(a, b *entry) int { return cmpEntry(a, b.key, b.b.Name) })
		s.dirty = false
	}
	start := 0
	if token != "" {
		// The first entry after the last one served.
		start, _ = slices.BinarySearchFunc(s.order, struct{}{}, func(e *entry, _ struct{}) int {
			if cmpEntry(e, fromKey, fromName) <= 0 {
				return -1
			}
			return 1
		})
	}
	items := make([]any, 0, size)
	var last *entry
	next := ""
	for i := start; i < len(s.order); i++ {
		e := s.order[i]
		if !strings.HasPrefix(e.b.Name, prefix) || strings.Contains(e.b.Name[len(prefix):], "/") {
			continue
		}
		if len(items) == size {
			next = encodeToken(last)
			break
		}
		items = append(items, render(e.b))
		last = e
	}
	s.mu.Unlock()
	if f != nil && f.RepeatToken && token != "" {
		next = token
	}
	if f != nil && f.DropPageToken && next != "" {
		s.mu.Lock()
		s.minted++
		next += "." + strconv.FormatUint(s.minted, 10)
		s.mu.Unlock()
	}
	out := map[string]any{field: items}
	if next != "" {
		out["nextPageToken"] = next
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(out)
}

// durationString renders a google.protobuf.Duration in JSON ("31s", "1.5s").
func durationString(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Field order follows the API's (encoding/json keeps struct order).
type geminiOp struct {
	Name     string          `json:"name"`
	Metadata geminiMeta      `json:"metadata"`
	Done     bool            `json:"done,omitempty"`
	Error    *Status         `json:"error,omitempty"`
	Response *geminiResponse `json:"response,omitempty"`
}

type geminiMeta struct {
	Type        string        `json:"@type"`
	Model       string        `json:"model,omitempty"`
	DisplayName string        `json:"displayName,omitempty"`
	Name        string        `json:"name"`
	Output      *geminiOutput `json:"output,omitempty"`
	CreateTime  string        `json:"createTime,omitempty"`
	EndTime     string        `json:"endTime,omitempty"`
	UpdateTime  string        `json:"updateTime,omitempty"`
	BatchStats  *geminiStats  `json:"batchStats,omitempty"`
	State       string        `json:"state"`
}

type geminiOutput struct {
	ResponsesFile    string         `json:"responsesFile,omitempty"`
	InlinedResponses *geminiInlined `json:"inlinedResponses,omitempty"`
}

type geminiInlined struct {
	InlinedResponses []json.RawMessage `json:"inlinedResponses"`
}

type geminiStats struct {
	RequestCount           int64 `json:"requestCount,string"`
	SuccessfulRequestCount int64 `json:"successfulRequestCount,string,omitempty"`
	FailedRequestCount     int64 `json:"failedRequestCount,string,omitempty"`
}

type geminiResponse struct {
	Type             string         `json:"@type"`
	ResponsesFile    string         `json:"responsesFile,omitempty"`
	InlinedResponses *geminiInlined `json:"inlinedResponses,omitempty"`
}

const typePrefix = "type.googleapis.com/google.ai.generativelanguage.v1main."

func optTS(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return ts(t)
}

func geminiState(s string) string {
	short := ShortState(s)
	switch short {
	case "UNSPECIFIED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED":
		return "BATCH_STATE_" + short
	}
	return s
}

func vertexState(s string) string {
	short := ShortState(s)
	switch short {
	case "UNSPECIFIED", "QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLING",
		"CANCELLED", "PAUSED", "EXPIRED", "UPDATING", "PARTIALLY_SUCCEEDED":
		return "JOB_STATE_" + short
	}
	return s
}

// renderGemini renders a batch as the Gemini API's long-running operation.
func (s *Server) renderGemini(b Batch) any {
	if b.Raw != nil {
		return b.Raw
	}
	short := ShortState(b.State)
	typ := cmp.Or(b.Type, "GenerateContentBatch")
	op := geminiOp{Name: b.Name, Metadata: geminiMeta{
		Type: typePrefix + typ, Model: b.Model, DisplayName: b.DisplayName, Name: b.Name,
		CreateTime: optTS(b.CreateTime), EndTime: optTS(b.EndTime), UpdateTime: optTS(b.UpdateTime),
		State: geminiState(b.State),
	}}
	if b.RequestCount != 0 || b.SuccessfulCount != 0 || b.FailedCount != 0 {
		op.Metadata.BatchStats = &geminiStats{b.RequestCount, b.SuccessfulCount, b.FailedCount}
	}
	if terminal(short) {
		op.Done = true
		if b.Error != nil {
			op.Error = b.Error
		} else if short == "SUCCEEDED" && (b.ResponsesFile != "" || b.InlinedResponses != nil) {
			var in *geminiInlined
			if b.InlinedResponses != nil {
				in = &geminiInlined{b.InlinedResponses}
			}
			op.Metadata.Output = &geminiOutput{b.ResponsesFile, in}
			op.Response = &geminiResponse{Type: typePrefix + typ + "Output", ResponsesFile: b.ResponsesFile, InlinedResponses: in}
		}
	}
	return op
}

type vertexJob struct {
	Name            string         `json:"name"`
	DisplayName     string         `json:"displayName,omitempty"`
	Model           string         `json:"model,omitempty"`
	State           string         `json:"state"`
	Error           any            `json:"error,omitempty"`
	CreateTime      string         `json:"createTime,omitempty"`
	EndTime         string         `json:"endTime,omitempty"`
	UpdateTime      string         `json:"updateTime,omitempty"`
	CompletionStats any            `json:"completionStats,omitempty"`
	OutputInfo      *vertexOutInfo `json:"outputInfo,omitempty"`
	OutputConfig    *vertexOutConf `json:"outputConfig,omitempty"`
	InputConfig     *vertexInConf  `json:"inputConfig,omitempty"`
}

type vertexOutInfo struct {
	GcsOutputDirectory string `json:"gcsOutputDirectory"`
}
type vertexOutConf struct {
	PredictionsFormat string `json:"predictionsFormat"`
}
type vertexInConf struct {
	InstancesFormat string `json:"instancesFormat"`
}

type vertexStats struct {
	SuccessfulCount int64 `json:"successfulCount,string"`
	FailedCount     int64 `json:"failedCount,string,omitempty"`
}

type vertexStatsNumeric struct {
	SuccessfulCount int64 `json:"successfulCount"`
	FailedCount     int64 `json:"failedCount,omitempty"`
}

// renderVertex renders a batch as a Vertex BatchPredictionJob.
func (s *Server) renderVertex(b Batch) any {
	short := ShortState(b.State)
	j := vertexJob{
		Name: b.Name, DisplayName: b.DisplayName, Model: b.Model, State: vertexState(b.State),
		CreateTime: optTS(b.CreateTime), EndTime: optTS(b.EndTime), UpdateTime: optTS(b.UpdateTime),
		InputConfig:  &vertexInConf{"jsonl"},
		OutputConfig: &vertexOutConf{"jsonl"},
	}
	if b.SuccessfulCount != 0 || b.FailedCount != 0 {
		if s.opts.VertexNumericCounters {
			j.CompletionStats = vertexStatsNumeric{b.SuccessfulCount, b.FailedCount}
		} else {
			j.CompletionStats = vertexStats{b.SuccessfulCount, b.FailedCount}
		}
	}
	if b.Error != nil {
		e := map[string]any{"code": b.Error.Code, "message": b.Error.Message}
		if s.opts.VertexErrorDetailsObjects {
			e["details"] = []any{map[string]any{
				"@type":  "type.googleapis.com/google.rpc.ErrorInfo",
				"reason": "BATCH_FAILED",
			}}
		}
		j.Error = e
	}
	if terminal(short) && short != "FAILED" && short != "CANCELLED" {
		id := b.Name[strings.LastIndex(b.Name, "/")+1:]
		j.OutputInfo = &vertexOutInfo{"gs://geminifake-bucket/out/prediction-" + id}
	}
	return j
}

// LoadBatches reads a JSON array of Batch from a file (a fixture).
func LoadBatches(path string) ([]Batch, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("geminifake: %w", err)
	}
	var bs []Batch
	if err := json.Unmarshal(raw, &bs); err != nil {
		return nil, fmt.Errorf("geminifake: %s: %w", path, err)
	}
	for i, b := range bs {
		if b.Name == "" {
			return nil, fmt.Errorf("geminifake: %s: batch %d has no name", path, i)
		}
	}
	return bs, nil
}
