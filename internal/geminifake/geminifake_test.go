package geminifake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
)

func start(t *testing.T, opts Options, bs ...Batch) (*Server, string) {
	t.Helper()
	s := New(opts)
	s.Add(bs...)
	u, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, strings.TrimSuffix(u, "/")
}

func get(t *testing.T, url string, hdr map[string]string) (int, http.Header, []byte) {
	t.Helper()
	h := http.Header{}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return testkit.Call(t, http.MethodGet, url, "", h)
}

func jsonEqual(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("want is not JSON: %v\n%s", err, want)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("JSON differs:\n got %s\nwant %s", got, want)
	}
}

// The fake renders the documented batches exactly as docs/gemini-api.md shows them.
func TestGeminiShapesMatchDoc(t *testing.T) {
	bs, err := LoadBatches("../../testdata/gemini/doc-batches.json")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../testdata/gemini/doc-operations.json")
	if err != nil {
		t.Fatal(err)
	}
	var wantOps []json.RawMessage
	if err := json.Unmarshal(want, &wantOps); err != nil {
		t.Fatal(err)
	}
	_, u := start(t, Options{APIKey: "k"}, bs...)
	for i, b := range bs {
		code, _, body := get(t, u+"/v1beta/"+b.Name, map[string]string{"x-goog-api-key": "k"})
		if code != 200 {
			t.Fatalf("GET %s = %d %s", b.Name, code, body)
		}
		jsonEqual(t, body, wantOps[i])
	}
	code, _, body := get(t, u+"/v1beta/batches?pageSize=10", map[string]string{"x-goog-api-key": "k"})
	if code != 200 {
		t.Fatalf("list = %d %s", code, body)
	}
	var page struct {
		Operations    []json.RawMessage `json:"operations"`
		NextPageToken *string           `json:"nextPageToken"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Operations) != 3 || page.NextPageToken != nil {
		t.Errorf("list: %d operations, next %v; want 3 and no token", len(page.Operations), page.NextPageToken)
	}
	if strings.Contains(string(body), `"done":false`) {
		t.Errorf("a non-terminal operation carries done: %s", body)
	}
}

// Pages cover every batch exactly once, in a shuffled (not time) order,
// and their tokens are opaque.
func TestPagingCoversAllShuffled(t *testing.T) {
	base := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	var bs []Batch
	for i := range 95 {
		bs = append(bs, Batch{Name: GeminiName(fmt.Sprintf("b%03d", i)), State: "RUNNING",
			CreateTime: base.Add(time.Duration(i) * time.Minute)})
	}
	s, u := start(t, Options{Seed: 7}, bs...)
	seen := map[string]int{}
	var order []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			t.Fatal("paging does not end")
		}
		code, _, body := get(t, u+"/v1beta/batches?pageSize=10&pageToken="+token, nil)
		if code != 200 {
			t.Fatalf("list = %d %s", code, body)
		}
		var page struct {
			Operations []struct {
				Name string `json:"name"`
			} `json:"operations"`
			NextPageToken string `json:"nextPageToken"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		for _, op := range page.Operations {
			seen[op.Name]++
			order = append(order, op.Name)
		}
		if strings.Contains(page.NextPageToken, "batches/") {
			t.Errorf("token %q is not opaque", page.NextPageToken)
		}
		if page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
		if pages == 2 {
			// A batch added mid-listing does not disturb the cursor.
			s.Add(Batch{Name: GeminiName("late"), State: "RUNNING", CreateTime: base})
		}
	}
	for _, b := range bs {
		if seen[b.Name] != 1 {
			t.Errorf("%s listed %d times, want 1", b.Name, seen[b.Name])
		}
	}
	sorted := true
	for i := 1; i < len(order); i++ {
		if order[i] < order[i-1] {
			sorted = false
		}
	}
	if sorted {
		t.Error("results come sorted; the fake must shuffle")
	}
	if got := len(s.Requests()); got != 10 {
		t.Errorf("recorded %d requests, want 10", got)
	}
}

