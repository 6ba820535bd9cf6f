package poller

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Every request goes to the API version gemrecon pins, whatever the SDK's
// default (v1 from genai v1.78.0) and GOOGLE_GENAI_API_VERSION say: list
// pages, a get, a credential probe, a download and its files.get on the
// Gemini API under v1beta, and Vertex AI under v1beta1. (The stand-in
// serves batches and files on v1 as well, so only the recorded paths can
// tell.)
func TestAPIVersionPinned(t *testing.T) {
	t.Setenv("GOOGLE_GENAI_API_VERSION", "v1")
	bs := load(t, "batches-mixed.json")
	s := startFake(t, geminifake.Options{}, bs...)
	s.AddFile(geminifake.File{Name: "files/unframed", Data: []byte("{}\n"), Unframed: true})
	s.Deny("batches/other")
	p := newPoller(t, testConfig(s, &sleeps{}))
	if _, _, err := collect(t, p); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Get(ctx, bs[0].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, "batches/other"); err == nil {
		t.Fatal("a denied batch was fetched")
	}
	if _, err := p.Download(ctx, "files/unframed", io.Discard); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, r := range s.Requests() {
		if !strings.HasPrefix(r.Path, "/v1beta/") {
			t.Errorf("%s %s: not under /v1beta/", r.Method, r.Path)
		}
		switch {
		case strings.HasSuffix(r.Path, "/batches"):
			kinds["list"]++
		case strings.HasPrefix(r.Path, "/v1beta/batches/"):
			kinds["get"]++
		case strings.HasSuffix(r.Path, ":download"):
			kinds["download"]++
		case strings.HasPrefix(r.Path, "/v1beta/files/"):
			kinds["files.get"]++
		}
	}
	if kinds["list"] < 2 || kinds["get"] != 2 || kinds["download"] != 1 || kinds["files.get"] != 1 {
		t.Errorf("requests by kind %v; want the pages, two gets, one probe (a list), a download and a files.get", kinds)
	}

	vs := startFake(t, geminifake.Options{BearerToken: "tok"}, load(t, "vertex-jobs.json")...)
	cfg := testConfig(vs, &sleeps{})
	cfg.Backend, cfg.APIKey, cfg.Project, cfg.Location = BackendVertex, "", "123", "us-central1"
	cfg.NoCredentials = true
	cfg.HTTPClient = &http.Client{Transport: bearer{"tok"}}
	if _, _, err := collect(t, newPoller(t, cfg)); err != nil {
		t.Fatal(err)
	}
	for _, r := range vs.Requests() {
		if !strings.HasPrefix(r.Path, "/v1beta1/projects/123/locations/us-central1/") {
			t.Errorf("vertex: %s %s: not under /v1beta1/", r.Method, r.Path)
		}
	}
}
