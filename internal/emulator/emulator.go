// Package emulator is `gemrecon emulator` (spec §11) as a library: the
// Gemini API stand-in of internal/geminifake served on one listener with
// the key set of internal/fakejwks, batches that finish over time (from a
// file, generated, or created with the SDK's Batches.Create), signed
// webhook deliveries — static (HMAC, to webhooks registered through the
// WebhookService) and dynamic (v1a and/or an RS256 JWT, to a batch's
// webhookConfig URIs) — with at-least-once redelivery, seeded drops and
// duplicates, readable results files, and seeded 429/5xx faults.
//
// It is a package of its own rather than more of geminifake because it is
// the active half: geminifake is a passive stand-in whose batches change
// only when its caller says so (tests set every state and time), while the
// emulator owns a clock-driven scheduler, generated data, a fault rate and
// the JWKS. Keeping them apart leaves geminifake free of go-jose and of
// goroutines a test did not ask for. `gemrecon emulator` and `gemrecon
// demo` both start an Emulator; the command only parses flags and prints.
//
// An Emulator's API requests go through geminifake, so its API key check,
// request record, fault queue and every control (Deny, SetGetState,
// AddFile, …) apply; the JWKS and GET /emulator/status are answered beside
// it and are never faulted.
package emulator

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/internal/field"
	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Defaults of Config and of the command's flags.
const (
	DefaultListen             = "127.0.0.1:8787"
	DefaultFinishWithin       = 2 * time.Minute
	DefaultCreatedFinishAfter = 10 * time.Second
	DefaultRetryDelay         = time.Second
	// JWKSPath is where the key set of dynamic signatures is served, the
	// same path as the Gemini API's.
	JWKSPath = "/.well-known/jwks.json"
	// recordLimit bounds geminifake's request and delivery records, so a
	// long-running emulator does not grow without end.
	recordLimit = 2000
)

// SignatureMode chooses how dynamic deliveries are signed. The official
// documents disagree (the guide says an RS256 JWT, live deliveries are
// reported to carry v1a Ed25519), so the default signs both ways.
type SignatureMode string

// The signature modes.
const (
	SignV1a  SignatureMode = "v1a"
	SignJWT  SignatureMode = "jwt"
	SignBoth SignatureMode = "both"
)

// Config configures an Emulator. The zero value listens on DefaultListen
// with a generated key and seed, no batches, and every default below.
type Config struct {
	// Listen is the address to listen on ("" means DefaultListen; a port of
	// 0 picks a free one).
	Listen string
	// APIKey is the one key accepted in x-goog-api-key ("" generates one).
	APIKey string
	// Seed seeds every random choice: generated batches, drops, duplicates,
	// faults (0 picks one at random; Seed() tells which).
	Seed uint64

	// Batches are played out: each one in a terminal state is listed
	// PENDING from the start and reaches the given state (and fields) at a
	// seeded moment within FinishWithin; others are served as given and
	// never change. A zero CreateTime becomes the start time. With
	// FinishWithin 0 every batch is served as given from the start.
	Batches []geminifake.Batch
	// Generate adds this many generated batches that finish within
	// FinishWithin with a mix of outcomes (SUCCEEDED with a responses file,
	// FAILED with a reason, EXPIRED, CANCELLED).
	Generate int
	// FinishWithin bounds when played-out and generated batches finish
	// (0: they are added already finished).
	FinishWithin time.Duration
	// DynamicURIs, when set, are the webhookConfig URIs of generated
	// batches (a DynamicShare of them; 0 means all).
	DynamicURIs  []string
	DynamicShare float64
	// CreatedFinishAfter is how long a batch made by batches.create runs
	// before it succeeds (0 means DefaultCreatedFinishAfter).
	CreatedFinishAfter time.Duration

	// Signature signs dynamic deliveries ("" means SignBoth).
	Signature SignatureMode
	// Drop and Duplicate are the probabilities that a delivery is lost or
	// sent twice (geminifake.WebhookOptions).
	Drop, Duplicate float64
	// Delivery holds the other delivery options (client, attempts,
	// backoff); its Drop, Duplicate, Seed, DynamicSigner and OnAttempt are
	// set from this Config.
	Delivery geminifake.WebhookOptions

	// FailRate is the probability that an API request is answered with a
	// fault instead: half of them 429 RESOURCE_EXHAUSTED with a
	// google.rpc.RetryInfo of RetryDelay, a quarter 503, a quarter 500.
	FailRate float64
	// RetryDelay is the retryDelay of injected 429s (0 means
	// DefaultRetryDelay).
	RetryDelay time.Duration

	// Now is the clock (default time.Now).
	Now func() time.Time
	// Manual leaves the scheduler off: batches change only when Advance is
	// called (tests, or a caller that drives its own story).
	Manual bool
	// OnEvent, when set, receives every Event in order, from one goroutine.
	OnEvent func(Event)
}

