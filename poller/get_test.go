package poller

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

var getAt = time.Date(2025, 12, 11, 6, 0, 0, 0, time.UTC)

func getBatches() []geminifake.Batch {
	return []geminifake.Batch{
		{Name: "batches/ok", State: "SUCCEEDED", CreateTime: getAt, EndTime: getAt.Add(time.Hour),
			RequestCount: 3, SuccessfulCount: 3, ResponsesFile: "files/out-ok"},
		{Name: "batches/failed", State: "FAILED", CreateTime: getAt, EndTime: getAt.Add(time.Hour),
			Error: &geminifake.Status{Code: 8, Message: "Enqueued token quota exceeded for this model."}},
		{Name: "batches/running", State: "RUNNING", CreateTime: getAt},
	}
}

func getOne(t *testing.T, p *Poller, name string) (Operation, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.Get(ctx, name)
}

// Get returns the API's operation as sent (the failed batch's error, done,
// batchStats: what the SDK drops), its state and times, terminal or not, and
// counts one get request each.
func TestGetRawOperation(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	for _, tc := range []struct {
		name, state string
		terminal    bool
		raw         []string
	}{
		{"batches/ok", "SUCCEEDED", true, []string{`"done":true`, `"batchStats"`, `"responsesFile":"files/out-ok"`}},
		{"batches/failed", "FAILED", true, []string{`"done":true`, `"Enqueued token quota exceeded for this model."`}},
		{"batches/running", "RUNNING", false, []string{`"BATCH_STATE_RUNNING"`}},
	} {
		op, err := getOne(t, p, tc.name)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if op.Name != tc.name || op.State != tc.state || op.Terminal != tc.terminal || !op.CreateTime.Equal(getAt) {
			t.Errorf("%s: got %s %s terminal=%v created %v", tc.name, op.Name, op.State, op.Terminal, op.CreateTime)
		}
		for _, want := range tc.raw {
			if !strings.Contains(string(op.Raw), want) {
				t.Errorf("%s: raw lacks %s: %s", tc.name, want, op.Raw)
			}
		}
		if !json.Valid(op.Raw) {
			t.Errorf("%s: raw is not JSON", tc.name)
		}
	}
	if c := counts(s); c.Get != 3 || c.List != 0 || c.Probe != 0 || c.total() != 3 {
		t.Errorf("counts %+v, total %d; want 3 gets", c, c.total())
	}
	if n := s.Count(http.MethodGet, "/v1beta/batches/failed"); n != 1 {
		t.Errorf("the fake saw %d gets of batches/failed, want 1", n)
	}
}

// The list may say RUNNING and a get a moment later SUCCEEDED: Get tells
// what the API says now.
func TestGetSeesStateAfterList(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	s.SetGetState("batches/running", "SUCCEEDED")
	ops, _, err := collect(t, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Name == "batches/running" {
			t.Fatalf("the list handed over batches/running as %s", op.State)
		}
	}
	op, err := getOne(t, p, "batches/running")
	if err != nil || op.State != "SUCCEEDED" || !op.Terminal {
		t.Errorf("get after the list: %+v, %v; want SUCCEEDED", op, err)
	}
	s.SetGetState("batches/running", "")
	s.SetState("batches/running", "FAILED")
	if op, err = getOne(t, p, "batches/running"); err != nil || op.State != "FAILED" {
		t.Errorf("get after SetState: %s, %v", op.State, err)
	}
}

// 404 is ErrNotFound at once (no probe); a 403 while the credential lists
// is ErrNotFound after one probe; a 403 whose probe is refused too is
// ErrAuth, so a bad key never makes a batch unknown.
func TestGetNotFoundAndForbidden(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	p := newPoller(t, testConfig(s, &sleeps{}))

	_, err := getOne(t, p, "batches/nope")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrAuth) || errors.Is(err, ErrTransient) || !strings.Contains(err.Error(), "404") {
		t.Errorf("unknown batch: %v", err)
	}
	if c := counts(s); c.Get != 1 || c.Probe != 0 {
		t.Errorf("404: counts %+v, want one get, no probe", c)
	}

	s.Deny("batches/other-project")
	_, err = getOne(t, p, "batches/other-project")
	if !errors.Is(err, ErrNotFound) || errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "another project") {
		t.Errorf("403 with a working key: %v", err)
	}
	if c := counts(s); c.Get != 2 || c.Probe != 1 {
		t.Errorf("403: counts %+v, want 2 gets, 1 probe", c)
	}
	if r := s.Requests(); r[len(r)-1].Path != "/v1beta/batches" || r[len(r)-1].Query.Get("pageSize") != "1" {
		t.Errorf("the probe was %s?%s, want a list of page size 1", r[len(r)-1].Path, r[len(r)-1].Query.Encode())
	}

	// A revoked key: every request answers 403. No batch becomes unknown.
	s.SetHook(func(*http.Request) *geminifake.Fault {
		return &geminifake.Fault{Status: 403, Message: "Permission denied: Consumer 'api_key:x' has been suspended."}
	})
	for _, name := range []string{"batches/ok", "batches/failed", "batches/nope"} {
		_, err = getOne(t, p, name)
		if !errors.Is(err, ErrAuth) || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "GEMINI_API_KEY") {
			t.Errorf("%s with a revoked key: %v, want ErrAuth naming the key", name, err)
		}
	}
	s.SetHook(nil)
}

