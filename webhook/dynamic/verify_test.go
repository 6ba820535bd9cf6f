package dynamic_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

func TestV1aDeliveryAccepted(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	h := headers("msg_1", clk.Now(), keys.SignV1a("msg_1", clk.Now(), testBody))
	res, err := verify(v, testBody, h)
	if err != nil {
		t.Fatalf("Verify(v1a) = %v, want nil", err)
	}
	want := dynamic.Result{Scheme: dynamic.SchemeV1a, KeyID: keys.Ed25519KeyIDs()[0]}
	if res != want {
		t.Errorf("Verify(v1a) = %+v, want %+v", res, want)
	}
	if got := keys.Fetches(); got != 1 {
		t.Errorf("key set fetched %d times, want 1", got)
	}
}

func TestJWTDeliveryAccepted(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	// The guide's form: the JWT is the whole webhook-signature value, and
	// it needs neither webhook-id nor webhook-timestamp.
	h := headers("", time.Time{}, keys.SignJWT("msg_1", clk.Now(), testBody))
	res, err := verify(v, testBody, h)
	if err != nil {
		t.Fatalf("Verify(JWT) = %v, want nil", err)
	}
	want := dynamic.Result{Scheme: dynamic.SchemeJWT, KeyID: keys.RSAKeyID()}
	if res != want {
		t.Errorf("Verify(JWT) = %+v, want %+v", res, want)
	}
}

func TestBothEntriesInOneValue(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	h := headers("msg_1", clk.Now(), keys.Sign("msg_1", clk.Now(), testBody))
	res, err := verify(v, testBody, h)
	if err != nil || res.Scheme != dynamic.SchemeV1a {
		t.Fatalf("Verify(v1a + JWT) = %+v, %v; want v1a, nil", res, err)
	}
	// The body is not what was signed: the v1a entry fails, and the JWT,
	// which binds no body, verifies — which is exactly why the caller must
	// confirm the batch (spec §6) and needs to know the scheme.
	res, err = verify(v, []byte(`{"other":"body"}`), h)
	if err != nil || res.Scheme != dynamic.SchemeJWT {
		t.Fatalf("Verify(tampered body, v1a + JWT) = %+v, %v; want jwt, nil", res, err)
	}
}

func TestAcceptedWithinTolerance(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	v := verifier(t, srv.URL, clk, "")
	now := clk.Now()
	almost := dynamic.Tolerance - time.Second
	cases := []struct {
		name string
		h    http.Header
	}{
		{"v1a timestamp almost 5 min old", headers("m", now.Add(-almost), keys.SignV1a("m", now.Add(-almost), testBody))},
		{"v1a timestamp almost 5 min ahead", headers("m", now.Add(almost), keys.SignV1a("m", now.Add(almost), testBody))},
		{"JWT expired less than 5 min ago", headers("", time.Time{}, keys.SignClaims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now.Add(-time.Hour)), Expiry: jwt.NewNumericDate(now.Add(-almost))}))},
		{"JWT nbf less than 5 min ahead", headers("", time.Time{}, keys.SignClaims(jwt.Claims{NotBefore: jwt.NewNumericDate(now.Add(almost)), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}))},
		{"JWT iat less than 5 min ahead", headers("", time.Time{}, keys.SignClaims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now.Add(almost)), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}))},
		{"JWT with only iat, almost 5 min old", headers("", time.Time{}, keys.SignClaims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now.Add(-almost))}))},
		{"JWT with an old iat and a live exp", headers("", time.Time{}, keys.SignClaims(jwt.Claims{IssuedAt: jwt.NewNumericDate(now.Add(-2 * time.Hour)), Expiry: jwt.NewNumericDate(now.Add(time.Hour))}))},
		{"JWT with an aud and no audience configured", headers("", time.Time{}, keys.SignClaims(jwt.Claims{Expiry: jwt.NewNumericDate(now.Add(time.Hour)), Audience: jwt.Audience{"anyone"}}))},
	}
	for _, c := range cases {
		if _, err := verify(v, testBody, c.h); err != nil {
			t.Errorf("%s: Verify = %v, want nil", c.name, err)
		}
	}
}

