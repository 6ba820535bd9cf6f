package webhook_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// BenchmarkDuplicateHandler is the CPU cost of one signed duplicate delivery
// through the handler (no network): verify, canon, Record of a known key.
func BenchmarkDuplicateHandler(b *testing.B) {
	s := sqlitetest.Open(b, sqlitetest.Path(b), sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}})
	if err != nil {
		b.Fatal(err)
	}
	body := event("bench-dup")
	hdr := signed(b, testSecret, "msg_b", time.Now(), body)
	send := func() int {
		req := httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(body))
		req.Header = hdr.Clone()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if c := send(); c != 202 {
		b.Fatalf("first delivery = %d", c)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if c := send(); c != 202 {
			b.Fatalf("duplicate delivery = %d", c)
		}
	}
}
