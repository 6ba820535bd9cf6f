package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/webhook"
)

// hookReceiver is a real HTTP server standing for serve: it keeps every
// request and answers 200.
type hookReceiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []struct {
		h    http.Header
		body []byte
	}
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	rc := &hookReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, struct {
			h    http.Header
			body []byte
		}{r.Header.Clone(), b})
		rc.mu.Unlock()
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *hookReceiver) last(t *testing.T) (http.Header, []byte) {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.got) == 0 {
		t.Fatal("the receiver got nothing")
	}
	g := rc.got[len(rc.got)-1]
	return g.h, g.body
}

func (rc *hookReceiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// webhooksAPI starts the stand-in with its WebhookService and sets the key.
func webhooksAPI(t *testing.T) *geminifake.Server {
	t.Helper()
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	// The stand-in serves the WebhookService on v1beta only, as the API
	// does: every webhooks test shows that this cannot move the version.
	t.Setenv("GOOGLE_GENAI_API_VERSION", "v1")
	return fakeAPI(t)
}

func wh(api *geminifake.Server, args ...string) []string {
	return append([]string{"webhooks", "--base-url", api.URL()}, args...)
}

func idleDeliveries(t *testing.T, api *geminifake.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := api.Webhooks().Wait(ctx); err != nil {
		t.Fatalf("deliveries did not finish: %v", err)
	}
}

var (
	idLine     = regexp.MustCompile(`(?m)^id: (\S+)$`)
	secretLine = regexp.MustCompile(`(?m)^secret: (whsec_\S+)$`)
)

func match(t *testing.T, re *regexp.Regexp, s string) string {
	t.Helper()
	m := re.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %s in %q", re, s)
	}
	return m[1]
}

