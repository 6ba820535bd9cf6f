package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/emulator"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// emuProc is `gemrecon emulator` running as a child process.
type emuProc struct {
	cmd            *exec.Cmd
	stdout, stderr *testkit.Buffer
	done           chan error
	url, key, jwks string
}

// startEmulator starts `gemrecon --log-format json emulator --listen
// 127.0.0.1:0 args…` and reads the base URL, key and JWKS URL from the
// exports it prints. SIGTERM stops it at cleanup.
func startEmulator(t *testing.T, args ...string) *emuProc {
	t.Helper()
	p := &emuProc{stdout: &testkit.Buffer{}, stderr: &testkit.Buffer{}, done: make(chan error, 1)}
	p.cmd = child(t, append([]string{"--log-format", "json", "emulator", "--listen", "127.0.0.1:0"}, args...)...)
	p.cmd.Env = append(p.cmd.Env, "GOOGLE_API_KEY=")
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })
	deadline := time.Now().Add(60 * time.Second)
	for p.jwks == "" {
		for _, line := range strings.Split(p.stdout.String(), "\n") {
			if kv, ok := strings.CutPrefix(line, "export "); ok {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "GEMINI_API_KEY":
					p.key = v
				case "GOOGLE_GEMINI_BASE_URL":
					p.url = v
				case "GEMRECON_JWKS_URL":
					p.jwks = v
				}
			}
		}
		select {
		case err := <-p.done:
			t.Fatalf("the emulator exited (%v) before printing its exports\nstdout:\n%s\nstderr:\n%s", err, p.stdout, p.stderr)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exports within 60s\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
	}
	return p
}

// stop sends SIGTERM and waits (bounded) for the exit.
func (p *emuProc) stop(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Errorf("the emulator exited with %v after SIGTERM\n%s", err, p.stderr)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		t.Errorf("the emulator did not stop within 30s of SIGTERM")
	}
}

// status reads GET /emulator/status.
func (p *emuProc) status(t *testing.T) emulator.Status {
	t.Helper()
	resp, err := http.Get(p.url + emulator.StatusPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st emulator.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// waitIdle waits (bounded) until the emulator is idle and cond holds.
func (p *emuProc) waitIdle(t *testing.T, cond func(emulator.Status) bool) emulator.Status {
	t.Helper()
	var st emulator.Status
	waitFor(t, 60*time.Second, func() bool {
		st = p.status(t)
		return st.Idle && cond(st)
	})
	return st
}

// events returns the logged events with this message.
func (p *emuProc) events(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

func (p *emuProc) client(t *testing.T) *genai.Client {
	t.Helper()
	return genaitest.Client(t, p.url, p.key)
}

// The exports work as printed: with GOOGLE_GEMINI_BASE_URL and the key in
// the environment (no base URL in the config) the SDK's List and Get see
// the generated batches finish over time, in every outcome; an unknown
// name is 404.
func TestEmulatorBatchesFinishOverTime(t *testing.T) {
	p := startEmulator(t, "--batches", "8", "--finish-within", "4s", "--seed", "7")
	t.Setenv("GOOGLE_GEMINI_BASE_URL", p.url)
	t.Setenv("GEMINI_API_KEY", p.key)
	t.Setenv("GOOGLE_API_KEY", "")
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{Backend: genai.BackendGeminiAPI})
	if err != nil {
		t.Fatal(err)
	}
	first := genaitest.ListAll(t, c, 5)
	if len(first) != 8 {
		t.Fatalf("listed %d batches, want 8", len(first))
	}
	var pendingName string
	for name, b := range first {
		if !genaitest.Terminal(b.State) {
			pendingName = name
		}
	}
	if pendingName == "" {
		t.Fatalf("every batch had finished at the first listing: %v", first)
	}
	var last map[string]*genai.BatchJob
	waitFor(t, 60*time.Second, func() bool {
		last = genaitest.ListAll(t, c, 5)
		for _, b := range last {
			if !genaitest.Terminal(b.State) {
				return false
			}
		}
		return true
	})
	states := map[genai.JobState]bool{}
	for _, b := range last {
		states[b.State] = true
	}
	if len(states) != 4 {
		t.Errorf("outcomes %v, want SUCCEEDED, FAILED, EXPIRED and CANCELLED", states)
	}
	got, err := c.Batches.Get(context.Background(), pendingName, nil)
	if err != nil || !genaitest.Terminal(got.State) || got.EndTime.Before(got.CreateTime) {
		t.Errorf("Get %s after the run: %+v, %v", pendingName, got, err)
	}
	_, err = c.Batches.Get(context.Background(), "batches/nope", nil)
	var ae genai.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusNotFound {
		t.Errorf("Get of an unknown batch: %v, want 404", err)
	}
	for _, ev := range p.events("batch finished") {
		if ev["state"] == "FAILED" && ev["reason"] == "" {
			t.Errorf("a FAILED batch without a reason: %v", ev)
		}
	}
	if n := len(p.events("batch finished")); n != 8 {
		t.Errorf("%d batch-finished events, want 8\n%s", n, p.stderr)
	}
}

// dynReceiver verifies each dynamic delivery with package webhook/dynamic
// against the emulator's JWKS, entry by entry, and answers 200.
type dynReceiver struct {
	srv *httptest.Server
	v   *dynamic.Verifier
	mu  sync.Mutex
	got []dynDelivery
}

type dynDelivery struct {
	header  http.Header
	body    []byte
	schemes []dynamic.Scheme
	errs    []error
}

func newDynReceiver(t *testing.T) *dynReceiver {
	t.Helper()
	rc := &dynReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d := dynDelivery{header: r.Header.Clone(), body: body}
		rc.mu.Lock()
		v := rc.v
		rc.mu.Unlock()
		for _, entry := range strings.Fields(r.Header.Get("webhook-signature")) {
			one := r.Header.Clone()
			one.Set("webhook-signature", entry)
			res, err := v.Verify(r.Context(), body, one)
			d.schemes = append(d.schemes, res.Scheme)
			d.errs = append(d.errs, err)
		}
		rc.mu.Lock()
		rc.got = append(rc.got, d)
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *dynReceiver) use(t *testing.T, jwksURL string) {
	t.Helper()
	v, err := dynamic.New(dynamic.Config{JWKSURL: jwksURL})
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	rc.v = v
	rc.mu.Unlock()
}

func (rc *dynReceiver) all() []dynDelivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got)
}

