package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// lockDatabase holds an exclusive lock on the SQLite file from another
// connection (as another process would) until release is called.
func lockDatabase(t *testing.T, path string) (release func()) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(100)")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatalf("BEGIN EXCLUSIVE: %v", err)
	}
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		if _, err := conn.ExecContext(context.Background(), "COMMIT"); err != nil {
			t.Errorf("COMMIT: %v", err)
		}
		conn.Close()
		db.Close()
	}
	t.Cleanup(release)
	return release
}

// trickle sends a request line and then one header byte every 50ms, and
// reports what the server answered and how long it kept the connection.
func trickle(t *testing.T, addr string) (answer string, held time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		hdr := "X-Slow-Header: " + strings.Repeat("a", 200)
		for i := 0; i < len(hdr); i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{hdr[i]}); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(bufio.NewReader(conn)) // until the server closes (or 5s)
	return string(b), time.Since(start)
}

// TestBadInput sends every kind of bad request to a real server on a real
// SQLite file and checks the status code and that a rejected request left
// the database exactly as it was.
func TestBadInput(t *testing.T) {
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 200 * time.Millisecond})
	m := metrics.New(s)
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Metrics: m, RetryAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{ReadHeaderTimeout: 300 * time.Millisecond})
	client := &http.Client{Timeout: 10 * time.Second}
	now := time.Now()
	sign := func(body []byte) http.Header { return signed(t, testSecret, "msg_1", now, body) }

	big := append(append([]byte(`{"name":"batches/big","pad":"`), bytes.Repeat([]byte("x"), webhook.DefaultMaxBody)...), []byte(`"}`)...)
	big = big[:webhook.DefaultMaxBody+1]

	type row struct {
		name       string
		method     string
		path       string
		body       []byte
		header     func(body []byte) http.Header
		wantCode   int
		wantStatus string // for 2xx
		wantErr    string // substring of {"error"} for rejections
		records    bool   // the request may change the database
		custom     func(t *testing.T) reply
	}
	rows := []row{
		{name: "valid new key", body: event("b1"), header: sign, wantCode: 202, wantStatus: "accepted", records: true},
		{name: "valid duplicate", body: event("b1"), header: sign, wantCode: 202, wantStatus: "duplicate", records: true},
		{name: "body of MaxBody+1 bytes", body: big, header: sign, wantCode: 413, wantErr: "limit"},
		// A verified body that cannot be used is 200 invalid (spec §6).
		{name: "invalid JSON", body: []byte(`{"name":"batches/x"`), header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "JSON"},
		{name: "JSON array", body: []byte(`[{"name":"batches/x"}]`), header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "not a JSON object"},
		{name: "JSON string", body: []byte(`"batches/x"`), header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "not a JSON object"},
		{name: "empty body", body: nil, header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "empty"},
		{name: "no operation name", body: []byte(`{"type":"batch.succeeded","data":{"size":3}}`), header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "fields present: data, data.size, type"},
		{name: "a name spec §12 refuses", body: []byte(`{"name":"batches/\u0000"}`), header: sign, wantCode: 200, wantStatus: "invalid", wantErr: "control character"},
		{name: "not a batch event", body: []byte(`{"type":"interaction.completed","data":{"id":"int_1"}}`), header: sign, wantCode: 200, wantStatus: "ignored"},
		// An unverified body is 401 whatever it holds: the signature comes first.
		{name: "unusable and unsigned", body: []byte(`{`), header: func([]byte) http.Header { return http.Header{} }, wantCode: 401, wantErr: "missing"},
		{name: "non-terminal state", body: []byte(`{"name":"batches/r1","metadata":{"state":"BATCH_STATE_RUNNING"}}`), header: sign, wantCode: 200, wantStatus: "ignored"},
		{name: "non-terminal done:false", body: []byte(`{"name":"operations/o1","done":false}`), header: sign, wantCode: 200, wantStatus: "ignored"},
		{name: "bad signature", body: event("b2"), header: func(b []byte) http.Header {
			h := sign(b)
			h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
			return h
		}, wantCode: 401, wantErr: "signature"},
		{name: "body changed after signing", body: event("b2"), header: func([]byte) http.Header { return sign(event("b3")) }, wantCode: 401, wantErr: "signature"},
		{name: "timestamp 6 min old", body: event("b2"), header: func(b []byte) http.Header {
			return signed(t, testSecret, "msg_2", time.Now().Add(-6*time.Minute), b)
		}, wantCode: 401, wantErr: "too old"},
		{name: "timestamp 6 min ahead", body: event("b2"), header: func(b []byte) http.Header {
			return signed(t, testSecret, "msg_2", time.Now().Add(6*time.Minute), b)
		}, wantCode: 401, wantErr: "future"},
		{name: "missing signature headers", body: event("b2"), header: func([]byte) http.Header { return http.Header{} }, wantCode: 401, wantErr: "missing"},
		{name: "missing webhook-id only", body: event("b2"), header: func(b []byte) http.Header {
			h := sign(b)
			h.Del("webhook-id")
			return h
		}, wantCode: 401, wantErr: "missing"},
		{name: "rotated-out secret", body: event("b2"), header: func(b []byte) http.Header {
			return signed(t, rotatedSecret, "msg_3", time.Now(), b)
		}, wantCode: 401, wantErr: "signature"},
		{name: "wrong method GET", method: http.MethodGet, body: nil, header: sign, wantCode: 405},
		{name: "wrong method PUT", method: http.MethodPut, body: event("b2"), header: sign, wantCode: 405},
		{name: "unknown path", path: "/webhooks", body: event("b2"), header: sign, wantCode: 404},
		{name: "trickled headers", custom: func(t *testing.T) reply {
			answer, held := trickle(t, strings.TrimPrefix(base, "http://"))
			if held > 3*time.Second {
				t.Errorf("trickling client held the connection %v, want it cut near the 300ms read-header timeout", held)
			}
			if strings.HasPrefix(answer, "HTTP/1.1 2") {
				t.Errorf("trickling client got %q, want no 2xx", answer)
			}
			return reply{Code: 0}
		}},
		{name: "database locked", custom: func(t *testing.T) reply {
			release := lockDatabase(t, path)
			r := do(t, client, http.MethodPost, base+"/webhook", event("b4"), sign(event("b4")))
			release()
			return r
		}, wantCode: 503, wantErr: "database unavailable"},
		{name: "sender retries after the lock is released", body: event("b4"), header: sign, wantCode: 202, wantStatus: "accepted", records: true},
	}
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, s)
			var r reply
			if tt.custom != nil {
				r = tt.custom(t)
			} else {
				method, p := tt.method, tt.path
				if method == "" {
					method = http.MethodPost
				}
				if p == "" {
					p = "/webhook"
				}
				r = do(t, client, method, base+p, tt.body, tt.header(tt.body))
			}
			if tt.wantCode != 0 && r.Code != tt.wantCode {
				t.Errorf("%s: status = %d (%s), want %d", tt.name, r.Code, r.Raw, tt.wantCode)
			}
			if tt.wantStatus != "" && r.Status != tt.wantStatus {
				t.Errorf("%s: status field = %q, want %q", tt.name, r.Status, tt.wantStatus)
			}
			if tt.wantErr != "" && !strings.Contains(r.Error, tt.wantErr) {
				t.Errorf("%s: error = %q, want it to contain %q", tt.name, r.Error, tt.wantErr)
			}
			if r.Code >= 400 && r.Error == "" && r.Code != 0 {
				t.Errorf("%s: %d without a JSON error body: %q", tt.name, r.Code, r.Raw)
			}
			if r.Code == 503 && r.Header.Get("Retry-After") != "2" {
				t.Errorf("%s: Retry-After = %q, want %q", tt.name, r.Header.Get("Retry-After"), "2")
			}
			if !tt.records {
				if after := snapshot(t, s); after != before {
					t.Errorf("%s: database changed by a rejected request:\nbefore:\n%safter:\n%s", tt.name, before, after)
				}
			}
		})
	}

	// The accepted keys are there, pending, sighted by the webhook.
	for _, key := range []string{"gemini:batches/b1", "gemini:batches/b4"} {
		e, err := s.Get(context.Background(), key)
		if err != nil || e.State != sink.StatePending || e.FirstSource != sink.SourceWebhook {
			t.Errorf("Get(%q) = %+v, %v; want pending, first source webhook", key, e, err)
		}
	}
	if e, _ := s.Get(context.Background(), "gemini:batches/b1"); e.SeenCount != 2 {
		t.Errorf("Get(b1).SeenCount = %d, want 2", e.SeenCount)
	}
	// A done key answers done.
	if n := drain(t, s, func(string) error { return nil }); n != 2 {
		t.Errorf("drain ran %d effects, want 2", n)
	}
	if r := do(t, client, http.MethodPost, base+"/webhook", event("b1"), sign(event("b1"))); r.Code != 202 || r.Status != "done" {
		t.Errorf("redelivery of a done key = %d %q, want 202 done", r.Code, r.Status)
	}

	// /metrics saw the outcomes.
	r := do(t, client, http.MethodGet, base+"/metrics", nil, nil)
	for _, want := range []string{
		`gemrecon_deliveries_total{outcome="accepted",source="webhook"} 2`,
		`gemrecon_deliveries_total{outcome="unverified",source="webhook"} 8`,
		`gemrecon_deliveries_total{outcome="invalid",source="webhook"} 6`,
		`gemrecon_webhook_invalid_total{reason="bad_json"} 4`,
		`gemrecon_deliveries_total{outcome="unavailable",source="webhook"} 1`,
		`gemrecon_deliveries_total{outcome="too_large",source="webhook"} 1`,
		`gemrecon_deliveries_total{outcome="ignored",source="webhook"} 3`,
		`gemrecon_keys{state="done"} 2`,
		"gemrecon_db_up 1",
	} {
		if !strings.Contains(r.Raw, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestHealthAndReady(t *testing.T) {
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 100 * time.Millisecond})
	h, err := newHandler(webhook.Config{Sink: s, InsecureNoVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	c := &http.Client{Timeout: 10 * time.Second}
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/healthz", 200},
		{http.MethodGet, "/readyz", 200},
		{http.MethodHead, "/healthz", 200},
		{http.MethodPost, "/healthz", 405},
		{http.MethodGet, "/metrics", 200},
		{http.MethodDelete, "/metrics", 405},
		{http.MethodGet, "/", 404},
	}
	for _, tt := range tests {
		if r := do(t, c, tt.method, base+tt.path, nil, nil); r.Code != tt.want {
			t.Errorf("%s %s = %d, want %d", tt.method, tt.path, r.Code, tt.want)
		}
	}
	release := lockDatabase(t, path)
	if r := do(t, c, http.MethodGet, base+"/readyz", nil, nil); r.Code != 503 {
		t.Errorf("GET /readyz with the database locked = %d, want 503", r.Code)
	}
	if r := do(t, c, http.MethodGet, base+"/healthz", nil, nil); r.Code != 200 {
		t.Errorf("GET /healthz with the database locked = %d, want 200 (alive, not ready)", r.Code)
	}
	release()
	if r := do(t, c, http.MethodGet, base+"/readyz", nil, nil); r.Code != 200 {
		t.Errorf("GET /readyz after release = %d, want 200", r.Code)
	}
}

func TestNewHandlerConfig(t *testing.T) {
	s := sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	tests := []struct {
		name    string
		cfg     webhook.Config
		wantErr string
	}{
		{"no verifier", webhook.Config{Sink: s}, "no webhook verifier"},
		{"insecure without secret", webhook.Config{Sink: s, InsecureNoVerify: true}, ""},
		{"bad secret", webhook.Config{Sink: s, Secrets: []string{"whsec_AAAAsecretAAAA"}}, "secret #1"},
		{"no sink", webhook.Config{InsecureNoVerify: true}, "no sink"},
		{"sync without dispatcher", webhook.Config{Sink: s, InsecureNoVerify: true, Sync: true}, "dispatcher"},
		{"relative path", webhook.Config{Sink: s, InsecureNoVerify: true, Path: "hook"}, "must start with /"},
		{"path taken", webhook.Config{Sink: s, InsecureNoVerify: true, Path: "/metrics"}, "built-in"},
		// Requests are matched on the URL's path alone: a query or a
		// fragment in --path would make it match no request (every
		// delivery 404, for a day of retries).
		{"path with a query", webhook.Config{Sink: s, InsecureNoVerify: true, Path: "/webhook?token=x"}, "no request"},
		{"path with a fragment", webhook.Config{Sink: s, InsecureNoVerify: true, Path: "/webhook#a"}, "no request"},
	}
	for _, tt := range tests {
		_, err := newHandler(tt.cfg)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("NewHandler(%s) = %v, want nil", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("NewHandler(%s) = %v, want an error containing %q", tt.name, err, tt.wantErr)
		case err != nil && strings.Contains(err.Error(), "AAAAsecretAAAA"):
			t.Errorf("NewHandler(%s) error %q contains the secret", tt.name, err)
		}
	}
}

func TestCustomPathAndSmallBody(t *testing.T) {
	s := sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, InsecureNoVerify: true, Path: "/hooks/gemini", MaxBody: 100})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	c := &http.Client{Timeout: 10 * time.Second}
	if r := do(t, c, http.MethodPost, base+"/hooks/gemini", []byte(`{"name":"batches/c1"}`), nil); r.Code != 202 || r.Key != "gemini:batches/c1" {
		t.Errorf("POST custom path = %d %q, want 202 gemini:batches/c1", r.Code, r.Key)
	}
	if r := do(t, c, http.MethodPost, base+"/webhook", []byte(`{"name":"batches/c2"}`), nil); r.Code != 404 {
		t.Errorf("POST default path with a custom one = %d, want 404", r.Code)
	}
	// Exactly MaxBody passes; MaxBody+1 does not — also when chunked (no Content-Length).
	exact := []byte(`{"name":"batches/c3","pad":"` + strings.Repeat("x", 100-len(`{"name":"batches/c3","pad":""}`)) + `"}`)
	if r := do(t, c, http.MethodPost, base+"/hooks/gemini", exact, nil); r.Code != 202 {
		t.Errorf("POST of exactly MaxBody = %d (%s), want 202", r.Code, r.Raw)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/hooks/gemini", io.MultiReader(bytes.NewReader(exact), strings.NewReader(" ")))
	req.ContentLength = -1 // chunked: the limit must hold while reading
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Errorf("chunked POST of MaxBody+1 = %d, want 413", resp.StatusCode)
	}
}