// Emulator is a running sandbox. Its methods are safe for concurrent use.
type Emulator struct {
	cfg    Config
	api    *geminifake.Server
	keys   *fakejwks.Keys
	events *eventQueue
	faults *faultSource

	mu       sync.Mutex
	ln       net.Listener
	srv      *http.Server
	start    time.Time
	steps    stepHeap
	applying int // steps popped and not yet applied
	seq      int
	stats    Stats
	wake     chan struct{}
	stop     context.CancelFunc
	loopDone chan struct{}
	closed   bool
}

// Stats counts what the emulator did.
type Stats struct {
	Batches    int // batches added (every source)
	Created    int // of which by batches.create
	Finished   int // batches the scheduler finished
	Faults     int // API requests answered with an injected fault
	Deliveries geminifake.DeliveryStats
}

// New checks cfg, generates the keys and builds the stand-in. Nothing
// listens and no batch exists until Start.
func New(cfg Config) (*Emulator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.APIKey == "" {
		cfg.APIKey = "emu-" + strings.ToLower(rand.Text()[:20])
	}
	for cfg.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		cfg.Seed = binary.LittleEndian.Uint64(b[:])
	}
	if cfg.Signature == "" {
		cfg.Signature = SignBoth
	}
	if cfg.CreatedFinishAfter == 0 {
		cfg.CreatedFinishAfter = DefaultCreatedFinishAfter
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.DynamicShare == 0 {
		cfg.DynamicShare = 1
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	keys, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		return nil, err
	}
	e := &Emulator{
		cfg:    cfg,
		keys:   keys,
		events: newEventQueue(cfg.OnEvent),
		faults: newFaultSource(cfg.Seed, cfg.FailRate, cfg.RetryDelay),
		wake:   make(chan struct{}, 1),
	}
	e.api = geminifake.New(geminifake.Options{APIKey: cfg.APIKey, Seed: cfg.Seed, Now: cfg.Now, RecordLimit: recordLimit})
	d := cfg.Delivery
	d.Drop, d.Duplicate, d.Seed = cfg.Drop, cfg.Duplicate, cfg.Seed
	d.DynamicSigner = e.signer()
	d.OnAttempt = e.onAttempt
	if err := e.api.Webhooks().SetOptions(d); err != nil {
		return nil, err
	}
	e.api.SetHook(e.fault)
	e.api.SetCreateHook(e.created)
	return e, nil
}

// Validate checks cfg's settings, naming the field at fault (a
// field.Error): probabilities in [0, 1], no negative count or duration, a
// known signature mode, usable dynamic webhook URIs and batches. New calls
// it.
func (c *Config) Validate() error {
	const p = "emulator: "
	for _, pr := range []struct {
		name string
		v    float64
	}{{"{Drop}", c.Drop}, {"{Duplicate}", c.Duplicate}, {"{FailRate}", c.FailRate}, {"{DynamicShare}", c.DynamicShare}} {
		if !(pr.v >= 0 && pr.v <= 1) {
			return field.Errorf(p, pr.name+" %v: want a probability from 0 to 1", pr.v)
		}
	}
	if c.Generate < 0 {
		return field.Errorf(p, "{the batches to generate|Generate} %d: must not be negative", c.Generate)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"{FinishWithin}", c.FinishWithin}, {"{the created batches' run time|CreatedFinishAfter}", c.CreatedFinishAfter}, {"{RetryDelay}", c.RetryDelay}} {
		if d.v < 0 {
			return field.Errorf(p, d.name+" %v: must not be negative", d.v)
		}
	}
	switch c.Signature {
	case "", SignV1a, SignJWT, SignBoth:
	default:
		return field.Errorf(p, "{the signature mode|Signature} %q: want v1a, jwt or both", c.Signature)
	}
	if err := geminifake.CheckWebhookConfig(&geminifake.WebhookConfig{Uris: c.DynamicURIs}); err != nil {
		return field.Errorf(p, "{a dynamic webhook URI|DynamicURIs}: %w", err)
	}
	seen := map[string]bool{}
	for i, b := range c.Batches {
		if b.Name == "" {
			return fmt.Errorf("emulator: batch %d has no name", i)
		}
		if seen[b.Name] {
			return fmt.Errorf("emulator: batch %s is listed twice", b.Name)
		}
		seen[b.Name] = true
		if err := geminifake.CheckWebhookConfig(b.WebhookConfig); err != nil {
			return fmt.Errorf("emulator: batch %s: webhookConfig: %w", b.Name, err)
		}
	}
	return nil
}

// signer is the DynamicSigner of the chosen mode.
func (e *Emulator) signer() geminifake.Signer {
	switch e.cfg.Signature {
	case SignV1a:
		return fakejwks.SignerFunc(e.keys.SignV1a)
	case SignJWT:
		return fakejwks.SignerFunc(e.keys.SignJWT)
	}
	return e.keys // both: a v1a entry and a JWT, space-separated
}

