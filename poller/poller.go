// Package poller lists Gemini batch operations (Gemini API or Vertex AI
// batch prediction jobs) and hands every terminal one to a callback: one
// reconciliation pass of spec §5. google.golang.org/genai builds its client
// (key, base URL, pinned API version, Vertex credentials); the requests and
// the reading of their answers are its own, with encoding/json, one
// operation at a time (the SDK's mapping drops fields and panics on shapes
// the API sends: docs/gemini-api.md).
//
// It owns a rate limiter every HTTP request waits on, bounded retries
// honouring google.rpc.RetryInfo and Retry-After, the raw operation as the
// API sent it (done, error, response, batchStats), the lookback stop rule (spec §5.2: paging ends early
// only once the listing has shown itself newest first), the scope a pass
// lists (spec §5.5), and refusing to loop on a repeated page token or on
// fresh tokens for pages that list nothing new (ErrEndlessListing). It
// records nothing and keeps no state between passes: the caller's callback
// records, and the caller decides when a pass must be a full scan.
// Pages are streamed to the callback, never collected, so memory stays flat
// however many batches are listed.
package poller

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
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/internal/ctxsleep"
	"github.com/gemrecon/gemrecon/internal/field"
)

// Backends.
const (
	BackendGemini = "gemini"
	BackendVertex = "vertex"
)

// API versions gemrecon speaks, set on every client it builds so that
// neither the SDK's default (v1 for the Gemini API from genai v1.78.0) nor
// GOOGLE_GENAI_API_VERSION can move them: the WebhookService exists only on
// v1beta, and batches, files and downloads are documented there
// (docs/gemini-api.md, "Building the client").
const (
	APIVersionGemini = "v1beta"
	APIVersionVertex = "v1beta1"
)

// Defaults used by DefaultConfig (and by New where a field is zero and zero
// has no meaning of its own).
const (
	DefaultPageSize   = 100
	MaxPageSize       = 1000           // the largest page size a list request may ask for
	DefaultLookback   = 72 * time.Hour // 48 h batch expiry + margin
	DefaultMaxRetries = 5
	// A retry without a server delay waits from DefaultBackoffMin,
	// doubling up to DefaultBackoffMax (backoff); no Config changes them.
	DefaultBackoffMin     = time.Second
	DefaultBackoffMax     = time.Minute
	DefaultRequestTimeout = time.Minute
)

// Errors a pass can end with; match with errors.Is.
var (
	// ErrAuth: the API refused the credential (401/403, an invalid key) or
	// there is none; the message names the credential to check. Never retried.
	ErrAuth = errors.New("gemini credentials refused")
	// ErrRepeatedPageToken: the API handed back a page token it had already
	// given in this pass; paging stops instead of looping.
	ErrRepeatedPageToken = errors.New("repeated page token")
	// ErrEndlessListing: the API went on handing out new page tokens for
	// pages that were empty (MaxEmptyPagesInRow in a row) or that listed
	// only operations this pass had listed already; paging stops instead
	// of reading forever. Never retried: the same requests get the same
	// answers.
	ErrEndlessListing = errors.New("endless listing")
	// ErrMalformedPage: a list response that could not be decoded. (One
	// larger than MaxResponseBody is not read at all: ErrBodyTooLarge.)
	ErrMalformedPage = errors.New("malformed list page")
)

