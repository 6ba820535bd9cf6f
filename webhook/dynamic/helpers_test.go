package dynamic_test

import (
	"context"
	"crypto/hmac"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

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
	v, err := dynamic.New(dynamic.Config{JWKSURL: url, Now: clk.Now, Audience: audience, FetchTimeout: 5 * time.Second})
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

// rawJWT builds a compact JWS by hand from a header and claims, with sig
// computed over the signing input by signFn (nil: an empty signature).
func rawJWT(t *testing.T, header map[string]any, claims map[string]any, signFn func(input []byte) []byte) string {
	t.Helper()
	hb, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	input := base64.RawURLEncoding.EncodeToString(hb) + "." + base64.RawURLEncoding.EncodeToString(cb)
	var sig []byte
	if signFn != nil {
		sig = signFn([]byte(input))
	}
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func hs256(secret []byte) func([]byte) []byte {
	return func(input []byte) []byte {
		m := hmac.New(sha256.New, secret)
		m.Write(input)
		return m.Sum(nil)
	}
}

// signRS256 signs a live JWT (iat now, exp in a minute) with any RSA key
// under any kid. Safe to call from several goroutines (t.Fatal is not
// used).
func signRS256(t *testing.T, key *rsa.PrivateKey, kid string, now time.Time) string {
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Error(err)
		return ""
	}
	tok, err := jwt.Signed(s).Claims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(time.Minute))}).Serialize()
	if err != nil {
		t.Error(err)
	}
	return tok
}

func verify(v *dynamic.Verifier, body []byte, h http.Header) (dynamic.Result, error) {
	return v.Verify(context.Background(), body, h)
}