func TestAuthAndFaults(t *testing.T) {
	b := Batch{Name: GeminiName("x"), State: "SUCCEEDED", CreateTime: time.Now()}
	s, u := start(t, Options{APIKey: "good"}, b)
	tests := []struct {
		name   string
		hdr    map[string]string
		fault  *Fault
		status int
		want   string
	}{
		{"missing key", nil, nil, 403, "PERMISSION_DENIED"},
		{"wrong key", map[string]string{"x-goog-api-key": "bad"}, nil, 401, "UNAUTHENTICATED"},
		{"good key", map[string]string{"x-goog-api-key": "good"}, nil, 200, `"done":true`},
		{"429 retry info", map[string]string{"x-goog-api-key": "good"}, &Fault{Status: 429, RetryDelay: 31 * time.Second, RetryAfter: "7"}, 429, `"retryDelay":"31s"`},
		{"503", map[string]string{"x-goog-api-key": "good"}, &Fault{Status: 503}, 503, "UNAVAILABLE"},
		{"malformed", map[string]string{"x-goog-api-key": "good"}, &Fault{Body: `{"operations":[{`}, 200, `{"operations":[{`},
	}
	for _, tc := range tests {
		if tc.fault != nil {
			s.InjectFault(*tc.fault)
		}
		code, hdr, body := get(t, u+"/v1beta/batches/x", tc.hdr)
		if code != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: GET = %d %s, want %d containing %q", tc.name, code, body, tc.status, tc.want)
		}
		if tc.fault != nil && tc.fault.RetryAfter != "" && hdr.Get("Retry-After") != tc.fault.RetryAfter {
			t.Errorf("%s: Retry-After = %q, want %q", tc.name, hdr.Get("Retry-After"), tc.fault.RetryAfter)
		}
	}
	reqs := s.Requests()
	if len(reqs) != len(tests) {
		t.Fatalf("recorded %d requests, want %d", len(reqs), len(tests))
	}
	if reqs[1].Header.Get("x-goog-api-key") != "bad" || reqs[1].Status != 401 {
		t.Errorf("request record = %+v", reqs[1])
	}
}