// Config configures a Poller. Start from DefaultConfig.
type Config struct {
	// Backend is BackendGemini (default when "") or BackendVertex.
	Backend string
	// APIKey for the Gemini API (or Vertex express mode). "" lets the SDK
	// read GOOGLE_API_KEY, then GEMINI_API_KEY.
	APIKey string
	// Project and Location for Vertex; "" lets the SDK read
	// GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION (or GOOGLE_CLOUD_REGION).
	Project, Location string
	// NoCredentials skips Application Default Credentials on Vertex (an
	// emulator or an authenticating proxy at BaseURL, or tests).
	NoCredentials bool
	// BaseURL overrides the API endpoint (an emulator, a proxy); "" uses the
	// SDK's default (or GOOGLE_GEMINI_BASE_URL / GOOGLE_VERTEX_BASE_URL).
	BaseURL string
	// HTTPClient supplies the base transport (default: a clone of
	// http.DefaultTransport). Its Timeout is ignored: RequestTimeout applies
	// per attempt.
	HTTPClient *http.Client
	// QPS and Burst configure the one limiter every HTTP request waits on,
	// retries included. QPS 0 means unlimited; Burst 0 means 1.
	QPS   float64
	Burst int
	// PageSize is sent with every list request, 1..MaxPageSize (0 means
	// DefaultPageSize).
	PageSize int
	// Lookback is the window of spec §5.2: terminal operations created
	// before now − Lookback (by createTime; without one, by endTime, else
	// updateTime: see createdBefore) are not handed to the callback (they
	// are counted as SkippedOld), and paging may end early once the listing has proved
	// itself newest first and a whole page is older than the window (see
	// Pass). 0 reads every page and hands over every terminal one.
	Lookback time.Duration
	// MaxRetries is the retry budget of one request for 429, 5xx and
	// transport errors (0: no retries).
	MaxRetries int
	// RequestTimeout bounds one HTTP attempt (0: none).
	RequestTimeout time.Duration
	// Now is the clock for the lookback window (default time.Now).
	Now func() time.Time
	// Sleep waits between retries (default: a timer that honours ctx).
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger receives retry warnings (default: discard).
	Logger *slog.Logger

	// maxBody replaces MaxResponseBody when non-zero: for tests, whose
	// pages at the limit would otherwise be 64 MiB to decode.
	maxBody int64
}

// DefaultConfig returns the defaults of `gemrecon poll`.
func DefaultConfig() Config {
	return Config{
		Backend:        BackendGemini,
		Burst:          1,
		PageSize:       DefaultPageSize,
		Lookback:       DefaultLookback,
		MaxRetries:     DefaultMaxRetries,
		RequestTimeout: DefaultRequestTimeout,
	}
}

// Validate reports the first invalid field by name (a field.Error), for a
// Config as it will run (New fills an empty Backend, a zero PageSize and
// Burst with their defaults first).
func (c Config) Validate() error {
	const p = "poller: "
	switch {
	case c.Backend != BackendGemini && c.Backend != BackendVertex:
		return field.Errorf(p, "{Backend} %q: want %s or %s", c.Backend, BackendGemini, BackendVertex)
	case c.Backend == BackendGemini && (c.Project != "" || c.Location != ""):
		return field.Errorf(p, "{Project} and {Location} apply to the vertex backend only")
	case c.PageSize < 1 || c.PageSize > MaxPageSize:
		return field.Errorf(p, "{PageSize} %d: want 1..%d", c.PageSize, MaxPageSize)
	case c.Lookback < 0:
		return field.Errorf(p, "{Lookback} %v is negative (0 reads every page)", c.Lookback)
	case c.MaxRetries < 0:
		return field.Errorf(p, "{max retries|MaxRetries} %d is negative", c.MaxRetries)
	case c.QPS < 0 || math.IsNaN(c.QPS) || c.Burst < 1:
		return field.Errorf(p, "{QPS} must not be negative and {Burst} must be at least 1")
	}
	return nil
}

// EnvAPIKey returns the Gemini API key of the environment: GOOGLE_API_KEY,
// else GEMINI_API_KEY (the SDK's order).
func EnvAPIKey() string { return cmp.Or(os.Getenv("GOOGLE_API_KEY"), os.Getenv("GEMINI_API_KEY")) }

// ErrNoAPIKey: a Gemini API poller with no API key.
var ErrNoAPIKey = errors.New("no API key: set GEMINI_API_KEY (or GOOGLE_API_KEY) to a Gemini API key")

// CheckCredentials says what c lacks to reach the API: ErrNoAPIKey for the
// Gemini API without a key, a field.Error for Vertex AI without a project
// and a location (whose Application Default Credentials the SDK looks up);
// nil when it names them.
func (c Config) CheckCredentials() error {
	switch {
	case c.Backend != BackendVertex && c.APIKey == "":
		return ErrNoAPIKey
	case c.Backend == BackendVertex && (c.Project == "" || c.Location == ""):
		return field.Errorf("poller: ", "{Backend} vertex needs {Project} and {Location} (or GOOGLE_CLOUD_PROJECT and GOOGLE_CLOUD_LOCATION)")
	}
	return nil
}