func TestAudienceChecked(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{Audience: "https://example.test/webhook"})
	v := verifier(t, srv.URL, clk, "https://example.test/webhook")
	now := clk.Now()
	if _, err := verify(v, testBody, headers("", time.Time{}, keys.SignJWT("m", now, testBody))); err != nil {
		t.Fatalf("Verify(JWT for the configured audience) = %v, want nil", err)
	}
	for name, aud := range map[string]jwt.Audience{"another audience": {"https://other.test/"}, "no aud": nil} {
		tok := keys.SignClaims(jwt.Claims{Expiry: jwt.NewNumericDate(now.Add(time.Hour)), Audience: aud})
		_, err := verify(v, testBody, headers("", time.Time{}, tok))
		if !errors.Is(err, dynamic.ErrUnverified) || !strings.Contains(err.Error(), "audience") {
			t.Errorf("Verify(JWT with %s) = %v, want ErrUnverified naming the audience", name, err)
		}
	}
}

// TestRejectedAsUnverified: every bad, stale, forged or malformed
// signature is ErrUnverified (401), never ErrUnavailable, and its error
// quotes no signature, token or key.
func TestRejectedAsUnverified(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	other, err := fakejwks.New(fakejwks.Options{}) // keys nobody publishes
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, srv.URL, clk, "")
	now := clk.Now()
	kid := keys.RSAKeyID()
	live := map[string]any{"iat": now.Unix(), "exp": now.Add(5 * time.Minute).Unix()}

	// An RSA key nobody publishes, claiming the published kid.
	impostor, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signWith := func(alg jose.SignatureAlgorithm, key any, kid string) string {
		s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key, KeyID: kid}}, (&jose.SignerOptions{}).WithType("JWT"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := jwt.Signed(s).Claims(live).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	// The classic key confusion: HS256 keyed with the RSA public key, in
	// every encoding a confused verifier might use as the secret.
	pub := keys.RSAPrivateKey().Public().(*rsa.PublicKey)
	pkix, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pkixPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pkix})
	pkcs1PEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(pub)})
	jwkJSON, err := json.Marshal(jose.JSONWebKey{Key: pub, KeyID: kid})
	if err != nil {
		t.Fatal(err)
	}
	hs := func(alg string, secret []byte) string {
		return fakejwks.RawJWT(map[string]any{"alg": alg, "typ": "JWT", "kid": kid}, live, fakejwks.HS256(secret))
	}
	none := func(alg string) string {
		return fakejwks.RawJWT(map[string]any{"alg": alg, "typ": "JWT", "kid": kid}, live, nil)
	}
	noneSigned := fakejwks.RawJWT(map[string]any{"alg": "none", "kid": kid}, live, func(in []byte) []byte { return fakejwks.HS256(pkixPEM)(in) })

	v1a := func(id string, ts time.Time, body []byte) http.Header {
		return headers(id, ts, keys.SignV1a(id, ts, body))
	}
	jwtH := func(tok string) http.Header { return headers("m", now, tok) }
	claims := func(c jwt.Claims) http.Header { return jwtH(keys.SignClaims(c)) }
	ago := func(d time.Duration) *jwt.NumericDate { return jwt.NewNumericDate(now.Add(-d)) }
	ahead := func(d time.Duration) *jwt.NumericDate { return jwt.NewNumericDate(now.Add(d)) }
	past := dynamic.Tolerance + time.Second

	cases := []struct {
		name string
		body []byte
		h    http.Header
		want string // in the error
	}{
		{"v1a by a key the set does not publish", testBody, headers("m", now, other.SignV1a("m", now, testBody)), "no Ed25519 key"},
		{"v1a over a tampered body", []byte(strings.Replace(string(testBody), "abc123", "abc124", 1)), v1a("m", now, testBody), "no Ed25519 key"},
		{"v1a with another webhook-id", testBody, func() http.Header { h := v1a("m", now, testBody); h.Set(dynamic.HeaderID, "m2"); return h }(), "no Ed25519 key"},
		{"v1a with another webhook-timestamp", testBody, func() http.Header {
			h := v1a("m", now, testBody)
			h.Set(dynamic.HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))
			return h
		}(), "no Ed25519 key"},
		{"v1a with a stale timestamp", testBody, v1a("m", now.Add(-past), testBody), "more than 5 minutes old"},
		{"v1a with a future timestamp", testBody, v1a("m", now.Add(past), testBody), "more than 5 minutes in the future"},
		{"v1a without webhook-id", testBody, func() http.Header { h := v1a("m", now, testBody); h.Del(dynamic.HeaderID); return h }(), "missing webhook-id"},
		{"v1a with a timestamp that is not Unix seconds", testBody, func() http.Header {
			h := v1a("m", now, testBody)
			h.Set(dynamic.HeaderTimestamp, now.Format(time.RFC3339))
			return h
		}(), "not Unix seconds"},
		{"v1a that is not base64", testBody, headers("m", now, "v1a,***not-base64***"), "not base64"},
		{"v1a of the wrong length", testBody, headers("m", now, "v1a,"+base64.StdEncoding.EncodeToString([]byte("short"))), "not base64 of 64 bytes"},
		{"JWT by a key the set does not publish, under its kid", testBody, jwtH(signWith(jose.RS256, impostor, kid)), "does not verify"},
		{"JWT with an unknown kid", testBody, jwtH(signWith(jose.RS256, impostor, "no-such-kid")), "no RSA key with the JWT's kid"},
		{"JWT without kid", testBody, jwtH(signWith(jose.RS256, impostor, "")), "names no kid"},
		{"JWT of another issuer's set", testBody, jwtH(other.SignJWT("m", now, testBody)), "no RSA key with the JWT's kid"},
		{"expired JWT", testBody, claims(jwt.Claims{IssuedAt: ago(time.Hour), Expiry: ago(past)}), "expired"},
		{"JWT not valid yet", testBody, claims(jwt.Claims{NotBefore: ahead(past), Expiry: ahead(time.Hour)}), "not valid yet"},
		{"JWT issued in the future", testBody, claims(jwt.Claims{IssuedAt: ahead(past), Expiry: ahead(time.Hour)}), "issued in the future"},
		{"JWT with only an old iat", testBody, claims(jwt.Claims{IssuedAt: ago(past)}), "no exp and its iat"},
		{"JWT with neither exp nor iat", testBody, claims(jwt.Claims{Subject: "x"}), "neither exp nor iat"},
		{"JWT with exp of the wrong type", testBody, jwtH(keys.SignClaims(map[string]any{"exp": "tomorrow"})), "claims"},
		{"alg none", testBody, jwtH(none("none")), `alg "none" refused`},
		{"alg None", testBody, jwtH(none("None")), `alg "None" refused`},
		{"alg NONE", testBody, jwtH(none("NONE")), `alg "NONE" refused`},
		{"alg none with a signature", testBody, jwtH(noneSigned), `alg "none" refused`},
		{"no alg", testBody, jwtH(fakejwks.RawJWT(map[string]any{"kid": kid}, live, fakejwks.HS256([]byte("x")))), `alg "" refused`},
		{"HS256 keyed with the public key (PKIX PEM)", testBody, jwtH(hs("HS256", pkixPEM)), `alg "HS256" refused`},
		{"HS256 keyed with the public key (PKIX DER)", testBody, jwtH(hs("HS256", pkix)), `alg "HS256" refused`},
		{"HS256 keyed with the public key (PKCS#1 PEM)", testBody, jwtH(hs("HS256", pkcs1PEM)), `alg "HS256" refused`},
		{"HS256 keyed with the public JWK", testBody, jwtH(hs("HS256", jwkJSON)), `alg "HS256" refused`},
		{"HS384", testBody, jwtH(hs("HS384", pkixPEM)), `alg "HS384" refused`},
		{"HS512", testBody, jwtH(hs("HS512", pkixPEM)), `alg "HS512" refused`},
		{"RS384 by the published key", testBody, jwtH(signWith(jose.RS384, keys.RSAPrivateKey(), kid)), `alg "RS384" refused`},
		{"RS512 by the published key", testBody, jwtH(signWith(jose.RS512, keys.RSAPrivateKey(), kid)), `alg "RS512" refused`},
		{"PS256 by the published key", testBody, jwtH(signWith(jose.PS256, keys.RSAPrivateKey(), kid)), `alg "PS256" refused`},
		{"PS512 by the published key", testBody, jwtH(signWith(jose.PS512, keys.RSAPrivateKey(), kid)), `alg "PS512" refused`},
		{"ES256", testBody, jwtH(signWith(jose.ES256, ecKey, kid)), `alg "ES256" refused`},
		{"EdDSA JWT", testBody, jwtH(signWith(jose.EdDSA, edPriv, keys.Ed25519KeyIDs()[0])), `alg "EdDSA" refused`},
		{"three dots of garbage", testBody, jwtH("a.b.c"), "not a compact RS256 JWT"},
		{"too many entries", testBody, headers("m", now, strings.Repeat(keys.SignV1a("m", now, testBody)+" ", dynamic.MaxEntries+1)), "more than the 16"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := verify(v, c.body, c.h)
			if !errors.Is(err, dynamic.ErrUnverified) || errors.Is(err, dynamic.ErrUnavailable) {
				t.Fatalf("Verify = %+v, %v; want ErrUnverified (401)", res, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Verify error = %q, want it to say %q", err, c.want)
			}
			assertNoSecretsIn(t, err, c.h, keys)
		})
	}
}

