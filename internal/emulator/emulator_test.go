package emulator

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// events collects an emulator's events.
type events struct {
	mu  sync.Mutex
	all []Event
}

func (ev *events) on(e Event) { ev.mu.Lock(); defer ev.mu.Unlock(); ev.all = append(ev.all, e) }
func (ev *events) list() []Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return slices.Clone(ev.all)
}

func (ev *events) of(kind EventKind) []Event {
	var out []Event
	for _, e := range ev.list() {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// startEmu starts an emulator on a free port; Close runs at cleanup.
func startEmu(t *testing.T, cfg Config) *Emulator {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func waitIdle(t *testing.T, e *Emulator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Wait(ctx); err != nil {
		t.Fatalf("emulator not idle: %v (stats %+v)", err, e.Stats())
	}
}

// Generated batches start unfinished, finish at seeded moments within
// FinishWithin (RUNNING first), end in every kind of outcome with a reason
// or a readable responses file, and the same seed makes the same plan.
func TestGeneratedBatchesFinishOverTime(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := testkit.NewClock(t0)
	var evs events
	e := startEmu(t, Config{Seed: 5, Generate: 12, FinishWithin: time.Minute, Manual: true, Now: clk.Now, OnEvent: evs.on})
	c := genaitest.Client(t, e.URL(), e.APIKey())

	before := genaitest.ListAll(t, c, 7)
	if len(before) != 12 {
		t.Fatalf("listed %d batches, want 12", len(before))
	}
	for name, b := range before {
		if genaitest.Terminal(b.State) || !strings.HasPrefix(name, "batches/gen-") || b.CreateTime.After(t0) || t0.Sub(b.CreateTime) > 30*time.Minute {
			t.Errorf("at the start %s is %s, created %v", name, b.State, b.CreateTime)
		}
	}
	clk.Set(t0.Add(30 * time.Second))
	half := e.Advance(clk.Now())
	mid := genaitest.ListAll(t, c, 7)
	nDone := 0
	for _, b := range mid {
		if genaitest.Terminal(b.State) {
			nDone++
		}
	}
	if half == 0 || nDone == 0 || nDone == 12 {
		t.Errorf("half-way: %d changes applied, %d of 12 finished; want some, not all (seed 5)", half, nDone)
	}
	clk.Set(t0.Add(time.Minute))
	e.Advance(clk.Now())
	after := genaitest.ListAll(t, c, 7)
	states := map[genai.JobState]int{}
	ctx := context.Background()
	for name, b := range after {
		states[b.State]++
		if !genaitest.Terminal(b.State) || b.EndTime.Before(t0) || b.EndTime.After(t0.Add(time.Minute)) {
			t.Errorf("at the end %s is %s, ended %v", name, b.State, b.EndTime)
		}
		fb, _ := e.API().Batch(name)
		switch b.State {
		case genai.JobStateSucceeded:
			if b.Dest == nil || b.Dest.FileName != fb.ResponsesFile || fb.ResponsesFile == "" {
				t.Fatalf("%s succeeded without a responses file: %+v", name, b.Dest)
			}
			data, err := c.Files.Download(ctx, genai.NewDownloadURIFromFile(&genai.File{DownloadURI: b.Dest.FileName}), nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != string(Responses(fb)) || int64(strings.Count(string(data), "\n")) != fb.RequestCount {
				t.Errorf("%s: downloaded %q, want Responses (%d lines)", name, data, fb.RequestCount)
			}
			var line struct {
				Key      string          `json:"key"`
				Response json.RawMessage `json:"response"`
			}
			if err := json.Unmarshal([]byte(strings.SplitN(string(data), "\n", 2)[0]), &line); err != nil || line.Key != "request-1" || line.Response == nil {
				t.Errorf("%s: first line %q (%v)", name, data, err)
			}
		case genai.JobStateFailed:
			if fb.Error == nil || fb.Error.Message == "" {
				t.Errorf("%s failed without a reason", name)
			}
		}
	}
	for _, s := range []genai.JobState{genai.JobStateSucceeded, genai.JobStateFailed, genai.JobStateExpired, genai.JobStateCancelled} {
		if states[s] == 0 {
			t.Errorf("no generated batch ended %s: %v", s, states)
		}
	}
	e.Close()
	running := map[string]bool{}
	for _, ev := range evs.list() {
		switch ev.Kind {
		case KindRunning:
			running[ev.Batch] = true
		case KindFinished:
			if !running[ev.Batch] {
				t.Errorf("%s finished without running first", ev.Batch)
			}
		}
	}
	if n := len(evs.of(KindCreated)); n != 12 || len(evs.of(KindFinished)) != 12 {
		t.Errorf("events: %d created, %d finished; want 12 each", n, len(evs.of(KindFinished)))
	}

	// The same seed, the same plan; another seed, other names.
	plan := func(seed uint64) []string {
		var evs events
		e := startEmu(t, Config{Seed: seed, Generate: 12, FinishWithin: time.Minute, Manual: true, Now: testkit.NewClock(t0).Now, OnEvent: evs.on})
		e.Close()
		var out []string
		for _, ev := range evs.of(KindCreated) {
			out = append(out, ev.Batch+" "+ev.FinishAt.String())
		}
		return out
	}
	if a, b := plan(5), plan(5); !slices.Equal(a, b) {
		t.Errorf("seed 5 planned %v, then %v", a, b)
	}
	if a, b := plan(5), plan(6); a[0] == b[0] {
		t.Errorf("seeds 5 and 6 share a name: %s", a[0])
	}
}

// File batches are played out: terminal ones are PENDING until they reach
// the file's state and fields; others stay as given. FinishWithin 0 serves
// the file as it is.
func TestFileBatchesPlayedOut(t *testing.T) {
	bs, err := geminifake.LoadBatches("../../testdata/gemini/batches-mixed.json")
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := testkit.NewClock(t0)
	e := startEmu(t, Config{Seed: 9, Batches: bs, FinishWithin: 10 * time.Second, Manual: true, Now: clk.Now})
	for _, b := range bs {
		got, ok := e.API().Batch(b.Name)
		if !ok {
			t.Fatalf("%s missing", b.Name)
		}
		if terminal(b.State) && (got.State != "PENDING" || got.Error != nil || got.ResponsesFile != "" || !got.EndTime.IsZero()) {
			t.Errorf("%s (%s in the file) starts as %+v, want PENDING without its outcome", b.Name, b.State, got)
		}
		if !terminal(b.State) && got.State != b.State {
			t.Errorf("%s (%s in the file) starts %s", b.Name, b.State, got.State)
		}
		if !got.CreateTime.Equal(b.CreateTime) {
			t.Errorf("%s: createTime %v, want the file's %v", b.Name, got.CreateTime, b.CreateTime)
		}
	}
	clk.Set(t0.Add(10 * time.Second))
	e.Advance(clk.Now())
	for _, b := range bs {
		got, _ := e.API().Batch(b.Name)
		if got.State != b.State {
			t.Errorf("%s ends %s, want the file's %s", b.Name, got.State, b.State)
		}
		if terminal(b.State) && (got.EndTime.Before(t0) || got.EndTime.After(clk.Now()) ||
			(b.Error == nil) != (got.Error == nil) || got.ResponsesFile != b.ResponsesFile) {
			t.Errorf("%s ends as %+v, want the file's fields and an end within the window", b.Name, got)
		}
		if got.ResponsesFile != "" && !e.API().HasFile(got.ResponsesFile) {
			t.Errorf("%s: its responses file is not served", b.Name)
		}
	}
	if st := e.Stats(); st.Batches != len(bs) {
		t.Errorf("stats %+v, want %d batches", st, len(bs))
	}

	as := startEmu(t, Config{Batches: bs, Manual: true})
	for _, b := range bs {
		got, _ := as.API().Batch(b.Name)
		if got.State != b.State || !got.EndTime.Equal(b.EndTime) {
			t.Errorf("FinishWithin 0: %s is %s ended %v, want as in the file", b.Name, got.State, got.EndTime)
		}
	}
}

// receiver is a real HTTP server standing for a webhook receiver.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []*http.Request
	bodies [][]byte
	status func(n int) int
}

func newReceiver(t *testing.T, status func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{status: status}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, r)
		rc.bodies = append(rc.bodies, b)
		n := len(rc.got)
		rc.mu.Unlock()
		if rc.status != nil {
			w.WriteHeader(rc.status(n))
		}
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) all() ([]*http.Request, [][]byte) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.got), slices.Clone(rc.bodies)
}

