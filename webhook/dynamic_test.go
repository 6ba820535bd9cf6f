package webhook_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// Handler-level tests of dynamic verification (spec §6): the receiver with
// HMAC secrets and webhook/dynamic against a key set served over real
// HTTP by internal/fakejwks. The verifier's own rules are tested in
// webhook/dynamic; these prove what serve answers and records.

// dynRig is a receiver with HMAC (testSecret) and dynamic verification.
type dynRig struct {
	keys   *fakejwks.Keys
	clock  *testkit.Clock
	sink   sink.Sink
	base   string
	client *http.Client
}

func newDynRig(t *testing.T, secrets ...string) *dynRig {
	t.Helper()
	keys, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	jwks := httptest.NewServer(keys)
	t.Cleanup(jwks.Close)
	clk := testkit.NewClock(time.Now())
	v, err := dynamic.New(dynamic.Config{JWKSURL: jwks.URL, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	s := sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: secrets, Dynamic: v})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	return &dynRig{keys: keys, clock: clk, sink: s, base: base, client: &http.Client{Timeout: 10 * time.Second}}
}

func (r *dynRig) post(t *testing.T, body []byte, h http.Header) reply {
	t.Helper()
	return do(t, r.client, http.MethodPost, r.base+"/webhook", body, h)
}

// v1aHeaders are the Standard Webhooks headers of a delivery signed with a
// v1a entry by keys at the rig's time.
func (r *dynRig) v1aHeaders(keys *fakejwks.Keys, id string, body []byte) http.Header {
	now := r.clock.Now()
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	h.Set("webhook-signature", keys.SignV1a(id, now, body))
	return h
}

// jwtHeader is a request carrying only a JWT as its webhook-signature, as
// the Gemini API's guide describes it (no webhook-id or -timestamp).
func jwtHeader(token string) http.Header {
	h := http.Header{}
	h.Set("webhook-signature", token)
	return h
}

func (r *dynRig) entry(t *testing.T, key string) sink.Entry {
	t.Helper()
	e, err := r.sink.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return e
}

// A static (HMAC), a v1a and a JWT delivery are each accepted (202), with
// keys from a JWKS served over HTTP; the dynamic ones are recorded as
// needing confirmation, the static one not. A request that carries an HMAC
// signature that verifies is static even when it also carries a v1a entry
// (HMAC first), and a later HMAC sighting lifts a key's need.
func TestDynamicAndStaticDeliveriesAccepted(t *testing.T) {
	r := newDynRig(t, testSecret)
	now := time.Now()

	if got := r.post(t, event("st1"), signed(t, testSecret, "msg_st1", now, event("st1"))); got.Code != 202 || got.Status != "accepted" {
		t.Fatalf("static delivery = %d %s, want 202 accepted", got.Code, got.Raw)
	}
	if got := r.post(t, event("v1a1"), r.v1aHeaders(r.keys, "msg_v1a1", event("v1a1"))); got.Code != 202 || got.Status != "accepted" {
		t.Fatalf("v1a delivery = %d %s, want 202 accepted", got.Code, got.Raw)
	}
	if got := r.post(t, event("jwt1"), jwtHeader(r.keys.SignJWT("", r.clock.Now(), nil))); got.Code != 202 || got.Status != "accepted" {
		t.Fatalf("JWT delivery = %d %s, want 202 accepted", got.Code, got.Raw)
	}
	both := r.v1aHeaders(r.keys, "msg_both", event("both1"))
	both.Set("webhook-signature", r.keys.Sign("msg_both", r.clock.Now(), event("both1")))
	if got := r.post(t, event("both1"), both); got.Code != 202 {
		t.Fatalf("v1a + JWT delivery = %d %s, want 202", got.Code, got.Raw)
	}
	mixed := signed(t, testSecret, "msg_mixed", now, event("mixed1"))
	mixed.Add("webhook-signature", r.keys.SignV1a("msg_mixed", now, event("mixed1")))
	if got := r.post(t, event("mixed1"), mixed); got.Code != 202 {
		t.Fatalf("v1 + v1a delivery = %d %s, want 202", got.Code, got.Raw)
	}

	for key, want := range map[string]bool{
		"gemini:batches/st1": false, "gemini:batches/v1a1": true, "gemini:batches/jwt1": true,
		"gemini:batches/both1": true, "gemini:batches/mixed1": false,
	} {
		if e := r.entry(t, key); e.NeedsConfirm != want || e.State != sink.StatePending {
			t.Errorf("%s: state %s, needs confirmation %v; want pending, %v", key, e.State, e.NeedsConfirm, want)
		}
	}
	if n := r.keys.Fetches(); n != 1 {
		t.Errorf("the key set was fetched %d times, want once (cached)", n)
	}

	// A redelivery by the static webhook: the key no longer needs it.
	if got := r.post(t, event("v1a1"), signed(t, testSecret, "msg_v1a1b", now, event("v1a1"))); got.Code != 202 || got.Status != "duplicate" {
		t.Fatalf("static redelivery = %d %s, want 202 duplicate", got.Code, got.Raw)
	}
	// (The lift rides on the buffered sighting statistics.)
	if err := r.sink.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e := r.entry(t, "gemini:batches/v1a1"); e.NeedsConfirm {
		t.Errorf("an HMAC sighting should lift the need for confirmation: %+v", e)
	}
}

