package poller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// now is the tests' clock: the fixtures' batches were created on 2025-12-11.
var testNow = time.Date(2025, 12, 12, 0, 0, 0, 0, time.UTC)

const testKey = "test-key"

func startFake(t *testing.T, opts geminifake.Options, bs ...geminifake.Batch) *geminifake.Server {
	t.Helper()
	if opts.APIKey == "" {
		opts.APIKey = testKey
	}
	s := geminifake.New(opts)
	s.Add(bs...)
	if _, err := s.Start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// sleeps records the waits the poller asked for, without waiting.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d = append(s.d, d)
	return ctx.Err()
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.d)
}

// testConfig points a Poller at the fake with the tests' clock and no
// real waiting; tests override what they exercise.
func testConfig(s *geminifake.Server, sl *sleeps) Config {
	cfg := DefaultConfig()
	cfg.APIKey = testKey
	cfg.BaseURL = s.URL()
	cfg.PageSize = 10
	cfg.Now = func() time.Time { return testNow }
	cfg.Sleep = sl.sleep
	return cfg
}

func newPoller(t *testing.T, cfg Config) *Poller {
	t.Helper()
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func load(t *testing.T, name string) []geminifake.Batch {
	t.Helper()
	bs, err := geminifake.LoadBatches("../testdata/gemini/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// collect runs one pass and returns the operations handed over.
func collect(t *testing.T, p *Poller) ([]Operation, PassStats, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ops []Operation
	st, err := p.PassWith(ctx, PassOptions{}, func(page []Operation) error {
		ops = append(ops, page...)
		return nil
	})
	return ops, st, err
}

func names(ops []Operation) []string {
	var ns []string
	for _, op := range ops {
		ns = append(ns, op.Name)
	}
	slices.Sort(ns)
	return ns
}

func terminalNames(bs []geminifake.Batch) []string {
	var ns []string
	for _, b := range bs {
		if canon.IsTerminal(b.State) {
			ns = append(ns, b.Name)
		}
	}
	slices.Sort(ns)
	return ns
}

func listRequests(s *geminifake.Server) []geminifake.Request {
	var out []geminifake.Request
	for _, r := range s.Requests() {
		if strings.HasSuffix(r.Path, "/batches") || strings.HasSuffix(r.Path, "/batchPredictionJobs") {
			out = append(out, r)
		}
	}
	return out
}

// (1) Three pages of mixed states: only terminal operations are handed
// over, and a second pass hands the same ones over again.
func TestPassTerminalOnlyAndRepeats(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	sl := &sleeps{}
	p := newPoller(t, testConfig(s, sl))
	want := terminalNames(bs)
	for pass := 1; pass <= 2; pass++ {
		ops, st, err := collect(t, p)
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		if got := names(ops); !slices.Equal(got, want) {
			t.Errorf("pass %d handed over %q, want %q", pass, got, want)
		}
		for _, op := range ops {
			if !op.Terminal || !canon.IsTerminal(op.State) || strings.HasPrefix(op.State, "BATCH_STATE_") {
				t.Errorf("pass %d: %s state %q terminal %v", pass, op.Name, op.State, op.Terminal)
			}
			if op.CreateTime.IsZero() || op.EndTime.IsZero() || !json.Valid(op.Raw) {
				t.Errorf("pass %d: %s incomplete: %+v", pass, op.Name, op)
			}
		}
		if st.Listed != len(bs) || st.Terminal != len(want) || st.Passed != len(want) || st.Pages != 3 || st.Requests != 3 {
			t.Errorf("pass %d stats = %+v, want listed %d terminal %d pages 3 requests 3", pass, st, len(bs), len(want))
		}
	}
	reqs := listRequests(s)
	if len(reqs) != 6 {
		t.Fatalf("%d list requests, want 6", len(reqs))
	}
	for i, r := range reqs {
		if r.Query.Get("pageSize") != "10" || r.Header.Get("x-goog-api-key") != testKey || r.Query.Has("key") {
			t.Errorf("request %d: query %v key header %q", i, r.Query, r.Header.Get("x-goog-api-key"))
		}
		if (i%3 == 0) != (r.Query.Get("pageToken") == "") {
			t.Errorf("request %d: pageToken %q", i, r.Query.Get("pageToken"))
		}
	}
}

// (2) A batch that completes between passes appears on the next pass.
func TestCompletionBetweenPasses(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	running := "batches/mixed-01"
	if b, _ := s.Batch(running); b.State != "BATCH_STATE_RUNNING" {
		t.Fatalf("fixture: %s is %q", running, b.State)
	}
	ops, _, err := collect(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names(ops), running) {
		t.Fatalf("%s handed over while running", running)
	}
	s.Update(running, func(b *geminifake.Batch) {
		b.State = "BATCH_STATE_SUCCEEDED"
		b.EndTime = testNow.Add(-time.Minute)
	})
	ops, _, err = collect(t, p)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ops, func(op Operation) bool { return op.Name == running })
	if i < 0 {
		t.Fatalf("%s not handed over after completing", running)
	}
	if ops[i].State != "SUCCEEDED" || !ops[i].EndTime.Equal(testNow.Add(-time.Minute)) {
		t.Errorf("%s = %+v", running, ops[i])
	}
	if len(ops) != len(terminalNames(bs))+1 {
		t.Errorf("second pass handed over %d, want %d", len(ops), len(terminalNames(bs))+1)
	}
}

// (3) QPS 5, burst 1: no request leaves faster than 5 per second.
//
// Times are taken where the limiter hands the request on (a transport below
// it), against the time before the pass: request k (from 0) is never sent
// before start + k/QPS. (Gaps between arrivals at the server are not a
// sound measure: a request delayed on its way shortens the next gap, and a
// loaded machine did exactly that.)
func TestRateLimit(t *testing.T) {
	t.Parallel()
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.PageSize = 4 // 7 pages
	cfg.QPS, cfg.Burst = 5, 1
	sent := &sendTimes{}
	cfg.HTTPClient = &http.Client{Transport: sent}
	p := newPoller(t, cfg)
	start := time.Now()
	if _, _, err := collect(t, p); err != nil {
		t.Fatal(err)
	}
	times := sent.all()
	if len(times) != 7 || len(s.Requests()) != 7 {
		t.Fatalf("%d requests sent, %d received, want 7", len(times), len(s.Requests()))
	}
	for k, at := range times {
		if earliest := start.Add(time.Duration(k) * time.Second / 5); at.Before(earliest) {
			t.Errorf("request %d sent %v after the start, want ≥ %v", k, at.Sub(start), earliest.Sub(start))
		}
	}
}

// sendTimes records when each request leaves the poller's transport.
type sendTimes struct {
	mu sync.Mutex
	t  []time.Time
}

func (s *sendTimes) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.t = append(s.t, time.Now())
	s.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (s *sendTimes) all() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.t)
}

