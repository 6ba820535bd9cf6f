package webhook_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// TestSecondSignatureLine sends a delivery over HTTP whose first
// webhook-signature header line carries a signature by another secret and
// whose second line carries the valid one: it is accepted.
func TestSecondSignatureLine(t *testing.T) {
	s := sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	body := event("two-lines")
	now := time.Now()
	good := signed(t, testSecret, "msg_2l", now, body)
	other := signed(t, rotatedSecret, "msg_2l", now, body)
	hdr := good.Clone()
	hdr.Del("webhook-signature")
	hdr.Add("webhook-signature", other.Get("webhook-signature"))
	hdr.Add("webhook-signature", good.Get("webhook-signature"))
	c := &http.Client{Timeout: 10 * time.Second}
	if r := do(t, c, http.MethodPost, base+"/webhook", body, hdr); r.Code != 202 || r.Status != "accepted" {
		t.Errorf("valid signature on the second header line = %d %s, want 202 accepted", r.Code, r.Raw)
	}
	only := good.Clone()
	only.Del("webhook-signature")
	only.Add("webhook-signature", other.Get("webhook-signature"))
	only.Add("webhook-signature", "v1,AAAA")
	if r := do(t, c, http.MethodPost, base+"/webhook", event("none-valid"), only); r.Code != 401 {
		t.Errorf("no valid signature on any line = %d %s, want 401", r.Code, r.Raw)
	}
}
