package webhook_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// logBuffer collects a handler's JSON log lines; the server logs from its
// own goroutines.
type logBuffer struct{ testkit.Buffer }

// lines returns the log records written so far, decoded.
func (l *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		m["_raw"] = line
		out = append(out, m)
	}
	return out
}

// eventServer runs a signed inbox-mode receiver on a real SQLite file with
// its metrics and a JSON log.
func eventServer(t *testing.T) (base string, s sink.Sink, m *metrics.Metrics, logs *logBuffer, send func(body []byte) reply) {
	t.Helper()
	s = sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{})
	m = metrics.New(s)
	logs = &logBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Metrics: m, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	base, _ = serve(t, h, webhook.ServerOptions{})
	client := &http.Client{Timeout: 10 * time.Second}
	send = func(body []byte) reply {
		t.Helper()
		return do(t, client, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_ev", time.Now(), body))
	}
	return base, s, m, logs, send
}

// TestNotBatchEventsAreIgnored: a body with a type is a batch completion only
// for batch.* types (spec §6). Every other type — pings, interaction.*,
// video.generated, types added later — is answered 200 ignored with its type,
// recorded nowhere (even when it carries a name canon could read), and
// counted by type with a bounded label set.
func TestNotBatchEventsAreIgnored(t *testing.T) {
	base, s, _, _, send := eventServer(t)
	long := strings.Repeat("t", 10_000)
	tests := []struct {
		body     string
		wantType string // in the answer
		label    string // of gemrecon_webhook_ignored_total
	}{
		{`{"type":"interaction.completed","data":{"id":"int_1"}}`, "interaction.completed", "interaction.completed"},
		{`{"type":"interaction.failed","data":{"id":"int_2","name":"batches/looks-like-one"}}`, "interaction.failed", "interaction.failed"},
		{`{"type":"interaction.requires_action","data":{"id":"int_3"}}`, "interaction.requires_action", "interaction.requires_action"},
		{`{"type":"video.generated","version":"v1","data":{"id":"vid_1","name":"operations/v1"}}`, "video.generated", "video.generated"},
		{`{"type":"ping"}`, "ping", "ping"},
		{`{"type":"webhook.ping","data":{}}`, "webhook.ping", "webhook.ping"},
		{`{"type":"INTERACTION.COMPLETED","data":{"id":"int_4"}}`, "INTERACTION.COMPLETED", "interaction.completed"},
		{`{"type":"file.deleted","name":"batches/f1"}`, "file.deleted", "other"},
		{`{"type":"batches.succeeded","data":{"id":"x"}}`, "batches.succeeded", "other"},
		{`{"type":"batch.","data":{"id":"x"}}`, "batch.", "other"},
		{`{"type":"","name":"batches/empty-type"}`, "", "other"},
		{`{"type":7,"name":"batches/number-type"}`, "", "other"},
		{`{"type":{"name":"batch.succeeded"},"name":"batches/object-type"}`, "", "other"},
		{`{"type":"interaction.completed","name":"batches/\u0000","data":[]}`, "interaction.completed", "interaction.completed"},
		{`{"type":"` + long + `","name":"batches/long-type"}`, long[:120] + "…", "other"},
		{`{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(`{"type":"interaction.completed","data":{"id":"int_5"}}`)) + `"}}`, "interaction.completed", "interaction.completed"},
	}
	for _, tt := range tests {
		before := snapshot(t, s)
		r := send([]byte(tt.body))
		if r.Code != 200 || r.Status != "ignored" || r.Type != tt.wantType || r.Key != "" {
			t.Errorf("POST %.100s = %d %s, want 200 ignored with type %.40q and no key", tt.body, r.Code, r.Raw, tt.wantType)
		}
		if after := snapshot(t, s); after != before {
			t.Errorf("POST %.100s recorded something:\n%s", tt.body, after)
		}
	}
	for _, key := range []string{"gemini:int_1", "gemini:batches/int_1", "gemini:batches/looks-like-one", "gemini:operations/v1", "gemini:batches/f1"} {
		if _, err := s.Get(context.Background(), key); !errors.Is(err, sink.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want not found", key, err)
		}
	}
	// A batch event still goes through, and a non-terminal one is ignored
	// with its type counted by name (known) or as other.
	if r := send(event("real")); r.Code != 202 || r.Status != "accepted" {
		t.Errorf("batch.succeeded = %d %s, want 202 accepted", r.Code, r.Raw)
	}
	if r := send([]byte(`{"type":"batch.running","data":{"id":"run1"}}`)); r.Code != 200 || r.Status != "ignored" || r.Key != "gemini:batches/run1" || r.Type != "batch.running" {
		t.Errorf("batch.running = %d %s, want 200 ignored with key and type", r.Code, r.Raw)
	}
	if r := send([]byte(`{"name":"batches/r2","metadata":{"state":"BATCH_STATE_RUNNING"}}`)); r.Code != 200 || r.Status != "ignored" {
		t.Errorf("running seed shape = %d %s, want 200 ignored", r.Code, r.Raw)
	}

	raw := do(t, &http.Client{Timeout: 10 * time.Second}, http.MethodGet, base+"/metrics", nil, nil).Raw
	for _, want := range []string{
		`gemrecon_webhook_ignored_total{type="interaction.completed"} 4`,
		`gemrecon_webhook_ignored_total{type="interaction.failed"} 1`,
		`gemrecon_webhook_ignored_total{type="interaction.requires_action"} 1`,
		`gemrecon_webhook_ignored_total{type="video.generated"} 1`,
		`gemrecon_webhook_ignored_total{type="ping"} 1`,
		`gemrecon_webhook_ignored_total{type="webhook.ping"} 1`,
		`gemrecon_webhook_ignored_total{type="other"} 8`, // 7 unknown types + batch.running
		`gemrecon_webhook_ignored_total{type="none"} 1`,
		`gemrecon_deliveries_total{outcome="ignored",source="webhook"} 18`,
		`gemrecon_deliveries_total{outcome="accepted",source="webhook"} 1`,
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if n := strings.Count(raw, "gemrecon_webhook_ignored_total{"); n > len(metrics.KnownEventTypes)+2 {
		t.Errorf("/metrics has %d ignored-type series, want at most %d", n, len(metrics.KnownEventTypes)+2)
	}
}

// TestUnusableBodiesAreInvalid: a verified body that cannot be used is
// answered 200 {"status":"invalid","error"} (any non-2xx makes the Gemini API
// retry for a day and can disable the webhook), recorded nowhere, logged at
// error level and counted by reason. Error texts and log lines quote little
// of a bad name (spec §12).
func TestUnusableBodiesAreInvalid(t *testing.T) {
	base, s, _, logs, send := eventServer(t)
	huge := strings.Repeat("h", 100_000)
	tests := []struct {
		name, body string
		reason     string
		wantErr    string
	}{
		{"invalid JSON", `{"name":"batches/x"`, metrics.InvalidJSON, "parsing event"},
		{"JSON array", `[{"name":"batches/x"}]`, metrics.InvalidJSON, "not a JSON object"},
		{"empty body", ``, metrics.InvalidJSON, "empty event body"},
		{"no operation name", `{"type":"batch.succeeded","data":{"size":3}}`, metrics.InvalidNoName, "fields present: data, data.size, type"},
		{"no name, no type", `{"hello":"world"}`, metrics.InvalidNoName, "fields present: hello"},
		{"name of the wrong type", `{"name":42}`, metrics.InvalidFieldType, `field "name" is a number`},
		{"Pub/Sub data not base64", `{"message":{"data":"@@@"}}`, metrics.InvalidEnvelope, "not base64"},
		{"NUL in the name", `{"name":"batches/a\u0000b"}`, metrics.InvalidName, "control character U+0000"},
		{"100 KB name", `{"name":"batches/` + huge + `"}`, metrics.InvalidName, "over the limit of 512 bytes"},
		{"100 KB webhook id", `{"type":"batch.succeeded","data":{"id":"` + huge + `"}}`, metrics.InvalidName, "over the limit of 512 bytes"},
		{"unpaired surrogate", `{"name":"batches/a\ud800"}`, metrics.InvalidName, "not valid UTF-8 or holds an unpaired surrogate"},
		{"invalid UTF-8", "{\"name\":\"batches/a\xff\"}", metrics.InvalidName, "not valid UTF-8"},
		{"other invalid UTF-8", "{\"name\":\"batches/a\xfe\"}", metrics.InvalidName, "not valid UTF-8"},
		{"batches/", `{"name":"batches/"}`, metrics.InvalidName, "names a collection"},
		{"batches/ as a webhook id", `{"type":"batch.succeeded","data":{"id":"batches/"}}`, metrics.InvalidName, "names a collection"},
		{"non-terminal with a bad name", `{"type":"batch.running","data":{"id":"\u0007"}}`, metrics.InvalidName, "control character"},
	}
	for _, tt := range tests {
		before := snapshot(t, s)
		logs.Reset()
		r := send([]byte(tt.body))
		if r.Code != 200 || r.Status != "invalid" || !strings.Contains(r.Error, tt.wantErr) || r.Key != "" {
			t.Errorf("%s: POST = %d %.300s, want 200 invalid with an error containing %q", tt.name, r.Code, r.Raw, tt.wantErr)
		}
		if len(r.Raw) > 1000 || strings.Contains(r.Raw, huge[:1000]) {
			t.Errorf("%s: answer is %d bytes, want the bad name quoted to at most %d bytes", tt.name, len(r.Raw), 120)
		}
		if after := snapshot(t, s); after != before {
			t.Errorf("%s: recorded something:\n%s", tt.name, after)
		}
		var errorLines int
		for _, l := range logs.lines(t) {
			raw := l["_raw"].(string)
			if len(raw) > 2000 || strings.Contains(raw, huge[:1000]) {
				t.Errorf("%s: log line of %d bytes, want the bad name quoted to at most %d bytes", tt.name, len(raw), 120)
			}
			if l["level"] == "ERROR" && l["reason"] == tt.reason {
				errorLines++
			}
		}
		if errorLines != 1 {
			t.Errorf("%s: %d error-level log lines with reason %q, want 1:\n%v", tt.name, errorLines, tt.reason, logs.lines(t))
		}
	}
	raw := do(t, &http.Client{Timeout: 10 * time.Second}, http.MethodGet, base+"/metrics", nil, nil).Raw
	for _, want := range []string{
		`gemrecon_webhook_invalid_total{reason="bad_json"} 3`,
		`gemrecon_webhook_invalid_total{reason="no_name"} 2`,
		`gemrecon_webhook_invalid_total{reason="bad_field"} 1`,
		`gemrecon_webhook_invalid_total{reason="bad_envelope"} 1`,
		`gemrecon_webhook_invalid_total{reason="bad_name"} 9`,
		`gemrecon_webhook_invalid_total{reason="other"} 0`,
		`gemrecon_deliveries_total{outcome="invalid",source="webhook"} 16`,
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(raw, `outcome="bad_request"`) {
		t.Errorf("/metrics counts a bad_request; verified bodies are never 400")
	}
}

// TestSeedShapesWithoutType: a body without a type is read as spec §2 says
// (the seed documents' shapes), and still recorded.
func TestSeedShapesWithoutType(t *testing.T) {
	_, s, _, _, send := eventServer(t)
	if r := send([]byte(`{"name":"projects/p/locations/us/operations/abc-123/"}`)); r.Code != 202 || r.Status != "accepted" || r.Key != "gemini:operations/abc-123" {
		t.Errorf("seed name shape = %d %s, want 202 accepted gemini:operations/abc-123", r.Code, r.Raw)
	}
	if r := send([]byte(`{"operation":"operations/abc-123"}`)); r.Code != 202 || r.Status != "duplicate" || r.Key != "gemini:operations/abc-123" {
		t.Errorf("seed operation shape = %d %s, want 202 duplicate gemini:operations/abc-123", r.Code, r.Raw)
	}
	if r := send([]byte(`{"type":null,"name":"batches/null-type"}`)); r.Code != 202 || r.Key != "gemini:batches/null-type" {
		t.Errorf("type null = %d %s, want 202 (null is no type)", r.Code, r.Raw)
	}
	if e, err := s.Get(context.Background(), "gemini:operations/abc-123"); err != nil || e.SeenCount != 2 {
		t.Errorf("Get(gemini:operations/abc-123) = %+v, %v; want seen twice", e, err)
	}
}

// TestSyncNotBatchEventRunsNothing: in --sync mode, where the effect runs
// inside the request, an interaction event (once accepted as gemini:int_1 and
// run) and an unusable body run nothing.
func TestSyncNotBatchEventRunsNothing(t *testing.T) {
	base, s, effects := syncServer(t, nil, time.Second)
	if r := post(t, base, []byte(`{"type":"interaction.completed","data":{"id":"int_1"}}`)); r.Code != 200 || r.Status != "ignored" {
		t.Errorf("sync interaction.completed = %d %s, want 200 ignored", r.Code, r.Raw)
	}
	if r := post(t, base, []byte(`{"type":"batch.succeeded","data":{"id":"a\u0000"}}`)); r.Code != 200 || r.Status != "invalid" {
		t.Errorf("sync NUL id = %d %s, want 200 invalid", r.Code, r.Raw)
	}
	if r := post(t, base, event("sync-real")); r.Code != 200 || r.Status != "done" {
		t.Errorf("sync batch.succeeded = %d %s, want 200 done", r.Code, r.Raw)
	}
	if got := effectLines(t, effects); len(got) != 1 || got[0] != "gemini:batches/sync-real" {
		t.Errorf("effect runs = %q, want only gemini:batches/sync-real", got)
	}
	if _, err := s.Get(context.Background(), "gemini:int_1"); !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("Get(gemini:int_1) = %v, want not found", err)
	}
}

// TestByteOrderMarkBeforeTheEvent: nothing promises that a sender never
// puts a UTF-8 byte order mark before its JSON (RFC 8259 §8.1 lets a
// receiver ignore one). The signature covers the bytes as sent, BOM
// included; the event is then read, and stored, without it: a completion
// is not thrown away as invalid for three bytes, and the stored body is
// JSON an effect can be handed.
func TestByteOrderMarkBeforeTheEvent(t *testing.T) {
	_, s, _, _, send := eventServer(t)
	body := append([]byte("\xef\xbb\xbf"), event("bom1")...)
	r := send(body)
	if r.Code != 202 || r.Status != "accepted" || r.Key != "gemini:batches/bom1" {
		t.Fatalf("POST BOM+event = %d %s, want 202 accepted gemini:batches/bom1", r.Code, r.Raw)
	}
	e, err := s.Get(context.Background(), "gemini:batches/bom1")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(e.Payload) {
		t.Errorf("stored payload %q is not JSON", e.Payload)
	}
	// Only a leading BOM: one elsewhere is still not JSON.
	if r := send([]byte(`{"type":"batch.succeeded"` + "\xef\xbb\xbf" + `,"data":{"id":"bom2"}}`)); r.Code != 200 || r.Status != "invalid" {
		t.Errorf("POST with a BOM inside = %d %s, want 200 invalid", r.Code, r.Raw)
	}
}

// A POST to another path than Path — the sender registered a URL whose
// path differs (/hooks for /webhook, a trailing /) — is answered 404, and
// logged at info with the path, so that serve's log shows why every
// delivery fails; a GET elsewhere (a scanner, a browser) is not logged.
func TestPostToAnotherPathIsLogged(t *testing.T) {
	base, _, _, logs, _ := eventServer(t)
	c := &http.Client{Timeout: 10 * time.Second}
	if r := do(t, c, http.MethodPost, base+"/webhook/", event("p1"), nil); r.Code != http.StatusNotFound {
		t.Fatalf("POST /webhook/ = %d, want 404", r.Code)
	}
	if r := do(t, c, http.MethodGet, base+"/favicon.ico", nil, nil); r.Code != http.StatusNotFound {
		t.Fatalf("GET /favicon.ico = %d, want 404", r.Code)
	}
	var found []map[string]any
	for _, l := range logs.lines(t) {
		if l["path"] != nil {
			found = append(found, l)
		}
	}
	if len(found) != 1 || found[0]["level"] != "INFO" || found[0]["path"] != "/webhook/" || found[0]["method"] != "POST" {
		t.Fatalf("log records naming a path: %v, want one at INFO for POST /webhook/", found)
	}
}