// verifyEach verifies every entry of a delivery's webhook-signature on its
// own against the emulator's JWKS and returns the schemes that verified.
func verifyEach(t *testing.T, v *dynamic.Verifier, h http.Header, body []byte) []dynamic.Scheme {
	t.Helper()
	var out []dynamic.Scheme
	for _, entry := range strings.Fields(h.Get("webhook-signature")) {
		one := h.Clone()
		one.Set("webhook-signature", entry)
		res, err := v.Verify(context.Background(), body, one)
		if err != nil {
			t.Errorf("entry %.20q… did not verify: %v", entry, err)
			continue
		}
		out = append(out, res.Scheme)
	}
	return out
}

// Batches.Create through the SDK with a webhookConfig: the batch succeeds
// after CreatedFinishAfter with inlined responses (inline source) or a
// responses file (file source), and its completion reaches the config's URI
// signed as the mode says, verifiable with package webhook/dynamic against
// the JWKS the emulator serves; tampering breaks v1a.
func TestCreateDeliversDynamically(t *testing.T) {
	for _, tc := range []struct {
		mode SignatureMode
		want []dynamic.Scheme
	}{
		{SignBoth, []dynamic.Scheme{dynamic.SchemeV1a, dynamic.SchemeJWT}},
		{SignV1a, []dynamic.Scheme{dynamic.SchemeV1a}},
		{SignJWT, []dynamic.Scheme{dynamic.SchemeJWT}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			t0 := time.Now()
			clk := testkit.NewClock(t0)
			rc := newReceiver(t, nil)
			e := startEmu(t, Config{Signature: tc.mode, CreatedFinishAfter: 5 * time.Second, Manual: true, Now: clk.Now})
			c := genaitest.Client(t, e.URL(), e.APIKey())
			ctx := context.Background()
			job, err := c.Batches.Create(ctx, "gemini-2.5-flash", &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{
				{Contents: genai.Text("Say hello."), Metadata: map[string]string{"key": "hello"}},
				{Contents: genai.Text("Say goodbye."), Metadata: map[string]string{"key": "bye"}},
			}}, &genai.CreateBatchJobConfig{DisplayName: "dyn", WebhookConfig: &genai.WebhookConfig{
				Uris: []string{rc.srv.URL + "/hook"}, UserMetadata: map[string]any{"ticket": "T-1"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			fileJob, err := c.Batches.Create(ctx, "gemini-2.5-flash", &genai.BatchJobSource{FileName: "files/input"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(2500 * time.Millisecond))
			e.Advance(clk.Now())
			if b, _ := c.Batches.Get(ctx, job.Name, nil); b.State != genai.JobStateRunning {
				t.Errorf("half-way the created batch is %s, want RUNNING", b.State)
			}
			clk.Set(t0.Add(5 * time.Second))
			e.Advance(clk.Now())
			waitIdle(t, e)

			b, err := c.Batches.Get(ctx, job.Name, nil)
			if err != nil || b.State != genai.JobStateSucceeded || b.Dest == nil || len(b.Dest.InlinedResponses) != 2 {
				t.Fatalf("created batch after its run: %+v, %v", b, err)
			}
			r := b.Dest.InlinedResponses[1]
			if r.Metadata["key"] != "bye" || !strings.Contains(r.Response.Text(), "Say goodbye.") {
				t.Errorf("inlined response 2: metadata %v, text %q", r.Metadata, r.Response.Text())
			}
			fb, err := c.Batches.Get(ctx, fileJob.Name, nil)
			if err != nil || fb.State != genai.JobStateSucceeded || fb.Dest == nil || fb.Dest.FileName == "" {
				t.Fatalf("file-source batch: %+v, %v", fb, err)
			}
			data, err := c.Files.Download(ctx, genai.NewDownloadURIFromFile(&genai.File{DownloadURI: fb.Dest.FileName}), nil)
			if err != nil || strings.Count(string(data), "\n") != 3 {
				t.Errorf("file-source results: %q, %v", data, err)
			}

			reqs, bodies := rc.all()
			if len(reqs) != 1 {
				t.Fatalf("the receiver got %d deliveries, want 1 (the file batch has no webhookConfig and no static webhook exists)", len(reqs))
			}
			var ev struct {
				Type string `json:"type"`
				Data struct {
					ID           string            `json:"id"`
					UserMetadata map[string]string `json:"user_metadata"`
				} `json:"data"`
			}
			if err := json.Unmarshal(bodies[0], &ev); err != nil || ev.Type != "batch.succeeded" ||
				"batches/"+ev.Data.ID != job.Name || ev.Data.UserMetadata["ticket"] != "T-1" || reqs[0].URL.Path != "/hook" {
				t.Fatalf("delivery %s to %s (%v)", bodies[0], reqs[0].URL, err)
			}
			v, err := dynamic.New(dynamic.Config{JWKSURL: e.JWKSURL()})
			if err != nil {
				t.Fatal(err)
			}
			if got := verifyEach(t, v, reqs[0].Header, bodies[0]); !slices.Equal(got, tc.want) {
				t.Errorf("verified schemes %v, want %v", got, tc.want)
			}
			if tc.mode != SignJWT {
				tampered := append([]byte(nil), bodies[0]...)
				tampered[len(tampered)-2] ^= 1
				h := reqs[0].Header.Clone()
				h.Set("webhook-signature", strings.Fields(h.Get("webhook-signature"))[0])
				if _, err := v.Verify(ctx, tampered, h); err == nil {
					t.Error("a tampered body verified with v1a")
				}
			}
		})
	}
}

// A failed dynamic delivery is redelivered with the same webhook-id,
// signed afresh; the events show each attempt and its answer.
func TestDynamicRedelivery(t *testing.T) {
	rc := newReceiver(t, func(n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusAccepted
	})
	var evs events
	e := startEmu(t, Config{Seed: 3, Manual: true, OnEvent: evs.on, Signature: SignV1a,
		Delivery: geminifake.WebhookOptions{Sleep: func(context.Context, time.Duration) error { return nil }}})
	if err := e.Schedule(geminifake.Batch{Name: "batches/redo", State: "FAILED", Error: &geminifake.Status{Code: 8, Message: "quota"},
		WebhookConfig: &geminifake.WebhookConfig{Uris: []string{rc.srv.URL}}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Schedule(geminifake.Batch{Name: "batches/redo", State: "FAILED"}, 0); err == nil {
		t.Error("Schedule accepted a name that exists")
	}
	if err := e.Schedule(geminifake.Batch{Name: "batches/never", State: "RUNNING"}, 0); err == nil {
		t.Error("Schedule accepted a non-terminal final state")
	}
	e.Advance(time.Now().Add(time.Second))
	waitIdle(t, e)
	reqs, _ := rc.all()
	if len(reqs) != 2 || reqs[0].Header.Get("webhook-id") != reqs[1].Header.Get("webhook-id") {
		t.Fatalf("got %d requests (want 2 with one webhook-id)", len(reqs))
	}
	e.Close()
	var answers []string
	for _, ev := range evs.of(KindDelivery) {
		d := ev.Delivery
		if ev.Batch != "batches/redo" || d.WebhookID != "" || d.EventType != "batch.failed" {
			t.Errorf("delivery event %+v", ev)
		}
		answers = append(answers, d.Outcome+" "+http.StatusText(d.Status))
	}
	if want := []string{"failed Service Unavailable", "delivered Accepted"}; !slices.Equal(answers, want) {
		t.Errorf("delivery events %v, want %v", answers, want)
	}
	if st := e.Stats().Deliveries; st.Redelivered != 1 || st.Delivered != 1 || st.Failed != 1 {
		t.Errorf("delivery stats %+v", st)
	}
}

// Drops and duplicates are drawn from the seed: the counts match what the
// receiver got, and the same seed loses and repeats the same batches.
func TestDropsAndDuplicatesSeeded(t *testing.T) {
	run := func(seed uint64) (dropped, duplicated []string) {
		rc := newReceiver(t, nil)
		e := startEmu(t, Config{Seed: seed, Generate: 40, DynamicURIs: []string{rc.srv.URL}, Drop: 0.25, Duplicate: 0.25, Manual: true})
		waitIdle(t, e)
		reqs, bodies := rc.all()
		st := e.Stats().Deliveries
		if st.Messages != 40 || st.Dropped == 0 || st.Duplicates == 0 || len(reqs) != st.Delivered+st.Duplicates || st.Delivered != 40-st.Dropped {
			t.Fatalf("seed %d: stats %+v, the receiver got %d requests", seed, st, len(reqs))
		}
		perBatch := map[string]int{}
		for _, b := range bodies {
			perBatch[batchOf(b)]++
		}
		for _, a := range e.API().Webhooks().Attempts() {
			name := batchOf(a.Body)
			switch a.Outcome {
			case geminifake.OutcomeDropped:
				if perBatch[name] != 0 {
					t.Errorf("%s was dropped but arrived %d times", name, perBatch[name])
				}
				dropped = append(dropped, name)
			case geminifake.OutcomeDuplicate:
				if perBatch[name] != 2 {
					t.Errorf("%s was duplicated but arrived %d times", name, perBatch[name])
				}
				duplicated = append(duplicated, name)
			}
		}
		slices.Sort(dropped)
		slices.Sort(duplicated)
		return dropped, duplicated
	}
	d1, u1 := run(21)
	d2, u2 := run(21)
	if !slices.Equal(d1, d2) || !slices.Equal(u1, u2) {
		t.Errorf("seed 21: dropped %v then %v; duplicated %v then %v", d1, d2, u1, u2)
	}
}

// --fail-rate: a seeded share of API requests get 429 with RetryInfo, 503
// or 500; the same seed gives the same sequence; the JWKS is never faulted.
func TestFailRateSeeded(t *testing.T) {
	seq := func(seed uint64) []int {
		var evs events
		e := startEmu(t, Config{Seed: seed, FailRate: 0.4, Manual: true, OnEvent: evs.on})
		var out []int
		for range 200 {
			req, _ := http.NewRequest(http.MethodGet, e.URL()+"/v1beta/batches?pageSize=5", nil)
			req.Header.Set("x-goog-api-key", e.APIKey())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests &&
				(!strings.Contains(string(body), `"type.googleapis.com/google.rpc.RetryInfo"`) || !strings.Contains(string(body), `"retryDelay":"1s"`)) {
				t.Fatalf("a 429 without RetryInfo: %s", body)
			}
			out = append(out, resp.StatusCode)
		}
		for range 20 {
			resp, err := http.Get(e.JWKSURL())
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("JWKS answered %d", resp.StatusCode)
			}
		}
		e.Close()
		if n := e.Stats().Faults; n != len(evs.of(KindFault)) {
			t.Errorf("stats count %d faults, events %d", n, len(evs.of(KindFault)))
		}
		return out
	}
	a := seq(77)
	count := map[int]int{}
	for _, s := range a {
		count[s]++
	}
	if count[200] < 90 || count[200] > 150 || count[429] == 0 || count[503] == 0 || count[500] == 0 || len(count) != 4 {
		t.Errorf("answers at fail rate 0.4: %v", count)
	}
	if b := seq(77); !slices.Equal(a, b) {
		t.Error("the same seed gave another sequence of faults")
	}
	e := startEmu(t, Config{Manual: true})
	req, _ := http.NewRequest(http.MethodGet, e.URL()+"/v1beta/batches", nil)
	req.Header.Set("x-goog-api-key", "wrong")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong key got %d, want 401", resp.StatusCode)
	}
}

// Config errors name the field; Exports and Env say the same thing.
func TestConfigAndExports(t *testing.T) {
	for _, cfg := range []Config{
		{Drop: 1.5}, {Duplicate: -0.1}, {FailRate: 2}, {Generate: -1}, {FinishWithin: -time.Second},
		{Signature: "hmac"}, {DynamicURIs: []string{"not a url"}},
		{Batches: []geminifake.Batch{{Name: "batches/a"}, {Name: "batches/a"}}},
		{Batches: []geminifake.Batch{{Name: "batches/a", WebhookConfig: &geminifake.WebhookConfig{Uris: []string{"ftp://x"}}}}},
	} {
		if _, err := New(cfg); err == nil || !strings.HasPrefix(err.Error(), "emulator: ") {
			t.Errorf("New(%+v) = %v, want an error", cfg, err)
		}
	}
	e := startEmu(t, Config{APIKey: "it's a key", Manual: true})
	if e.Seed() == 0 || e.APIKey() != "it's a key" {
		t.Errorf("seed %d, key %q", e.Seed(), e.APIKey())
	}
	want := "export GEMINI_API_KEY='it'\\''s a key'\nexport GOOGLE_GEMINI_BASE_URL=" + e.URL() +
		"\nexport GEMRECON_JWKS_URL=" + e.URL() + "/.well-known/jwks.json\n"
	if got := e.Exports(); got != want {
		t.Errorf("Exports:\n%s\nwant:\n%s", got, want)
	}
	if env := e.Env(); len(env) != 3 || env[1] != "GOOGLE_GEMINI_BASE_URL="+e.URL() {
		t.Errorf("Env %v", env)
	}
	if got := dialable(&net.TCPAddr{IP: net.IPv4zero, Port: 8787}); got != "127.0.0.1:8787" {
		t.Errorf("a listener on 0.0.0.0 is dialled at %s", got)
	}
	if got := dialable(&net.TCPAddr{IP: net.IPv6unspecified, Port: 8787}); got != "[::1]:8787" {
		t.Errorf("a listener on :: is dialled at %s", got)
	}
	if g, err := New(Config{}); err != nil || !strings.HasPrefix(g.APIKey(), "emu-") || len(g.APIKey()) < 20 {
		t.Errorf("generated key %q (%v)", g.APIKey(), err)
	}
}

// Without Manual the scheduler finishes batches on the real clock; Wait
// returns once every batch finished and every delivery ended.
func TestSchedulerOnRealClock(t *testing.T) {
	rc := newReceiver(t, nil)
	e := startEmu(t, Config{Generate: 5, FinishWithin: 300 * time.Millisecond, DynamicURIs: []string{rc.srv.URL}})
	waitIdle(t, e)
	for name, b := range genaitest.ListAll(t, genaitest.Client(t, e.URL(), e.APIKey()), 7) {
		if !genaitest.Terminal(b.State) {
			t.Errorf("%s is %s after Wait", name, b.State)
		}
	}
	if reqs, _ := rc.all(); len(reqs) != 5 {
		t.Errorf("the receiver got %d deliveries, want 5", len(reqs))
	}
}