// Operation is one listed batch operation in a terminal state.
type Operation struct {
	// Name as listed: "batches/x" (Gemini API) or
	// "projects/P/locations/L/batchPredictionJobs/N" (Vertex).
	Name string
	// Invalid says why the operation must not be recorded, "" when it may:
	// it does not parse (not a JSON object, or a field gemrecon reads has
	// the wrong JSON type: Name is then whatever name could be read), or
	// its name is not valid UTF-8 or holds an unpaired surrogate escape
	// (spec §12: decoding replaces those with U+FFFD, so two different
	// names would read as one; Name holds that replaced form, for logs
	// only). Pass hands such an operation over as terminal, so that the
	// caller counts and names it, and goes on listing.
	Invalid string
	// State normalised by canon.NormalizeState: "SUCCEEDED", "FAILED",
	// "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED" (the BATCH_STATE_ /
	// JOB_STATE_ prefix dropped, CANCELED spelled CANCELLED).
	State string
	// Terminal is always true for operations handed to the callback: the
	// state is terminal, or the operation says "done": true and its state
	// is none known as unfinished (see finished).
	Terminal   bool
	CreateTime time.Time // zero when the API gave none
	EndTime    time.Time // zero when the API gave none
	UpdateTime time.Time // zero when the API gave none
	// Raw is the operation exactly as the API sent it, including done,
	// error, response and batchStats that the SDK drops.
	Raw json.RawMessage

	unknownType bool // metadata @type is none of knownTypes
}

// knownTypes are the metadata @types of the Gemini API's batches/
// collection that gemrecon knows: generateContent batches and embedding
// batches (asyncBatchEmbedContent). Both keep state, times and output in
// the same fields. Any other @type is read the same way and counted apart
// (PassStats.UnknownTypes).
var knownTypes = []string{
	"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",
	"type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch",
}

// finished reports whether an operation has ended: its (normalised) state
// is terminal (canon.IsTerminal), or the long-running operation says
// "done": true — which the operation's contract promises only of a
// finished one — and its state is not one known as unfinished. The batch
// states are an enum the API may extend, so a state gemrecon does not know
// (a new one, UNSPECIFIED, or none) decides nothing against done. A known
// unfinished state wins over done: a running batch is never run on partial
// results. Without done (Vertex has none) an unknown state is unfinished.
func finished(state string, done bool) bool {
	return canon.IsTerminal(state) ||
		done && !slices.Contains([]string{"PENDING", "RUNNING", "QUEUED", "CANCELLING", "PAUSED", "UPDATING"}, state)
}

// PassStats counts what one pass did.
type PassStats struct {
	Listed     int // operations listed on the pages read
	Terminal   int // of which in a terminal state
	Passed     int // handed to the callback (terminal and inside the lookback window)
	SkippedOld int // terminal but created before now − Lookback (createdBefore): not handed over
	// UnknownTypes: of those handed over, operations whose metadata @type
	// is none of knownTypes (recorded all the same, with the raw operation).
	UnknownTypes int
	Pages        int // list pages read
	Requests     int // HTTP requests sent, retries included
	Retries      int // of which retries
	// FullScan: the pass read every page to the end (the last page had no
	// next token) without an error: every operation the API listed was seen.
	FullScan bool
	// Unordered: a page boundary broke newest-first order (or an operation
	// had no createTime), so this pass could not end early.
	Unordered bool
	Duration  time.Duration
}

// PassOptions choose how one pass pages.
type PassOptions struct {
	// FullScan reads every page whatever the order: the periodic full scan
	// of spec §5.2, in case the listing is several newest-first runs joined
	// end to end (which the stop rule cannot tell from one run).
	FullScan bool
	// Unfinished, when set, sees every listed operation that has not
	// finished (spec §5.5: batches stuck, or about to expire).
	Unfinished func(Operation)
}