// Batches.Create through the SDK with a webhookConfig: after
// --created-finish-after the batch succeeds, and its completion reaches the
// webhookConfig's URI signed as --dynamic-signature says; package
// webhook/dynamic verifies v1a and JWT against the JWKS the emulator
// serves on its own listener.
func TestEmulatorCreateDeliversDynamically(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		mode string
		want []dynamic.Scheme
	}{
		{"both", []dynamic.Scheme{dynamic.SchemeV1a, dynamic.SchemeJWT}},
		{"v1a", []dynamic.Scheme{dynamic.SchemeV1a}},
		{"jwt", []dynamic.Scheme{dynamic.SchemeJWT}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			rc := newDynReceiver(t)
			p := startEmulator(t, "--created-finish-after", "500ms", "--dynamic-signature", tc.mode)
			rc.use(t, p.jwks)
			c := p.client(t)
			job, err := c.Batches.Create(context.Background(), "gemini-2.5-flash", &genai.BatchJobSource{
				InlinedRequests: []*genai.InlinedRequest{{Contents: genai.Text("Hello?"), Metadata: map[string]string{"key": "k1"}}},
			}, &genai.CreateBatchJobConfig{WebhookConfig: &genai.WebhookConfig{
				Uris: []string{rc.srv.URL + "/webhook"}, UserMetadata: map[string]any{"run": "r-9"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if job.State != genai.JobStatePending {
				t.Errorf("created batch is %s, want PENDING", job.State)
			}
			waitFor(t, 60*time.Second, func() bool { return len(rc.all()) > 0 })
			d := rc.all()[0]
			if !slices.Equal(d.schemes, tc.want) || errors.Join(d.errs...) != nil {
				t.Fatalf("signature entries verified as %v (errors %v), want %v", d.schemes, d.errs, tc.want)
			}
			var ev struct {
				Type string `json:"type"`
				Data struct {
					ID           string            `json:"id"`
					UserMetadata map[string]string `json:"user_metadata"`
				} `json:"data"`
			}
			if err := json.Unmarshal(d.body, &ev); err != nil || ev.Type != "batch.succeeded" || "batches/"+ev.Data.ID != job.Name || ev.Data.UserMetadata["run"] != "r-9" {
				t.Errorf("delivered %s (%v)", d.body, err)
			}
			got, err := c.Batches.Get(context.Background(), job.Name, nil)
			if err != nil || got.State != genai.JobStateSucceeded || got.Dest == nil || len(got.Dest.InlinedResponses) != 1 ||
				got.Dest.InlinedResponses[0].Metadata["key"] != "k1" || got.Dest.InlinedResponses[0].Response.Text() == "" {
				t.Errorf("Get after the delivery: %+v, %v", got, err)
			}
			waitFor(t, 30*time.Second, func() bool { return len(p.events("delivery")) > 0 })
			if ev := p.events("delivery")[0]; ev["webhook"] != "dynamic" || ev["outcome"] != "delivered" || ev["status"] != float64(200) || ev["batch"] != job.Name {
				t.Errorf("delivery event %v", ev)
			}
		})
	}
}

// `gemrecon webhooks create` (the CLI) registers a static webhook with the
// emulator; the batches that finish afterwards reach it signed with the
// secret create wrote, which webhook.Verifier accepts.
func TestEmulatorStaticWebhookFromCLI(t *testing.T) {
	parallel(t)
	p := startEmulator(t, "--batches", "6", "--finish-within", "3s", "--seed", "3")
	rc := newHookReceiver(t)
	secrets := filepath.Join(t.TempDir(), "whsec")
	r := gemreconWith(t, []string{"GEMINI_API_KEY=" + p.key, "GOOGLE_API_KEY="}, "webhooks", "--base-url", p.url, "create", "--url", rc.srv.URL+"/webhook",
		"--events", "batch.succeeded,batch.failed,batch.expired,batch.cancelled", "--secret-file", secrets)
	wantCode(t, r, exitOK)
	p.waitIdle(t, func(st emulator.Status) bool { return st.Finished == 6 })
	p.stop(t)
	delivered := 0
	for _, ev := range p.events("delivery") {
		if ev["webhook"] == "static" && ev["outcome"] == "delivered" {
			delivered++
		}
	}
	if delivered == 0 || rc.count() != delivered {
		t.Fatalf("the receiver got %d requests, the emulator logged %d static deliveries\n%s", rc.count(), delivered, p.stderr)
	}
	list, err := webhook.LoadSecrets("", secrets)
	if err != nil {
		t.Fatal(err)
	}
	v, err := webhook.NewVerifier(list, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, g := range rc.got {
		if err := v.Verify(g.body, g.h); err != nil {
			t.Errorf("a static delivery did not verify: %v\n%s", err, g.body)
		}
	}
}

// --drop and --duplicate are seeded: the receiver gets every delivered
// message, duplicates twice with the same webhook-id, dropped ones never,
// matching the counts the emulator logs at exit; the same seed drops the
// same batches.
func TestEmulatorDropsAndDuplicates(t *testing.T) {
	parallel(t)
	run := func() (dropped []string) {
		rc := newHookReceiver(t)
		p := startEmulator(t, "--batches", "24", "--finish-within", "0", "--seed", "11", "--drop", "0.25", "--duplicate", "0.25",
			"--dynamic-webhook", rc.srv.URL)
		idle := p.waitIdle(t, func(st emulator.Status) bool { return st.Deliveries.Messages == 24 })
		p.stop(t)
		stopped := p.events("emulator stopped")
		if len(stopped) != 1 {
			t.Fatalf("no summary at exit\n%s", p.stderr)
		}
		st := stopped[0]
		perID := map[string]int{}
		rc.mu.Lock()
		for _, g := range rc.got {
			perID[g.h.Get("webhook-id")]++
		}
		rc.mu.Unlock()
		d := idle.Deliveries
		if d.Dropped == 0 || d.Duplicates == 0 || rc.count() != d.Delivered+d.Duplicates || d.Delivered+d.Dropped != 24 ||
			st["dropped"] != float64(d.Dropped) || st["duplicates"] != float64(d.Duplicates) {
			t.Fatalf("status %+v, summary at exit %v, the receiver got %d requests", d, st, rc.count())
		}
		for _, ev := range p.events("delivery") {
			id, _ := ev["message_id"].(string)
			switch ev["outcome"] {
			case "dropped":
				dropped = append(dropped, ev["batch"].(string))
				if perID[id] != 0 {
					t.Errorf("dropped message %s arrived %d times", id, perID[id])
				}
			case "duplicate":
				if perID[id] != 2 {
					t.Errorf("duplicated message %s arrived %d times", id, perID[id])
				}
			}
		}
		slices.Sort(dropped)
		return dropped
	}
	if a, b := run(), run(); !slices.Equal(a, b) {
		t.Errorf("seed 11 dropped %v, then %v", a, b)
	}
}

// A SUCCEEDED batch's responses file downloads byte for byte: through the
// SDK's Files.Download and through the poller's streaming download (what
// results directories use), both equal to emulator.Responses.
func TestEmulatorResultsDownloadByteForByte(t *testing.T) {
	parallel(t)
	p := startEmulator(t, "--batches", "8", "--finish-within", "0", "--seed", "5")
	c := p.client(t)
	ctx := context.Background()
	pc := poller.DefaultConfig()
	pc.APIKey, pc.BaseURL = p.key, p.url
	pl, err := poller.New(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for name, job := range genaitest.ListAll(t, c, 5) {
		if job.State != genai.JobStateSucceeded {
			continue
		}
		// The counts the SDK drops, from the raw operation.
		req, _ := http.NewRequest(http.MethodGet, p.url+"/v1beta/"+name, nil)
		req.Header.Set("x-goog-api-key", p.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var op struct {
			Metadata struct {
				Model      string `json:"model"`
				BatchStats struct {
					RequestCount int64 `json:"requestCount,string"`
				} `json:"batchStats"`
			} `json:"metadata"`
		}
		err = json.NewDecoder(resp.Body).Decode(&op)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := emulator.Responses(geminifake.Batch{Name: name, Model: op.Metadata.Model, RequestCount: op.Metadata.BatchStats.RequestCount})
		sdkBytes, err := c.Files.Download(ctx, genai.NewDownloadURIFromFile(&genai.File{DownloadURI: job.Dest.FileName}), nil)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "out.jsonl")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		n, err := pl.Download(ctx, job.Dest.FileName, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		streamed, _ := os.ReadFile(path)
		if !bytes.Equal(sdkBytes, want) || !bytes.Equal(streamed, want) || n != int64(len(want)) {
			t.Errorf("%s: SDK %d bytes, stream %d bytes, want %d equal bytes", name, len(sdkBytes), len(streamed), len(want))
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(want), "\n"), "\n") {
			var l struct {
				Key string `json:"key"`
			}
			if json.Unmarshal([]byte(line), &l) != nil || l.Key != "request-"+itoa(i+1) {
				t.Errorf("%s line %d: %q", name, i+1, line)
			}
		}
		checked++
	}
	if checked < 4 {
		t.Fatalf("checked %d succeeded batches, want at least 4 (5 in 8 succeed)", checked)
	}
}

// --fail-rate: the emulator answers some requests 429 with RetryInfo (and
// some 5xx), and `gemrecon poll` retries them: the pass exits 0 and records
// every completion.
func TestEmulatorFailRatePollRetries(t *testing.T) {
	parallel(t)
	p := startEmulator(t, "--batches", "6", "--finish-within", "0", "--seed", "5", "--fail-rate", "0.3")
	db := newDB(t)
	out := filepath.Join(t.TempDir(), "effects.log")
	r := gemreconWith(t, []string{"GEMINI_API_KEY=" + p.key, "GOOGLE_API_KEY="}, "--db", db, "poll", "--base-url", p.url, "--page-size", "1", "--qps", "0",
		"--exec", `echo "$GEMRECON_KEY" >> `+shellQuote(out))
	wantCode(t, r, exitOK)
	if lines := readLines(t, out); len(lines) != 6 {
		t.Errorf("effects ran for %v, want the 6 batches", lines)
	}
	faults := p.events("fault injected")
	saw429 := false
	for _, f := range faults {
		if f["status"] == float64(http.StatusTooManyRequests) && f["retry_delay"] != nil {
			saw429 = true
		}
	}
	if !saw429 {
		t.Fatalf("no 429 was injected (seed 5): %v\n%s", faults, r.stderr)
	}
	if !strings.Contains(r.stderr, "api_requests=") || strings.Contains(r.stderr, "api_requests=6 ") {
		t.Errorf("poll's summary shows no retried request: %s", r.stderr)
	}
}

// Wrong flags exit 2 before anything listens; a busy port exits 1.
func TestEmulatorUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`[{"state":"SUCCEEDED"}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--drop", "1.5"}, {"--duplicate", "-1"}, {"--fail-rate", "2"}, {"--batches", "-3"},
		{"--finish-within", "-1s"}, {"--dynamic-signature", "hmac"}, {"--dynamic-webhook", "not-a-url"},
		{"--batches-file", filepath.Join(t.TempDir(), "missing.json")}, {"--batches-file", bad},
		{"--api-key", ""}, {"--listen", ""}, {"extra"},
		{"--dynamic-webhook", "http://127.0.0.1:1/x", "--dynamic-share", "0"},
	} {
		r := gemrecon(t, append([]string{"emulator"}, args...)...)
		if r.code != exitUsage || r.stdout != "" {
			t.Errorf("emulator %v: want exit 2 and nothing on stdout, got %v", args, r)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := gemrecon(t, "emulator", "--listen", ln.Addr().String())
	if r.code != exitFatal || !strings.Contains(r.stderr, ln.Addr().String()) {
		t.Errorf("a busy port: want exit 1 naming it, got %v", r)
	}
}
