package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// FuzzWebhook drives arbitrary bodies through the whole handler (unsigned,
// into a real SQLite file): it must never panic, never answer 5xx to bad
// input, and every 202 must name a key that is now in the database.
func FuzzWebhook(f *testing.F) {
	for _, seed := range []string{
		`{"type":"batch.succeeded","data":{"id":"abc"}}`,
		`{"name":"projects/p/locations/us/operations/abc-123/"}`,
		`{"operation":"operations/abc-123"}`,
		`{"operationName":{"name":"batches/x"}}`,
		`{"resourceName":"https://generativelanguage.googleapis.com/v1beta/batches/y"}`,
		`{"name":"batches/r","metadata":{"state":"BATCH_STATE_RUNNING"}}`,
		`{"name":"batches/d","done":false}`,
		`{"type":"batch.created","data":{"id":"c"}}`,
		`{"message":{"data":"eyJuYW1lIjoiYmF0Y2hlcy9wdWJzdWIifQ=="}}`,
		`{"message":{"data":"not base64"}}`,
		`{"data":{"size":1}}`,
		`[{"name":"batches/x"}]`,
		`"batches/x"`,
		`{"name":`,
		`{"name":"   "}`,
		`{"name":"batches/\u0000"}`,
		`{"name":1e400}`,
		`{"type":"interaction.completed","data":{"id":"int_1"}}`,
		`{"type":"ping"}`,
		`{"name":"batches/\ud800"}`,
		"{\"name\":\"batches/\xff\"}",
		`{"name":"batches/"}`,
		``,
		"\xff\xfe",
		`{"name":"batches/` + strings.Repeat("a", 5000) + `"}`,
		strings.Repeat(`{"data":`, 500) + `{}` + strings.Repeat(`}`, 500),
	} {
		f.Add([]byte(seed))
	}
	s := sqlitetest.Open(f, sqlitetest.Path(f), sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, InsecureNoVerify: true, MaxBody: 4096})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(body)))
		var r struct{ Key, Status, Error string }
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
			t.Fatalf("POST %q: response %q is not JSON", body, rec.Body.String())
		}
		switch rec.Code {
		case http.StatusAccepted:
			if !strings.HasPrefix(r.Key, "gemini:") {
				t.Fatalf("POST %q = 202 with key %q, want a gemini: key", body, r.Key)
			}
			if _, err := s.Get(context.Background(), r.Key); err != nil {
				t.Fatalf("POST %q = 202 %q but Get = %v", body, r.Key, err)
			}
		case http.StatusOK:
			switch {
			case r.Status == "ignored":
			case r.Status == "invalid" && r.Error != "" && r.Key == "":
			default:
				t.Fatalf("POST %q = 200 %s, want ignored, or invalid with an error", body, rec.Body.String())
			}
		case http.StatusRequestEntityTooLarge:
			if r.Error == "" {
				t.Fatalf("POST %q = %d without an error message", body, rec.Code)
			}
		default:
			// A readable body is never 400: what cannot be used is 200
			// invalid (spec §6).
			t.Fatalf("POST %q = %d %s, want 200, 202 or 413", body, rec.Code, rec.Body.String())
		}
		if rec.Body.Len() > 2000 {
			t.Fatalf("POST %q: answer of %d bytes, want a bounded one", body, rec.Body.Len())
		}
	})
}
