package loadgen

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestCheckLoopback(t *testing.T) {
	tests := []struct {
		url string
		ok  bool
	}{
		{"http://127.0.0.1:8080/webhook", true},
		{"http://127.0.0.2:80/", true},
		{"http://[::1]:8080/webhook", true},
		{"http://localhost:8080/webhook", true},
		{"http://example.com/webhook", false},
		{"http://10.0.0.1/webhook", false},
		{"http://0.0.0.0:8080/", false},
		{"::bad", false},
	}
	for _, tt := range tests {
		if err := CheckLoopback(tt.url); (err == nil) != tt.ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", tt.url, err, tt.ok)
		}
	}
}

func TestRunAgainstReceiver(t *testing.T) {
	ctx := context.Background()
	s := sqlitetest.OpenTemp(t, sink.Options{})
	h, err := serve.Receiver(webhook.Config{Secrets: []string{secret}}, s)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	res, err := Run(ctx, Config{URL: srv.URL + "/webhook", Secret: secret, Workers: 4, Count: 40, Body: NewKeys("t")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 40 || res.ByStatus[202] != 40 || len(res.Acks) != 40 || res.TransportErrors != 0 {
		t.Fatalf("Run(40 new keys) = sent %d, statuses %v, acks %d, transport errors %d; want 40 × 202", res.Sent, res.ByStatus, len(res.Acks), res.TransportErrors)
	}
	for _, a := range res.Acks {
		if a.Status != "accepted" {
			t.Errorf("ack %d = %q, want accepted", a.Index, a.Status)
		}
		if _, err := s.Get(ctx, a.Key); err != nil {
			t.Errorf("Get(%q) after 202 = %v", a.Key, err)
		}
	}
	if res.Quantile(0.5) <= 0 || res.Quantile(0.99) < res.Quantile(0.5) || res.Rate() <= 0 {
		t.Errorf("p50 %v, p99 %v, rate %v: want positive and ordered", res.Quantile(0.5), res.Quantile(0.99), res.Rate())
	}

	res, err = Run(ctx, Config{URL: srv.URL + "/webhook", Secret: secret, Workers: 4, Count: 20, Body: SameKey("t-0")})
	if err != nil {
		t.Fatal(err)
	}
	if res.ByStatus[202] != 20 {
		t.Fatalf("Run(20 duplicates) statuses = %v, want 20 × 202", res.ByStatus)
	}
	for _, a := range res.Acks {
		if a.Status != "duplicate" {
			t.Errorf("duplicate ack %d = %q, want duplicate", a.Index, a.Status)
		}
	}

	// Unsigned requests to a verifying receiver are all 401.
	res, err = Run(ctx, Config{URL: srv.URL + "/webhook", Workers: 2, Count: 5})
	if err != nil || res.ByStatus[401] != 5 {
		t.Errorf("Run(unsigned) = %v, %v; want 5 × 401", res.ByStatus, err)
	}

	// Duration bounds a run without a count.
	start := time.Now()
	if _, err := Run(ctx, Config{URL: srv.URL + "/webhook", Secret: secret, Workers: 2, Duration: 200 * time.Millisecond, Body: SameKey("t-1")}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Run(Duration 200ms) took %v", el)
	}
}

func TestRunRefuses(t *testing.T) {
	ctx := context.Background()
	tests := []Config{
		{URL: "http://192.0.2.1/webhook", Count: 1},
		{URL: "http://127.0.0.1:1/webhook"}, // unbounded
		{URL: "http://127.0.0.1:1/webhook", Count: 1, Secret: "nope"},
	}
	for _, cfg := range tests {
		if _, err := Run(ctx, cfg); err == nil {
			t.Errorf("Run(%+v) = nil error, want a refusal", cfg)
		}
	}
}

func TestRunServerGone(t *testing.T) {
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close()
	res, err := Run(context.Background(), Config{URL: url + "/webhook", Workers: 3, Count: 100, StopOnTransportError: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.TransportErrors != 3 || len(res.Acks) != 0 || res.FirstError == nil {
		t.Errorf("Run(closed server) = %d transport errors, %d acks, first %v; want 3 (one per worker), 0", res.TransportErrors, len(res.Acks), res.FirstError)
	}
}
