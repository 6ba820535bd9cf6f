package dynamic_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// t0 is the tests' clock start: a fixed instant, so that nothing depends
// on the machine's time.
var t0 = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

// newClock returns a clock at t0 that tests move by hand.
func newClock() *testkit.Clock { return testkit.NewClock(t0) }

// served starts a fake key server over real HTTP.
func served(t *testing.T, opts fakejwks.Options) (*fakejwks.Keys, *httptest.Server) {
	t.Helper()
	keys, err := fakejwks.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(keys)
	t.Cleanup(srv.Close)
	return keys, srv
}

func verifier(t *testing.T, url string, clk *testkit.Clock, audience string) *dynamic.Verifier {
	t.Helper()
	v, err := dynamic.New(dynamic.Config{JWKSURL: url, Now: clk.Now, Audience: audience})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var testBody = []byte(`{"type":"batch.succeeded","version":"v1","timestamp":"2026-05-04T12:00:00Z","data":{"id":"batches/abc123"}}`)

// headers are the Standard Webhooks headers of a delivery made at ts with
// the given webhook-signature lines.
func headers(id string, ts time.Time, sigLines ...string) http.Header {
	h := http.Header{}
	if id != "" {
		h.Set(dynamic.HeaderID, id)
	}
	if !ts.IsZero() {
		h.Set(dynamic.HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	}
	for _, l := range sigLines {
		h.Add(dynamic.HeaderSignature, l)
	}
	return h
}

func verify(v *dynamic.Verifier, body []byte, h http.Header) (dynamic.Result, error) {
	return v.Verify(context.Background(), body, h)
}
