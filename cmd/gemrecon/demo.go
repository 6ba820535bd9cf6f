package main

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

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/emulator"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
)

func (a *app) demoCommand() *cobra.Command {
	var keep string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "A self-contained run on loopback: each completion seen up to three times, its effect run once",
		Long: `Start the emulator (the Gemini API stand-in of 'gemrecon emulator', with its
WebhookService and key set) and serve's webhook receiver on free loopback
ports with a temporary database; five batches finish over about a second and a
half (one fails, one expires). Their completions arrive by signed webhook —
four through a static webhook (HMAC), one through a per-job webhookConfig
(signed with the emulator's published keys) — each delivered twice, except one
that is "lost"; then a poll pass sees them all again. Every key first seen by
webhook is confirmed with the API (Batches.Get) before its effect runs, and a
succeeded batch's results are written to a results directory first. The
effect appends a line per run to a file. Ends with a table — one effect per
completion — and what one webhook-first key's effect received. Needs no
credentials and reaches no network.`,
		Example: `  gemrecon demo
  gemrecon demo --keep /tmp/gemrecon-demo && gemrecon --db /tmp/gemrecon-demo/gemrecon.db status batches/demo-nightly`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runDemo(cmd.Context(), keep)
		},
	}
	cmd.Flags().StringVar(&keep, "keep", "", "keep the database, the effect log and the results directory in this directory (created if missing)")
	return cmd
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

