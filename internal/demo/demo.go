// Package demo is `gemrecon demo`: a self-contained run on loopback. It
// starts the emulator (internal/emulator: the Gemini API stand-in with its
// WebhookService and key set) and the very wiring of serve — the sink, the
// dispatcher with confirmation and results (dispatch), the receiver
// (serve.Receiver, run by package serve) — and of poll (reconcile.Poll),
// then tells what happened to five batches whose completions arrive by
// signed webhook, twice, or not at all, and are seen again by a poll pass:
// each runs its effect once. Everything it starts is stopped before Run
// returns; it needs no credentials and reaches no network.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/emulator"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/reconcile"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// Config is what one demo run needs.
type Config struct {
	// Stdout receives the story; Stderr the effect's own output (unless
	// EffectOutput says otherwise) and, without a Logger, the wiring's
	// warnings.
	Stdout, Stderr io.Writer
	// Logger receives the logs of everything the demo wires (the sink, the
	// dispatcher, the receiver, the poll pass). nil: warnings and errors
	// as text on Stderr, so that the wiring's logs do not drown the story.
	Logger *slog.Logger
	// EffectOutput is where the effect command's own output goes (an
	// effect.ExecOutput or a handler of its own); nil: Stderr.
	EffectOutput func(effect.OutputLine)
	// Keep, when set, is a directory that keeps the database, the effect
	// log and the results directory (created if missing; what a previous
	// demo left there is removed first). Else a temporary one is removed
	// at the end.
	Keep string
}

// demoBatch is one batch of the demo's story.
type demoBatch struct {
	id       string
	final    string // the terminal state it reaches
	after    time.Duration
	requests int64  // a SUCCEEDED batch's requests (its responses file's lines)
	dynamic  bool   // a per-job webhookConfig pointing at the receiver
	lost     bool   // its webhook is lost: only the poll pass finds it
	errMsg   string // a FAILED batch's error
}

// demoStory is the demo's script, in order of completion.
func demoStory() []demoBatch {
	return []demoBatch{
		{id: "demo-nightly", final: "SUCCEEDED", after: 200 * time.Millisecond, requests: 3},
		{id: "demo-embeddings", final: "SUCCEEDED", after: 500 * time.Millisecond, requests: 2, dynamic: true},
		{id: "demo-quota", final: "FAILED", after: 800 * time.Millisecond, errMsg: "Enqueued token quota exceeded for this model."},
		{id: "demo-stale", final: "EXPIRED", after: 1100 * time.Millisecond},
		{id: "demo-lost-hook", final: "SUCCEEDED", after: 1400 * time.Millisecond, requests: 2, lost: true},
	}
}

// demoShowcase is the webhook-first key whose event document the demo
// shows at the end.
const demoShowcase = "demo-nightly"

// run is one demo run's state: where it writes, what it started.
type run struct {
	cfg   Config
	start time.Time
	story []demoBatch
	outMu sync.Mutex // the emulator's events, the effects and the story all print
	log   *slog.Logger

	dir, dbPath, logPath, resultsDir string
	effectCmd                        string

	emu     *emulator.Emulator
	hookURL string
	secret  string
	sink    sink.Sink
	poller  *poller.Poller
	metrics *metrics.Metrics
	disp    *dispatch.Dispatcher
	eff     *narratedEffect
	server  *serve.Server
}