func TestVertexShapesAndTraps(t *testing.T) {
	bs, err := LoadBatches("../../testdata/gemini/vertex-jobs.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, numeric := range []bool{false, true} {
		_, u := start(t, Options{BearerToken: "tok", VertexNumericCounters: numeric, VertexErrorDetailsObjects: true}, bs...)
		base := u + "/v1beta1/projects/123/locations/us-central1/batchPredictionJobs"
		if code, _, _ := get(t, base, nil); code != 401 {
			t.Errorf("no token: %d, want 401", code)
		}
		code, _, body := get(t, base+"?pageSize=100", map[string]string{"Authorization": "Bearer tok"})
		if code != 200 {
			t.Fatalf("list = %d %s", code, body)
		}
		var page struct {
			Jobs []map[string]any `json:"batchPredictionJobs"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		if len(page.Jobs) != len(bs) {
			t.Fatalf("listed %d jobs, want %d", len(page.Jobs), len(bs))
		}
		for _, j := range page.Jobs {
			if !strings.HasPrefix(j["state"].(string), "JOB_STATE_") {
				t.Errorf("state %v not in Vertex spelling", j["state"])
			}
			if cs, ok := j["completionStats"].(map[string]any); ok {
				_, isString := cs["successfulCount"].(string)
				if isString == numeric {
					t.Errorf("numeric=%v: successfulCount = %#v", numeric, cs["successfulCount"])
				}
			}
		}
		code, _, body = get(t, base+"/1001", map[string]string{"Authorization": "Bearer tok"})
		if code != 200 || !strings.Contains(string(body), "JOB_STATE_PARTIALLY_SUCCEEDED") {
			t.Errorf("get = %d %s", code, body)
		}
		// Other projects' jobs are not listed.
		_, _, body = get(t, u+"/v1beta1/projects/other/locations/us-central1/batchPredictionJobs", map[string]string{"Authorization": "Bearer tok"})
		if strings.Contains(string(body), "batchPredictionJobs/") {
			t.Errorf("other project lists jobs: %s", body)
		}
	}
}

func TestRecordLimit(t *testing.T) {
	s, u := start(t, Options{RecordLimit: 3})
	for range 5 {
		get(t, u+"/v1beta/batches/none", nil)
	}
	reqs := s.Requests()
	if len(reqs) != 3 {
		t.Fatalf("kept %d records, want 3", len(reqs))
	}
	for _, r := range reqs {
		if r.Status != 404 {
			t.Errorf("record status %d, want 404", r.Status)
		}
	}
}

// listAll pages through the Gemini listing and returns the names and
// createTimes in listing order.
func listAll(t *testing.T, u string, pageSize int) ([]string, []time.Time) {
	t.Helper()
	var names []string
	var times []time.Time
	token := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
		code, _, body := get(t, fmt.Sprintf("%s/v1beta/batches?pageSize=%d&pageToken=%s", u, pageSize, token), nil)
		if code != 200 {
			t.Fatalf("list = %d %s", code, body)
		}
		var page struct {
			Operations []struct {
				Name     string `json:"name"`
				Metadata struct {
					CreateTime time.Time `json:"createTime"`
				} `json:"metadata"`
			} `json:"operations"`
			NextPageToken string `json:"nextPageToken"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		for _, op := range page.Operations {
			names = append(names, op.Name)
			times = append(times, op.Metadata.CreateTime)
		}
		if page.NextPageToken == "" {
			return names, times
		}
		token = page.NextPageToken
	}
}

func nonIncreasing(ts []time.Time) bool {
	for i := 1; i < len(ts); i++ {
		if ts[i].After(ts[i-1]) {
			return false
		}
	}
	return true
}

// Each listing order lists every batch once, in the order it names.
func TestListingOrders(t *testing.T) {
	base := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	var bs []Batch
	for i := range 60 {
		// Names in another order than times, and two batches sharing a time.
		bs = append(bs, Batch{Name: GeminiName(fmt.Sprintf("o%03d", (i*37)%60)), State: "SUCCEEDED",
			CreateTime: base.Add(time.Duration(i/2) * time.Minute)})
	}
	for _, order := range Orders {
		t.Run(order.String(), func(t *testing.T) {
			s, u := start(t, Options{Seed: 5, Order: order}, bs...)
			names, times := listAll(t, u, 7)
			seen := map[string]int{}
			for _, n := range names {
				seen[n]++
			}
			for _, b := range bs {
				if seen[b.Name] != 1 {
					t.Fatalf("%s listed %d times, want 1", b.Name, seen[b.Name])
				}
			}
			rev := slices.Clone(times)
			slices.Reverse(rev)
			switch order {
			case OrderNewestFirst:
				if !nonIncreasing(times) {
					t.Errorf("not newest first: %v", times)
				}
			case OrderOldestFirst:
				if !nonIncreasing(rev) {
					t.Errorf("not oldest first: %v", times)
				}
			case OrderShuffled:
				if nonIncreasing(times) || nonIncreasing(rev) {
					t.Errorf("shuffled listing is sorted by time")
				}
			case OrderTwoRuns:
				split := slices.IndexFunc(names, func(n string) bool { return s.RunOf(n) == 1 })
				if split <= 0 || split == len(names) {
					t.Fatalf("one run is empty (split at %d of %d)", split, len(names))
				}
				for i, n := range names {
					if s.RunOf(n) != btoi(i >= split) {
						t.Fatalf("%s (run %d) listed at %d, split at %d", n, s.RunOf(n), i, split)
					}
				}
				if !nonIncreasing(times[:split]) || !nonIncreasing(times[split:]) || nonIncreasing(times) {
					t.Errorf("want two newest-first runs, not one: %v", times)
				}
			}
			// SetOrder changes the next listing.
			s.SetOrder(OrderOldestFirst)
			_, times = listAll(t, u, 7)
			slices.Reverse(times)
			if !nonIncreasing(times) {
				t.Errorf("after SetOrder(oldest-first): %v", times)
			}
		})
	}
}

// A batch whose createTime changes moves in a time order; a listing under
// way still lists every other batch exactly once.
func TestListingOrderUpdateMovesBatch(t *testing.T) {
	base := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	var bs []Batch
	for i := range 20 {
		bs = append(bs, Batch{Name: GeminiName(fmt.Sprintf("u%02d", i)), State: "SUCCEEDED", CreateTime: base.Add(time.Duration(i) * time.Hour)})
	}
	s, u := start(t, Options{Order: OrderNewestFirst}, bs...)
	s.Update(GeminiName("u00"), func(b *Batch) { b.CreateTime = base.Add(100 * time.Hour) })
	names, _ := listAll(t, u, 6)
	if names[0] != GeminiName("u00") || names[1] != GeminiName("u19") || len(names) != 20 {
		t.Errorf("after moving u00 to the newest: %v", names)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
