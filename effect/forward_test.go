package effect

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// delivery is what the test server saw of one request.
type delivery struct {
	header http.Header
	body   []byte
}

func TestForwardStatusMapping(t *testing.T) {
	tests := []struct {
		status     int
		retryAfter string
		wantErr    bool
		permanent  bool
		after      time.Duration
	}{
		{200, "", false, false, 0},
		{201, "", false, false, 0},
		{204, "", false, false, 0},
		{400, "", true, true, 0},
		{401, "", true, true, 0},
		{404, "", true, true, 0},
		{410, "", true, true, 0},
		{422, "", true, true, 0},
		{302, "", true, true, 0},
		{307, "", true, true, 0},
		{408, "", true, false, 0},
		{409, "", true, false, 0},
		{425, "", true, false, 0},
		{429, "", true, false, 0},
		{429, "7", true, false, 7 * time.Second},
		{500, "", true, false, 0},
		{502, "", true, false, 0},
		{503, "2", true, false, 2 * time.Second},
		{503, "Sun, 29 Nov 2026 08:01:00 GMT", true, false, time.Minute},
	}
	now := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if tt.retryAfter != "" {
				w.Header().Set("Retry-After", tt.retryAfter)
			}
			if tt.status/100 == 3 {
				if r.URL.Path == "/moved" {
					w.WriteHeader(http.StatusOK) // a redirect followed would end here
					return
				}
				w.Header().Set("Location", "/moved")
			}
			w.WriteHeader(tt.status)
			io.WriteString(w, "reason-"+strconv.Itoa(tt.status))
		}))
		f, err := NewForward(srv.URL, "", srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		f.Now = func() time.Time { return now }
		err = f.Run(context.Background(), testEvent())
		srv.Close()
		name := strconv.Itoa(tt.status) + " Retry-After " + strconv.Quote(tt.retryAfter)
		if (err != nil) != tt.wantErr {
			t.Errorf("Forward(%s) = %v, want error %v", name, err, tt.wantErr)
			continue
		}
		if err == nil {
			continue
		}
		if got := IsPermanent(err); got != tt.permanent {
			t.Errorf("IsPermanent(Forward(%s)) = %v, want %v (%v)", name, got, tt.permanent, err)
		}
		d, _ := RetryAfterOf(err)
		if d != tt.after {
			t.Errorf("RetryAfterOf(Forward(%s)) = %v, want %v", name, d, tt.after)
		}
		if !strings.Contains(err.Error(), strconv.Itoa(tt.status)) || !strings.Contains(err.Error(), "reason-"+strconv.Itoa(tt.status)) {
			t.Errorf("Forward(%s) error %q lacks the status or the body snippet", name, err)
		}
		var se *StatusError
		if !errors.As(err, &se) || se.Code != tt.status {
			t.Errorf("Forward(%s) error %v is not a StatusError with code %d", name, err, tt.status)
		}
	}
}

func TestForwardTransportErrorIsRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	f, err := NewForward("http://"+addr+"/hook", testSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Run(context.Background(), testEvent())
	if err == nil || IsPermanent(err) {
		t.Fatalf("Forward(refused) = %v, want a retryable error", err)
	}
	if strings.Contains(err.Error(), strings.TrimPrefix(testSecret, "whsec_")) {
		t.Errorf("error %q contains the secret", err)
	}
}

func TestForwardHeadersBodyAndSignature(t *testing.T) {
	var mu sync.Mutex
	var got []delivery
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, delivery{r.Header.Clone(), b})
		mu.Unlock()
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	defer srv.Close()
	f, err := NewForward(srv.URL+"/hook", testSecret, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ev := testEvent()
	for range 2 { // the same attempt twice: same webhook-id
		if err := f.Run(context.Background(), ev); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	ev.Token++
	if err := f.Run(context.Background(), ev); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(got) != 3 {
		t.Fatalf("deliveries = %d, want 3", len(got))
	}
	wh, err := standardwebhooks.NewWebhook(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range got {
		if err := wh.Verify(d.body, d.header); err != nil {
			t.Errorf("delivery %d: Verify = %v, want nil", i, err)
		}
		if ct := d.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("delivery %d: Content-Type = %q, want application/json", i, ct)
		}
		if k := d.header.Get("Idempotency-Key"); k != ev.Key {
			t.Errorf("delivery %d: Idempotency-Key = %q, want %q", i, k, ev.Key)
		}
		var doc Event
		if err := json.Unmarshal(d.body, &doc); err != nil || doc.Key != ev.Key || doc.Name != ev.Name {
			t.Errorf("delivery %d: body %s is not the event document (%v)", i, d.body, err)
		}
		if strings.Contains(d.header.Get("webhook-id"), testSecret) {
			t.Errorf("delivery %d: webhook-id leaks the secret", i)
		}
	}
	if tok := got[0].header.Get("Gemrecon-Fencing-Token"); tok != "42" {
		t.Errorf("Gemrecon-Fencing-Token = %q, want 42", tok)
	}
	if tok := got[2].header.Get("Gemrecon-Fencing-Token"); tok != "43" {
		t.Errorf("Gemrecon-Fencing-Token = %q, want 43", tok)
	}
	id0, id1, id2 := got[0].header.Get("webhook-id"), got[1].header.Get("webhook-id"), got[2].header.Get("webhook-id")
	if id0 == "" || id0 != id1 || id0 == id2 {
		t.Errorf("webhook-ids = %q, %q, %q: want stable per key+token and distinct per token", id0, id1, id2)
	}
	// A tampered body does not verify (the signature is over the body).
	if err := wh.Verify(append([]byte(" "), got[0].body...), got[0].header); err == nil {
		t.Errorf("Verify(tampered) = nil, want an error")
	}
	// Another secret does not verify.
	other, _ := standardwebhooks.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret, 24 bytes")))
	if err := other.Verify(got[0].body, got[0].header); err == nil {
		t.Errorf("Verify(other secret) = nil, want an error")
	}
}

func TestForwardUnsignedWithoutSecret(t *testing.T) {
	var h http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h = r.Header.Clone() }))
	defer srv.Close()
	f, err := NewForward(srv.URL, "", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Run(context.Background(), testEvent()); err != nil {
		t.Fatal(err)
	}
	if h.Get("webhook-signature") != "" || h.Get("Idempotency-Key") == "" {
		t.Errorf("headers = %v: want no signature and an Idempotency-Key", h)
	}
}

