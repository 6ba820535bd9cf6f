package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
)

func (a *app) demoCommand() *cobra.Command {
	var keep string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "A self-contained run on loopback: each completion seen up to three times, its effect run once",
		Long: `Start a local stand-in for the Gemini API and a webhook receiver on free
loopback ports with a temporary database; complete a handful of batches over a
few seconds (one fails, one expires); deliver each completion twice by signed
webhook (one webhook is "lost"), then let a poll pass see them all again. The
effect appends a line per run to a file. Ends with a table: one effect per
completion. Needs no credentials and reaches no network.`,
		Example: `  gemrecon demo
  gemrecon demo --keep /tmp/gemrecon-demo && gemrecon --db /tmp/gemrecon-demo/gemrecon.db status batches/demo-nightly`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runDemo(cmd.Context(), keep)
		},
	}
	cmd.Flags().StringVar(&keep, "keep", "", "keep the database and effect log in this directory (created if missing)")
	return cmd
}

// demoBatch is one batch of the demo's story.
type demoBatch struct {
	id      string
	final   string // terminal state it reaches
	after   time.Duration
	webhook bool // false: its webhook is "lost", only the poll pass finds it
	errMsg  string
}

// demoStory is the demo's script, in order of completion.
func demoStory() []demoBatch {
	return []demoBatch{
		{id: "demo-nightly", final: "SUCCEEDED", after: 200 * time.Millisecond, webhook: true},
		{id: "demo-embeddings", final: "SUCCEEDED", after: 500 * time.Millisecond, webhook: true},
		{id: "demo-quota", final: "FAILED", after: 800 * time.Millisecond, webhook: true, errMsg: "Enqueued token quota exceeded for this model."},
		{id: "demo-stale", final: "EXPIRED", after: 1100 * time.Millisecond, webhook: true},
		{id: "demo-lost-hook", final: "SUCCEEDED", after: 1400 * time.Millisecond, webhook: false},
	}
}