// Every forged or stale dynamic signature is 401 at the HTTP level and
// records nothing: a wrong key, a tampered body (v1a), an expired JWT,
// alg none, an HS256 token keyed with the RSA public key, an unknown kid,
// a JWT under the right kid signed by another key. A request with only a
// wrong HMAC signature gets the HMAC verifier's error.
func TestDynamicForgeriesRefused(t *testing.T) {
	r := newDynRig(t, testSecret)
	other, err := fakejwks.New(fakejwks.Options{}) // a key set nobody published
	if err != nil {
		t.Fatal(err)
	}
	now := r.clock.Now()
	body := event("forged")
	pub := &r.keys.RSAPrivateKey().PublicKey
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pemText := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	live := map[string]any{"iat": now.Unix(), "exp": now.Add(time.Minute).Unix()}

	tampered := r.v1aHeaders(r.keys, "msg_t", event("original"))
	cases := []struct {
		name string
		h    http.Header
		want string // in the error
	}{
		{"v1a by another key set", r.v1aHeaders(other, "msg_o", body), "no Ed25519 key"},
		{"v1a over another body", tampered, "no Ed25519 key"},
		{"expired JWT", jwtHeader(r.keys.SignClaims(jwt.Claims{
			IssuedAt: jwt.NewNumericDate(now.Add(-time.Hour)), Expiry: jwt.NewNumericDate(now.Add(-30 * time.Minute))})), "expired"},
		{"alg none", jwtHeader(fakejwks.RawJWT(map[string]any{"alg": "none", "typ": "JWT", "kid": r.keys.RSAKeyID()}, live, nil)), "refused"},
		{"HS256 keyed with the public key (DER)", jwtHeader(fakejwks.RawJWT(map[string]any{"alg": "HS256", "typ": "JWT", "kid": r.keys.RSAKeyID()}, live, fakejwks.HS256(der))), "refused"},
		{"HS256 keyed with the public key (PEM)", jwtHeader(fakejwks.RawJWT(map[string]any{"alg": "HS256", "typ": "JWT", "kid": r.keys.RSAKeyID()}, live, fakejwks.HS256(pemText))), "refused"},
		{"unknown kid", jwtHeader(fakejwks.SignRS256(other.RSAPrivateKey(), other.RSAKeyID(), now)), "no RSA key with the JWT's kid"},
		{"right kid, wrong key", jwtHeader(fakejwks.SignRS256(other.RSAPrivateKey(), r.keys.RSAKeyID(), now)), "does not verify"},
		{"wrong HMAC secret", signed(t, rotatedSecret, "msg_h", now, body), "no webhook-signature matches"},
		{"no signature", http.Header{}, "missing webhook-id"},
	}
	for _, tc := range cases {
		got := r.post(t, body, tc.h)
		if got.Code != http.StatusUnauthorized || !strings.Contains(got.Error, tc.want) {
			t.Errorf("%s: %d %s, want 401 mentioning %q", tc.name, got.Code, got.Raw, tc.want)
		}
	}
	if snap := snapshot(t, r.sink); snap != "" {
		t.Errorf("refused requests recorded:\n%s", snap)
	}
	m := do(t, r.client, http.MethodGet, r.base+"/metrics", nil, nil)
	if want := `gemrecon_deliveries_total{outcome="unverified",source="webhook"} ` + strconv.Itoa(len(cases)); !strings.Contains(m.Raw, want) {
		t.Errorf("/metrics lacks %q", want)
	}
}