// (4) A 429 whose RetryInfo says 2s (or whose Retry-After says so): the
// next request comes ≥ 2 s later and the pass completes. Real time, bounded.
func TestRetryHonoursServerDelay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		fault geminifake.Fault
		want  time.Duration
	}{
		{"RetryInfo", geminifake.Fault{Status: 429, RetryDelay: 2 * time.Second}, 2 * time.Second},
		{"Retry-After", geminifake.Fault{Status: 429, RetryAfter: "1"}, time.Second},
		{"503 Retry-After", geminifake.Fault{Status: 503, RetryAfter: "1"}, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bs := load(t, "batches-mixed.json")
			s := startFake(t, geminifake.Options{}, bs...)
			s.InjectFault(geminifake.Fault{}, tc.fault)
			cfg := testConfig(s, nil)
			cfg.Sleep = nil // real waiting
			p := newPoller(t, cfg)
			ops, st, err := collect(t, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(ops) != len(terminalNames(bs)) || st.Requests != 4 || st.Retries != 1 {
				t.Errorf("handed over %d, stats %+v; want %d, 4 requests, 1 retry", len(ops), st, len(terminalNames(bs)))
			}
			reqs := s.Requests()
			if reqs[1].Status != tc.fault.Status || reqs[2].Status != 200 {
				t.Fatalf("statuses %d, %d", reqs[1].Status, reqs[2].Status)
			}
			if gap := reqs[2].Time.Sub(reqs[1].Time); gap < tc.want {
				t.Errorf("retry came %v after the %d, want ≥ %v", gap, tc.fault.Status, tc.want)
			}
			if reqs[2].Query.Get("pageToken") != reqs[1].Query.Get("pageToken") {
				t.Errorf("retry asked for another page")
			}
		})
	}
}