// runDemo is `gemrecon demo`. Everything it starts listens on 127.0.0.1 and
// is stopped before it returns.
func (a *app) runDemo(ctx context.Context, keep string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	story := demoStory()
	out := a.stdout
	say := func(format string, args ...any) {
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
	for _, p := range []string{dbPath, dbPath + "-wal", dbPath + "-shm", logPath} {
		_ = os.Remove(p) // a kept directory starts afresh
	}
	// The demo's own logs would drown the narrative; show warnings only.
	quiet := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// 1. The Gemini API stand-in, with an API key like the real one.
	const apiKey = "demo-api-key"
	api := geminifake.New(geminifake.Options{APIKey: apiKey})
	apiURL, err := api.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer api.Close()
	created := time.Now().Add(-time.Hour)
	api.Add(geminifake.Batch{Name: "batches/demo-running", State: "RUNNING", DisplayName: "still running", CreateTime: created})
	for _, b := range story {
		api.Add(geminifake.Batch{Name: "batches/" + b.id, State: "PENDING", DisplayName: b.id, CreateTime: created})
	}

	// 2. The sink and the effect: one line per run appended to effects.log.
	s, err := sqlite.Open(ctx, dbPath, sink.Options{RetryBase: 100 * time.Millisecond, RetryMax: time.Second})
	if err != nil {
		return err
	}
	defer s.Close()
	effectCmd := `echo "$GEMRECON_KEY $GEMRECON_STATE token=$GEMRECON_TOKEN" >> ` + shellQuote(logPath)
	var runsMu sync.Mutex
	eff := &narratedEffect{inner: effect.NewExec(effectCmd), say: say, mu: &runsMu}
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: eff, Lease: 30 * time.Second, EffectTimeout: 10 * time.Second,
		Concurrency: 4, Grace: 5 * time.Second, Logger: quiet})
	if err != nil {
		return err
	}

	// 3. The webhook receiver, verifying Standard Webhooks signatures.
	secret := "whsec_" + base64.StdEncoding.EncodeToString(randomBytes(24))
	h, err := webhook.NewHandler(webhook.Config{Sink: s, Secrets: []string{secret}, Dispatcher: d, Logger: quiet})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hookURL := "http://" + ln.Addr().String() + "/webhook"
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	workCtx, stopWork := context.WithCancel(ctx)
	var workers sync.WaitGroup
	workers.Add(1)
	go func() { defer workers.Done(); _ = d.Run(workCtx) }()
	defer func() { stopWork(); workers.Wait() }()

	fmt.Fprintf(out, "gemrecon demo: everything runs on loopback; nothing leaves this machine.\n")
	fmt.Fprintf(out, "  Gemini API stand-in  %s\n  webhook receiver     %s (signed per Standard Webhooks)\n  database             %s\n  effect               %s\n\n",
		apiURL, hookURL, dbPath, effectCmd)

	// 4. Batches complete over time; each completion's webhook arrives twice.
	signer, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return err
	}
	deliveries := map[string]int{}
	for _, b := range story {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(start.Add(b.after))):
		}
		name := "batches/" + b.id
		api.Update(name, func(x *geminifake.Batch) {
			x.State, x.EndTime, x.UpdateTime = b.final, time.Now(), time.Now()
			if b.errMsg != "" {
				x.Error = &geminifake.Status{Code: 8, Message: b.errMsg}
			}
		})
		say("%s reached %s", name, b.final)
		if !b.webhook {
			say("  webhook for %s was lost in transit (the poll pass will find it)", name)
			continue
		}
		for i := 1; i <= 2; i++ {
			status, err := deliverDemoWebhook(ctx, hookURL, signer, b, i)
			if err != nil {
				return err
			}
			deliveries[name]++
			say("  webhook delivery %d of %s → %s", i, name, status)
		}
	}

	// 5. A reconciliation pass sees every completion again.
	time.Sleep(200 * time.Millisecond) // let the background workers take the webhooks' keys first
	pc := poller.DefaultConfig()       // the same retries and lookback as `gemrecon poll`
	pc.APIKey, pc.BaseURL, pc.PageSize, pc.Logger = apiKey, apiURL, 2, quiet
	p, err := poller.New(ctx, pc)
	if err != nil {
		return err
	}
	say("poll pass: listing batches through the genai SDK (pages of 2)")
	listed := ingest.Listed{Sink: s, Logger: quiet}
	stats, err := p.Pass(ctx, func(op poller.Operation) error {
		out, err := listed.Record(ctx, op)
		if err != nil {
			return err
		}
		res := out.Result
		verdict := "duplicate (already " + string(res.State) + ")"
		if res.New {
			verdict = "new: the webhook never came"
		}
		say("  listed %s %s → %s", op.Name, op.State, verdict)
		return nil
	})
	if err != nil {
		return fmt.Errorf("poll pass: %w", err)
	}
	say("poll pass done: %d listed, %d terminal, %d API requests", stats.Listed, stats.Terminal, stats.Requests)
	if _, err := d.Drain(ctx); err != nil {
		return err
	}

	// 6. Wait until every completion is done, then show the ledger.
	keys := make([]string, 0, len(story))
	for _, b := range story {
		k, _ := canon.Key("batches/" + b.id)
		keys = append(keys, k)
	}
	if err := waitAllDone(ctx, s, keys); err != nil {
		return err
	}
	if err := s.Flush(ctx); err != nil {
		return err
	}
	runs, err := countEffectRuns(logPath)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tSTATE\tDELIVERIES SEEN\tFIRST SEEN BY\tEFFECTS RUN")
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\n", canon.Name(k), story[i].final, e.SeenCount, e.FirstSource, runs[k])
	}
	tw.Flush()
	fmt.Fprintln(out)
	if !once {
		return fmt.Errorf("demo: some completion did not run its effect exactly once (see %s)", logPath)
	}
	fmt.Fprintf(out, "%d completions, %d deliveries, %d effects: each completion ran its effect once.\n", len(keys), totalSeen, len(keys))
	if keep != "" {
		fmt.Fprintf(out, "Kept %s. Try:\n  gemrecon --db %s status batches/demo-quota\n  gemrecon --db %s stats\n", dir, dbPath, dbPath)
	}
	fmt.Fprintf(out, "Finished in %.1fs.\n", time.Since(start).Seconds())
	return nil
}

// narratedEffect tells the demo's story of each effect run.
type narratedEffect struct {
	inner effect.Effect
	say   func(string, ...any)
	mu    *sync.Mutex
}

func (n *narratedEffect) Run(ctx context.Context, ev effect.Event) error {
	err := n.inner.Run(ctx, ev)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.say("  effect for %s failed: %v", ev.Key, err)
	} else {
		n.say("  effect ran for %s (%s, source %s, attempt %d, token %d)", ev.Key, ev.State, ev.Source, ev.Attempt, ev.Token)
	}
	return err
}

// deliverDemoWebhook sends one signed Gemini-style webhook event and returns
// the receiver's verdict.
func deliverDemoWebhook(ctx context.Context, url string, signer *standardwebhooks.Webhook, b demoBatch, attempt int) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"type":      "batch." + strings.ToLower(b.final),
		"version":   "v1",
		"timestamp": time.Now().UTC().Format(time.RFC3339),
		"data":      map[string]any{"id": b.id, "state": "BATCH_STATE_" + b.final},
	})
	msgID := fmt.Sprintf("msg_%s", b.id) // a redelivery keeps its webhook-id
	now := time.Now()
	sig, err := signer.Sign(msgID, now, body)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", msgID)
	req.Header.Set("webhook-timestamp", fmt.Sprint(now.Unix()))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var reply struct {
		Key    string `json:"key"`
		Status string `json:"status"`
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = json.Unmarshal(raw, &reply)
	return fmt.Sprintf("%d %s", resp.StatusCode, reply.Status), nil
}

func waitAllDone(ctx context.Context, s sink.Sink, keys []string) error {
	deadline := time.Now().Add(15 * time.Second)
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
			return fmt.Errorf("demo: %d completion(s) not done after 15s", pending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
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

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