// create, list, ping and delete through the SDK against the stand-in over
// HTTP: the ping lands at a real server and verifies with the secret that
// create printed.
func TestWebhooksCreateListPingDelete(t *testing.T) {
	api := webhooksAPI(t)
	rc := newHookReceiver(t)

	r := gemrecon(t, wh(api, "create", "--url", rc.srv.URL+"/webhook", "--name", "nightly")...)
	wantCode(t, r, exitOK)
	id, secret := match(t, idLine, r.stdout), match(t, secretLine, r.stdout)
	if strings.Count(r.stdout, "\n") != 2 {
		t.Errorf("create's stdout should be the id and secret lines only: %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "shown only this once") || !strings.Contains(r.stderr, "GEMRECON_WEBHOOK_SECRET") {
		t.Errorf("create's stderr should say the secret is shown once and how serve takes it: %q", r.stderr)
	}
	held := api.Webhooks().All()
	if len(held) != 1 || held[0].ID != id || held[0].Secrets[0].Secret != secret || held[0].Name != "nightly" ||
		strings.Join(held[0].SubscribedEvents, ",") != "batch.succeeded,batch.failed,batch.expired,batch.cancelled" {
		t.Fatalf("the API holds %+v; create printed id %s", held, id)
	}

	r = gemrecon(t, wh(api, "list")...)
	wantCode(t, r, exitOK)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("list: %q", r.stdout)
	}
	for _, want := range []string{id, "nightly", "enabled", "batch.succeeded,batch.failed,batch.expired,batch.cancelled", rc.srv.URL + "/webhook"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("list row %q lacks %q", lines[1], want)
		}
	}
	if strings.Contains(r.stdout, secret) {
		t.Fatal("list shows the secret")
	}
	r = gemrecon(t, wh(api, "list", "--json")...)
	wantCode(t, r, exitOK)
	var listed []struct {
		ID               string   `json:"id"`
		URI              string   `json:"uri"`
		State            string   `json:"state"`
		SubscribedEvents []string `json:"subscribed_events"`
		SigningSecrets   []struct {
			TruncatedSecret string `json:"truncated_secret"`
		} `json:"signing_secrets"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 || listed[0].ID != id ||
		listed[0].State != "enabled" || len(listed[0].SubscribedEvents) != 4 || len(listed[0].SigningSecrets) != 1 {
		t.Fatalf("list --json = %s (err %v)", r.stdout, err)
	}

	r = gemrecon(t, wh(api, "ping", id)...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "ping sent to webhook "+id) {
		t.Errorf("ping: %q", r.stdout)
	}
	idleDeliveries(t, api)
	h, body := rc.last(t)
	v, err := webhook.NewVerifier([]string{secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(body, h); err != nil {
		t.Fatalf("the ping does not verify with the secret create printed: %v", err)
	}
	var ev struct{ Type string }
	if json.Unmarshal(body, &ev); ev.Type != geminifake.PingEventType {
		t.Fatalf("ping body %s", body)
	}

	r = gemrecon(t, wh(api, "delete", id)...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "deleted webhook "+id) || len(api.Webhooks().All()) != 0 {
		t.Fatalf("delete: %v; API holds %d", r, len(api.Webhooks().All()))
	}
	r = gemrecon(t, wh(api, "list", "--json")...)
	wantCode(t, r, exitOK)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("list --json with no webhooks = %q, want []", r.stdout)
	}
	r = gemrecon(t, wh(api, "list")...)
	wantCode(t, r, exitOK)
	if r.stdout != "" || !strings.Contains(r.stderr, "No webhooks") {
		t.Errorf("empty list: %v", r)
	}

	// An API error is shown with its status and message: exit 1.
	for _, sub := range []string{"ping", "delete", "rotate"} {
		r = gemrecon(t, wh(api, sub, id)...)
		wantCode(t, r, exitFatal)
		if !strings.Contains(r.stderr, "404 NOT_FOUND: Requested entity was not found.") || !strings.Contains(r.stderr, "webhooks list") {
			t.Errorf("%s of a deleted webhook: %q", sub, r.stderr)
		}
	}
}

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// --secret-file: create writes a new 0600 file serve reads and refuses an
// existing one before anything is created; rotate appends, so that serve
// holds both secrets through the overlap, and deliveries verify with the
// file, the old secret alone and the new one alone.
func TestWebhooksSecretFile(t *testing.T) {
	api := webhooksAPI(t)
	rc := newHookReceiver(t)
	path := filepath.Join(t.TempDir(), "whsec")

	r := gemrecon(t, wh(api, "create", "--url", rc.srv.URL, "--secret-file", path)...)
	wantCode(t, r, exitOK)
	id := match(t, idLine, r.stdout)
	if strings.Contains(r.stdout, "whsec_") || secretLine.MatchString(r.stderr) {
		t.Fatalf("create --secret-file printed the secret: %v", r)
	}
	if m := fileMode(t, path); m != 0o600 {
		t.Fatalf("secret file mode %04o, want 0600", m)
	}
	secrets, err := webhook.LoadSecrets("", path)
	if err != nil || len(secrets) != 1 {
		t.Fatalf("serve's loader reads %v from the file (err %v)", secrets, err)
	}
	old := secrets[0]
	if held := api.Webhooks().All(); held[0].Secrets[0].Secret != old {
		t.Fatal("the file holds another secret than the API's")
	}
	if strings.Contains(r.stdout+r.stderr, old) {
		t.Fatal("the secret was printed")
	}

	// An existing file is never overwritten, and nothing is created.
	before, _ := os.ReadFile(path)
	r = gemrecon(t, wh(api, "create", "--url", rc.srv.URL, "--secret-file", path)...)
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "exists") || !strings.Contains(r.stderr, "rotate") {
		t.Errorf("create onto an existing file: %q", r.stderr)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("create changed an existing secret file")
	}
	if n := len(api.Webhooks().All()); n != 1 {
		t.Fatalf("a refused create registered a webhook (%d now)", n)
	}

	// rotate appends; the previous secret stays valid for 24 h.
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", path)...)
	wantCode(t, r, exitOK)
	if strings.Contains(r.stdout, "whsec_") {
		t.Fatalf("rotate --secret-file printed the secret: %q", r.stdout)
	}
	for _, want := range []string{"valid until", "alongside the old", path, "Restart serve"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("rotate's explanation lacks %q: %q", want, r.stderr)
		}
	}
	secrets, err = webhook.LoadSecrets("", path)
	if err != nil || len(secrets) != 2 || secrets[0] != old {
		t.Fatalf("after rotate the file holds %d secrets (err %v), want the old then the new", len(secrets), err)
	}
	fresh := secrets[1]
	if m := fileMode(t, path); m != 0o600 {
		t.Errorf("mode after append %04o", m)
	}
	held := api.Webhooks().All()[0]
	if len(held.Secrets) != 2 || held.Secrets[0].Secret != fresh || held.Secrets[1].ExpireTime.IsZero() {
		t.Fatalf("API secrets after rotate: %+v", held.Secrets)
	}

	// A completion during the overlap verifies with the file, and with
	// either secret alone (a serve not yet restarted, or one restarted).
	api.Add(geminifake.Batch{Name: "batches/done1", State: "SUCCEEDED"})
	idleDeliveries(t, api)
	h, body := rc.last(t)
	for _, set := range [][]string{secrets, {old}, {fresh}} {
		v, err := webhook.NewVerifier(set, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Verify(body, h); err != nil {
			t.Errorf("a delivery during the overlap fails with %d secret(s): %v", len(set), err)
		}
	}

	// rotate --now without a file prints the secret and says how to give
	// serve both; the previous ones are revoked.
	r = gemrecon(t, wh(api, "rotate", id, "--now")...)
	wantCode(t, r, exitOK)
	third := match(t, secretLine, r.stdout)
	if !strings.Contains(r.stderr, "revoked now") || !strings.Contains(r.stderr, `GEMRECON_WEBHOOK_SECRET="whsec_NEW"`) ||
		strings.Contains(r.stderr, "both") {
		t.Errorf("rotate --now's explanation: %q", r.stderr)
	}
	if held := api.Webhooks().All()[0]; len(held.Secrets) != 1 || held.Secrets[0].Secret != third {
		t.Fatalf("after rotate --now the API holds %+v", held.Secrets)
	}

	// Without a file, rotate prints the secret and says how to give serve both.
	r = gemrecon(t, wh(api, "rotate", id)...)
	wantCode(t, r, exitOK)
	third = match(t, secretLine, r.stdout)
	if !strings.Contains(r.stderr, `GEMRECON_WEBHOOK_SECRET="whsec_NEW whsec_OLD"`) || !strings.Contains(r.stderr, "--secret-file FILE") {
		t.Errorf("rotate's explanation without a file: %q", r.stderr)
	}

	// A file without a final newline gets one before the appended secret.
	bare := filepath.Join(t.TempDir(), "bare")
	if err := os.WriteFile(bare, []byte(third), 0o600); err != nil {
		t.Fatal(err)
	}
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", bare)...)
	wantCode(t, r, exitOK)
	if s, err := webhook.LoadSecrets("", bare); err != nil || len(s) != 2 || s[0] != third {
		t.Fatalf("append to a file without a final newline: %v %v", s, err)
	}
	// A missing file is created 0600.
	created := filepath.Join(t.TempDir(), "new")
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", created)...)
	wantCode(t, r, exitOK)
	if s, err := webhook.LoadSecrets("", created); err != nil || len(s) != 1 || fileMode(t, created) != 0o600 {
		t.Fatalf("rotate to a missing file: %v %v", s, err)
	}
	// A file serve would refuse is not appended to, and nothing rotates.
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not-a-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := len(api.Webhooks().All()[0].Secrets)
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", bad)...)
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "whsec_") || strings.Contains(r.stderr, "not-a-secret") {
		t.Errorf("rotate onto a bad file: %q (must say what is wrong without quoting the line)", r.stderr)
	}
	if len(api.Webhooks().All()[0].Secrets) != n {
		t.Fatal("a refused rotate rotated")
	}
	// A group-readable file is appended to, with a warning.
	loose := filepath.Join(t.TempDir(), "loose")
	if err := os.WriteFile(loose, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(loose, 0o644)
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", loose)...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("no warning for a 0644 secret file: %q", r.stderr)
	}
}

// Wrong words exit 2 before any request; --backend vertex is refused.
func TestWebhooksUsageErrors(t *testing.T) {
	api := webhooksAPI(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{wh(api, "list", "--backend", "vertex"), "Gemini API's only"},
		{wh(api, "create", "--backend", "vertex", "--url", "https://x/y", "--secret-file", filepath.Join(dir, "v")), "Gemini API's only"},
		{wh(api, "ping", "--backend", "openai", "x"), "--backend"},
		{wh(api, "create"), "--url is required"},
		{wh(api, "create", "--url", "/webhook"), "absolute"},
		{wh(api, "create", "--url", "https://x/y", "--events", "batch.succeeded,,batch.failed"), "empty event"},
		{wh(api, "ping"), "one webhook ID"},
		{wh(api, "rotate", "a", "b"), "one webhook ID"},
		{wh(api, "delete", " "), "empty"},
		{wh(api, "list", "extra"), "argument"},
		{wh(api, "explode"), "unknown command"},
		{wh(api, "create", "--url", "https://x/y", "--bogus"), "unknown flag"},
	} {
		r := gemrecon(t, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: want exit 2 naming %q, got %v", tc.args[3:], tc.want, r)
		}
	}
	if n := len(api.Requests()); n != 0 {
		t.Errorf("usage errors sent %d requests", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "v")); !errors.Is(err, os.ErrNotExist) {
		t.Error("a refused create left a secret file")
	}
	// No key: exit 1 naming the variables, no file, no request.
	t.Setenv("GEMINI_API_KEY", "")
	r := gemrecon(t, wh(api, "create", "--url", "https://x/y", "--secret-file", filepath.Join(dir, "k"))...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "GEMINI_API_KEY") {
		t.Errorf("no key: %q", r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "k")); !errors.Is(err, os.ErrNotExist) || len(api.Requests()) != 0 {
		t.Error("create without a key left a file or sent a request")
	}
	// Every subcommand's help has examples.
	for _, sub := range []string{"create", "list", "ping", "rotate", "delete"} {
		r := gemrecon(t, "webhooks", sub, "--help")
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("webhooks %s --help has no examples", sub)
		}
	}
	r = gemrecon(t, "webhooks")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "rotate") {
		t.Errorf("webhooks without a subcommand should show help: %q", r.stdout)
	}
}

// Errors from the service: status and message shown, exit 1; a create is
// never retried (a lost answer could have registered a webhook), and a
// failed create leaves no secret file.
func TestWebhooksAPIErrors(t *testing.T) {
	api := webhooksAPI(t)
	dir := t.TempDir()

	t.Setenv("GEMINI_API_KEY", "wrong")
	r := gemrecon(t, wh(api, "list")...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "401 UNAUTHENTICATED: API key not valid") || !strings.Contains(r.stderr, "GEMINI_API_KEY") {
		t.Errorf("wrong key: %q", r.stderr)
	}
	t.Setenv("GEMINI_API_KEY", testAPIKey)

	f := filepath.Join(dir, "s1")
	r = gemrecon(t, wh(api, "create", "--url", "https://x/y", "--events", "batch.done", "--secret-file", f)...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "400 INVALID_ARGUMENT") || !strings.Contains(r.stderr, "batch.done") {
		t.Errorf("unknown event: %q", r.stderr)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed create left its secret file")
	}

	api.ResetRequests()
	api.InjectFault(geminifake.Fault{Status: http.StatusServiceUnavailable, Message: "The service is currently unavailable."})
	r = gemrecon(t, wh(api, "create", "--url", "https://x/y", "--secret-file", f)...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "503 UNAVAILABLE: The service is currently unavailable.") || !strings.Contains(r.stderr, "webhooks list") {
		t.Errorf("503 on create: %q", r.stderr)
	}
	if n := len(api.Requests()); n != 1 {
		t.Errorf("create sent %d requests after a 503, want 1 (no retry)", n)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed create left its secret file")
	}

	// Nothing listens at the address: nothing was sent, so nothing was
	// created, and the message says to check the address, not to look for a
	// webhook that may exist.
	r = gemrecon(t, "webhooks", "--base-url", "http://"+freeAddr(t), "create", "--url", "https://x/y", "--secret-file", f)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "nothing was created") || !strings.Contains(r.stderr, "--base-url") || strings.Contains(r.stderr, "may have been created") {
		t.Errorf("create with no server at the address: %q", r.stderr)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Error("a failed create left its secret file")
	}

	// A rotate that fails leaves an existing file as it was.
	r = gemrecon(t, wh(api, "create", "--url", "https://x/y", "--secret-file", f)...)
	wantCode(t, r, exitOK)
	id := match(t, idLine, r.stdout)
	before, _ := os.ReadFile(f)
	api.InjectFault(geminifake.Fault{Status: http.StatusInternalServerError})
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", f)...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "500 INTERNAL") {
		t.Errorf("500 on rotate: %q", r.stderr)
	}
	if after, _ := os.ReadFile(f); string(after) != string(before) {
		t.Error("a failed rotate changed the secret file")
	}

	// A body that is not Google's error shape is quoted, bounded.
	api.InjectFault(geminifake.Fault{Status: http.StatusBadGateway, Body: "<html>bad gateway\x1b[2J</html>"})
	r = gemrecon(t, wh(api, "delete", id)...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "502") || strings.Contains(r.stderr, "\x1b") {
		t.Errorf("502 with an HTML body: %q", r.stderr)
	}
}

// The commands and serve together: a webhook created with --secret-file
// feeds a real serve process; the stand-in's deliveries pass its
// verification, a batch completion runs the effect, a default rotation keeps
// an unrestarted serve working (the old secret still signs), and --now makes
// it answer 401 until it has the new secret.
func TestWebhooksWithServe(t *testing.T) {
	api := webhooksAPI(t)
	if err := api.Webhooks().SetOptions(geminifake.WebhookOptions{MaxAttempts: 1}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	secrets := filepath.Join(dir, "whsec")
	addr := freeAddr(t)
	r := gemrecon(t, wh(api, "create", "--url", "http://"+addr+"/webhook", "--secret-file", secrets)...)
	wantCode(t, r, exitOK)
	id := match(t, idLine, r.stdout)

	log := filepath.Join(dir, "effects.log")
	// serve confirms each completion with the API (the stand-in) before
	// its effect runs (spec §9.2).
	cmd := child(t, "--db", initDB(t, filepath.Join(dir, "s.db")), "serve", "--listen", addr, "--secret-file", secrets,
		"--base-url", api.URL(), "--exec", `echo "$GEMRECON_KEY" >> `+shellQuote(log))
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET=")
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")

	lastStatus := func() int {
		t.Helper()
		idleDeliveries(t, api)
		at := api.Webhooks().Attempts()
		return at[len(at)-1].Status
	}
	wantEffects := func(n int) {
		t.Helper()
		waitFor(t, 30*time.Second, func() bool {
			b, _ := os.ReadFile(log)
			return strings.Count(string(b), "\n") >= n
		})
	}

	// A ping is verified with the secret create wrote and answered 200
	// {"status":"ignored"} (spec §6: not a batch event), recorded nowhere;
	// one attempt (MaxAttempts 1) that failed would have disabled the
	// webhook and failed the deliveries below.
	r = gemrecon(t, wh(api, "ping", id)...)
	wantCode(t, r, exitOK)
	if code := lastStatus(); code != http.StatusOK {
		t.Fatalf("serve answered the ping %d, want 200 ignored\n%s", code, stderr)
	}
	metricsText := func() string {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	m := metricsText()
	for _, want := range []string{
		`gemrecon_deliveries_total{outcome="ignored",source="webhook"} 1`,
		`gemrecon_webhook_ignored_total{type="webhook.ping"} 1`, // the emulator's ping (the real type is undocumented)
	} {
		if !strings.Contains(m, want) {
			t.Errorf("after the ping, /metrics lacks %q", want)
		}
	}
	if strings.Contains(m, `outcome="accepted"`) {
		t.Errorf("the ping was recorded as a completion")
	}
	// The README's "look for it in serve's log": at serve's default level.
	if line := grepLines(stderr.String(), "type=webhook.ping"); !strings.Contains(line, "level=INFO") {
		t.Errorf("serve's log at its default level does not show the ping: %q\n%s", line, stderr)
	}

	api.Add(geminifake.Batch{Name: "batches/e2e1", State: "SUCCEEDED"})
	if code := lastStatus(); code != http.StatusAccepted {
		t.Fatalf("serve answered a completion %d, want 202\n%s", code, stderr)
	}
	wantEffects(1)

	// A default rotation, serve not restarted: the old secret still signs.
	r = gemrecon(t, wh(api, "rotate", id, "--secret-file", secrets)...)
	wantCode(t, r, exitOK)
	api.Add(geminifake.Batch{Name: "batches/e2e2", State: "FAILED"})
	if code := lastStatus(); code != http.StatusAccepted {
		t.Fatalf("during the overlap an unrestarted serve answered %d, want 202\n%s", code, stderr)
	}
	wantEffects(2)

	// --now: serve holds only revoked secrets and rejects deliveries.
	r = gemrecon(t, wh(api, "rotate", id, "--now")...)
	wantCode(t, r, exitOK)
	api.Add(geminifake.Batch{Name: "batches/e2e3", State: "SUCCEEDED"})
	if code := lastStatus(); code != http.StatusUnauthorized {
		t.Fatalf("after rotate --now serve answered %d, want 401 until it has the new secret", code)
	}
	if lines := readLines(t, log); strings.Join(lines, ",") != "gemini:batches/e2e1,gemini:batches/e2e2" {
		t.Fatalf("effects ran for %q", lines)
	}
}

// A webhook the API disabled after failed deliveries shows its state in
// list, with what to do; enable brings it back (PATCH, update_mask state),
// and the next completion — a cancelled batch, which the default
// subscriptions include — is delivered.
func TestWebhooksEnableAfterFailedDeliveries(t *testing.T) {
	api := webhooksAPI(t)
	ws := api.Webhooks()
	noWait := func(context.Context, time.Duration) error { return nil }
	if err := ws.SetOptions(geminifake.WebhookOptions{MaxAttempts: 2, Sleep: noWait}); err != nil {
		t.Fatal(err)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/webhook"
	dead.Close() // connection refused from now on
	r := gemrecon(t, wh(api, "create", "--url", deadURL)...)
	wantCode(t, r, exitOK)
	id := match(t, idLine, r.stdout)
	api.Add(geminifake.Batch{Name: "batches/lost", State: "FAILED"})
	idleDeliveries(t, api)
	r = gemrecon(t, wh(api, "list")...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "disabled_due_to_failed_deliveries") || !strings.Contains(r.stderr, "gemrecon webhooks enable "+id) {
		t.Fatalf("list of a disabled webhook: %v", r)
	}

	rc := newHookReceiver(t)
	fixed := rc.srv.URL + "/webhook"
	if _, err := ws.Update(id, geminifake.WebhookUpdate{URI: &fixed}); err != nil {
		t.Fatal(err)
	}
	r = gemrecon(t, wh(api, "enable", id)...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "enabled webhook "+id) {
		t.Errorf("enable: %v", r)
	}
	if got, err := ws.Get(id); err != nil || got.State != geminifake.WebhookEnabled {
		t.Fatalf("after enable the API holds %+v, %v", got, err)
	}
	api.Add(geminifake.Batch{Name: "batches/stopped", State: "CANCELLED"})
	idleDeliveries(t, api)
	_, body := rc.last(t)
	var ev struct{ Type string }
	if err := json.Unmarshal(body, &ev); err != nil || ev.Type != "batch.cancelled" {
		t.Fatalf("delivered %s (%v), want batch.cancelled", body, err)
	}
	r = gemrecon(t, wh(api, "enable", "nope")...)
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, "404") {
		t.Errorf("enable of an unknown webhook: %v", r)
	}
}

// A panic in a webhooks command (the SDK's client on an answer it cannot
// map) is an error naming it, exit 1, never a crash.
func TestWebhooksPanicIsExit1(t *testing.T) {
	cmd := &cobra.Command{Use: "probe"}
	err := contained(func(*cobra.Command, []string) error { panic("interface conversion: string, not map") })(cmd, nil)
	if err == nil || !strings.Contains(err.Error(), "interface conversion") || exitCode(err) != exitFatal {
		t.Fatalf("err = %v, want exit %d naming the panic", err, exitFatal)
	}
}
