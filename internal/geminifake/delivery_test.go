package geminifake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genai/interactions/models/operations"
	"google.golang.org/genai/interactions/models/webhooks"

	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/webhook"
)

// received is one request a test receiver got.
type received struct {
	header http.Header
	body   []byte
}

// receiver is a real HTTP server standing for a webhook receiver: it records
// every request and answers with status(n) for the n-th (1-based).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	status func(n int) int
}

func newReceiver(t *testing.T, status func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{status: status}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, received{r.Header.Clone(), body})
		n := len(rc.got)
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.status != nil {
			code = rc.status(n)
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

func waitIdle(t *testing.T, ws *WebhookService) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ws.Wait(ctx); err != nil {
		t.Fatalf("deliveries did not finish: %v (stats %+v)", err, ws.Stats())
	}
}

func verifier(t *testing.T, now func() time.Time, secrets ...string) *webhook.Verifier {
	t.Helper()
	v, err := webhook.NewVerifier(secrets, now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

type envelope struct {
	Type      string         `json:"type"`
	Version   string         `json:"version"`
	Timestamp string         `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

func decode(t *testing.T, body []byte) envelope {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("event body %q: %v", body, err)
	}
	return e
}

// A create then a ping through the SDK lands a signed request at a real
// HTTP server, which webhook.Verifier (the receiver's own) accepts.
func TestPingDeliversSignedEvent(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	rc := newReceiver(t, nil)
	c := genaitest.Client(t, base, whKey)
	w := createHook(t, c, rc.srv.URL+"/webhook", webhooks.WebhookSubscribedEventBatchSucceeded)
	if _, err := c.Webhooks.Ping(context.Background(), operations.PingWebhookRequest{ID: *w.ID, Body: &webhooks.PingWebhookRequest{}}); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, s.Webhooks())
	got := rc.requests()
	if len(got) != 1 {
		t.Fatalf("receiver got %d requests, want 1", len(got))
	}
	if err := verifier(t, nil, *w.NewSigningSecret).Verify(got[0].body, got[0].header); err != nil {
		t.Fatalf("the ping does not verify with the webhook's secret: %v (headers %v)", err, got[0].header)
	}
	if err := verifier(t, nil, newSecret()).Verify(got[0].body, got[0].header); !errors.Is(err, webhook.ErrBadSignature) {
		t.Fatalf("another secret verifies the ping: %v", err)
	}
	e := decode(t, got[0].body)
	if e.Type != PingEventType || e.Version != "v1" || e.Data["webhook_id"] != *w.ID || strings.HasPrefix(e.Type, "batch.") {
		t.Fatalf("ping event %s", got[0].body)
	}
	if ct := got[0].header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	at := s.Webhooks().Attempts()
	if len(at) != 1 || at[0].Outcome != OutcomeDelivered || at[0].Status != 200 || at[0].WebhookID != *w.ID ||
		at[0].MessageID != got[0].header.Get("webhook-id") || at[0].URL != rc.srv.URL+"/webhook" {
		t.Fatalf("attempt record %+v", at)
	}
}

// A batch that reaches a terminal state sends its event to every enabled
// webhook subscribed to that event, once per change of state.
func TestBatchCompletionDelivers(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	rcA, rcB := newReceiver(t, nil), newReceiver(t, nil)
	_, secA, err := ws.Create("a", rcA.srv.URL, []string{"batch.succeeded", "batch.failed"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Create("b", rcB.srv.URL, []string{"batch.expired"}); err != nil {
		t.Fatal(err)
	}
	off, _, _ := ws.Create("off", rcB.srv.URL, []string{"batch.succeeded"})
	if _, err := ws.Update(off.ID, WebhookUpdate{State: new(string)}); err == nil {
		t.Fatal("state \"\" accepted")
	}
	disabled := WebhookDisabled
	if _, err := ws.Update(off.ID, WebhookUpdate{State: &disabled}); err != nil {
		t.Fatal(err)
	}
	end := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	s.Add(Batch{Name: "batches/run", State: "RUNNING"},
		Batch{Name: "batches/already", State: "SUCCEEDED", EndTime: end},
		Batch{Name: VertexName("p", "l", "v1"), State: "SUCCEEDED"}) // Vertex: no push
	s.SetState("batches/run", "BATCH_STATE_RUNNING") // not terminal
	s.Update("batches/run", func(b *Batch) {
		b.State, b.EndTime = "FAILED", end
		b.Error = &Status{Code: 8, Message: "Enqueued token quota exceeded for this model."}
	})
	s.SetState("batches/run", "BATCH_STATE_FAILED")                         // same state, other spelling
	s.Add(Batch{Name: "batches/already", State: "SUCCEEDED", EndTime: end}) // re-added, same state
	s.Add(Batch{Name: "batches/old", State: "EXPIRED"})                     // to b only
	s.Add(Batch{Name: "batches/gone", State: "CANCELLED"})                  // nobody subscribed
	waitIdle(t, ws)

	var types []string
	v := verifier(t, nil, secA)
	for _, r := range rcA.requests() {
		if err := v.Verify(r.body, r.header); err != nil {
			t.Fatalf("delivery to a does not verify: %v", err)
		}
		e := decode(t, r.body)
		types = append(types, e.Type+" "+fmt.Sprint(e.Data["id"]))
		if e.Type == "batch.failed" && (e.Data["error_code"] != float64(8) || e.Data["error_message"] != "Enqueued token quota exceeded for this model.") {
			t.Errorf("batch.failed data %v", e.Data)
		}
		if e.Timestamp != "2026-05-04T12:00:00Z" {
			t.Errorf("event timestamp %q, want the batch's end time", e.Timestamp)
		}
	}
	slices.Sort(types) // deliveries of different messages come in no set order
	if want := "batch.failed run,batch.succeeded already"; strings.Join(types, ",") != want {
		t.Errorf("a got %q, want %q", types, want)
	}
	gotB := rcB.requests()
	if len(gotB) != 1 || decode(t, gotB[0].body).Type != "batch.expired" {
		t.Errorf("b (and the disabled webhook on the same URL) got %d requests, want one batch.expired", len(gotB))
	}

	// FullNames puts the batch's full name in data.id.
	if err := ws.SetOptions(WebhookOptions{FullNames: true}); err != nil {
		t.Fatal(err)
	}
	s.Add(Batch{Name: "batches/full", State: "SUCCEEDED"})
	waitIdle(t, ws)
	r := rcA.requests()
	if e := decode(t, r[len(r)-1].body); e.Data["id"] != "batches/full" {
		t.Errorf("FullNames: data.id %v", e.Data["id"])
	}
}

// A 500 is redelivered with exponential backoff and the same webhook-id,
// each attempt signed afresh, until a 2xx.
func TestRedeliveryAfter500(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	var mu sync.Mutex
	var waits []time.Duration
	if err := ws.SetOptions(WebhookOptions{BackoffBase: 3 * time.Second, BackoffMax: time.Minute,
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			waits = append(waits, d)
			mu.Unlock()
			return nil
		}}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, func(n int) int {
		if n <= 3 {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	w, secret, _ := ws.Create("", rc.srv.URL, []string{"batch.succeeded"})
	s.Add(Batch{Name: "batches/x", State: "SUCCEEDED"})
	waitIdle(t, ws)
	got := rc.requests()
	if len(got) != 4 {
		t.Fatalf("receiver got %d requests, want 4 (3 × 500, then 204)", len(got))
	}
	v := verifier(t, nil, secret)
	for i, r := range got {
		if err := v.Verify(r.body, r.header); err != nil {
			t.Errorf("attempt %d does not verify: %v", i+1, err)
		}
		if r.header.Get("webhook-id") != got[0].header.Get("webhook-id") {
			t.Errorf("attempt %d has webhook-id %q, want the message's %q", i+1, r.header.Get("webhook-id"), got[0].header.Get("webhook-id"))
		}
	}
	if want := []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second}; fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Errorf("backoff %v, want %v", waits, want)
	}
	st := ws.Stats()
	if st != (DeliveryStats{Messages: 1, Attempts: 4, Delivered: 1, Failed: 3, Redelivered: 3}) {
		t.Errorf("stats %+v", st)
	}
	var outcomes []string
	for _, a := range ws.Attempts() {
		outcomes = append(outcomes, fmt.Sprintf("%d %s %d", a.Attempt, a.Outcome, a.Status))
	}
	if want := "[1 failed 500 2 failed 500 3 failed 500 4 delivered 204]"; fmt.Sprint(outcomes) != want {
		t.Errorf("attempts %v, want %s", outcomes, want)
	}
	if h, _ := ws.Get(w.ID); h.State != WebhookEnabled {
		t.Errorf("state %q after a delivery that succeeded", h.State)
	}
	// The backoff is capped.
	o := WebhookOptions{BackoffBase: time.Second, BackoffMax: 10 * time.Second}
	if d := backoff(o, 40); d != 10*time.Second {
		t.Errorf("backoff after 40 failures = %v, want the 10s cap", d)
	}
}

// Transport errors are redelivered too; a message that exhausts its
// attempts disables its webhook, as the API does.
func TestTransportErrorsExhaustAndDisable(t *testing.T) {
	s, base := start(t, Options{APIKey: whKey})
	ws := s.Webhooks()
	noWait := func(context.Context, time.Duration) error { return nil }
	if err := ws.SetOptions(WebhookOptions{MaxAttempts: 3, Sleep: noWait}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/webhook"
	ln.Close() // connection refused from now on
	c := genaitest.Client(t, base, whKey)
	w := createHook(t, c, dead, webhooks.WebhookSubscribedEventBatchFailed)
	s.Add(Batch{Name: "batches/f", State: "FAILED"})
	waitIdle(t, ws)
	st := ws.Stats()
	if st.Attempts != 3 || st.Failed != 3 || st.Exhausted != 1 || st.Delivered != 0 {
		t.Fatalf("stats %+v, want 3 failed attempts and 1 exhausted message", st)
	}
	for _, a := range ws.Attempts() {
		if a.Status != 0 || !strings.Contains(a.Err, "refused") {
			t.Errorf("attempt %+v: want a connection-refused error", a)
		}
	}
	got, err := c.Webhooks.Get(context.Background(), operations.GetWebhookRequest{ID: *w.ID})
	if err != nil {
		t.Fatal(err)
	}
	if *got.Webhook.State != webhooks.WebhookStateDisabledDueToFailedDeliveries {
		t.Fatalf("state %q, want disabled_due_to_failed_deliveries", *got.Webhook.State)
	}
	// A disabled webhook gets no batch events (a ping still goes out).
	s.Add(Batch{Name: "batches/f2", State: "FAILED"})
	waitIdle(t, ws)
	if n := ws.Stats().Messages; n != 1 {
		t.Fatalf("a disabled webhook was sent %d messages", n-1)
	}
}

// Deleting a webhook abandons the redeliveries queued for it: forced by a
// Sleep that holds the message between its first and second attempt.
func TestDeleteAbandonsRedelivery(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	entered, release := make(chan struct{}), make(chan struct{})
	if err := ws.SetOptions(WebhookOptions{Sleep: func(ctx context.Context, d time.Duration) error {
		close(entered)
		<-release
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, func(int) int { return http.StatusBadGateway })
	w, _, _ := ws.Create("", rc.srv.URL, []string{"batch.succeeded"})
	s.Add(Batch{Name: "batches/x", State: "SUCCEEDED"})
	<-entered
	if err := ws.Delete(w.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	waitIdle(t, ws)
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("receiver got %d requests, want only the one before the delete", n)
	}
	at := ws.Attempts()
	if st := ws.Stats(); st.Abandoned != 1 || at[len(at)-1].Outcome != OutcomeAbandoned || at[len(at)-1].Err != "webhook deleted" {
		t.Fatalf("stats %+v, last attempt %+v", st, at[len(at)-1])
	}
}

// Seeded drops and duplicates: a dropped message never arrives, a
// duplicated one arrives exactly twice with one webhook-id, the counts match
// what the receiver saw, and the same seed drops the same completions.
func TestDropsAndDuplicates(t *testing.T) {
	run := func(seed uint64) (dropped map[string]bool, st DeliveryStats) {
		s, _ := start(t, Options{})
		ws := s.Webhooks()
		if err := ws.SetOptions(WebhookOptions{Drop: 0.2, Duplicate: 0.3, Seed: seed}); err != nil {
			t.Fatal(err)
		}
		rc := newReceiver(t, nil)
		_, secret, _ := ws.Create("", rc.srv.URL, []string{"batch.succeeded"})
		const n = 200
		for i := range n {
			s.Add(Batch{Name: fmt.Sprintf("batches/b%03d", i), State: "SUCCEEDED"})
		}
		waitIdle(t, ws)
		v := verifier(t, nil, secret)
		perID := map[string]int{}
		perBatch := map[string]int{}
		for _, r := range rc.requests() {
			if err := v.Verify(r.body, r.header); err != nil {
				t.Fatalf("a delivery does not verify: %v", err)
			}
			perID[r.header.Get("webhook-id")]++
			perBatch[fmt.Sprint(decode(t, r.body).Data["id"])]++
		}
		st = ws.Stats()
		twice := 0
		for id, k := range perID {
			switch k {
			case 1:
			case 2:
				twice++
			default:
				t.Errorf("message %s arrived %d times", id, k)
			}
		}
		dropped = map[string]bool{}
		for i := range n {
			id := fmt.Sprintf("b%03d", i)
			if perBatch[id] == 0 {
				dropped[id] = true
			}
		}
		if st.Messages != n || st.Dropped != len(dropped) || st.Delivered != n-len(dropped) || st.Duplicates != twice ||
			st.Attempts != st.Delivered+st.Duplicates {
			t.Errorf("stats %+v; receiver saw %d distinct messages, %d twice, %d batches missing", st, len(perID), twice, len(dropped))
		}
		// With p = 0.2 and 0.3 over 200 messages, 0 of either is out of reach
		// (probability < 1e-19); the exact counts are the seed's.
		if st.Dropped == 0 || st.Duplicates == 0 {
			t.Errorf("seed %d: %d dropped, %d duplicated: the probabilities were not applied", seed, st.Dropped, st.Duplicates)
		}
		return dropped, st
	}
	d1, st1 := run(7)
	d2, st2 := run(7)
	if fmt.Sprint(d1) != fmt.Sprint(d2) || st1 != st2 {
		t.Errorf("the same seed gave different runs: %v / %v; %+v / %+v", d1, d2, st1, st2)
	}
	d3, _ := run(8)
	if fmt.Sprint(d1) == fmt.Sprint(d3) {
		t.Errorf("seeds 7 and 8 dropped the same completions %v", d1)
	}
	s := New(Options{})
	if err := s.Webhooks().SetOptions(WebhookOptions{Drop: 1.5}); err == nil {
		t.Error("a drop probability of 1.5 was accepted")
	}
}

// During a rotation's overlap every delivery is signed with both secrets,
// so a receiver holding either verifies it; after 24 h only the new one
// signs. An immediate rotation signs with the new secret alone.
func TestRotationOverlapSignsWithEither(t *testing.T) {
	clk := testkit.NewClock(time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC))
	s, base := start(t, Options{APIKey: whKey})
	ws := s.Webhooks()
	if err := ws.SetOptions(WebhookOptions{Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil)
	c := genaitest.Client(t, base, whKey)
	ctx := context.Background()
	w := createHook(t, c, rc.srv.URL, webhooks.WebhookSubscribedEventBatchSucceeded)
	old := *w.NewSigningSecret
	rot, err := c.Webhooks.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: *w.ID,
		Body: webhooks.RotateSigningSecretRequest{RevocationBehavior: webhooks.RevocationBehaviorRevokePreviousSecretsAfterH24.ToPointer()}})
	if err != nil {
		t.Fatal(err)
	}
	fresh := *rot.WebhookRotateSigningSecretResponse.Secret
	oldOnly, newOnly := verifier(t, clk.Now, old), verifier(t, clk.Now, fresh)

	last := func() received {
		t.Helper()
		waitIdle(t, ws)
		got := rc.requests()
		return got[len(got)-1]
	}
	clk.Advance(23 * time.Hour)
	s.Add(Batch{Name: "batches/during", State: "SUCCEEDED"})
	r := last()
	if n := len(strings.Fields(r.header.Get("webhook-signature"))); n != 2 {
		t.Fatalf("during the overlap: %d signatures, want 2", n)
	}
	if err := oldOnly.Verify(r.body, r.header); err != nil {
		t.Errorf("during the overlap a receiver with the old secret fails: %v", err)
	}
	if err := newOnly.Verify(r.body, r.header); err != nil {
		t.Errorf("during the overlap a receiver with the new secret fails: %v", err)
	}

	clk.Advance(time.Hour) // 24 h after the rotation: the old secret has expired
	if _, err := c.Webhooks.Ping(ctx, operations.PingWebhookRequest{ID: *w.ID}); err != nil {
		t.Fatal(err)
	}
	r = last()
	if n := len(strings.Fields(r.header.Get("webhook-signature"))); n != 1 {
		t.Fatalf("after the overlap: %d signatures, want 1", n)
	}
	if err := oldOnly.Verify(r.body, r.header); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("after the overlap the old secret still verifies: %v", err)
	}
	if err := newOnly.Verify(r.body, r.header); err != nil {
		t.Errorf("after the overlap the new secret fails: %v", err)
	}
	got, _ := c.Webhooks.Get(ctx, operations.GetWebhookRequest{ID: *w.ID})
	if n := len(got.Webhook.SigningSecrets); n != 1 {
		t.Errorf("get lists %d signing secrets after the overlap, want 1", n)
	}

	rot, err = c.Webhooks.RotateSigningSecret(ctx, operations.RotateSigningSecretRequest{ID: *w.ID,
		Body: webhooks.RotateSigningSecretRequest{RevocationBehavior: webhooks.RevocationBehaviorRevokePreviousSecretsImmediately.ToPointer()}})
	if err != nil {
		t.Fatal(err)
	}
	third := *rot.WebhookRotateSigningSecretResponse.Secret
	s.Add(Batch{Name: "batches/after", State: "SUCCEEDED"})
	r = last()
	if err := newOnly.Verify(r.body, r.header); !errors.Is(err, webhook.ErrBadSignature) {
		t.Errorf("after an immediate rotation the previous secret still verifies: %v", err)
	}
	if err := verifier(t, clk.Now, third).Verify(r.body, r.header); err != nil {
		t.Errorf("after an immediate rotation the new secret fails: %v", err)
	}
}

// Send delivers with the caller's Signer (per-job webhooks plug theirs in).
func TestSendUsesTheGivenSigner(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	rc := newReceiver(t, nil)
	secret := newSecret()
	hs, err := NewHMACSigner(secret)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := BatchEvent(Batch{Name: "batches/d", State: "SUCCEEDED"}, false, time.Now())
	if !ok {
		t.Fatal("no event for a succeeded batch")
	}
	if _, err := ws.Send(Delivery{URL: rc.srv.URL, Event: ev, Signer: hs}); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Send(Delivery{URL: "not a url", Event: ev}); err == nil {
		t.Error("Send accepted a bad URL")
	}
	waitIdle(t, ws)
	got := rc.requests()
	if len(got) != 1 {
		t.Fatalf("got %d requests", len(got))
	}
	if err := verifier(t, nil, secret).Verify(got[0].body, got[0].header); err != nil {
		t.Fatal(err)
	}
	if _, err := NewHMACSigner("whsec_not base64!"); err == nil || strings.Contains(err.Error(), "base64!") {
		t.Errorf("a bad secret: %v (must fail without quoting it)", err)
	}
	if _, ok := BatchEvent(Batch{Name: "batches/r", State: "RUNNING"}, false, time.Now()); ok {
		t.Error("an event for a running batch")
	}
}

// Close cancels an attempt in flight and sends nothing afterwards.
func TestCloseStopsDeliveries(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	inFlight := make(chan struct{})
	blocker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Read the body first: only then does net/http watch the
		// connection and cancel the context when the client goes.
		_, _ = io.ReadAll(r.Body)
		close(inFlight)
		select {
		case <-r.Context().Done():
		case <-time.After(20 * time.Second):
		}
	}))
	defer blocker.Close()
	ws.Create("", blocker.URL, []string{"batch.succeeded"})
	s.Add(Batch{Name: "batches/x", State: "SUCCEEDED"})
	<-inFlight
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return while an attempt was in flight")
	}
	s.Add(Batch{Name: "batches/y", State: "SUCCEEDED"})
	if st := ws.Stats(); st.Messages != 1 {
		t.Fatalf("messages after Close: %+v", st)
	}
}