func TestNewForwardRejects(t *testing.T) {
	secretBody := "not*base64!"
	tests := []struct{ url, secret string }{
		{"ftp://example.com/x", ""},
		{"/relative", ""},
		{"http://example.com/x", "plainsecret"},
		{"http://example.com/x", "whsec_" + secretBody},
		{"http://example.com/x", "whsec_"},
	}
	for _, tt := range tests {
		_, err := NewForward(tt.url, tt.secret, nil)
		if err == nil {
			t.Errorf("NewForward(%q, secret) = nil error, want one", tt.url)
			continue
		}
		if s := strings.TrimPrefix(tt.secret, "whsec_"); s != "" && strings.Contains(err.Error(), s) {
			t.Errorf("NewForward(%q) error %q echoes the secret", tt.url, err)
		}
	}
}

func TestForwardHonoursContext(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	f, _ := NewForward(srv.URL, "", srv.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := f.Run(ctx, testEvent())
	if !errors.Is(err, context.DeadlineExceeded) || IsPermanent(err) {
		t.Errorf("Run(timeout) = %v, want a retryable DeadlineExceeded", err)
	}
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestForward2xxBeforeTheDeadlineIsSuccess: a 2xx whose status line arrived
// before the effect's deadline is a success, even when the deadline fires
// while the body is still being read (issue 12 item 3: the outcome is the
// answer's, not the context's state afterwards). The transport ends the
// context the moment the answer is handed over; the body never finishes.
func TestForward2xxBeforeTheDeadlineIsSuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, "accepted; more follows")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest of the body never comes
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		cancel(errors.New("effect timeout 2s exceeded"))
		return resp, err
	})}
	f, err := NewForward(srv.URL, "", client)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Run(ctx, testEvent()); err != nil {
		t.Errorf("Run() = %v, want nil: the 202 arrived before the deadline", err)
	}
	if ctx.Err() == nil {
		t.Fatal("the test's transport did not end the context")
	}
}

// TestForwardAnswerWithAStalledBody: the status line decides, so an answer
// whose body then stalls (a target that flushed its headers and hangs, or
// trickles an endless body) does not hold the attempt until the effect
// timeout: the body is read for the error's snippet and for connection
// reuse only, within a short bound.
func TestForwardAnswerWithAStalledBody(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusOK, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			forwardAnswerWithAStalledBody(t, status)
		})
	}
}

func forwardAnswerWithAStalledBody(t *testing.T, status int) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "start of the body")
		w.(http.Flusher).Flush()
		select { // the rest never comes
		case <-release:
		case <-r.Context().Done():
		}
	}))
	f, err := NewForward(srv.URL, "", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	start := time.Now()
	err = f.Run(ctx, testEvent())
	elapsed := time.Since(start)
	cancel()
	close(release)
	srv.Close()
	if status == http.StatusOK && err != nil {
		t.Errorf("Run(200, stalled body) = %v, want nil", err)
	}
	if status != http.StatusOK {
		var se *StatusError
		if !errors.As(err, &se) || se.Code != status || !strings.Contains(se.Body, "start of the body") {
			t.Errorf("Run(%d, stalled body) = %v, want a StatusError %d with the body's start", status, err, status)
		}
	}
	if elapsed > 8*time.Second {
		t.Errorf("Run(%d, stalled body) took %v: held until the effect timeout", status, elapsed)
	}
}

// TestForward2xxThenResetIsSuccess: a target that answers 2xx and then
// resets the connection before its declared body is complete did accept
// the document.
func TestForward2xxThenResetIsSuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
		_ = buf.Flush()
		_ = conn.(*net.TCPConn).SetLinger(0) // RST, not FIN
		conn.Close()
	}))
	defer srv.Close()
	f, err := NewForward(srv.URL, "", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Run(context.Background(), testEvent()); err != nil {
		t.Errorf("Run() = %v, want nil: the target answered 200", err)
	}
}

// TestForward2xxBeforeTheDocumentWasReadIsSuccess: a target may answer
// before it read the whole request (a large document), and then close the
// connection: its 2xx is still its answer.
func TestForward2xxBeforeTheDocumentWasReadIsSuccess(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	f, err := NewForward(srv.URL, "", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	ev := testEvent()
	ev.Operation = json.RawMessage(`"` + strings.Repeat("x", 8<<20) + `"`)
	if err := f.Run(context.Background(), ev); err != nil {
		t.Errorf("Run() = %v, want nil: the target answered 202", err)
	}
}