// When the key set cannot be fetched, dynamically signed requests get 503
// with Retry-After (the sender retries) and count as jwks_unavailable,
// while HMAC requests are answered as always and an HMAC-only request
// never touches the key set; /readyz stays 200. Once the key server is
// back and the refetch interval has passed, the same delivery is accepted.
func TestJWKSUnavailable(t *testing.T) {
	r := newDynRig(t, testSecret)
	r.keys.SetFailure(http.StatusServiceUnavailable)
	now := time.Now()

	if got := r.post(t, event("h0"), signed(t, rotatedSecret, "msg_h0", now, event("h0"))); got.Code != 401 || !strings.Contains(got.Error, "no webhook-signature matches") {
		t.Errorf("a wrong HMAC signature = %d %s, want 401 with the HMAC error", got.Code, got.Raw)
	}
	if got := r.post(t, event("h1"), signed(t, testSecret, "msg_h1", now, event("h1"))); got.Code != 202 {
		t.Errorf("an HMAC delivery = %d %s, want 202", got.Code, got.Raw)
	}
	if n := r.keys.Fetches(); n != 0 {
		t.Errorf("HMAC-only requests fetched the key set %d times, want never", n)
	}
	v1a := r.v1aHeaders(r.keys, "msg_d1", event("d1"))
	got := r.post(t, event("d1"), v1a)
	if got.Code != 503 || got.Header.Get("Retry-After") != "60" || !strings.Contains(got.Error, "key set") {
		t.Errorf("v1a with the key set unavailable = %d (Retry-After %q) %s, want 503, Retry-After 60", got.Code, got.Header.Get("Retry-After"), got.Raw)
	}
	if got := r.post(t, event("d2"), jwtHeader(r.keys.SignJWT("", r.clock.Now(), nil))); got.Code != 503 {
		t.Errorf("JWT with the key set unavailable = %d %s, want 503", got.Code, got.Raw)
	}
	if got := r.post(t, event("h2"), signed(t, testSecret, "msg_h2", now, event("h2"))); got.Code != 202 {
		t.Errorf("an HMAC delivery during the outage = %d %s, want 202", got.Code, got.Raw)
	}
	if got := do(t, r.client, http.MethodGet, r.base+"/readyz", nil, nil); got.Code != 200 {
		t.Errorf("/readyz during a key set outage = %d, want 200 (HMAC requests are served)", got.Code)
	}
	if snap := snapshot(t, r.sink); strings.Contains(snap, "batches/d") {
		t.Errorf("a 503 recorded something:\n%s", snap)
	}
	m := do(t, r.client, http.MethodGet, r.base+"/metrics", nil, nil)
	for _, want := range []string{
		`gemrecon_deliveries_total{outcome="jwks_unavailable",source="webhook"} 2`,
		`gemrecon_deliveries_total{outcome="accepted",source="webhook"} 2`,
	} {
		if !strings.Contains(m.Raw, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(m.Raw, `outcome="unavailable"`) {
		t.Errorf("a key set outage counted as the database's unavailable")
	}

	// The sender retries after the key server recovered.
	r.keys.SetFailure(0)
	r.clock.Advance(dynamic.RefetchInterval + time.Second)
	if got := r.post(t, event("d1"), r.v1aHeaders(r.keys, "msg_d1", event("d1"))); got.Code != 202 || got.Status != "accepted" {
		t.Errorf("the retried v1a delivery = %d %s, want 202 accepted", got.Code, got.Raw)
	}
	if e := r.entry(t, "gemini:batches/d1"); !e.NeedsConfirm {
		t.Errorf("d1 should need confirmation: %+v", e)
	}
}

// 1,000 requests with random unknown kids (and unverifiable v1a entries),
// eight at a time, cause at most two fetches of the key set — the first,
// and one refetch after the clock passed the refetch interval half-way —
// and are each answered 401, since the latest fetch succeeded.
func TestUnknownKidStormFetchesBounded(t *testing.T) {
	r := newDynRig(t, testSecret)
	const n, workers = 1000, 8
	sig := make([]byte, 256) // the kid is looked up before any signature is checked
	_, _ = rand.Read(sig)
	token := func(i int) string {
		now := r.clock.Now()
		hb, _ := json.Marshal(map[string]any{"alg": "RS256", "typ": "JWT", "kid": "kid-" + rand.Text()})
		cb, _ := json.Marshal(map[string]any{"iat": now.Unix(), "exp": now.Add(time.Minute).Unix()})
		return base64.RawURLEncoding.EncodeToString(hb) + "." + base64.RawURLEncoding.EncodeToString(cb) + "." + base64.RawURLEncoding.EncodeToString(sig)
	}
	v1a := func(i int) http.Header {
		now := r.clock.Now()
		bad := make([]byte, 64)
		_, _ = rand.Read(bad)
		h := http.Header{}
		h.Set("webhook-id", "msg_storm_"+strconv.Itoa(i))
		h.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		h.Set("webhook-signature", "v1a,"+base64.StdEncoding.EncodeToString(bad))
		return h
	}
	var (
		mu    sync.Mutex
		codes = map[int]int{}
	)
	storm := func(from, to int) {
		var wg sync.WaitGroup
		next := make(chan int)
		for range workers {
			wg.Go(func() {
				for i := range next {
					h := jwtHeader(token(i))
					if i%4 == 0 {
						h = v1a(i)
					}
					req, _ := http.NewRequest(http.MethodPost, r.base+"/webhook", strings.NewReader(string(event("storm"))))
					req.Header = h
					resp, err := r.client.Do(req)
					code := 0
					if err == nil {
						code = resp.StatusCode
						resp.Body.Close()
					}
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			})
		}
		for i := from; i < to; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	storm(0, n/2)
	r.clock.Advance(dynamic.RefetchInterval + time.Second)
	storm(n/2, n)
	if codes[401] != n {
		t.Errorf("answers %v, want all %d 401", codes, n)
	}
	if f := r.keys.Fetches(); f < 1 || f > 2 {
		t.Errorf("%d requests with unknown kids caused %d key set fetches, want 1 or 2", n, f)
	}
	if snap := snapshot(t, r.sink); snap != "" {
		t.Errorf("refused requests recorded:\n%s", snap)
	}
}

// A receiver may verify dynamic signatures alone (no secret); it may not
// combine them with --insecure-no-verify.
func TestNewHandlerDynamicConfig(t *testing.T) {
	s := sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	v, err := dynamic.New(dynamic.Config{JWKSURL: "http://127.0.0.1:1/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newHandler(webhook.Config{Sink: s, Dynamic: v}); err != nil {
		t.Errorf("dynamic only: %v", err)
	}
	if _, err := newHandler(webhook.Config{Sink: s, Dynamic: v, InsecureNoVerify: true}); err == nil || !strings.Contains(err.Error(), "insecure") {
		t.Errorf("dynamic with InsecureNoVerify = %v, want a refusal", err)
	}
}