// Poller lists batch operations. One Poller may run passes one after the
// other or concurrently; they share its rate limiter.
type Poller struct {
	cfg    Config
	client *genai.Client // resolves the key, base URL and version; sends nothing
	httpc  *http.Client  // the client's HTTP client: list, get and probe
}

// New builds a Poller and its genai client. It sends no request.
func New(ctx context.Context, cfg Config) (*Poller, error) {
	cfg.Backend, cfg.PageSize, cfg.Burst = cmp.Or(cfg.Backend, BackendGemini), cmp.Or(cfg.PageSize, DefaultPageSize), cmp.Or(cfg.Burst, 1)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = ctxsleep.Sleep
	}
	cfg.Logger = cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	cfg.maxBody = cmp.Or(cfg.maxBody, MaxResponseBody)
	limit := rate.Inf
	if cfg.QPS > 0 {
		limit = rate.Limit(cfg.QPS)
	}
	var rt http.RoundTripper = http.DefaultTransport.(*http.Transport).Clone()
	if cfg.HTTPClient != nil && cfg.HTTPClient.Transport != nil {
		rt = cfg.HTTPClient.Transport
	}
	p := &Poller{cfg: cfg}
	t := &transport{base: rt, limiter: rate.NewLimiter(limit, cfg.Burst), cfg: &p.cfg}
	cc := &genai.ClientConfig{
		APIKey: cfg.APIKey, Backend: genai.BackendGeminiAPI, HTTPClient: &http.Client{Transport: t},
		HTTPOptions: genai.HTTPOptions{BaseURL: cfg.BaseURL, APIVersion: APIVersionGemini},
	}
	if cfg.Backend == BackendVertex {
		cc.Backend = genai.BackendVertexAI
		cc.Project, cc.Location = cfg.Project, cfg.Location
		cc.HTTPOptions.APIVersion = APIVersionVertex
		if cfg.APIKey == "" && !cfg.NoCredentials {
			// The SDK only finds ADC itself when it builds its own client;
			// ours must carry the token, so wrap it here (the auth layer sits
			// outside our transport: limits and retries still see every call).
			if err := cc.UseDefaultCredentials(); err != nil {
				return nil, fmt.Errorf("%w: vertex: %v; %s", ErrAuth, err, vertexCredHint)
			}
		}
	}
	client, err := genai.NewClient(ctx, cc)
	if err != nil {
		if strings.Contains(err.Error(), "api key is required") {
			return nil, fmt.Errorf("%w: no Gemini API key: set GEMINI_API_KEY (or GOOGLE_API_KEY)", ErrAuth)
		}
		return nil, fmt.Errorf("poller: genai client: %w", err)
	}
	// The SDK's client is kept for what it resolves (key, base URL and
	// version from the config or the environment; on Vertex the
	// credentials around the transport); the requests are gemrecon's own.
	p.client = client
	p.httpc = &http.Client{Transport: client.ClientConfig().HTTPClient.Transport, CheckRedirect: dropKeyAcrossHosts}
	return p, nil
}

const vertexCredHint = "check Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`) and the project/location (GOOGLE_CLOUD_PROJECT, GOOGLE_CLOUD_LOCATION)"

// Scope names what this Poller lists, for the per-scope pass records of
// spec §5.5: the backend, the effective base URL (the SDK's default, an
// environment override or Config.BaseURL, normalised to end in one "/"),
// and for the Gemini API (or Vertex express mode) the first 12 hex digits of
// the API key's SHA-256 — never the key — or for Vertex the project and
// location. Two Pollers list the same operations exactly when their scopes
// are equal, so replicas sharing a database share one record.
//
//	gemini https://generativelanguage.googleapis.com/ key=sha256:6e4a29c1b0f3
//	vertex https://us-central1-aiplatform.googleapis.com/ project=p location=us-central1
func (p *Poller) Scope() string {
	cc := p.client.ClientConfig()
	base := strings.TrimRight(cc.HTTPOptions.BaseURL, "/") + "/"
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
		base = u.String()
	}
	parts := []string{p.cfg.Backend, base}
	if cc.Backend == genai.BackendVertexAI && (cc.Project != "" || cc.Location != "") {
		parts = append(parts, "project="+cc.Project, "location="+cc.Location)
	}
	if cc.APIKey != "" && (cc.Backend != genai.BackendVertexAI || cc.Project == "") {
		sum := sha256.Sum256([]byte(cc.APIKey))
		parts = append(parts, "key=sha256:"+hex.EncodeToString(sum[:6]))
	}
	return strings.Join(parts, " ")
}