// Start listens, adds the batches (the clock of FinishWithin starts now),
// starts the scheduler (unless Manual) and serves.
func (e *Emulator) Start() error {
	e.mu.Lock()
	if e.ln != nil || e.closed {
		e.mu.Unlock()
		return errors.New("emulator: already started")
	}
	e.mu.Unlock()
	ln, err := net.Listen("tcp", e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("emulator: listen on %s: %w", e.cfg.Listen, err)
	}
	now := e.cfg.Now()
	e.mu.Lock()
	e.ln, e.start = ln, now
	e.srv = &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
	srv := e.srv
	e.mu.Unlock()
	e.events.push(Event{Time: now, Kind: KindListening, URL: e.URL(), Seed: e.cfg.Seed})
	if err := e.plan(now); err != nil {
		ln.Close()
		return err
	}
	if !e.cfg.Manual {
		ctx, cancel := context.WithCancel(context.Background())
		e.mu.Lock()
		e.stop, e.loopDone = cancel, make(chan struct{})
		done := e.loopDone
		e.mu.Unlock()
		go func() { defer close(done); e.loop(ctx) }()
	}
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// Handler is the emulator's HTTP handler: the JWKS at JWKSPath, the
// Status at StatusPath, every other request to the stand-in. Start serves it; a caller with its own listener
// may serve it instead (then URL and the exports are its to make).
func (e *Emulator) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case JWKSPath:
			e.keys.ServeHTTP(w, r)
			return
		case StatusPath:
			e.serveStatus(w, r)
			return
		}
		e.api.ServeHTTP(w, r)
	})
}

// Close stops serving (open connections are dropped), stops the scheduler
// and every delivery, and delivers the last events to OnEvent. It returns
// after all of that.
func (e *Emulator) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	srv, stop, done := e.srv, e.stop, e.loopDone
	e.mu.Unlock()
	var err error
	if srv != nil {
		err = srv.Close()
	}
	if stop != nil {
		stop()
		<-done
	}
	e.api.Close() // stops deliveries
	e.events.close()
	return err
}

// URL is the base URL to give the SDK (--base-url, GOOGLE_GEMINI_BASE_URL):
// "http://127.0.0.1:PORT", "" before Start.
func (e *Emulator) URL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		return ""
	}
	return "http://" + dialable(e.ln.Addr())
}

// dialable is the address a client on this machine dials: a listener on
// every interface (0.0.0.0, ::) is reached through loopback.
func dialable(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.String()
	}
	ip := net.IPv4(127, 0, 0, 1)
	if ta.IP.To4() == nil {
		ip = net.IPv6loopback
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

// JWKSURL is where the key set of dynamic signatures is served.
func (e *Emulator) JWKSURL() string {
	if u := e.URL(); u != "" {
		return u + JWKSPath
	}
	return ""
}

// APIKey is the one key the emulator accepts.
func (e *Emulator) APIKey() string { return e.cfg.APIKey }

// Seed is the seed in use (the one given, or the one picked).
func (e *Emulator) Seed() uint64 { return e.cfg.Seed }

// API is the stand-in, for its controls: the WebhookService
// (API().Webhooks()), files, faults, denials, the request record.
func (e *Emulator) API() *geminifake.Server { return e.api }

// Keys is the key server and signer of dynamic deliveries.
func (e *Emulator) Keys() *fakejwks.Keys { return e.keys }

// Env is what a client needs, as NAME=value entries for a child process's
// environment: GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL (which the genai SDK
// reads when no base URL is configured) and GEMRECON_JWKS_URL.
func (e *Emulator) Env() []string {
	return []string{
		"GEMINI_API_KEY=" + e.cfg.APIKey,
		"GOOGLE_GEMINI_BASE_URL=" + e.URL(),
		"GEMRECON_JWKS_URL=" + e.JWKSURL(),
	}
}

// Exports is Env as shell export lines, ready to paste.
func (e *Emulator) Exports() string {
	var b strings.Builder
	for _, kv := range e.Env() {
		k, v, _ := strings.Cut(kv, "=")
		b.WriteString("export " + k + "=" + shellWord(v) + "\n")
	}
	return b.String()
}

// shellWord quotes v for a POSIX shell unless it needs none.
func shellWord(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@%+=,") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// Stats returns the counters.
func (e *Emulator) Stats() Stats {
	st := e.ownStats()
	st.Deliveries = e.api.Webhooks().Stats()
	return st
}

// ownStats is Stats without the delivery counters.
func (e *Emulator) ownStats() Stats {
	e.mu.Lock()
	st := e.stats
	e.mu.Unlock()
	st.Faults = e.faults.count()
	return st
}

func (e *Emulator) pendingSteps() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.steps) + e.applying
}

// Wait blocks until no scheduled change is left (every played-out,
// generated and created batch finished) and no delivery is under way, or
// ctx ends. Batches created afterwards start it over.
func (e *Emulator) Wait(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		if e.pendingSteps() == 0 {
			if err := e.api.Webhooks().Wait(ctx); err != nil {
				return err
			}
			if e.pendingSteps() == 0 { // no change was applied meanwhile
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