// A server delay longer than MaxServerWait is not waited for inside the
// pass (it would hold the pass, and its lease, for hours): the pass fails
// at once with the refusal, which says how long the server asked for. A
// value beyond any duration (Retry-After: 10^20 seconds) is a very long
// delay too, never a short one.
func TestServerDelayBeyondMaxServerWait(t *testing.T) {
	tests := []struct {
		name  string
		fault geminifake.Fault
		want  time.Duration // the server's delay, as reported
	}{
		{"RetryInfo 2h", geminifake.Fault{Status: 429, RetryDelay: 2 * time.Hour}, 2 * time.Hour},
		{"Retry-After 1h", geminifake.Fault{Status: 429, RetryAfter: "3600"}, time.Hour},
		{"Retry-After overflow", geminifake.Fault{Status: 503, RetryAfter: "100000000000000000000"}, MaxServerDelay},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, geminifake.Options{}, load(t, "batches-mixed.json")...)
			s.InjectFault(tc.fault)
			var sl sleeps
			p := newPoller(t, testConfig(s, &sl))
			_, st, err := collect(t, p)
			if err == nil {
				t.Fatal("the pass succeeded; want it to fail on the refusal")
			}
			if slept := sl.all(); len(slept) != 0 {
				t.Errorf("the pass waited %v; want no wait longer than MaxServerWait (%v), so none", slept, MaxServerWait)
			}
			if st.Requests != 1 || st.Retries != 0 {
				t.Errorf("stats %+v; want 1 request, no retry", st)
			}
			if want := fmt.Sprintf("retry after %v", tc.want); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		})
	}
}

// 500/503 are retried with backoff; a budget that runs out fails the pass.
func TestRetry5xx(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	sl := &sleeps{}
	cfg := testConfig(s, sl)
	cfg.MaxRetries = 2
	p := newPoller(t, cfg)

	s.InjectFault(geminifake.Fault{Status: 500}, geminifake.Fault{Status: 503})
	ops, st, err := collect(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != len(terminalNames(bs)) || st.Requests != 5 || st.Retries != 2 {
		t.Errorf("handed over %d, stats %+v; want %d, 5 requests, 2 retries", len(ops), st, len(terminalNames(bs)))
	}
	d := sl.all()
	if len(d) != 2 || d[0] < DefaultBackoffMin/2 || d[0] > DefaultBackoffMin || d[1] < DefaultBackoffMin || d[1] > 2*DefaultBackoffMin {
		t.Errorf("backoff waits %v, want [0.5s..1s, 1s..2s]", d)
	}

	s.ResetRequests()
	s.InjectFault(geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503})
	_, st, err = collect(t, p)
	if err == nil || !strings.Contains(err.Error(), "503") || errors.Is(err, ErrAuth) {
		t.Errorf("budget exhausted: err = %v, want a 503 listing error", err)
	}
	if got := len(s.Requests()); got != 3 || st.Requests != 3 {
		t.Errorf("budget 2: %d requests (stats %d), want 3", got, st.Requests)
	}
}

// 408 Request Timeout is retried on the listing as on Get: the server
// gave up waiting for the request, nothing was done.
func TestRetry408(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	s.InjectFault(geminifake.Fault{Status: http.StatusRequestTimeout})
	ops, st, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != len(terminalNames(bs)) || st.Retries != 1 {
		t.Errorf("handed over %d, stats %+v; want %d and 1 retry", len(ops), st, len(terminalNames(bs)))
	}
}