// assertNoSecretsIn checks that err quotes no signature, token part or
// published key material.
func assertNoSecretsIn(t *testing.T, err error, h http.Header, keys *fakejwks.Keys) {
	t.Helper()
	msg := err.Error()
	for _, line := range h.Values(dynamic.HeaderSignature) {
		for _, e := range strings.Fields(line) {
			_, value, ok := strings.Cut(e, ",")
			if !ok {
				value = e
			}
			for _, part := range strings.Split(value, ".") {
				if len(part) >= 16 && strings.Contains(msg, part) {
					t.Errorf("error %q quotes part of a signature entry", msg)
				}
			}
		}
	}
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(keys.JWKS(), &set); err != nil {
		t.Fatal(err)
	}
	for _, k := range set.Keys {
		for _, field := range []string{"n", "x"} {
			if s, ok := k[field].(string); ok && strings.Contains(msg, s[:16]) {
				t.Errorf("error %q quotes key material", msg)
			}
		}
	}
}

func TestNoDynamicEntryTouchesNoKeySet(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	keys.SetFailure(http.StatusServiceUnavailable) // were it asked, it would fail
	v := verifier(t, srv.URL, clk, "")
	now := clk.Now()
	for name, h := range map[string]http.Header{
		"no webhook-signature": headers("m", now),
		"HMAC entries only":    headers("m", now, "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32))+" v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32))),
		"an unknown scheme":    headers("m", now, "v2,abc"),
		"a bare word":          headers("m", now, "Bearer"),
	} {
		_, err := verify(v, testBody, h)
		if !errors.Is(err, dynamic.ErrNoEntry) || !errors.Is(err, dynamic.ErrUnverified) {
			t.Errorf("%s: Verify = %v, want ErrNoEntry (an ErrUnverified)", name, err)
		}
	}
	// A malformed or stale dynamic entry is judged without keys too.
	for name, h := range map[string]http.Header{
		"stale v1a":   headers("m", now.Add(-time.Hour), keys.SignV1a("m", now.Add(-time.Hour), testBody)),
		"expired JWT": headers("m", now, keys.SignClaims(jwt.Claims{Expiry: jwt.NewNumericDate(now.Add(-time.Hour))})),
		"alg none":    headers("m", now, fakejwks.RawJWT(map[string]any{"alg": "none", "kid": keys.RSAKeyID()}, map[string]any{"exp": now.Unix() + 60}, nil)),
	} {
		if _, err := verify(v, testBody, h); !errors.Is(err, dynamic.ErrUnverified) {
			t.Errorf("%s: Verify = %v, want ErrUnverified", name, err)
		}
	}
	if got := keys.Fetches(); got != 0 {
		t.Errorf("key set fetched %d times for requests that need no key, want 0", got)
	}
}