func TestServeDrainTimeout(t *testing.T) {
	h, started, release := blockedHandler(t)
	defer close(release)
	base, stop := serve(t, h, webhook.ServerOptions{DrainTimeout: 200 * time.Millisecond})
	getInFlight(t, base, started) // the request is in flight before the drain starts
	if err := stop(); !errors.Is(err, webhook.ErrDrainTimeout) {
		t.Errorf("Serve after a drain timeout = %v, want ErrDrainTimeout", err)
	}
}

// pingBlocked is a sink whose Ping waits until release is closed; started
// is closed when the first Ping comes.
type pingBlocked struct {
	sink.Sink
	once             sync.Once
	started, release chan struct{}
}

func (p *pingBlocked) Ping(context.Context) error {
	p.once.Do(func() { close(p.started) })
	<-p.release
	return nil
}

// blockedHandler is a receiver whose GET /readyz answers 200 once release
// is closed; started is closed when the first such request reaches it.
func blockedHandler(t *testing.T) (h *webhook.Handler, started, release chan struct{}) {
	p := &pingBlocked{Sink: sqlitetest.OpenTemp(t, sink.Options{}), started: make(chan struct{}), release: make(chan struct{})}
	h, err := newHandler(webhook.Config{Sink: p, InsecureNoVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	return h, p.started, p.release
}

// getInFlight GETs base's /readyz in the background and returns where its
// status (0: no answer) arrives, once the request has reached the handler.
func getInFlight(t *testing.T, base string, started chan struct{}) chan int {
	t.Helper()
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the request never reached the handler")
	}
	return answered
}

// NoDrain closes the connections at once: Serve returns nil without
// waiting for the request in flight, whose client gets no answer (a
// webhook sender retries). Before, a negative DrainTimeout was the 30 s
// default.
func TestServeNoDrain(t *testing.T) {
	h, started, release := blockedHandler(t)
	defer close(release)
	base, stop := serve(t, h, webhook.ServerOptions{DrainTimeout: webhook.NoDrain})
	answered := getInFlight(t, base, started)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Serve with NoDrain = %v, want nil (the cut was asked for)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve with NoDrain waited for the request in flight")
	}
	if c := <-answered; c != 0 {
		t.Errorf("the request in flight was answered %d, want its connection closed", c)
	}
}

// A zero DrainTimeout is still the default, not NoDrain: the request in
// flight when shutdown begins finishes and is answered.
func TestServeZeroDrainTimeoutWaits(t *testing.T) {
	h, started, release := blockedHandler(t)
	base, stop := serve(t, h, webhook.ServerOptions{})
	answered := getInFlight(t, base, started)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Shutdown has begun once the listener refuses connections.
	addr := strings.TrimPrefix(base, "http://")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts 30s after shutdown began")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	if c := <-answered; c != http.StatusOK {
		t.Errorf("the request in flight at shutdown was answered %d, want 200 (drained)", c)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Serve after a clean drain = %v", err)
	}
}