// A slow response is cut at RequestTimeout and retried.
func TestSlowResponseRetried(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	s.InjectFault(geminifake.Fault{Delay: 5 * time.Second})
	cfg := testConfig(s, &sleeps{})
	cfg.RequestTimeout = 200 * time.Millisecond
	p := newPoller(t, cfg)
	start := time.Now()
	ops, st, err := collect(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != len(terminalNames(bs)) || st.Retries != 1 || time.Since(start) > 4*time.Second {
		t.Errorf("handed over %d, stats %+v after %v", len(ops), st, time.Since(start))
	}
}

// (5) 401/403 fail fast with ErrAuth naming the credential.
func TestAuthFailsFast(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	tests := []struct {
		name  string
		key   string
		fault *geminifake.Fault
		want  string
	}{
		{"wrong key 401", "wrong", nil, "GEMINI_API_KEY"},
		{"403", testKey, &geminifake.Fault{Status: 403, Message: "Permission denied."}, "GEMINI_API_KEY"},
		{"400 key invalid", testKey, &geminifake.Fault{Status: 400, Message: "API key not valid. Please pass a valid API key."}, "GEMINI_API_KEY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startFake(t, geminifake.Options{}, bs...)
			if tc.fault != nil {
				s.InjectFault(*tc.fault)
			}
			cfg := testConfig(s, &sleeps{})
			cfg.APIKey = tc.key
			_, st, err := collect(t, newPoller(t, cfg))
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want ErrAuth naming %s", err, tc.want)
			}
			if got := len(s.Requests()); got != 1 || st.Retries != 0 {
				t.Errorf("%d requests, %d retries; want 1 and no retry", got, st.Retries)
			}
		})
	}
	t.Run("no key", func(t *testing.T) {
		t.Setenv("GOOGLE_API_KEY", "")
		t.Setenv("GEMINI_API_KEY", "")
		cfg := DefaultConfig()
		cfg.BaseURL = "http://127.0.0.1:1/"
		_, err := New(context.Background(), cfg)
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "GEMINI_API_KEY") {
			t.Errorf("New without a key: %v, want ErrAuth naming GEMINI_API_KEY", err)
		}
	})
	t.Run("vertex", func(t *testing.T) {
		s := startFake(t, geminifake.Options{BearerToken: "tok"}, load(t, "vertex-jobs.json")...)
		cfg := testConfig(s, &sleeps{})
		cfg.Backend, cfg.APIKey, cfg.Project, cfg.Location, cfg.NoCredentials = BackendVertex, "", "123", "us-central1", true
		_, _, err := collect(t, newPoller(t, cfg))
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "GOOGLE_APPLICATION_CREDENTIALS") {
			t.Errorf("err = %v, want ErrAuth naming the Vertex credential", err)
		}
		if got := len(s.Requests()); got != 1 {
			t.Errorf("%d requests, want 1", got)
		}
	})
}

// (6) A repeated page token ends the pass with ErrRepeatedPageToken.
func TestRepeatedPageToken(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	s.InjectFault(geminifake.Fault{}, geminifake.Fault{RepeatToken: true})
	_, st, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if !errors.Is(err, ErrRepeatedPageToken) {
		t.Fatalf("err = %v, want ErrRepeatedPageToken", err)
	}
	if got := len(s.Requests()); got != 2 || st.Pages != 2 {
		t.Errorf("%d requests, %d pages; want 2", got, st.Pages)
	}
	// A token seen two pages earlier is caught too.
	s.ResetRequests()
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		if r.URL.Query().Get("pageToken") != "" {
			return &geminifake.Fault{Body: `{"operations":[],"nextPageToken":"` + map[bool]string{true: "A", false: "B"}[r.URL.Query().Get("pageToken") == "B"] + `"}`}
		}
		return &geminifake.Fault{Body: `{"operations":[],"nextPageToken":"A"}`}
	})
	_, _, err = collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if !errors.Is(err, ErrRepeatedPageToken) || len(s.Requests()) != 3 {
		t.Errorf("A→B→A: err = %v after %d requests, want ErrRepeatedPageToken after 3", err, len(s.Requests()))
	}
}