// Lookback returns the configured lookback window (0: no window).
func (p *Poller) Lookback() time.Duration { return p.cfg.Lookback }

// PassWith lists batch operations page by page and calls fn once per page,
// before the next page is asked for, with the page's terminal operations
// inside the lookback window in listing order (nil when none), so
// that a caller can record a page at once (spec §5.3). The same completion
// is handed over again on every pass that lists it: deduplication is the
// caller's. An error from fn stops the pass and is returned wrapped.
//
// The API documents no listing order, so paging ends before the last page
// only when the pages read prove the listing newest first (spec §5.2): at
// least two non-empty pages were read, at every boundary between them the
// later page's newest createTime is no newer than the earlier page's oldest
// (order inside a page does not matter), and the last page read holds only
// operations created before now − Lookback. The first boundary that breaks
// that order, or an operation without a createTime (which cannot prove an
// order), makes the pass read every page. Empty pages say nothing about the
// order and are passed over. With opt.FullScan, or Lookback 0, every page
// is read.
func (p *Poller) PassWith(ctx context.Context, opt PassOptions, fn func([]Operation) error) (stats PassStats, err error) {
	start := time.Now()
	ctx, trace := withTrace(ctx, kindList)
	defer func() {
		stats.Requests = int(trace.requests.Load())
		stats.Retries = int(trace.retries.Load())
		stats.Duration = time.Since(start)
	}()
	var cutoff time.Time
	if p.cfg.Lookback > 0 {
		cutoff = p.cfg.Now().Add(-p.cfg.Lookback)
	}
	var (
		order   orderCheck
		mayStop = !cutoff.IsZero() && !opt.FullScan
		seen    = map[string]struct{}{}
		token   = ""
		loops   loopCheck
	)
	for {
		ops, next, err := p.page(ctx, trace, token, stats.Pages+1)
		if err != nil {
			return stats, err
		}
		stats.Pages++
		allOld := len(ops) > 0
		var passed []Operation
		for i := range ops {
			op := &ops[i]
			stats.Listed++
			old := !cutoff.IsZero() && createdBefore(op, cutoff)
			allOld = allOld && old
			if !op.Terminal {
				if opt.Unfinished != nil {
					opt.Unfinished(*op)
				}
				continue
			}
			stats.Terminal++
			if old {
				stats.SkippedOld++
				continue
			}
			stats.Passed++
			if op.unknownType {
				stats.UnknownTypes++
			}
			passed = append(passed, *op)
		}
		if err := fn(passed); err != nil {
			return stats, fmt.Errorf("poller: page %d: %w", stats.Pages, err)
		}
		if !order.page(ops) && !stats.Unordered {
			stats.Unordered = true
			if mayStop { // once: Unordered stays set
				p.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "the listing is not newest first; this pass reads every page",
					slog.Int("page", stats.Pages), slog.String("why", order.why))
			}
		}
		if next == "" {
			stats.FullScan = true
			return stats, nil
		}
		if mayStop && allOld && !stats.Unordered && order.pages >= 2 {
			return stats, nil
		}
		if _, dup := seen[next]; dup {
			return stats, fmt.Errorf("poller: page %d: %w %q (the API is looping; %d operations listed before it)",
				stats.Pages, ErrRepeatedPageToken, truncate(next, 40), stats.Listed)
		}
		if err := loops.page(ops); err != nil {
			return stats, fmt.Errorf("poller: page %d: %w; %d operations listed in all", stats.Pages, err, stats.Listed)
		}
		seen[next] = struct{}{}
		token = next
	}
}

