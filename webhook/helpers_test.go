package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	gserve "github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook"
)

// Secrets for tests (24+ random bytes each, base64).
const (
	testSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	rotatedSecret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD" // the sender's old secret, no longer configured
)

// event is a Gemini-shaped completion webhook for batches/id.
func event(id string) []byte {
	return fmt.Appendf(nil, `{"type":"batch.succeeded","version":"v1","timestamp":"2026-11-29T07:00:00Z","data":{"id":%q}}`, id)
}

// newHandler builds a receiver on cfg.Sink as serve does (serve.Receiver:
// the ingest path, and a Metrics unless cfg has one); without a sink it is
// webhook.NewHandler's refusal.
func newHandler(cfg webhook.Config) (*webhook.Handler, error) {
	s, ok := cfg.Sink.(sink.Sink)
	if !ok {
		return webhook.NewHandler(cfg)
	}
	return gserve.Receiver(cfg, s)
}

// serve runs h through webhook.Serve on a loopback port until the test ends
// (or cancel is called) and returns its base URL and a function that stops
// it and returns Serve's result.
func serve(t testing.TB, h *webhook.Handler, opts webhook.ServerOptions) (string, func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- webhook.Serve(ctx, ln, h, opts) }()
	var once sync.Once
	var result error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				result = errors.New("Serve did not return within 30s of cancel")
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return "http://" + ln.Addr().String(), stop
}

// signed returns the Standard Webhooks headers for body.
func signed(t testing.TB, secret, id string, at time.Time, body []byte) http.Header {
	t.Helper()
	h, err := testkit.SignWebhook(secret, id, at, body)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// reply is a decoded response.
type reply struct {
	Code   int
	Key    string `json:"key"`
	Status string `json:"status"`
	Type   string `json:"type"`
	Error  string `json:"error"`
	Header http.Header
	Raw    string
}

func do(t testing.TB, client *http.Client, method, url string, body []byte, h http.Header) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{Code: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s %s: response %q is not JSON: %v", method, url, raw, err)
		}
	}
	return r
}

// snapshot describes every row that matters for "nothing was recorded":
// keys, states, sighting counts and sources, after flushing buffered
// statistics.
func snapshot(t testing.TB, s sink.Sink) string {
	t.Helper()
	ctx := context.Background()
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	es, err := s.List(ctx, sink.ListOptions{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var b strings.Builder
	for _, e := range es {
		src := append([]string(nil), e.Sources...)
		sort.Strings(src)
		fmt.Fprintf(&b, "%s %s seen=%d sources=%v attempts=%d\n", e.Key, e.State, e.SeenCount, src, e.Attempts)
	}
	return b.String()
}

// drain claims every due key of s and runs effect for each, completing it
// on success: the dispatch loop in its smallest form, over the real sink. It
// returns how many effects ran.
func drain(t testing.TB, s sink.Sink, effect func(key string) error) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for {
		claims, err := s.ClaimDue(ctx, "test-drain", time.Minute, 64, sink.ClaimOptions{})
		if err != nil {
			t.Fatalf("ClaimDue: %v", err)
		}
		if len(claims) == 0 {
			return n
		}
		for _, c := range claims {
			n++
			if err := effect(c.Key); err != nil {
				if _, err := s.Fail(ctx, c.Key, c.Token, sink.Failure{Cause: err.Error()}); err != nil {
					t.Fatalf("Fail(%s): %v", c.Key, err)
				}
				continue
			}
			if err := s.Complete(ctx, c.Key, c.Token); err != nil {
				t.Fatalf("Complete(%s): %v", c.Key, err)
			}
		}
	}
}