// runDemo is `gemrecon demo`: the emulator of `gemrecon emulator`, and the
// very wiring of serve (webhook.NewHandler, webhook.Serve, the dispatcher
// with confirmation and results) and of poll (ingest.Poll), on loopback.
// Everything it starts is stopped before it returns.
func (a *app) runDemo(ctx context.Context, keep string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	start := time.Now()
	story := demoStory()
	var outMu sync.Mutex // the emulator's events, the effects and the story all print
	out := a.stdout
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "[%4.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	dir := keep
	if dir == "" {
		tmp, err := os.MkdirTemp("", "gemrecon-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--keep %s: %w", dir, err)
	}
	dbPath := filepath.Join(dir, "gemrecon.db")
	logPath := filepath.Join(dir, "effects.log")
	resultsDir := filepath.Join(dir, "results")
	for _, p := range []string{dbPath, dbPath + "-wal", dbPath + "-shm", logPath} {
		_ = os.Remove(p) // a kept directory starts afresh
	}
	if err := os.RemoveAll(resultsDir); err != nil {
		return err
	}
	// The demo's own logs would drown the narrative: the commands' wiring
	// runs with a logger that shows warnings only.
	quiet := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	q := &app{ctx: ctx, stdin: a.stdin, stdout: a.stdout, stderr: a.stderr, logger: quiet, logFormat: "text", logLevel: "warn", db: dbPath}

	// 1. The receiver's address first: the emulator delivers to it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	hookURL := "http://" + ln.Addr().String() + webhook.DefaultPath

	// 2. The emulator: the Gemini API stand-in, its WebhookService and the
	// key set of dynamic signatures. Every delivery is sent twice (as when
	// an acknowledgement is lost); the lost-hook batch's is dropped.
	lost := map[string]bool{}
	for _, b := range story {
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
		OnEvent: func(ev emulator.Event) { narrateEmulator(say, ev) },
	})
	if err != nil {
		return err
	}
	if err := emu.Start(); err != nil {
		return err
	}
	defer emu.Close()
	emu.API().Add(geminifake.Batch{Name: "batches/demo-running", State: "RUNNING", DisplayName: "still running", CreateTime: time.Now().Add(-time.Hour)})
	// What `gemrecon webhooks create` does: a static webhook, and its
	// signing secret for the receiver.
	_, secret, err := emu.API().Webhooks().Create("gemrecon-demo", hookURL, []string{"batch.succeeded", "batch.failed", "batch.expired"})
	if err != nil {
		return err
	}

	// 3. The sink, and the dispatcher as serve builds it: it confirms
	// webhook-first keys with the emulator (its generated API key) and
	// writes succeeded batches' results before their effect runs.
	s, err := sqlite.Open(ctx, dbPath, sink.Options{RetryBase: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	effectCmd := `echo "$GEMRECON_KEY $GEMRECON_BATCH_STATE confirmed=$GEMRECON_CONFIRMED token=$GEMRECON_TOKEN results=${GEMRECON_RESULTS_FILE:-none}" >> ` + shellQuote(logPath)
	ef := effectFlags{exec: effectCmd, concurrency: 4, lease: 30 * time.Second, effectTimeout: 10 * time.Second,
		grace: 5 * time.Second, maxAttempts: sink.DefaultMaxAttempts, retryBase: 100 * time.Millisecond, retryMax: time.Second}
	pf := pollFlags{backend: "gemini", baseURL: emu.URL(), qps: 0, burst: 1, pageSize: 2, lookback: 72 * time.Hour,
		fullScanEvery: ingest.DefaultFullScanEvery, passLease: ingest.DefaultPassLease}
	cf := confirmFlags{mode: confirmAuto, resultsDir: resultsDir, downloadTimeout: time.Minute}
	p, err := q.pollerWithKey(ctx, &pf, emu.APIKey())
	if err != nil {
		return err
	}
	api, err := q.setupAPI(ctx, &pf, &cf, p)
	if err != nil {
		return err
	}
	inner, err := q.effect(&ef)
	if err != nil {
		return err
	}
	eff := &narratedEffect{inner: inner, say: say, dir: dir, seen: map[string]effect.Event{}}
	m := metrics.New(s)
	d, err := q.dispatcherFor(s, eff, &ef, m.Observer(), api, &cf)
	if err != nil {
		return err
	}

	// 4. serve's receiver: HMAC with the webhook's secret, and the dynamic
	// signatures of per-job webhooks against the emulator's key set.
	dyn, err := q.dynamicVerifier(emu.JWKSURL(), "")
	if err != nil {
		return err
	}
	h, err := webhook.NewHandler(webhook.Config{Sink: s, Secrets: []string{secret}, Dynamic: dyn, Dispatcher: d, Metrics: m, Logger: quiet})
	if err != nil {
		return err
	}
	serveCtx, stopServing := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- webhook.Serve(serveCtx, ln, h, webhook.ServerOptions{DrainTimeout: 5 * time.Second, Logger: quiet})
	}()
	workCtx, stopWork := context.WithCancel(ctx)
	workers := make(chan error, 1)
	go func() { workers <- d.Run(workCtx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stopServing()
		err := <-served
		stopWork()
		if werr := <-workers; werr != nil && !errors.Is(werr, context.Canceled) && err == nil {
			err = werr
		}
		return err
	}
	defer stop()

	fmt.Fprintf(out, "gemrecon demo: everything runs on loopback; nothing leaves this machine.\n")
	fmt.Fprintf(out, "  Gemini API emulator  %s (API key %s, generated)\n", emu.URL(), emu.APIKey())
	fmt.Fprintf(out, "  webhook receiver     %s (HMAC for the static webhook; v1a/JWT from %s for per-job ones)\n", hookURL, emu.JWKSURL())
	fmt.Fprintf(out, "  database             %s\n  results              %s\n  effect               %s\n\n", dbPath, resultsDir, effectCmd)
	say("registered a static webhook for %s (what `gemrecon webhooks create` does)", hookURL)

	// 5. The batches finish over time; the emulator delivers their events.
	for _, b := range story {
		fb := geminifake.Batch{Name: "batches/" + b.id, State: b.final, DisplayName: b.id, Model: "models/gemini-2.5-flash", RequestCount: b.requests}
		if b.requests > 0 {
			fb.SuccessfulCount, fb.ResponsesFile = b.requests, "files/"+b.id
		}
		if b.errMsg != "" {
			fb.Error = &geminifake.Status{Code: 8, Message: b.errMsg}
		}
		if b.dynamic {
			fb.WebhookConfig = &geminifake.WebhookConfig{Uris: []string{hookURL}, UserMetadata: map[string]any{"pipeline": "embeddings"}}
		}
		if err := emu.Schedule(fb, b.after); err != nil {
			return err
		}
	}
	if err := emu.Wait(ctx); err != nil {
		return fmt.Errorf("demo: waiting for the emulator's batches and deliveries: %w", err)
	}
	keys := make([]string, 0, len(story))
	var hooked []string
	for _, b := range story {
		k, _ := canon.Key("batches/" + b.id)
		keys = append(keys, k)
		if !b.lost {
			hooked = append(hooked, k)
		}
	}
	// The webhooks' keys run first (confirmed, results written), so that
	// the poll pass below finds them done.
	if err := waitAllDone(ctx, s, hooked); err != nil {
		return err
	}

	// 6. A reconciliation pass, as `gemrecon poll` runs it, sees every
	// completion again.
	say("poll pass: listing batches through the genai SDK (pages of 2), as `gemrecon poll` does")
	loop, err := q.pollLoop(s, p, d, m, &pf, loopOptions{})
	if err != nil {
		return err
	}
	r := loop.Pass(ctx)
	if err := r.Err(); err != nil {
		return fmt.Errorf("poll pass: %w", err)
	}
	say("  %s", r.Summary())
	if err := waitAllDone(ctx, s, keys); err != nil {
		return err
	}
	for _, k := range keys {
		if e, err := s.Get(ctx, k); err == nil && e.FirstSource == sink.SourcePoll {
			say("  %s was new to the pass: its webhook never came", canon.Name(k))
		}
	}
	if err := stop(); err != nil {
		return err
	}
	if err := s.Flush(ctx); err != nil {
		return err
	}

	// 7. The ledger.
	runs, err := countEffectRuns(logPath)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tBATCH\tDELIVERIES SEEN\tFIRST SEEN BY\tCONFIRMED\tEFFECTS RUN")
	totalSeen, once := 0, true
	for i, k := range keys {
		e, err := s.Get(ctx, k)
		if err != nil {
			return err
		}
		totalSeen += int(e.SeenCount)
		if runs[k] != 1 {
			once = false
		}
		first := e.FirstSource
		if story[i].dynamic && first == sink.SourceWebhook {
			first += " (per-job)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%t\t%d\n", canon.Name(k), e.BatchState, e.SeenCount, first, e.Confirmed, runs[k])
	}
	tw.Flush()
	fmt.Fprintln(out)
	if !once {
		return fmt.Errorf("demo: some completion did not run its effect exactly once (see %s)", logPath)
	}
	fmt.Fprintf(out, "%d completions, %d deliveries, %d effects: each completion ran its effect once.\n", len(keys), totalSeen, len(keys))
	if err := eff.showcase(out, "gemini:batches/"+demoShowcase); err != nil {
		return err
	}
	if keep != "" {
		fmt.Fprintf(out, "Kept %s. Try:\n  gemrecon --db %s status batches/demo-quota\n  gemrecon --db %s stats\n", dir, dbPath, dbPath)
	}
	fmt.Fprintf(out, "Finished in %.1fs.\n", time.Since(start).Seconds())
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
