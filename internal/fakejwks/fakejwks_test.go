package fakejwks_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
)

func get(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func parseSet(t *testing.T, doc []byte) jose.JSONWebKeySet {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(doc, &set); err != nil {
		t.Fatal(err)
	}
	return set
}

// TestServesJWKS: the key server answers GET with the public keys and
// Cache-Control, counts every request, fails on demand, and publishes
// rotated keys beside the old ones.
func TestServesJWKS(t *testing.T) {
	keys, err := fakejwks.New(fakejwks.Options{Ed25519Keys: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(keys)
	defer srv.Close()

	resp, doc := get(t, srv.URL+"/.well-known/jwks.json")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Cache-Control") != fakejwks.DefaultCacheControl {
		t.Fatalf("GET = %s, Cache-Control %q; want 200, %q", resp.Status, resp.Header.Get("Cache-Control"), fakejwks.DefaultCacheControl)
	}
	for _, private := range []string{`"d"`, `"p"`, `"q"`, `"dp"`} {
		if strings.Contains(string(doc), private+":") {
			t.Errorf("the JWKS publishes private member %s", private)
		}
	}
	set := parseSet(t, doc)
	if len(set.Keys) != 3 {
		t.Fatalf("JWKS has %d keys, want 2 Ed25519 and 1 RSA", len(set.Keys))
	}
	for _, k := range set.Keys {
		if !k.IsPublic() || k.Use != "sig" || k.KeyID == "" || k.Algorithm == "" {
			t.Errorf("key %q: public %v, use %q, alg %q; want a public signing key with kid and alg", k.KeyID, k.IsPublic(), k.Use, k.Algorithm)
		}
	}

	keys.SetCacheControl("max-age=60")
	if resp, _ := get(t, srv.URL); resp.Header.Get("Cache-Control") != "max-age=60" {
		t.Errorf("Cache-Control after SetCacheControl = %q", resp.Header.Get("Cache-Control"))
	}
	keys.SetCacheControl("-")
	if resp, _ := get(t, srv.URL); resp.Header.Values("Cache-Control") != nil {
		t.Errorf("Cache-Control after SetCacheControl(-) = %q, want none", resp.Header.Values("Cache-Control"))
	}
	keys.SetFailure(http.StatusServiceUnavailable)
	if resp, _ := get(t, srv.URL); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET while failing = %s, want 503", resp.Status)
	}
	keys.SetFailure(0)
	resp, err = http.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST = %s, want 405", resp.Status)
	}
	if err := keys.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, doc := get(t, srv.URL); len(parseSet(t, doc).Keys) != 5 {
		t.Errorf("JWKS after Rotate has %d keys, want 5 (old and new)", len(parseSet(t, doc).Keys))
	}
	if n := keys.Fetches(); n != 6 { // five GETs and the POST
		t.Errorf("Fetches = %d, want 6", n)
	}
}

// TestSignatures checks the signer against the published keys with the
// standard library and go-jose directly, not through the verifier under
// test elsewhere.
func TestSignatures(t *testing.T) {
	keys, err := fakejwks.New(fakejwks.Options{Ed25519Keys: 3, Audience: "aud-1", JWTLifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	set := parseSet(t, keys.JWKS())
	ts := time.Unix(1777896000, 0)
	body := []byte(`{"type":"batch.succeeded"}`)

	v1a := keys.SignV1a("msg_1", ts, body)
	sig, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v1a, "v1a,"))
	if err != nil || !strings.HasPrefix(v1a, "v1a,") {
		t.Fatalf("SignV1a = %q, want v1a,<standard base64>", v1a)
	}
	msg := []byte("msg_1." + strconv.FormatInt(ts.Unix(), 10) + "." + string(body))
	ids := keys.Ed25519KeyIDs()
	for _, id := range ids {
		pub := set.Key(id)[0].Key.(ed25519.PublicKey)
		if got, want := ed25519.Verify(pub, msg, sig), id == ids[len(ids)-1]; got != want {
			t.Errorf("v1a verifies with key %s: %v, want %v (the last key signs)", id, got, want)
		}
	}

	tok, err := jwt.ParseSigned(keys.SignJWT("msg_1", ts, body), []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Headers[0].KeyID != keys.RSAKeyID() || tok.Headers[0].ExtraHeaders[jose.HeaderType] != "JWT" {
		t.Errorf("JWT header = %+v, want kid %s and typ JWT", tok.Headers[0], keys.RSAKeyID())
	}
	var c jwt.Claims
	if err := tok.Claims(set.Key(keys.RSAKeyID())[0].Key, &c); err != nil {
		t.Fatalf("JWT does not verify with the published key: %v", err)
	}
	if !c.IssuedAt.Time().Equal(ts) || !c.Expiry.Time().Equal(ts.Add(time.Minute)) || !c.Audience.Contains("aud-1") {
		t.Errorf("JWT claims = iat %v exp %v aud %v; want %v, %v, aud-1", c.IssuedAt.Time(), c.Expiry.Time(), c.Audience, ts, ts.Add(time.Minute))
	}

	both := strings.Fields(keys.Sign("msg_1", ts, body))
	if len(both) != 2 || both[0] != v1a || strings.Count(both[1], ".") != 2 {
		t.Errorf("Sign = %q, want the v1a entry and a JWT", both)
	}
	var s fakejwks.Signer = fakejwks.SignerFunc(keys.SignJWT)
	if strings.Count(s.Sign("m", ts, body), ".") != 2 {
		t.Error("SignerFunc(SignJWT) does not sign a JWT")
	}
}