// A 404 whose body is not the API's error document — an HTML page from a
// proxy, or from a server that is not the API at all (a wrong --base-url)
// — says nothing about the batch: it is ErrUnexpected (a counted failure,
// retried), not ErrNotFound (dead at once, "unknown to the API"), and its
// message shows the status once and what to check.
func TestGetNotFoundThatIsNotTheAPIs(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	s.SetHook(func(*http.Request) *geminifake.Fault {
		return &geminifake.Fault{Status: http.StatusNotFound, Body: "<html><body>Not Found</body></html>"}
	})
	_, err := getOne(t, p, "batches/ok")
	if errors.Is(err, ErrNotFound) || !errors.Is(err, ErrUnexpected) {
		t.Fatalf("a 404 page that is not the API's answer: %v, want ErrUnexpected", err)
	}
	for _, want := range []string{"HTTP 404 Not Found: <html>", "--base-url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "404 404") {
		t.Errorf("error %q names the status twice", err)
	}
	// The listing's 404 says the same.
	if _, _, err := collect(t, p); err == nil || !strings.Contains(err.Error(), "HTTP 404 Not Found: <html>") ||
		!strings.Contains(err.Error(), "--base-url") || strings.Contains(err.Error(), "404 404") {
		t.Errorf("a list page answered by a 404 page: %v", err)
	}
	s.SetHook(nil)
	// The API's own 404 stays decisive.
	if _, err := getOne(t, p, "batches/nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the API's 404: %v, want ErrNotFound", err)
	}
}

// 401 and 400 API_KEY_INVALID are ErrAuth at once, naming the credential.
func TestGetAuth(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	cfg := testConfig(s, &sleeps{})
	cfg.APIKey = "wrong"
	p := newPoller(t, cfg)
	_, err := getOne(t, p, "batches/ok")
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "GEMINI_API_KEY") {
		t.Errorf("wrong key: %v", err)
	}

	p = newPoller(t, testConfig(s, &sleeps{}))
	s.InjectFault(geminifake.Fault{Status: 400, Message: "API key not valid. Please pass a valid API key."})
	if _, err = getOne(t, p, "batches/ok"); !errors.Is(err, ErrAuth) {
		t.Errorf("400 API key not valid: %v", err)
	}
	if c := counts(s); c.Probe != 0 {
		t.Errorf("auth errors sent %d probes, want none", c.Probe)
	}
}

// 429/5xx are retried within the budget, then come back as a
// *TransientError carrying the server's delay; transport errors and
// timeouts are transient too.
func TestGetTransient(t *testing.T) {
	t.Parallel()
	s := startFake(t, geminifake.Options{}, getBatches()...)
	sl := &sleeps{}
	cfg := testConfig(s, sl)
	cfg.MaxRetries = 2
	p := newPoller(t, cfg)

	storm := geminifake.Fault{Status: 429, RetryDelay: 31 * time.Second}
	s.InjectFault(storm, storm, storm)
	_, err := getOne(t, p, "batches/ok")
	var te *TransientError
	if !errors.As(err, &te) || !errors.Is(err, ErrTransient) || te.Status != 429 || te.RetryAfter != 31*time.Second {
		t.Fatalf("429 storm: %v (%+v)", err, te)
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrAuth) {
		t.Errorf("429 storm classified as decisive: %v", err)
	}
	if d := sl.all(); len(d) != 2 || d[0] != 31*time.Second || d[1] != 31*time.Second {
		t.Errorf("waits %v, want the server's 31s twice", d)
	}
	if c := counts(s); c.Get != 3 {
		t.Errorf("get requests %d, want 3 (1 + 2 retries)", c.Get)
	}

	s.InjectFault(geminifake.Fault{Status: 503, RetryAfter: "7"}, geminifake.Fault{Status: 503, RetryAfter: "7"},
		geminifake.Fault{Status: 503, RetryAfter: "7"})
	if _, err = getOne(t, p, "batches/ok"); !errors.As(err, &te) || te.Status != 503 || te.RetryAfter != 7*time.Second {
		t.Errorf("503 Retry-After 7: %v", err)
	}

	// A server that never answers in time: each attempt is cut at
	// RequestTimeout, and the last one comes back as transient.
	cfg.RequestTimeout = 100 * time.Millisecond
	p = newPoller(t, cfg)
	slow := geminifake.Fault{Delay: time.Minute}
	s.InjectFault(slow, slow, slow)
	if _, err = getOne(t, p, "batches/ok"); !errors.Is(err, ErrTransient) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("timeouts: %v", err)
	}

	// The caller's own context ends: transient, with the context's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err = p.Get(ctx, "batches/ok"); !errors.Is(err, ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}

	// A 403 whose probe gets no answer decides nothing: transient.
	p = newPoller(t, testConfig(s, sl))
	s.Deny("batches/x")
	s.InjectFault(geminifake.Fault{}, geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503},
		geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503}, geminifake.Fault{Status: 503})
	if _, err = getOne(t, p, "batches/x"); !errors.Is(err, ErrTransient) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrAuth) {
		t.Errorf("403, probe 503: %v", err)
	}
}

