package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/fakejwks"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// serve --dynamic needs confirmation (spec §6): exit 2 with --confirm
// never or without API credentials (--jwks-url implies --dynamic, the
// environment variable does not), and the flags that make no sense
// together are exit 2 — all before a database is created.
func TestServeDynamicFlags(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "whsec")
	if err := os.WriteFile(secrets, []byte(unusableSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "s.db")
	t.Setenv("GEMRECON_WEBHOOK_SECRET", "")
	t.Setenv("GOOGLE_API_KEY", "")
	t.Setenv("GEMRECON_JWKS_URL", "")
	serve := func(env map[string]string, args ...string) result {
		t.Helper()
		for k, v := range env {
			t.Setenv(k, v)
		}
		return gemrecon(t, append([]string{"--db", db, "serve", "--listen", "127.0.0.1:0", "--print"}, args...)...)
	}
	withKey := map[string]string{"GEMINI_API_KEY": testAPIKey}
	noKey := map[string]string{"GEMINI_API_KEY": ""}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"--confirm never", withKey, []string{"--dynamic", "--confirm", "never"}, "--confirm never"},
		{"no credentials", noKey, []string{"--dynamic", "--secret-file", secrets}, "needs API credentials"},
		{"--jwks-url implies --dynamic", noKey, []string{"--jwks-url", "http://127.0.0.1:1/jwks.json"}, "--dynamic needs API credentials"},
		{"--jwt-audience without --dynamic", withKey, []string{"--secret-file", secrets, "--jwt-audience", "me"}, "add --dynamic"},
		{"--insecure-no-verify with --dynamic", withKey, []string{"--dynamic", "--insecure-no-verify"}, "one or the other"},
		{"--backend vertex", withKey, []string{"--dynamic", "--backend", "vertex", "--project", "p", "--location", "l"}, "does not go with --backend vertex"},
		{"a bad --jwks-url", withKey, []string{"--jwks-url", "ftp://example.com/jwks"}, "not an absolute http or https URL"},
		{"no verifier, GEMRECON_JWKS_URL set", map[string]string{"GEMINI_API_KEY": testAPIKey, "GEMRECON_JWKS_URL": "http://127.0.0.1:1/jwks.json"},
			nil, "GEMRECON_JWKS_URL only sets the key set's address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := serve(tc.env, tc.args...)
			wantCode(t, r, exitUsage)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, r.stderr)
			}
			if _, err := os.Stat(db); !os.IsNotExist(err) {
				t.Errorf("a refused serve created the database (%v)", err)
			}
		})
	}
}

// dynDeliver POSTs body with the given webhook-signature (and webhook-id
// and -timestamp) and returns the status and response body.
func dynDeliver(t *testing.T, url, id string, at time.Time, sig string, body []byte) (int, string) {
	t.Helper()
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	h.Set("webhook-signature", sig)
	return postJSON(t, url, string(body), h)
}

// keyStatus is `status --json KEY` on db.
func keyStatus(t *testing.T, db, key string) (sink.Entry, int) {
	t.Helper()
	r := gemrecon(t, "--db", db, "status", "--json", key)
	var e sink.Entry
	if r.code != exitUnknownKey {
		if err := json.Unmarshal([]byte(r.stdout), &e); err != nil {
			t.Fatalf("status --json %s: %v\n%s", key, err, r)
		}
	}
	return e, r.code
}

// A real serve --dynamic (with an HMAC secret too) against the stand-in
// and a key set served over HTTP: a v1a delivery and a JWT delivery of
// this project's batches are confirmed with Batches.Get and run once each
// with the API's operation; a validly signed replay of another project's
// batch (the stand-in answers 404) ends dead as "unknown to the API" and
// never runs; a static delivery still runs; the start line names the
// verifiers.
func TestServeDynamicConfirmsAndRefusesForeignBatches(t *testing.T) {
	api := fakeAPI(t)
	created := time.Now().Add(-time.Hour)
	for _, id := range []string{"ours-v1a", "ours-jwt", "ours-static"} {
		api.Add(geminifake.Batch{Name: geminifake.GeminiName(id), State: "SUCCEEDED", CreateTime: created, RequestCount: 3})
	}
	keys, err := fakejwks.New(fakejwks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	jwks := httptest.NewServer(keys)
	t.Cleanup(jwks.Close)

	dir := t.TempDir()
	db, log := initDB(t, filepath.Join(dir, "s.db")), filepath.Join(dir, "effects.log")
	addr := freeAddr(t)
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	cmd := child(t, "--db", db, "serve", "--listen", addr, "--dynamic", "--jwks-url", jwks.URL, "--base-url", api.URL(),
		"--exec", `echo "$GEMRECON_KEY confirmed=$GEMRECON_CONFIRMED $GEMRECON_BATCH_STATE" >> `+shellQuote(log))
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+unusableSecret)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := "http://" + addr + "/webhook"
	waitHealthy(t, "http://"+addr+"/healthz", &stderr)
	if line := grepLines(stderr.String(), "serving webhooks"); !strings.Contains(line, "HMAC v1 (1 secret(s)) + dynamic v1a and RS256 JWT (keys from "+jwks.URL) {
		t.Errorf("the start line should name both verifiers: %q", line)
	}

	ev := func(id string) []byte {
		return []byte(`{"type":"batch.succeeded","version":"v1","data":{"id":"` + id + `"}}`)
	}
	now := time.Now()
	for _, d := range []struct {
		id, sig string
	}{
		{"ours-v1a", keys.SignV1a("msg_ours-v1a", now, ev("ours-v1a"))},
		{"ours-jwt", keys.SignJWT("", now, nil)},
		// Signed by Google (the same keys), for a batch of someone else's
		// project: this API key's Batches.Get answers 404.
		{"theirs", keys.Sign("msg_theirs", now, ev("theirs"))},
	} {
		if code, body := dynDeliver(t, url, "msg_"+d.id, now, d.sig, ev(d.id)); code != http.StatusAccepted {
			t.Fatalf("delivery of %s = %d %s, want 202\n%s", d.id, code, body, &stderr)
		}
	}
	if code, body := deliverOnce(t, url, "ours-static"); code != http.StatusAccepted {
		t.Fatalf("static delivery = %d %s, want 202", code, body)
	}

	waitFor(t, 30*time.Second, func() bool {
		e, _ := keyStatus(t, db, "batches/theirs")
		return e.State == sink.StateDead && len(readLinesIfAny(log)) >= 3
	})
	e, code := keyStatus(t, db, "batches/theirs")
	if code != exitDead || e.DeadReason != sink.DeadUnknownToAPI || e.Confirmed {
		t.Errorf("the foreign batch: exit %d, %+v; want dead, reason %s", code, e, sink.DeadUnknownToAPI)
	}
	for _, id := range []string{"ours-v1a", "ours-jwt"} {
		if e, code := keyStatus(t, db, "batches/"+id); code != exitOK || !e.Confirmed || e.NeedsConfirm {
			t.Errorf("%s: exit %d, %+v; want done and confirmed", id, code, e)
		}
	}
	want := []string{
		"gemini:batches/ours-jwt confirmed=true SUCCEEDED",
		"gemini:batches/ours-static confirmed=true SUCCEEDED",
		"gemini:batches/ours-v1a confirmed=true SUCCEEDED",
	}
	got := readLines(t, log)
	slices.Sort(got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("effects ran:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := keys.Fetches(); n != 1 {
		t.Errorf("the key set was fetched %d times, want once", n)
	}
}

// readLinesIfAny is readLines for a file that may not exist yet.
func readLinesIfAny(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
