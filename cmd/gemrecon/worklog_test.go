package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
)

// The work shows as it happens (issue 24 item 5): at the default level a
// real serve logs one line per new key (key, source) and one per effect
// outcome (key, token, ok or failed with the reason, duration); a
// redelivery of a known key adds no line at that level.
func TestServeLogsEachNewKeyAndOutcome(t *testing.T) {
	db := newDB(t)
	addr := freeAddr(t)
	cmd := child(t, "--db", db, "serve", "--listen", addr, "--confirm", "never", "--retry-base", "1h",
		"--exec", `case "$GEMRECON_KEY" in *bad*) echo "no room on the shelf" >&2; exit 3;; esac`)
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+unusableSecret)
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")
	url := "http://" + addr + "/webhook"
	for _, id := range []string{"good", "bad", "good"} {
		if code, body := deliverOnce(t, url, id); code != 202 {
			t.Fatalf("delivery of %s = %d %s", id, code, body)
		}
	}
	lines := func(pattern string) []string {
		return regexp.MustCompile(`(?m)^.*`+pattern+`.*$`).FindAllString(stderr.String(), -1)
	}
	waitFor(t, 30*time.Second, func() bool {
		return len(lines(`msg="dispatch: effect ok" key=gemini:batches/good`)) > 0 &&
			len(lines(`msg="dispatch: effect failed; retry scheduled" key=gemini:batches/bad`)) > 0
	})
	for _, want := range []struct {
		pattern string
		n       int
	}{
		{`level=INFO msg="new key" key=gemini:batches/good source=webhook$`, 1},
		{`level=INFO msg="new key" key=gemini:batches/bad source=webhook$`, 1},
		{`level=INFO msg="dispatch: effect ok" key=gemini:batches/good token=1 attempt=1 duration=[0-9.]+[mµn]?s$`, 1},
		{`level=WARN msg="dispatch: effect failed; retry scheduled" key=gemini:batches/bad token=1 attempt=1 err=".*no room on the shelf.*" duration=[0-9.]+[mµn]?s`, 1},
		{`known key`, 0}, // the redelivery: at debug only
	} {
		if got := lines(want.pattern); len(got) != want.n {
			t.Errorf("%d lines match %s, want %d:\n%s", len(got), want.pattern, want.n, stderr)
		}
	}

	// A delivery refused for its signature is a WARN line that says where
	// the secrets came from (never them), how far webhook-timestamp is from
	// now, and what to check; at most one per 10 s (webhook's
	// TestSignatureRefusalsWarnOncePer10s counts them).
	const otherSecret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	body := `{"type":"batch.succeeded","version":"v1","data":{"id":"forged"}}`
	h, err := testkit.SignWebhook(otherSecret, "msg-forged", time.Now().Add(-2*time.Minute), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := postJSON(t, url, body, h); code != 401 {
		t.Fatalf("a delivery signed with another secret = %d %s", code, resp)
	}
	waitFor(t, 10*time.Second, func() bool { return len(lines(`level=WARN msg="webhook: deliveries refused`)) > 0 })
	warn := lines(`level=WARN msg="webhook: deliveries refused`)[0]
	for _, want := range []string{"refused=1 ", `secrets="1 from GEMRECON_WEBHOOK_SECRET"`, "timestamp_age=2m", `check="that the webhook's signing secret`} {
		if !strings.Contains(warn, want) {
			t.Errorf("the refusal's WARN line lacks %s:\n%s", want, warn)
		}
	}
	if strings.Contains(stderr.String(), strings.TrimPrefix(unusableSecret, "whsec_")) || strings.Contains(stderr.String(), strings.TrimPrefix(otherSecret, "whsec_")) {
		t.Errorf("the log holds a secret:\n%s", stderr)
	}
}

// poll logs the same lines, a known key at debug only, and --log-level warn
// silences them (the summary line stays).
func TestPollLogsEachNewKeyAndOutcome(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t, "SUCCEEDED", "RUNNING")
	db := newDB(t)
	r := gemrecon(t, pollArgs(db, api, "--exec", "true")...)
	wantCode(t, r, exitOK)
	for _, want := range []string{`msg="new key" key=gemini:batches/b0 source=poll`, `msg="dispatch: effect ok" key=gemini:batches/b0 token=1`} {
		if strings.Count(r.stderr, want) != 1 {
			t.Errorf("stderr should hold %s once:\n%s", want, r.stderr)
		}
	}
	r = gemrecon(t, pollArgs(db, api, "--exec", "true")...) // b0 again: a duplicate
	wantCode(t, r, exitOK)
	if strings.Contains(r.stderr, "new key") || !strings.Contains(r.stderr, "duplicates=1") {
		t.Errorf("a known key logs nothing at the default level, and counts in the summary:\n%s", r.stderr)
	}
	api.Add(geminifake.Batch{Name: geminifake.GeminiName("b9"), State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Minute)})
	r = gemrecon(t, append([]string{"--log-level", "warn"}, pollArgs(db, api, "--exec", "true")...)...)
	wantCode(t, r, exitOK)
	if strings.Contains(r.stderr, "new key") || strings.Contains(r.stderr, "effect ok") || !strings.Contains(r.stderr, "new=1") {
		t.Errorf("--log-level warn should leave only the summary line:\n%s", r.stderr)
	}
}