// say prints one line of the story, stamped with the time since the start.
func (r *run) say(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.cfg.Stdout, "[%4.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run is `gemrecon demo`: the emulator, serve's wiring and a poll pass on
// loopback, and the story of what they did. Everything it starts is
// stopped before it returns.
func Run(ctx context.Context, cfg Config) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	r := &run{cfg: cfg, start: time.Now(), story: demoStory(), log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(cfg.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	cleanup, err := r.prepareDir()
	if err != nil {
		return err
	}
	defer cleanup()
	// 1. The receiver's address first: the emulator delivers to it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	r.hookURL = "http://" + ln.Addr().String() + webhook.DefaultPath
	if err := r.startEmulator(); err != nil {
		return err
	}
	defer r.emu.Close()
	if err := r.openSink(ctx); err != nil {
		return err
	}
	defer r.sink.Close()
	if err := r.startServe(ctx, ln); err != nil {
		return err
	}
	defer r.server.Stop()
	r.intro()
	if err := r.finishBatches(ctx); err != nil {
		return err
	}
	if err := r.pollPass(ctx); err != nil {
		return err
	}
	if err := r.server.Stop(); err != nil {
		return err
	}
	if err := r.sink.Flush(ctx); err != nil {
		return err
	}
	return r.ledger(ctx)
}

// prepareDir chooses the demo's directory (Keep, or a temporary one) and
// clears what an earlier run left there.
func (r *run) prepareDir() (cleanup func(), err error) {
	cleanup = func() {}
	r.dir = r.cfg.Keep
	if r.dir == "" {
		tmp, err := os.MkdirTemp("", "gemrecon-demo-")
		if err != nil {
			return cleanup, err
		}
		cleanup = func() { os.RemoveAll(tmp) }
		r.dir = tmp
	} else if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return cleanup, fmt.Errorf("demo: the directory to keep, %s: %w", r.dir, err)
	}
	r.dbPath = filepath.Join(r.dir, "gemrecon.db")
	r.logPath = filepath.Join(r.dir, "effects.log")
	r.resultsDir = filepath.Join(r.dir, "results")
	for _, p := range []string{r.dbPath, r.dbPath + "-wal", r.dbPath + "-shm", r.logPath} {
		_ = os.Remove(p) // a kept directory starts afresh
	}
	return cleanup, os.RemoveAll(r.resultsDir)
}

// startEmulator starts the Gemini API stand-in, its WebhookService and the
// key set of dynamic signatures. Every delivery is sent twice (as when an
// acknowledgement is lost); the lost-hook batch's is dropped. Then it
// registers a static webhook, as `gemrecon webhooks create` does.
func (r *run) startEmulator() error {
	lost := map[string]bool{}
	for _, b := range r.story {
		lost["batches/"+b.id] = b.lost
	}
	emu, err := emulator.New(emulator.Config{
		Listen:    "127.0.0.1:0",
		Seed:      1,
		Duplicate: 1,
		Delivery: geminifake.WebhookOptions{
			BackoffBase: 200 * time.Millisecond, BackoffMax: time.Second,
			DropIf: func(ev geminifake.Event) bool { return lost[ev.Batch()] },
		},
		OnEvent: func(ev emulator.Event) { narrateEmulator(r.say, ev) },
	})
	if err != nil {
		return err
	}
	if err := emu.Start(); err != nil {
		return err
	}
	r.emu = emu
	emu.API().Add(geminifake.Batch{Name: "batches/demo-running", State: "RUNNING", DisplayName: "still running", CreateTime: time.Now().Add(-time.Hour)})
	_, r.secret, err = emu.API().Webhooks().Create("gemrecon-demo", r.hookURL, []string{"batch.succeeded", "batch.failed", "batch.expired"})
	return err
}

// openSink opens the demo's database and the poller every API request goes
// through (the emulator's generated API key).
func (r *run) openSink(ctx context.Context) error {
	s, err := sqlite.Open(ctx, r.dbPath, sink.Options{RetryBase: 100 * time.Millisecond, RetryMax: time.Second}, sqlite.WithLogger(r.log))
	if err != nil {
		return err
	}
	r.sink = s
	pc := poller.DefaultConfig()
	pc.APIKey, pc.BaseURL, pc.QPS, pc.PageSize, pc.Logger = r.emu.APIKey(), r.emu.URL(), 0, 2, r.log
	r.poller, err = poller.New(ctx, pc)
	return err
}

// startServe builds the dispatcher as serve does — it confirms
// webhook-first keys with the emulator and writes succeeded batches'
// results before their effect runs — and serve's receiver: HMAC with the
// webhook's secret, and the dynamic signatures of per-job webhooks against
// the emulator's key set; then runs them (package serve).
func (r *run) startServe(ctx context.Context, ln net.Listener) error {
	dir, err := results.Open(r.resultsDir)
	if err != nil {
		return err
	}
	r.effectCmd = `echo "$GEMRECON_KEY $GEMRECON_BATCH_STATE confirmed=$GEMRECON_CONFIRMED token=$GEMRECON_TOKEN results=${GEMRECON_RESULTS_FILE:-none}" >> ` + shellQuote(r.logPath)
	out := r.cfg.EffectOutput
	if out == nil {
		out = effect.ExecOutput(r.cfg.Stderr)
	}
	r.eff = &narratedEffect{inner: effect.NewExec(r.effectCmd, out), say: r.say, dir: r.dir, seen: map[string]effect.Event{}}
	r.metrics = metrics.New(r.sink)
	dc := dispatch.DefaultConfig()
	dc.Sink, dc.Effect, dc.Lease, dc.EffectTimeout, dc.Grace = r.sink, r.eff, 30*time.Second, 10*time.Second, 5*time.Second
	dc.Logger, dc.Observer, dc.Confirm, dc.API, dc.Results = r.log, r.metrics, true, r.poller, dir
	dc.RecheckBase, dc.RecheckMax, dc.DownloadTimeout = 100*time.Millisecond, time.Second, time.Minute
	if r.disp, err = dispatch.New(dc); err != nil {
		return err
	}
	dyn, err := dynamic.New(dynamic.Config{JWKSURL: r.emu.JWKSURL(), Log: r.log})
	if err != nil {
		return err
	}
	wc := webhook.DefaultConfig()
	wc.Secrets, wc.Dynamic, wc.Dispatcher, wc.Metrics, wc.Logger = []string{r.secret}, dyn, r.disp, r.metrics, r.log
	h, err := serve.Receiver(wc, r.sink)
	if err != nil {
		return err
	}
	r.server = serve.Start(ctx, serve.Config{Listener: ln, Handler: h, Dispatcher: r.disp, Logger: r.log,
		// The default drain: net/http's Shutdown waits up to 5 s for a
		// connection accepted with no request yet, so a 5 s drain could
		// time out on a slow machine with nothing in flight.
		Server: webhook.ServerOptions{Logger: r.log}})
	return nil
}

// intro says what runs where.
func (r *run) intro() {
	out := r.cfg.Stdout
	fmt.Fprintf(out, "gemrecon demo: everything runs on loopback; nothing leaves this machine.\n")
	fmt.Fprintf(out, "  Gemini API emulator  %s (API key %s, generated)\n", r.emu.URL(), r.emu.APIKey())
	fmt.Fprintf(out, "  webhook receiver     %s (HMAC for the static webhook; v1a/JWT from %s for per-job ones)\n", r.hookURL, r.emu.JWKSURL())
	fmt.Fprintf(out, "  database             %s\n  results              %s\n  effect               %s\n\n", r.dbPath, r.resultsDir, r.effectCmd)
	r.say("registered a static webhook for %s (what `gemrecon webhooks create` does)", r.hookURL)
}

// keys are the story's keys, and those whose webhook is not lost.
func (r *run) keys() (all, hooked []string) {
	for _, b := range r.story {
		k, _ := canon.Key("batches/" + b.id)
		all = append(all, k)
		if !b.lost {
			hooked = append(hooked, k)
		}
	}
	return all, hooked
}

// finishBatches lets the batches finish over time; the emulator delivers
// their events, and the webhooks' keys run first (confirmed, results
// written), so that the poll pass finds them done.
func (r *run) finishBatches(ctx context.Context) error {
	for _, b := range r.story {
		fb := geminifake.Batch{Name: "batches/" + b.id, State: b.final, DisplayName: b.id, Model: "models/gemini-2.5-flash", RequestCount: b.requests}
		if b.requests > 0 {
			fb.SuccessfulCount, fb.ResponsesFile = b.requests, "files/"+b.id
		}
		if b.errMsg != "" {
			fb.Error = &geminifake.Status{Code: 8, Message: b.errMsg}
		}
		if b.dynamic {
			fb.WebhookConfig = &geminifake.WebhookConfig{Uris: []string{r.hookURL}, UserMetadata: map[string]any{"pipeline": "embeddings"}}
		}
		if err := r.emu.Schedule(fb, b.after); err != nil {
			return err
		}
	}
	if err := r.emu.Wait(ctx); err != nil {
		return fmt.Errorf("demo: waiting for the emulator's batches and deliveries: %w", err)
	}
	_, hooked := r.keys()
	return waitAllDone(ctx, r.sink, hooked)
}

// pollPass runs a reconciliation pass, as `gemrecon poll` does: it sees
// every completion again.
func (r *run) pollPass(ctx context.Context) error {
	r.say("poll pass: listing batches through the genai SDK (pages of 2), as `gemrecon poll` does")
	loop, err := reconcile.NewPoll(reconcile.PollConfig{Sink: r.sink, Poller: r.poller, Dispatcher: r.disp, Metrics: r.metrics,
		FullScanEvery: reconcile.DefaultFullScanEvery, PassLease: reconcile.DefaultPassLease, Logger: r.log})
	if err != nil {
		return err
	}
	res := loop.Pass(ctx)
	if err := res.Err(); err != nil {
		return fmt.Errorf("poll pass: %w", err)
	}
	r.say("  %s", res.Summary())
	keys, _ := r.keys()
	if err := waitAllDone(ctx, r.sink, keys); err != nil {
		return err
	}
	for _, k := range keys {
		if e, err := r.sink.Get(ctx, k); err == nil && e.FirstSource == sink.SourcePoll {
			r.say("  %s was new to the pass: its webhook never came", canon.Name(k))
		}
	}
	return nil
}

// ledger prints the table — one effect per completion — and what one
// webhook-first key's effect received.
func (r *run) ledger(ctx context.Context) error {
	runs, err := countEffectRuns(r.logPath)
	if err != nil {
		return err
	}
	out := r.cfg.Stdout
	keys, _ := r.keys()
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tBATCH\tDELIVERIES SEEN\tFIRST SEEN BY\tCONFIRMED\tEFFECTS RUN")
	totalSeen, once := 0, true
	for i, k := range keys {
		e, err := r.sink.Get(ctx, k)
		if err != nil {
			return err
		}
		totalSeen += int(e.SeenCount)
		if runs[k] != 1 {
			once = false
		}
		first := e.FirstSource
		if r.story[i].dynamic && first == sink.SourceWebhook {
			first += " (per-job)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%t\t%d\n", canon.Name(k), e.BatchState, e.SeenCount, first, e.Confirmed, runs[k])
	}
	tw.Flush()
	fmt.Fprintln(out)
	if !once {
		return fmt.Errorf("demo: some completion did not run its effect exactly once (see %s)", r.logPath)
	}
	fmt.Fprintf(out, "%d completions, %d deliveries, %d effects: each completion ran its effect once.\n", len(keys), totalSeen, len(keys))
	if err := r.eff.showcase(out, "gemini:batches/"+demoShowcase); err != nil {
		return err
	}
	if r.cfg.Keep != "" {
		fmt.Fprintf(out, "Kept %s. Try:\n  gemrecon --db %s status batches/demo-quota\n  gemrecon --db %s stats\n", r.dir, r.dbPath, r.dbPath)
	}
	fmt.Fprintf(out, "Finished in %.1fs.\n", time.Since(r.start).Seconds())
	return nil
}

// narrateEmulator tells what the emulator did: batches finishing, and each
// delivery attempt with the receiver's answer.
func narrateEmulator(say func(string, ...any), ev emulator.Event) {
	switch ev.Kind {
	case emulator.KindFinished:
		say("%s reached %s", ev.Batch, ev.State)
	case emulator.KindDelivery:
		d := ev.Delivery
		kind := "static webhook (HMAC)"
		if d.WebhookID == "" {
			kind = "per-job webhook (v1a + JWT)"
		}
		switch d.Outcome {
		case geminifake.OutcomeDropped:
			say("  the webhook for %s was lost in transit (the poll pass will find it)", ev.Batch)
		case geminifake.OutcomeDuplicate:
			say("  %s delivered %s again (same webhook-id) → %d", kind, ev.Batch, d.Status)
		default:
			say("  %s delivered %s → %d (attempt %d)", kind, ev.Batch, d.Status, d.Attempt)
		}
	}
}

// narratedEffect tells the demo's story of each effect run and keeps the
// event documents it ran with.
type narratedEffect struct {
	inner effect.Effect
	say   func(string, ...any)
	dir   string
	mu    sync.Mutex
	seen  map[string]effect.Event
}

func (n *narratedEffect) Run(ctx context.Context, ev effect.Event) error {
	err := n.inner.Run(ctx, ev)
	if err != nil {
		n.say("  effect for %s failed: %v", ev.Key, err)
		return err
	}
	n.mu.Lock()
	n.seen[ev.Key] = ev
	n.mu.Unlock()
	results := "no results file"
	if ev.ResultsFile != "" {
		rel, _ := filepath.Rel(n.dir, ev.ResultsFile)
		results = "results in " + rel
	}
	confirmed := "confirmed by the API"
	if !ev.Confirmed {
		confirmed = "unconfirmed"
	}
	n.say("  effect ran for %s: %s, first seen by %s, %s, %s (attempt %d, token %d)",
		ev.Key, ev.BatchState, ev.Source, confirmed, results, ev.Attempt, ev.Token)
	return nil
}

// showcase prints what the effect of key received: the webhook that came
// first, the API's operation that replaced it, and the results file.
func (n *narratedEffect) showcase(out io.Writer, key string) error {
	n.mu.Lock()
	ev, ok := n.seen[key]
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("demo: no effect ran for %s", key)
	}
	fmt.Fprintf(out, "\nThe effect of %s (first seen by webhook) received, on stdin and as GEMRECON_*:\n", canon.Name(key))
	fmt.Fprintf(out, "  webhook       %s\n", clipJSON(ev.Webhook, 200))
	fmt.Fprintf(out, "  operation     %s\n", operationSummary(ev.Operation))
	fmt.Fprintf(out, "                (the API's, fetched with Batches.Get before the effect ran: confirmed=%t, batch_state=%s)\n", ev.Confirmed, ev.BatchState)
	if ev.ResultsFile == "" {
		return fmt.Errorf("demo: %s ran without its results file", key)
	}
	lines, first, err := firstLine(ev.ResultsFile)
	if err != nil {
		return fmt.Errorf("demo: reading %s: %w", ev.ResultsFile, err)
	}
	fmt.Fprintf(out, "  results_file  %s (%d lines, written before the effect ran)\n", ev.ResultsFile, lines)
	fmt.Fprintf(out, "                %s\n\n", clipJSON([]byte(first), 110))
	return nil
}