// createdBefore reports whether op was certainly created before t: its
// createTime is, or, when the API gave none, its endTime or else its
// updateTime is (a batch is created before it ends or is updated). An
// operation with none of the three is never old: it is handed over on
// every pass (deduplication is the caller's), never lost.
func createdBefore(op *Operation, t time.Time) bool {
	for _, at := range []time.Time{op.CreateTime, op.EndTime, op.UpdateTime} {
		if !at.IsZero() {
			return at.Before(t)
		}
	}
	return false
}

// orderCheck follows whether the pages read so far are newest first at
// every boundary, keeping only the previous non-empty page's oldest time.
type orderCheck struct {
	pages  int       // non-empty pages seen
	oldest time.Time // the previous non-empty page's oldest createTime
	broken bool
	why    string // what broke the order, for the log
}

// page takes the next page and reports whether the order still holds.
func (c *orderCheck) page(ops []Operation) bool {
	if c.broken || len(ops) == 0 {
		return !c.broken
	}
	for _, op := range ops {
		if op.CreateTime.IsZero() {
			c.broken, c.why = true, "an operation without createTime: "+truncate(op.Name, 80)
			return false
		}
	}
	byCreateTime := func(a, b Operation) int { return a.CreateTime.Compare(b.CreateTime) }
	newest, oldest := slices.MaxFunc(ops, byCreateTime).CreateTime, slices.MinFunc(ops, byCreateTime).CreateTime
	if c.pages > 0 && newest.After(c.oldest) {
		c.broken = true
		c.why = fmt.Sprintf("a page's newest createTime %s is newer than the previous page's oldest %s",
			newest.UTC().Format(time.RFC3339), c.oldest.UTC().Format(time.RFC3339))
		return false
	}
	c.pages++
	c.oldest = oldest
	return true
}

// Bounds of loopCheck: a listing that goes on handing out fresh page tokens
// while it lists nothing new is endless, and a pass must not read it
// forever (ErrEndlessListing).
const (
	// MaxEmptyPagesInRow is how many empty pages in a row, each with a
	// next page token, end a pass.
	MaxEmptyPagesInRow = 100
	// A run of pages that list only operations already listed (on the
	// pass's first page, or on one of the loopWindow pages before) ends a
	// pass once it holds at least minLoopPages pages and minLoopOps
	// operations: a handful of repeats across a page boundary is what a
	// listing that shifts under new batches shows, not a loop.
	minLoopPages = 3
	minLoopOps   = 100
	loopWindow   = 16
)

// loopCheck follows one pass's pages for an endless listing that fresh page
// tokens hide from the repeated-token check: a proxy that drops the
// pageToken parameter gets the first page again and again, each time with
// the token the API mints for it, which may differ every time. It keeps
// the operation names of the first page and of the last loopWindow pages,
// so its memory is bounded by the page size, not by the listing.
type loopCheck struct {
	pages    []map[string]bool // the first non-empty page's names, then the last loopWindow pages'
	empty    int               // empty pages in a row
	runPages int               // pages in a row that listed nothing new
	runOps   int               // operations on them
}

// page takes the operations of the next page that came with a next page
// token, and returns an error once the listing has shown itself endless.
func (c *loopCheck) page(ops []Operation) error {
	if len(ops) == 0 {
		if c.empty++; c.empty >= MaxEmptyPagesInRow {
			return fmt.Errorf("%w: %d empty pages in a row, each with a new page token", ErrEndlessListing, c.empty)
		}
		return nil
	}
	c.empty = 0
	names, seen := make(map[string]bool, len(ops)), len(c.pages) > 0
	for _, op := range ops {
		names[op.Name] = true
		seen = seen && slices.ContainsFunc(c.pages, func(p map[string]bool) bool { return p[op.Name] })
	}
	if seen {
		c.runPages++
		c.runOps += len(ops)
	} else {
		c.runPages, c.runOps = 0, 0
	}
	if len(c.pages) > loopWindow {
		c.pages = slices.Delete(c.pages, 1, 2)
	}
	c.pages = append(c.pages, names)
	if c.runPages >= minLoopPages && c.runOps >= minLoopOps {
		return fmt.Errorf("%w: %d pages in a row (%d operations) listed only operations this pass had already listed, each with a new page token (a proxy or gateway that drops the pageToken query parameter does this)",
			ErrEndlessListing, c.runPages, c.runOps)
	}
	return nil
}

