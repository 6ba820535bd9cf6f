package geminifake

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// signerFunc adapts a function to Signer.
type signerFunc func(id string, ts time.Time, body []byte) string

func (f signerFunc) Sign(id string, ts time.Time, body []byte) string { return f(id, ts, body) }

// A batch with webhookConfig URIs sends its completion to each URI, signed
// by DynamicSigner, with user_metadata in the data, and not to the static
// webhooks (the SDK: "used instead of the registered webhooks"); one with
// only user metadata goes to the static webhooks with it.
func TestDynamicDeliveriesReplaceStatic(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	var (
		mu     sync.Mutex
		signed []string
	)
	if err := ws.SetOptions(WebhookOptions{DynamicSigner: signerFunc(func(id string, ts time.Time, body []byte) string {
		mu.Lock()
		defer mu.Unlock()
		signed = append(signed, id)
		return "v1a,dGVzdA=="
	})}); err != nil {
		t.Fatal(err)
	}
	static := newReceiver(t, nil)
	dyn1, dyn2 := newReceiver(t, nil), newReceiver(t, nil)
	if _, _, err := ws.Create("s", static.srv.URL, []string{"batch.succeeded", "batch.failed"}); err != nil {
		t.Fatal(err)
	}
	meta := map[string]any{"team": "search"}
	s.Add(Batch{Name: "batches/dyn", State: "RUNNING",
		WebhookConfig: &WebhookConfig{Uris: []string{dyn1.srv.URL + "/a", dyn2.srv.URL + "/b"}, UserMetadata: meta}})
	s.Add(Batch{Name: "batches/meta", State: "RUNNING", WebhookConfig: &WebhookConfig{UserMetadata: map[string]any{"run": "r1"}}})
	s.SetState("batches/dyn", "SUCCEEDED")
	s.Update("batches/meta", func(b *Batch) { b.State, b.Error = "FAILED", &Status{Code: 8, Message: "quota"} })
	waitIdle(t, ws)

	for _, rc := range []*receiver{dyn1, dyn2} {
		got := rc.requests()
		if len(got) != 1 {
			t.Fatalf("dynamic receiver got %d requests, want 1", len(got))
		}
		ev := decode(t, got[0].body)
		md, _ := ev.Data["user_metadata"].(map[string]any)
		if ev.Type != "batch.succeeded" || ev.Data["id"] != "dyn" || md["team"] != "search" {
			t.Errorf("dynamic event %s", got[0].body)
		}
		if sig := got[0].header.Get("webhook-signature"); sig != "v1a,dGVzdA==" {
			t.Errorf("dynamic delivery signed %q, want the DynamicSigner's", sig)
		}
	}
	got := static.requests()
	if len(got) != 1 {
		t.Fatalf("static receiver got %d requests, want only batches/meta's", len(got))
	}
	ev := decode(t, got[0].body)
	md, _ := ev.Data["user_metadata"].(map[string]any)
	if ev.Type != "batch.failed" || ev.Data["id"] != "meta" || md["run"] != "r1" || ev.Data["error_code"] != float64(8) {
		t.Errorf("static event %s", got[0].body)
	}
	if !strings.HasPrefix(got[0].header.Get("webhook-signature"), "v1,") {
		t.Errorf("static delivery signed %q, want HMAC v1", got[0].header.Get("webhook-signature"))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(signed) != 2 {
		t.Errorf("DynamicSigner signed %d attempts, want 2", len(signed))
	}
	// Without a DynamicSigner, dynamic deliveries go out unsigned.
	if err := ws.SetOptions(WebhookOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Add(Batch{Name: "batches/unsigned", State: "EXPIRED", WebhookConfig: &WebhookConfig{Uris: []string{dyn1.srv.URL}}})
	waitIdle(t, ws)
	got = dyn1.requests()
	if len(got) != 2 || got[1].header.Get("webhook-signature") != "" || decode(t, got[1].body).Type != "batch.expired" {
		t.Errorf("unsigned dynamic delivery: %d requests, last %v %s", len(got), got[len(got)-1].header, got[len(got)-1].body)
	}
}

// OnAttempt sees every record, drops included, as Attempts does.
func TestOnAttemptSeesEveryRecord(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	var seen []DeliveryAttempt
	if err := ws.SetOptions(WebhookOptions{Drop: 0.5, Seed: 11, OnAttempt: func(a DeliveryAttempt) { seen = append(seen, a) }}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil)
	for i := range 8 {
		s.Add(Batch{Name: "batches/o" + string(rune('a'+i)), State: "SUCCEEDED", WebhookConfig: &WebhookConfig{Uris: []string{rc.srv.URL}}})
	}
	waitIdle(t, ws)
	ws.mu.Lock()
	got := slices.Clone(seen)
	ws.mu.Unlock()
	all := ws.Attempts()
	if len(got) != len(all) || len(all) != 8 {
		t.Fatalf("OnAttempt saw %d records, Attempts has %d, want 8", len(got), len(all))
	}
	st := ws.Stats()
	if st.Dropped == 0 || st.Delivered == 0 || st.Dropped+st.Delivered != 8 {
		t.Errorf("stats %+v: want both drops and deliveries (seed 11)", st)
	}
	if err := CheckWebhookConfig(&WebhookConfig{Uris: []string{"mailto:x"}}); err == nil {
		t.Error("CheckWebhookConfig accepted a mailto: URI")
	}
}

// DropIf loses exactly the deliveries it picks (the demo's "lost
// webhook"); Event.Batch names the batch whatever the data's shape.
func TestDropIfLosesChosenDeliveries(t *testing.T) {
	s, _ := start(t, Options{})
	ws := s.Webhooks()
	if err := ws.SetOptions(WebhookOptions{DropIf: func(ev Event) bool { return ev.Batch() == "batches/lost" }}); err != nil {
		t.Fatal(err)
	}
	rc := newReceiver(t, nil)
	if _, _, err := ws.Create("s", rc.srv.URL, []string{"batch.succeeded"}); err != nil {
		t.Fatal(err)
	}
	s.Add(Batch{Name: "batches/kept", State: "SUCCEEDED"}, Batch{Name: "batches/lost", State: "SUCCEEDED"},
		Batch{Name: "batches/lost-too", State: "SUCCEEDED", WebhookConfig: &WebhookConfig{UserMetadata: map[string]any{"k": "v"}}})
	waitIdle(t, ws)
	var got []string
	for _, r := range rc.requests() {
		got = append(got, decode(t, r.body).Data["id"].(string))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"kept", "lost-too"}) {
		t.Errorf("delivered %v, want kept and lost-too", got)
	}
	if st := ws.Stats(); st.Dropped != 1 {
		t.Errorf("stats %+v, want one drop", st)
	}
	ev, _ := BatchEvent(Batch{Name: "batches/x", State: "FAILED"}, false, time.Now())
	if ev.Batch() != "batches/x" || withUserMetadata(ev, Batch{WebhookConfig: &WebhookConfig{UserMetadata: map[string]any{"a": 1}}}).Batch() != "batches/x" {
		t.Errorf("Event.Batch of %+v = %q", ev, ev.Batch())
	}
	if (Event{Type: PingEventType, Data: map[string]string{"webhook_id": "w"}}).Batch() != "" {
		t.Error("a ping names a batch")
	}
}