// operationSummary shows the fields of a batch operation an effect reads
// most: its name, state, counts and output.
func operationSummary(raw []byte) string {
	var op struct {
		Name     string `json:"name"`
		Metadata struct {
			State      string          `json:"state"`
			BatchStats json.RawMessage `json:"batchStats"`
			Output     json.RawMessage `json:"output"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &op); err != nil || op.Name == "" {
		return clipJSON(raw, 110)
	}
	s := op.Name + ": metadata.state " + op.Metadata.State
	if len(op.Metadata.BatchStats) > 0 {
		s += ", batchStats " + clipJSON(op.Metadata.BatchStats, 80)
	}
	if len(op.Metadata.Output) > 0 {
		s += ", output " + clipJSON(op.Metadata.Output, 80)
	}
	return s
}

// clipJSON compacts a JSON document to one line of at most n bytes.
func clipJSON(raw []byte, n int) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		b.Reset()
		b.Write(raw)
	}
	s := b.String()
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// firstLine counts a file's lines and returns the first.
func firstLine(path string) (int, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	n, first := 0, ""
	for sc.Scan() {
		if n == 0 {
			first = sc.Text()
		}
		n++
	}
	return n, first, sc.Err()
}

func waitAllDone(ctx context.Context, s sink.Sink, keys []string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		pending := 0
		for _, k := range keys {
			e, err := s.Get(ctx, k)
			if err != nil && !errors.Is(err, sink.ErrNotFound) {
				return err
			}
			if err != nil || e.State != sink.StateDone {
				pending++
			}
		}
		if pending == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: %d completion(s) not done after 20s", pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// countEffectRuns reads the effect log: one line per run, the key first.
func countEffectRuns(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	runs := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 0 {
			runs[fields[0]]++
		}
	}
	return runs, sc.Err()
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