func TestEveryHeaderLineAndEntryConsidered(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{})
	other, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	v := verifier(t, srv.URL, clk, "")
	now := clk.Now()
	good := keys.SignV1a("m", now, testBody)
	bad := other.SignV1a("m", now, testBody)
	goodJWT := keys.SignJWT("m", now, testBody)
	badJWT := other.SignJWT("m", now, testBody)
	hmac := "v1," + base64.StdEncoding.EncodeToString(make([]byte, 32))
	cases := []struct {
		name  string
		lines []string
		want  dynamic.Scheme
	}{
		{"two v1a lines, the second verifies", []string{bad, good}, dynamic.SchemeV1a},
		{"two JWT lines, the second verifies", []string{badJWT, goodJWT}, dynamic.SchemeJWT},
		{"a v1a line that fails, then a JWT line", []string{bad, goodJWT}, dynamic.SchemeJWT},
		{"HMAC and a bad v1a, then a good v1a line", []string{hmac + " " + bad, good}, dynamic.SchemeV1a},
		{"entries in one line, the last verifies", []string{hmac + " " + bad + " " + badJWT + " " + good}, dynamic.SchemeV1a},
		{"two lines folded by a proxy, the first verifies", []string{good + ", " + bad}, dynamic.SchemeV1a},
		{"a folded JWT line", []string{goodJWT + ", " + bad}, dynamic.SchemeJWT},
		{"extra white space", []string{"  " + bad + "\t " + good + "  "}, dynamic.SchemeV1a},
	}
	for _, c := range cases {
		res, err := verify(v, testBody, headers("m", now, c.lines...))
		if err != nil || res.Scheme != c.want {
			t.Errorf("%s: Verify = %+v, %v; want %s, nil", c.name, res, err, c.want)
		}
	}
}