// page fetches one list page and reads it (rawPage).
func (p *Poller) page(ctx context.Context, trace *passTrace, token string, n int) ([]Operation, string, error) {
	q := url.Values{"pageSize": {strconv.Itoa(p.cfg.PageSize)}}
	if token != "" {
		q.Set("pageToken", token)
	}
	body, err := p.call(ctx, p.collection(), q)
	var apiErr genai.APIError
	var big *BodyTooLargeError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, "", fmt.Errorf("poller: page %d: %w", n, ctx.Err())
	case errors.As(err, &apiErr):
		return nil, "", p.apiError(n, apiErr, trace.lastDelay)
	case errors.As(err, &big):
		// Not malformed, and not transient: the transport read no more of
		// it than the limit and did not retry.
		return nil, "", fmt.Errorf("poller: page %d: %w", n, big)
	default:
		// A transport failure after the retry budget.
		return nil, "", fmt.Errorf("poller: listing page %d: %w", n, err)
	}
	ops, next, err := p.rawPage(body)
	if err != nil {
		return nil, "", fmt.Errorf("poller: page %d: %w: %v", n, ErrMalformedPage, err)
	}
	return ops, next, nil
}

// collection is the path of the batch list: "batches" on the Gemini API,
// "batchPredictionJobs" on Vertex AI (under the project and location).
func (p *Poller) collection() string {
	if p.cfg.Backend == BackendVertex {
		return "batchPredictionJobs"
	}
	return "batches"
}

// request builds GET {base}/{apiVersion}/[projects/P/locations/L/]path?q
// as the SDK builds its requests (api_client.go createAPIURL: the path
// joined under the base URL, taken as already escaped), with the API key
// header when there is a key.
func (p *Poller) request(ctx context.Context, path string, q url.Values) (*http.Request, error) {
	cc := p.client.ClientConfig()
	u, err := url.Parse(cc.HTTPOptions.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("base URL: %w", err)
	}
	if cc.Backend == genai.BackendVertexAI && cc.Project != "" && cc.Location != "" {
		path = "projects/" + cc.Project + "/locations/" + cc.Location + "/" + path
	}
	u = u.JoinPath(cc.HTTPOptions.APIVersion, path)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if cc.APIKey != "" {
		req.Header.Set("x-goog-api-key", cc.APIKey)
	}
	return req, nil
}

// call sends one request (request) through the client's HTTP client — the
// transport, wrapped in the credentials on Vertex AI — and returns the body
// of a 2xx answer; a refusal is a genai.APIError (apiErrorOf). The answer
// is read with encoding/json by the caller, never mapped by the SDK: the
// SDK drops done, error, response and batchStats, and its mapping panics
// on some shapes the API can send (docs/gemini-api.md).
func (p *Poller) call(ctx context.Context, path string, q url.Values) ([]byte, error) {
	req, err := p.request(ctx, path, q)
	if err != nil {
		return nil, err
	}
	resp, err := p.httpc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body) // already read by the transport, at most its limit
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, apiErrorOf(resp, body)
	}
	return body, nil
}

// apiError is the error of a list page the API refused; delay is the
// server's (RetryInfo, Retry-After) on that answer, 0 when it gave none.
func (p *Poller) apiError(n int, e genai.APIError, delay time.Duration) error {
	what := describe(e)
	if delay > 0 {
		what += fmt.Sprintf(" (the server asks to retry after %v)", delay)
	}
	switch {
	case keyInvalid(e) || e.Code == http.StatusUnauthorized || e.Code == http.StatusForbidden:
		return p.authError(fmt.Sprintf("list page %d", n), what)
	case e.Code == http.StatusNotFound:
		// The API always has its list endpoint.
		what += ": no batch list at this address; is --base-url (or GOOGLE_GEMINI_BASE_URL, GOOGLE_VERTEX_BASE_URL) the API's?"
	}
	return fmt.Errorf("poller: listing page %d: %s", n, what)
}

