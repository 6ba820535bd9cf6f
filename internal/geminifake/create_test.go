package geminifake

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/genaitest"
)

// Batches.Create through the SDK v1.79.1, inline and file sources with a
// webhookConfig: the request is read as the SDK sends it, the answer is the
// PENDING operation the SDK maps, the hook sees the request, and the batch
// is listed and fetched afterwards.
func TestBatchesCreateThroughSDK(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	c := genaitest.Client(t, base, whKey)
	ctx := context.Background()
	var mu sync.Mutex
	var hooked []CreateRequest
	s.SetCreateHook(func(b Batch, req CreateRequest) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := s.Batch(b.Name); !ok {
			t.Errorf("hook called before %s was added", b.Name)
		}
		hooked = append(hooked, req)
	})

	cfg := &genai.CreateBatchJobConfig{
		DisplayName: "inline-one",
		WebhookConfig: &genai.WebhookConfig{
			Uris:         []string{"https://hooks.example.com/dyn"},
			UserMetadata: map[string]any{"team": "search", "run": float64(7)},
		},
	}
	src := &genai.BatchJobSource{InlinedRequests: []*genai.InlinedRequest{
		{Contents: genai.Text("What is 2+2?"), Metadata: map[string]string{"key": "q1"}},
		{Contents: genai.Text("Name a colour."), Metadata: map[string]string{"key": "q2"}},
	}}
	job, err := c.Batches.Create(ctx, "gemini-2.5-flash", src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(job.Name, "batches/") || job.State != genai.JobStatePending || job.DisplayName != "inline-one" ||
		job.Model != "models/gemini-2.5-flash" || job.CreateTime.IsZero() {
		t.Fatalf("create returned %+v", job)
	}
	b, ok := s.Batch(job.Name)
	if !ok || b.RequestCount != 2 || b.WebhookConfig == nil || b.WebhookConfig.Uris[0] != "https://hooks.example.com/dyn" ||
		b.WebhookConfig.UserMetadata["team"] != "search" {
		t.Fatalf("stored batch %+v (ok %v)", b, ok)
	}
	got, err := c.Batches.Get(ctx, job.Name, nil)
	if err != nil || got.State != genai.JobStatePending {
		t.Fatalf("get after create: %+v, %v", got, err)
	}

	job2, err := c.Batches.Create(ctx, "models/gemini-2.5-pro", &genai.BatchJobSource{FileName: "files/input-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if job2.Name == job.Name || job2.Model != "models/gemini-2.5-pro" {
		t.Fatalf("second create returned %+v", job2)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(hooked) != 2 {
		t.Fatalf("hook saw %d creates, want 2", len(hooked))
	}
	in := hooked[0]
	if in.Model != "models/gemini-2.5-flash" || in.DisplayName != "inline-one" || in.FileName != "" || len(in.Requests) != 2 ||
		in.Requests[1].Metadata["key"] != "q2" || !strings.Contains(string(in.Requests[0].Request), "What is 2+2?") ||
		in.WebhookConfig == nil || in.WebhookConfig.UserMetadata["run"] != float64(7) {
		t.Errorf("inline create request seen as %+v", in)
	}
	if f := hooked[1]; f.FileName != "files/input-1" || len(f.Requests) != 0 || f.WebhookConfig != nil {
		t.Errorf("file create request seen as %+v", f)
	}
}

// Bad create requests get the API's 400 (or 401/403/404/405) and add no
// batch; faults apply to create as to every request.
func TestBatchesCreateRefusals(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	const path = "/v1beta/models/gemini-2.5-flash:batchGenerateContent"
	for _, tc := range []struct {
		name, path, method, key, body string
		want                          int
	}{
		{"no key", path, "POST", "", `{"batch":{"inputConfig":{"fileName":"files/a"}}}`, 403},
		{"wrong key", path, "POST", "nope", `{"batch":{"inputConfig":{"fileName":"files/a"}}}`, 401},
		{"GET", path, "GET", whKey, ``, 405},
		{"bad model", "/v1beta/models/a/b:batchGenerateContent", "POST", whKey, `{"batch":{"inputConfig":{"fileName":"files/a"}}}`, 404},
		{"not json", path, "POST", whKey, `{"batch":`, 400},
		{"no batch", path, "POST", whKey, `{}`, 400},
		{"unknown field", path, "POST", whKey, `{"batch":{"inputConfig":{"fileName":"files/a"},"priority":3}}`, 400},
		{"no input", path, "POST", whKey, `{"batch":{"displayName":"x"}}`, 400},
		{"both inputs", path, "POST", whKey, `{"batch":{"inputConfig":{"fileName":"files/a","requests":{"requests":[{"request":{}}]}}}}`, 400},
		{"empty requests", path, "POST", whKey, `{"batch":{"inputConfig":{"requests":{"requests":[]}}}}`, 400},
		{"request not an object", path, "POST", whKey, `{"batch":{"inputConfig":{"requests":{"requests":[{"request":"hi"}]}}}}`, 400},
		{"bad file name", path, "POST", whKey, `{"batch":{"inputConfig":{"fileName":"gs://bucket/a.jsonl"}}}`, 400},
		{"bad webhook uri", path, "POST", whKey, `{"batch":{"inputConfig":{"fileName":"files/a"},"webhookConfig":{"uris":["ftp://x"]}}}`, 400},
		{"model mismatch", path, "POST", whKey, `{"batch":{"model":"models/other","inputConfig":{"fileName":"files/a"}}}`, 400},
	} {
		req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		if tc.key != "" {
			req.Header.Set("x-goog-api-key", tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("refused creates added %d batches", n)
	}

	s.InjectFault(Fault{Status: http.StatusServiceUnavailable})
	c := genaitest.Client(t, base, whKey)
	_, err := c.Batches.Create(context.Background(), "gemini-2.5-flash", &genai.BatchJobSource{FileName: "files/a"}, nil)
	var ae genai.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusServiceUnavailable {
		t.Fatalf("create under a 503 fault: %v", err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("a faulted create added %d batches", n)
	}
}