func TestEveryEd25519KeyTried(t *testing.T) {
	clk := newClock()
	keys, srv := served(t, fakejwks.Options{Ed25519Keys: 4})
	v := verifier(t, srv.URL, clk, "")
	now := clk.Now()
	res, err := verify(v, testBody, headers("m", now, keys.SignV1a("m", now, testBody)))
	ids := keys.Ed25519KeyIDs()
	if err != nil || res.KeyID != ids[len(ids)-1] || res.Scheme != dynamic.SchemeV1a {
		t.Fatalf("Verify(v1a by the last of %d keys) = %+v, %v; want v1a by %s", len(ids), res, err, ids[len(ids)-1])
	}
}

func TestNewRefusesBadURL(t *testing.T) {
	for _, u := range []string{"not a url", "ftp://example.test/jwks", "/relative/jwks.json", "https://"} {
		if _, err := dynamic.New(dynamic.Config{JWKSURL: u}); err == nil {
			t.Errorf("New(JWKSURL %q) = nil error, want one", u)
		}
	}
	v, err := dynamic.New(dynamic.Config{})
	if err != nil || v.URL() != dynamic.DefaultJWKSURL {
		t.Errorf("New(default) = %v, URL %q; want %s", err, v.URL(), dynamic.DefaultJWKSURL)
	}
}