// rawPage reads a list body. Each operation is read on its own (fromRaw):
// one that does not parse is handed on as Invalid, never a reason to fail
// the page (and with it every later page, on every pass while the API
// lists it). Only a body that is not a list page at all is an error.
func (p *Poller) rawPage(body []byte) ([]Operation, string, error) {
	var pg struct {
		Operations          []json.RawMessage `json:"operations"`
		BatchPredictionJobs []json.RawMessage `json:"batchPredictionJobs"`
		NextPageToken       string            `json:"nextPageToken"`
	}
	if err := json.Unmarshal(body, &pg); err != nil {
		return nil, "", err
	}
	raws := pg.Operations
	if p.cfg.Backend == BackendVertex {
		raws = pg.BatchPredictionJobs
	}
	ops := make([]Operation, 0, len(raws))
	for _, raw := range raws {
		ops = append(ops, fromRaw(raw))
	}
	return ops, pg.NextPageToken, nil
}

// opFields are what both backends' shapes say of an operation: the Gemini
// API's long-running operation keeps them under metadata, Vertex at the top.
type opFields struct {
	Name                            json.RawMessage // read strictly (canon.StrictString)
	State                           string
	CreateTime, EndTime, UpdateTime string
}

// opMetadata is the Gemini API operation's metadata: its @type beside the
// fields.
type opMetadata struct {
	Type string `json:"@type"`
	opFields
}

// fromRaw reads one raw operation. Its Name is the top-level name, else
// metadata.name (the Gemini API repeats it there). An operation with
// neither gets an empty Name, not an error: the caller skips it as a name
// that cannot be a key (spec §12). One that does not parse is Invalid and
// terminal (handed over to be counted and named), with the name that can
// be read.
func fromRaw(raw json.RawMessage) Operation {
	var r struct {
		opFields
		Done     bool
		Metadata opMetadata // zero when absent
	}
	err := json.Unmarshal(raw, &r)
	if t := bytes.TrimSpace(raw); err == nil && (len(t) == 0 || t[0] != '{') {
		err = errors.New("not a JSON object")
	}
	if err != nil {
		// Past a field of the wrong type, Unmarshal went on reading the
		// others: the names were read if they could be.
		name, _ := listedName(r.Name, r.Metadata.Name)
		return Operation{Name: name, Invalid: "the operation does not parse: " + truncate(err.Error(), 200), Terminal: true, Raw: raw}
	}
	f, m := r.opFields, r.Metadata
	name, valid := listedName(f.Name, m.Name)
	op := Operation{Name: name, State: canon.NormalizeState(cmp.Or(f.State, m.State)), Raw: raw,
		unknownType: m.Type != "" && !slices.Contains(knownTypes, m.Type)}
	if !valid {
		op.Invalid = "the listed name is not valid UTF-8 or holds an unpaired surrogate escape"
	}
	op.CreateTime, _ = time.Parse(time.RFC3339Nano, cmp.Or(f.CreateTime, m.CreateTime))
	op.EndTime, _ = time.Parse(time.RFC3339Nano, cmp.Or(f.EndTime, m.EndTime))
	op.UpdateTime, _ = time.Parse(time.RFC3339Nano, cmp.Or(f.UpdateTime, m.UpdateTime))
	op.Terminal = finished(op.State, r.Done)
	return op
}

// listedName reads a listed name, the top-level one, else metadata's,
// strictly (canon.StrictString). One that is not valid (ok false) is
// returned as encoding/json decodes it, with U+FFFD for what it could not
// read, for logs only; a name that is not a string is "".
func listedName(top, meta json.RawMessage) (name string, ok bool) {
	for _, raw := range []json.RawMessage{top, meta} {
		if name, ok = canon.StrictString(raw); !ok {
			_ = json.Unmarshal(raw, &name)
		}
		if name != "" {
			break
		}
	}
	return name, ok
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