// (7) Vertex: batchPredictionJobs are listed; PARTIALLY_SUCCEEDED is
// terminal, PAUSED and CANCELLING are not.
func TestVertex(t *testing.T) {
	bs := load(t, "vertex-jobs.json")
	s := startFake(t, geminifake.Options{BearerToken: "tok"}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.Backend, cfg.APIKey, cfg.Project, cfg.Location = BackendVertex, "", "123", "us-central1"
	cfg.NoCredentials = true
	cfg.HTTPClient = &http.Client{Transport: bearer{"tok"}}
	cfg.PageSize = 5
	ops, st, err := collect(t, newPoller(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	want := terminalNames(bs)
	if got := names(ops); !slices.Equal(got, want) {
		t.Errorf("handed over %q, want %q", got, want)
	}
	states := map[string]bool{}
	for _, op := range ops {
		states[op.State] = true
	}
	if !states["PARTIALLY_SUCCEEDED"] || states["PAUSED"] || states["CANCELLING"] {
		t.Errorf("states handed over: %v", states)
	}
	if st.Pages != 3 {
		t.Errorf("pages = %d, want 3", st.Pages)
	}
	for _, r := range listRequests(s) {
		if r.Path != "/v1beta1/projects/123/locations/us-central1/batchPredictionJobs" || r.Query.Get("pageSize") != "5" {
			t.Errorf("request %s?%s", r.Path, r.Query.Encode())
		}
	}
}

type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// (8) Lookback: 50 pages of which only the first 2 hold batches inside the
// window → at most 3 list requests; Lookback 0 reads all 50.
func TestLookbackStopsPaging(t *testing.T) {
	old := testNow.Add(-30 * 24 * time.Hour)
	var bs []geminifake.Batch
	for i := range 500 {
		bs = append(bs, geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("lb%03d", i)),
			State: "SUCCEEDED", CreateTime: old, EndTime: old.Add(time.Hour)})
	}
	s := startFake(t, geminifake.Options{Seed: 3}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.Lookback = 0
	ops, st, err := collect(t, newPoller(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages != 50 || len(ops) != 500 || len(listRequests(s)) != 50 {
		t.Fatalf("lookback 0: %d pages, %d ops, %d requests; want 50, 500, 50", st.Pages, len(ops), len(listRequests(s)))
	}
	// The shuffle put these 20 on the first two pages: make them recent.
	for _, op := range ops[:20] {
		s.Update(op.Name, func(b *geminifake.Batch) { b.CreateTime = testNow.Add(-time.Hour) })
	}
	s.ResetRequests()
	cfg.Lookback = DefaultLookback
	got, st, err := collect(t, newPoller(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(listRequests(s)); n > 3 || st.Pages != 3 {
		t.Errorf("lookback 72h: %d requests, %d pages; want ≤ 3", n, st.Pages)
	}
	if !slices.Equal(names(got), names(ops[:20])) || st.Passed != 20 || st.Terminal != 30 {
		t.Errorf("lookback 72h handed over %d (stats %+v), want the 20 recent ones", len(got), st)
	}
}

// An empty page does not count as "all old": paging goes on.
func TestLookbackEmptyPageContinues(t *testing.T) {
	s := startFake(t, geminifake.Options{})
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		if r.URL.Query().Get("pageToken") == "" {
			return &geminifake.Fault{Body: `{"operations":[],"nextPageToken":"p2"}`}
		}
		return &geminifake.Fault{Body: `{"operations":[{"name":"batches/late","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-12-11T23:00:00Z"},"done":true}]}`}
	})
	ops, _, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil || len(ops) != 1 || ops[0].Name != "batches/late" {
		t.Errorf("ops %v err %v; want batches/late", names(ops), err)
	}
}

// (9) A failed batch's Raw keeps the API's error, which the SDK drops.
func TestRawKeepsFailedBatchError(t *testing.T) {
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	ops, _, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, op := range ops {
		var raw struct {
			Done  bool `json:"done"`
			Error *struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
			Metadata struct {
				State      string `json:"state"`
				BatchStats *struct {
					RequestCount string `json:"requestCount"`
				} `json:"batchStats"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(op.Raw, &raw); err != nil {
			t.Fatal(err)
		}
		if !raw.Done || raw.Metadata.State != "BATCH_STATE_"+op.State {
			t.Errorf("%s raw done %v state %q", op.Name, raw.Done, raw.Metadata.State)
		}
		switch op.State {
		case "FAILED":
			failed++
			if raw.Error == nil || raw.Error.Message != "Enqueued token quota exceeded for this model." || raw.Error.Code != 8 {
				t.Errorf("%s raw error = %+v", op.Name, raw.Error)
			}
		case "SUCCEEDED":
			if raw.Metadata.BatchStats == nil || raw.Metadata.BatchStats.RequestCount != "3" {
				t.Errorf("%s raw batchStats = %+v", op.Name, raw.Metadata.BatchStats)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no failed batch handed over")
	}
}

// A malformed page is a clear error, not retried.
func TestMalformedPage(t *testing.T) {
	s := startFake(t, geminifake.Options{}, load(t, "batches-mixed.json")...)
	s.InjectFault(geminifake.Fault{}, geminifake.Fault{Body: `{"operations":[{"name":`})
	_, st, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if !errors.Is(err, ErrMalformedPage) || !strings.Contains(err.Error(), "page 2") {
		t.Errorf("err = %v, want ErrMalformedPage on page 2", err)
	}
	if st.Requests != 2 {
		t.Errorf("%d requests, want 2", st.Requests)
	}
	// The SDK's error carries the whole body; the message does not.
	s.InjectFault(geminifake.Fault{Body: `{"operations":[{"name":"` + strings.Repeat("x", 1<<20)})
	_, _, err = collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if !errors.Is(err, ErrMalformedPage) || len(err.Error()) > 2000 {
		t.Errorf("a malformed page of 1 MiB: ErrMalformedPage %v, a message of %d bytes; want at most 2000", errors.Is(err, ErrMalformedPage), len(err.Error()))
	}
}

// The Vertex traps (counters as numbers, error.details as objects) made
// the SDK's List fail; the poller reads every page itself, so they list
// like any page.
func TestVertexTraps(t *testing.T) {
	bs := load(t, "vertex-jobs.json")
	for _, trap := range []geminifake.Options{{VertexNumericCounters: true}, {VertexErrorDetailsObjects: true}} {
		s := startFake(t, trap, bs...)
		cfg := testConfig(s, &sleeps{})
		cfg.Backend, cfg.APIKey, cfg.Project, cfg.Location = BackendVertex, testKey, "123", "us-central1"
		ops, _, err := collect(t, newPoller(t, cfg))
		if err != nil {
			t.Fatalf("%+v: %v", trap, err)
		}
		if got, want := names(ops), terminalNames(bs); !slices.Equal(got, want) {
			t.Errorf("%+v: handed over %q, want %q", trap, got, want)
		}
	}
}

// An error from the callback stops the pass.
func TestCallbackErrorStops(t *testing.T) {
	s := startFake(t, geminifake.Options{}, load(t, "batches-mixed.json")...)
	boom := errors.New("boom")
	calls := 0
	_, err := newPoller(t, testConfig(s, &sleeps{})).PassWith(context.Background(), PassOptions{}, func([]Operation) error {
		calls++
		return boom
	})
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("err = %v after %d calls, want boom after 1", err, calls)
	}
}

func TestServerDelay(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ri := `{"error":{"code":429,"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"%s"}]}}`
	tests := []struct {
		header, body string
		want         time.Duration
	}{
		{"", "", 0},
		{"3", "", 3 * time.Second},
		{"Wed, 01 Jan 2025 00:00:10 GMT", "", 10 * time.Second},
		{"", fmt.Sprintf(ri, "31s"), 31 * time.Second},
		{"", fmt.Sprintf(ri, "1.500s"), 1500 * time.Millisecond},
		{"5", fmt.Sprintf(ri, "2s"), 5 * time.Second},
		{"1", fmt.Sprintf(ri, "2s"), 2 * time.Second},
		{"soon", "not json", 0},
	}
	for _, tc := range tests {
		h := http.Header{}
		if tc.header != "" {
			h.Set("Retry-After", tc.header)
		}
		if got, _ := serverDelay(h, []byte(tc.body), now); got != tc.want {
			t.Errorf("serverDelay(%q, %q) = %v, want %v", tc.header, tc.body, got, tc.want)
		}
	}
}

// Listed states are normalised by canon (one spelling for the whole
// program): prefixes dropped, CANCELED spelled CANCELLED, and only canon's
// terminal states handed over.
func TestStatesNormalisedByCanon(t *testing.T) {
	tests := []struct {
		in       string
		want     string
		terminal bool
	}{
		{"BATCH_STATE_SUCCEEDED", "SUCCEEDED", true},
		{"BATCH_STATE_EXPIRED", "EXPIRED", true},
		{"BATCH_STATE_CANCELED", "CANCELLED", true}, // canon's spelling; poller's own copy kept CANCELED, not terminal
		{"cancelled", "CANCELLED", true},
		{"BATCH_STATE_RUNNING", "RUNNING", false},
		{"BATCH_STATE_PENDING", "PENDING", false},
	}
	var bs []geminifake.Batch
	for i, tc := range tests {
		bs = append(bs, geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("st%d", i)), State: tc.in, CreateTime: testNow.Add(-time.Hour)})
	}
	s := startFake(t, geminifake.Options{}, bs...)
	ops, _, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, op := range ops {
		got[op.Name] = op.State
	}
	for i, tc := range tests {
		st, ok := got[bs[i].Name]
		if ok != tc.terminal || (ok && st != tc.want) {
			t.Errorf("listed state %q: handed over %v as %q, want %v as %q", tc.in, ok, st, tc.terminal, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"default", func(*Config) {}, ""},
		{"backend", func(c *Config) { c.Backend = "openai" }, "backend"},
		{"lookback", func(c *Config) { c.Lookback = -time.Hour }, "lookback"},
		{"retries", func(c *Config) { c.MaxRetries = -1 }, "retries"},
		{"qps", func(c *Config) { c.QPS = -1 }, "qps"},
		{"gemini project", func(c *Config) { c.Project = "p" }, "vertex"},
	}
	for _, tc := range tests {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%s) = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// Vertex without credentials fails at New with ErrAuth naming ADC.
func TestVertexNoADC(t *testing.T) {
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", t.TempDir()+"/missing.json")
	t.Setenv("GOOGLE_API_KEY", "")
	t.Setenv("GEMINI_API_KEY", "")
	cfg := DefaultConfig()
	cfg.Backend, cfg.Project, cfg.Location = BackendVertex, "p", "us-central1"
	cfg.BaseURL = "http://127.0.0.1:1/"
	_, err := New(context.Background(), cfg)
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "GOOGLE_APPLICATION_CREDENTIALS") {
		t.Errorf("New = %v, want ErrAuth naming GOOGLE_APPLICATION_CREDENTIALS", err)
	}
}

// requestCounts counts the requests the stand-in received, by what they
// were for, retries included.
type requestCounts struct{ List, Get, Probe, Download int }

// counts reads s's record of requests: a list page of size 1 is a
// credential probe, anything under files/ a download (files.get too).
func counts(s *geminifake.Server) requestCounts {
	var c requestCounts
	for _, r := range s.Requests() {
		switch {
		case strings.Contains(r.Path, "/files/"):
			c.Download++
		case strings.HasSuffix(r.Path, "/batches") && r.Query.Get("pageSize") == "1":
			c.Probe++
		case strings.HasSuffix(r.Path, "/batches"):
			c.List++
		default:
			c.Get++
		}
	}
	return c
}

// total is how many requests the stand-in received in all.
func (c requestCounts) total() int { return c.List + c.Get + c.Probe + c.Download }