// Other 4xx and a body that is not the batch asked for decide nothing.
func TestGetUnexpected(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	s.InjectFault(geminifake.Fault{Status: 409, Message: "conflict"})
	if _, err := getOne(t, p, "batches/ok"); !errors.Is(err, ErrUnexpected) || !strings.Contains(err.Error(), "409") {
		t.Errorf("409: %v", err)
	}
	s.InjectFault(geminifake.Fault{Body: `{"name":"batches/someone-else","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`})
	if _, err := getOne(t, p, "batches/ok"); !errors.Is(err, ErrUnexpected) || !strings.Contains(err.Error(), "someone-else") {
		t.Errorf("another batch's body: %v", err)
	}
	s.InjectFault(geminifake.Fault{Body: `{"name":`})
	if _, err := getOne(t, p, "batches/ok"); !errors.Is(err, ErrUnexpected) {
		t.Errorf("malformed body: %v", err)
	}
}

// Names that the SDK would turn into another request are refused before
// any request; ids with characters that need escaping ("#", a space,
// non-ASCII) reach the API intact.
func TestGetNames(t *testing.T) {
	odd := "a b#é"
	s := startFake(t, geminifake.Options{}, geminifake.Batch{Name: "batches/" + odd, State: "SUCCEEDED", CreateTime: getAt})
	p := newPoller(t, testConfig(s, &sleeps{}))
	for _, name := range []string{"operations/x", "batches/", "batches", "batches/a/b", "tunedModels/batches/x",
		"batches/a?b", "batches/a%41", "batches/..", "batches/.", "batches/a\x00b", "files/x"} {
		if _, err := getOne(t, p, name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q: %v, want ErrInvalidName", name, err)
		}
	}
	if n := len(s.Requests()); n != 0 {
		t.Errorf("invalid names sent %d requests", n)
	}
	op, err := getOne(t, p, "batches/"+odd)
	if err != nil || op.Name != "batches/"+odd {
		t.Errorf("id %q: got %q, %v", odd, op.Name, err)
	}
	if n := s.Count(http.MethodGet, "/v1beta/batches/"+odd); n != 1 {
		t.Errorf("the fake saw %d gets of %q, want 1 (escaped on the way, decoded on arrival)", n, odd)
	}
}

// Vertex: a full job name of the client's project and location, or its
// numeric id; a job of another location is refused, not fetched from the
// client's; unknown → ErrNotFound; the decoding traps are read raw.
func TestGetVertex(t *testing.T) {
	jobs := []geminifake.Batch{
		{Name: geminifake.VertexName("123", "us-central1", "111"), State: "SUCCEEDED", CreateTime: getAt,
			EndTime: getAt.Add(time.Hour), SuccessfulCount: 9, FailedCount: 1},
	}
	for _, opts := range []geminifake.Options{{}, {VertexNumericCounters: true}} {
		s := startFake(t, opts, jobs...)
		cfg := testConfig(s, &sleeps{})
		cfg.Backend, cfg.Project, cfg.Location = BackendVertex, "123", "us-central1"
		p := newPoller(t, cfg)
		for _, name := range []string{jobs[0].Name, "111"} {
			op, err := getOne(t, p, name)
			if err != nil || op.Name != jobs[0].Name || op.State != "SUCCEEDED" || !op.Terminal {
				t.Errorf("%+v %s: %+v, %v", opts, name, op, err)
			}
			if !strings.Contains(string(op.Raw), `"completionStats"`) {
				t.Errorf("%+v %s: raw lacks completionStats: %s", opts, name, op.Raw)
			}
		}
		for _, name := range []string{geminifake.VertexName("123", "europe-west4", "111"), geminifake.VertexName("456", "us-central1", "111"), "batches/111", "abc"} {
			if _, err := getOne(t, p, name); !errors.Is(err, ErrInvalidName) {
				t.Errorf("%s: %v, want ErrInvalidName", name, err)
			}
		}
		if _, err := getOne(t, p, "222"); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown job: %v", err)
		}
		if n := s.Count(http.MethodGet, "/v1beta1/projects/123/locations/us-central1/batchPredictionJobs/111"); n != 2 {
			t.Errorf("%d gets of job 111, want 2", n)
		}
	}
}
