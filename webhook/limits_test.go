package webhook_test

import (
	"bufio"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
	"github.com/gemrecon/gemrecon/webhook/dynamic"
)

// Unauthenticated traffic is bounded (spec §6; issue 25 item 7), tested on
// a real server and a real SQLite file, with raw connections so that a test
// knows what the server read.

// rawPost opens a connection to addr and sends a POST's request line and
// headers (h, a Content-Length of length, and expectContinue's header when
// set), but no body. It returns the connection and its reader.
func rawPost(t *testing.T, addr string, h http.Header, length int, expectContinue bool) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var b strings.Builder
	fmt.Fprintf(&b, "POST /webhook HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", addr, length)
	if expectContinue {
		b.WriteString("Expect: 100-continue\r\n")
	}
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	b.WriteString("\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// readAnswer reads an answer from r within 10 s: its status and headers
// (the body stays unread).
func readAnswer(t *testing.T, c net.Conn, r *bufio.Reader) *http.Response {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	return resp
}

// plausible are signature headers that pass every check the headers allow:
// they cannot verify any body.
func plausible(id string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	return h
}

// A request that no body could make pass is answered before its body is
// read: the answer comes while the body has not been sent. "Malformed" is
// each verifier's: HMAC wants the three headers, Unix seconds within 5
// minutes, a v1 entry; the dynamic verifier a v1a or JWT entry, and for
// v1a the id and a timely timestamp. With both, a request fails only when
// both refuse it; with --insecure-no-verify nothing is refused.
func TestRefusedBeforeTheBodyIsRead(t *testing.T) {
	// Check never fetches the key set: an address nothing listens on will do.
	dyn, err := dynamic.New(dynamic.Config{JWKSURL: "http://127.0.0.1:1/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	stale := func(h http.Header) http.Header {
		h.Set("webhook-timestamp", strconv.FormatInt(time.Now().Add(-7*time.Minute).Unix(), 10))
		return h
	}
	without := func(h http.Header, k string) http.Header { h.Del(k); return h }
	with := func(h http.Header, k, v string) http.Header { h.Set(k, v); return h }
	v1a := "v1a," + strings.Repeat("A", 86) + "=="
	for _, tt := range []struct {
		name    string
		cfg     webhook.Config
		h       http.Header
		refused string // a pattern of the 401's body; "": the server waits for the body
	}{
		{"hmac: no headers", webhook.Config{Secrets: []string{testSecret}}, http.Header{}, "missing"},
		{"hmac: no webhook-id", webhook.Config{Secrets: []string{testSecret}}, without(plausible("a"), "webhook-id"), "missing"},
		{"hmac: timestamp not Unix seconds", webhook.Config{Secrets: []string{testSecret}}, with(plausible("a"), "webhook-timestamp", "2026-01-01T00:00:00Z"), "Unix seconds"},
		{"hmac: stale timestamp", webhook.Config{Secrets: []string{testSecret}}, stale(plausible("a")), `too old: 7m\d+s before this host's clock`},
		{"hmac: no v1 entry", webhook.Config{Secrets: []string{testSecret}}, with(plausible("a"), "webhook-signature", v1a), "no v1 entry"},
		{"hmac: plausible", webhook.Config{Secrets: []string{testSecret}}, plausible("a"), ""},
		{"dynamic: no v1a or JWT entry", webhook.Config{Dynamic: dyn}, plausible("a"), "no v1a or JWT entry"},
		{"dynamic: stale v1a", webhook.Config{Dynamic: dyn}, stale(with(plausible("a"), "webhook-signature", v1a)), `more than 5 minutes old \(7m\d+s\)`},
		{"dynamic: plausible v1a", webhook.Config{Dynamic: dyn}, with(plausible("a"), "webhook-signature", v1a), ""},
		{"both: neither", webhook.Config{Secrets: []string{testSecret}, Dynamic: dyn}, stale(plausible("a")), "too old"},
		{"both: a v1a for the dynamic verifier", webhook.Config{Secrets: []string{testSecret}, Dynamic: dyn}, with(plausible("a"), "webhook-signature", v1a), ""},
		{"insecure: no headers", webhook.Config{InsecureNoVerify: true}, http.Header{}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Sink = sqlitetest.OpenTemp(t, sink.Options{})
			h, err := newHandler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			base, _ := serve(t, h, webhook.ServerOptions{})
			c, r := rawPost(t, strings.TrimPrefix(base, "http://"), tt.h, webhook.DefaultMaxBody, true)
			if tt.refused == "" {
				// Passed the headers: the server asks for the body.
				if resp := readAnswer(t, c, r); resp.StatusCode != http.StatusContinue {
					t.Fatalf("answer before the body = %d, want 100 Continue", resp.StatusCode)
				}
				return
			}
			resp := readAnswer(t, c, r)
			var body strings.Builder
			_, _ = bufio.NewReader(resp.Body).WriteTo(&body)
			if resp.StatusCode != http.StatusUnauthorized || !regexp.MustCompile(tt.refused).MatchString(body.String()) {
				t.Errorf("answer before the body = %d %s, want 401 saying %q", resp.StatusCode, body.String(), tt.refused)
			}
		})
	}
}

// The bytes of bodies read but not yet verified are capped over all
// requests: beyond the cap a request gets 503 with Retry-After before its
// body is read, /healthz still answers, and the sender's retry once the cap
// has room is recorded.
func TestUnverifiedBytesCapped(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	m := metrics.New(s)
	var logs testkit.Buffer
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Metrics: m, MaxBody: 1000, MaxUnverified: 3000,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	addr := strings.TrimPrefix(base, "http://")
	type held struct {
		c net.Conn
		r *bufio.Reader
	}
	var holders []held
	for i := range 3 { // 3 × 1000 bytes: the whole budget, once the server reads them
		c, r := rawPost(t, addr, plausible(fmt.Sprint("hold-", i)), 1000, true)
		if resp := readAnswer(t, c, r); resp.StatusCode != http.StatusContinue {
			t.Fatalf("holder %d: %d, want 100 Continue", i, resp.StatusCode)
		}
		holders = append(holders, held{c, r})
	}
	client := &http.Client{Timeout: 10 * time.Second}
	body := event("capped")
	r := do(t, client, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_c", time.Now(), body))
	if r.Code != 503 || r.Header.Get("Retry-After") == "" || !strings.Contains(r.Error, "unverified") {
		t.Errorf("a delivery beyond the cap = %d %s (Retry-After %q), want 503 with Retry-After", r.Code, r.Raw, r.Header.Get("Retry-After"))
	}
	if r := do(t, client, http.MethodGet, base+"/healthz", nil, nil); r.Code != 200 {
		t.Errorf("/healthz at the cap = %d, want 200", r.Code)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="webhook: requests answered 503 before their body was read; senders retry" refused=1 reason="over the 3000 bytes`) {
		t.Errorf("the 503 should be a WARN line:\n%s", logs.String())
	}
	for _, hd := range holders { // their bodies come, and fail their signature
		if _, err := hd.c.Write([]byte(strings.Repeat(" ", 1000))); err != nil {
			t.Fatal(err)
		}
		if resp := readAnswer(t, hd.c, hd.r); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("holder's answer = %d, want 401", resp.StatusCode)
		}
	}
	if r := do(t, client, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_c", time.Now(), body)); r.Code != 202 {
		t.Fatalf("the sender's retry = %d %s, want 202", r.Code, r.Raw)
	}
	if e, err := s.Get(t.Context(), "gemini:batches/capped"); err != nil || e.State != sink.StatePending {
		t.Errorf("the retried delivery's key = %+v, %v; want it pending", e, err)
	}
	if text := metricsText(t, m); !strings.Contains(text, `gemrecon_deliveries_total{outcome="overloaded",source="webhook"} 1`) {
		t.Errorf("the 503 should count as overloaded:\n%s", text)
	}
}

// metricsText scrapes m through its Handler.
func metricsText(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics = %d: %s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// At the cap on connections the probes still answer, on a spare
// connection; a delivery on one gets 503 with Retry-After, and its retry
// once a connection is free is recorded.
func TestProbesAnswerAtTheConnectionCap(t *testing.T) {
	s := sqlitetest.OpenTemp(t, sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	addr := strings.TrimPrefix(base, "http://")
	var idle []net.Conn
	for range 4 { // accepted first: the kernel's queue is first in, first out
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	fresh := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := do(t, fresh, http.MethodGet, base+p, nil, nil); r.Code != 200 {
			t.Errorf("GET %s at the cap = %d, want 200", p, r.Code)
		}
	}
	body := event("at-cap")
	r := do(t, fresh, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_k", time.Now(), body))
	if r.Code != 503 || r.Header.Get("Retry-After") == "" || !strings.Contains(r.Error, "connections") {
		t.Errorf("a delivery at the cap = %d %s, want 503 with Retry-After", r.Code, r.Raw)
	}
	for _, c := range idle {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for { // the sender retries until a connection is free
		r = do(t, fresh, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_k", time.Now(), body))
		if r.Code == 202 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.Code != 202 {
		t.Fatalf("the retry after the idle connections closed = %d %s, want 202", r.Code, r.Raw)
	}
}

// A refused signature is a WARN line at most once per 10 s, counting the
// refusals since the last one, saying where the secrets came from (never
// them), how far webhook-timestamp is from now, and what to check.
func TestSignatureRefusalsWarnOncePer10s(t *testing.T) {
	clock := testkit.NewClock(time.Now().Truncate(time.Second)) // webhook-timestamp is whole seconds
	var logs testkit.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	s := sqlitetest.OpenTemp(t, sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Logger: log, Now: clock.Now,
		SecretSource: "1 from GEMRECON_WEBHOOK_SECRET"})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	client := &http.Client{Timeout: 10 * time.Second}
	body := event("w")
	send := func(hd http.Header) {
		t.Helper()
		if r := do(t, client, http.MethodPost, base+"/webhook", body, hd); r.Code != 401 {
			t.Fatalf("= %d %s, want 401", r.Code, r.Raw)
		}
	}
	warns := func() []string {
		return regexp.MustCompile(`(?m)^.*level=WARN.*$`).FindAllString(logs.String(), -1)
	}
	send(signed(t, rotatedSecret, "msg_1", clock.Now().Add(-90*time.Second), body)) // a secret not configured
	send(signed(t, testSecret, "msg_2", clock.Now().Add(-7*time.Minute), body))     // stale
	send(http.Header{})
	clock.Advance(9 * time.Second)
	send(http.Header{})
	if w := warns(); len(w) != 1 ||
		!strings.Contains(w[0], `refused=1 `) || !strings.Contains(w[0], `secrets="1 from GEMRECON_WEBHOOK_SECRET"`) ||
		!strings.Contains(w[0], "timestamp_age=1m30s") || !strings.Contains(w[0], "signing secret") {
		t.Fatalf("WARN lines after four refusals within 10s:\n%s", strings.Join(w, "\n"))
	}
	clock.Advance(2 * time.Second)
	send(signed(t, testSecret, "msg_3", clock.Now().Add(-7*time.Minute), body))
	w := warns()
	if len(w) != 2 || !strings.Contains(w[1], "refused=4 ") || !strings.Contains(w[1], "timestamp_age=7m0s") ||
		!strings.Contains(w[1], "too old: 7m0s before this host's clock") || !strings.Contains(w[1], "clock (NTP)") {
		t.Fatalf("WARN lines after a fifth refusal 11s on:\n%s", strings.Join(w, "\n"))
	}
	if strings.Contains(logs.String(), strings.TrimPrefix(testSecret, "whsec_")) {
		t.Errorf("the log holds the secret:\n%s", logs.String())
	}
}
