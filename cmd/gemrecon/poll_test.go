package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

const testAPIKey = "test-key"

// fakeAPI starts the Gemini API stand-in with batches in the given states
// (ids b0, b1, …), created an hour ago.
func fakeAPI(t *testing.T, states ...string) *geminifake.Server {
	t.Helper()
	api := geminifake.New(geminifake.Options{APIKey: testAPIKey})
	if _, err := api.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	created := time.Now().Add(-time.Hour)
	for i, st := range states {
		b := geminifake.Batch{Name: geminifake.GeminiName("b" + itoa(i)), State: st, CreateTime: created}
		if st == "FAILED" {
			b.Error = &geminifake.Status{Code: 8, Message: "Enqueued token quota exceeded for this model."}
		}
		api.Add(b)
	}
	return api
}

func pollArgs(db string, api *geminifake.Server, extra ...string) []string {
	return append([]string{"--db", db, "poll", "--base-url", api.URL(), "--qps", "0", "--page-size", "2",
		"--retry-base", "1h"}, extra...)
}

// Spec §5 exit statuses, each from a real scenario (issue 4, test 10).
func TestPollExitCodes(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")

	t.Run("0: listed fully, every effect succeeded", func(t *testing.T) {
		api := fakeAPI(t, "SUCCEEDED", "RUNNING", "FAILED", "EXPIRED", "PENDING")
		db := filepath.Join(t.TempDir(), "s.db")
		log := filepath.Join(t.TempDir(), "effects.log")
		r := gemrecon(t, pollArgs(db, api, "--exec", `echo "$GEMRECON_KEY $GEMRECON_STATE" >> `+shellQuote(log))...)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stderr, "poll: listed=5 terminal=3 skipped_old=0 new=3 duplicates=0 invalid=0 effects_ok=3 effects_failed=0 fenced=0 api_requests=3 full_scan=true duration=") {
			t.Errorf("summary line: %q", r.stderr)
		}
		lines := readLines(t, log)
		if len(lines) != 3 {
			t.Fatalf("effect ran %d times, want 3: %q", len(lines), lines)
		}
		// A second pass delivers nothing new and counts duplicates.
		r = gemrecon(t, pollArgs(db, api, "--exec", `echo "$GEMRECON_KEY" >> `+shellQuote(log))...)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stderr, "new=0 duplicates=3 invalid=0 effects_ok=0") {
			t.Errorf("second pass summary: %q", r.stderr)
		}
		if n := len(readLines(t, log)); n != 3 {
			t.Fatalf("second pass ran effects again: %d lines", n)
		}
	})

	t.Run("1: credentials refused", func(t *testing.T) {
		api := fakeAPI(t, "SUCCEEDED")
		db := filepath.Join(t.TempDir(), "s.db")
		t.Setenv("GEMINI_API_KEY", "wrong-key")
		r := gemrecon(t, pollArgs(db, api)...)
		wantCode(t, r, exitFatal)
		if !strings.Contains(r.stderr, "GEMINI_API_KEY") {
			t.Errorf("auth failure should name GEMINI_API_KEY: %v", r)
		}
	})

	t.Run("1: no API key at all, and no database left behind", func(t *testing.T) {
		api := fakeAPI(t, "SUCCEEDED")
		db := filepath.Join(t.TempDir(), "s.db")
		t.Setenv("GEMINI_API_KEY", "")
		r := gemrecon(t, pollArgs(db, api)...)
		wantCode(t, r, exitFatal)
		if !strings.Contains(r.stderr, "GEMINI_API_KEY") {
			t.Errorf("a missing key should name GEMINI_API_KEY: %v", r)
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Errorf("poll without credentials created %s", db)
		}
	})

	t.Run("1: a repeated page token ends paging with an error", func(t *testing.T) {
		api := fakeAPI(t, "SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED", "SUCCEEDED")
		api.InjectFault(geminifake.Fault{}, geminifake.Fault{RepeatToken: true}, geminifake.Fault{RepeatToken: true})
		db := filepath.Join(t.TempDir(), "s.db")
		r := gemrecon(t, pollArgs(db, api)...)
		wantCode(t, r, exitFatal)
		if !strings.Contains(strings.ToLower(r.stderr), "page token") {
			t.Errorf("want an error about the repeated page token: %v", r)
		}
	})

	t.Run("4: an effect failed", func(t *testing.T) {
		api := fakeAPI(t, "SUCCEEDED", "SUCCEEDED")
		db := filepath.Join(t.TempDir(), "s.db")
		r := gemrecon(t, pollArgs(db, api, "--exec", "echo downstream unavailable >&2; exit 3")...)
		wantCode(t, r, exitNotDone)
		if !strings.Contains(r.stderr, "effects_failed=2") {
			t.Errorf("summary should count 2 failed effects: %q", r.stderr)
		}
		r = gemrecon(t, "--db", db, "status", "batches/b0")
		wantCode(t, r, exitNotDone)
		if !strings.Contains(r.stdout, "downstream unavailable") {
			t.Errorf("status should show the effect's stderr as last error: %v", r)
		}
	})
}

// A failed batch's event document carries the API's error message, which the
// SDK drops (issue 4, test 9), through the whole CLI path.
func TestPollEventDocumentKeepsFailedBatchError(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t, "FAILED")
	db := filepath.Join(t.TempDir(), "s.db")
	r := gemrecon(t, pollArgs(db, api)...) // default effect: NDJSON on stdout
	wantCode(t, r, exitOK)
	for _, want := range []string{`"key":"gemini:batches/b0"`, `"state":"FAILED"`, `"source":"poll"`, "Enqueued token quota exceeded"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("event document %q lacks %s", r.stdout, want)
		}
	}
}

// --watch stopped by SIGTERM mid-effect exits within the grace period and
// leaves no key claimed (issue 4, test 11).
func TestPollWatchSIGTERMLeavesNoClaim(t *testing.T) {
	api := fakeAPI(t, "SUCCEEDED")
	dir := t.TempDir()
	db := filepath.Join(dir, "s.db")
	started := filepath.Join(dir, "started")
	cmd := child(t, pollArgs(db, api, "--watch", "--interval", "1h", "--grace", "1s",
		"--exec", "touch "+shellQuote(started)+"; sleep 60")...)
	cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	waitFile(t, started, 30*time.Second)
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatalf("poll --watch did not exit 15s after SIGTERM (grace 1s)\n%s", stderr.String())
	}
	if took := time.Since(sent); took > 10*time.Second {
		t.Errorf("exit took %v after SIGTERM with --grace 1s", took)
	}
	r := gemrecon(t, "--db", db, "list", "--state", "claimed")
	wantCode(t, r, exitOK)
	if strings.Contains(r.stdout, "gemini:") {
		t.Fatalf("a key is left claimed after SIGTERM:\n%s\nchild stderr:\n%s", r.stdout, stderr.String())
	}
	r = gemrecon(t, "--db", db, "status", "batches/b0")
	wantCode(t, r, exitNotDone) // pending again: the interrupted attempt is retried later
}

func waitFile(t *testing.T, path string, max time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), max)
	defer cancel()
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not appear within %v", path, max)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// Issue 12, item 1, as the user ran it: 30 batches finished 100 h ago and
// 12 finished 2 h ago, --page-size 5, an API listing oldest first. It was
// one request, new=0, exit 0: all 12 lost. Now every page is read.
func TestPollOldestFirstFindsEveryCompletion(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	api := geminifake.New(geminifake.Options{APIKey: testAPIKey, Order: geminifake.OrderOldestFirst})
	if _, err := api.Start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { api.Close() })
	now := time.Now()
	for i := range 30 {
		at := now.Add(-100 * time.Hour).Add(time.Duration(i) * time.Minute)
		api.Add(geminifake.Batch{Name: geminifake.GeminiName("old" + itoa(i)), State: "SUCCEEDED", CreateTime: at, EndTime: at.Add(time.Hour)})
	}
	for i := range 12 {
		at := now.Add(-3 * time.Hour).Add(time.Duration(i) * time.Minute)
		api.Add(geminifake.Batch{Name: geminifake.GeminiName("new" + itoa(i)), State: "SUCCEEDED", CreateTime: at, EndTime: now.Add(-2 * time.Hour)})
	}
	db := filepath.Join(t.TempDir(), "s.db")
	r := gemrecon(t, pollArgs(db, api, "--page-size", "5")...)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stderr, "listed=42 terminal=42 skipped_old=30 new=12 duplicates=0 invalid=0 effects_ok=12 effects_failed=0 fenced=0 api_requests=9 full_scan=true") {
		t.Errorf("summary: %s", r.stderr)
	}
	if n := strings.Count(r.stdout, `"source":"poll"`); n != 12 {
		t.Errorf("%d effects ran, want 12:\n%s", n, r.stdout)
	}
}

// --log-format json: the summary is one JSON object with the text line's
// field names (spec §5.4).
func TestPollSummaryJSON(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t, "SUCCEEDED", "RUNNING")
	db := filepath.Join(t.TempDir(), "s.db")
	r := gemrecon(t, append([]string{"--log-format", "json"}, pollArgs(db, api)...)...)
	wantCode(t, r, exitOK)
	var found int
	for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("stderr line is not JSON: %q", line)
		}
		if _, ok := m["listed"]; !ok {
			continue
		}
		found++
		want := []string{"listed", "terminal", "skipped_old", "new", "duplicates", "invalid", "effects_ok",
			"effects_failed", "fenced", "api_requests", "full_scan", "duration"}
		if len(m) != len(want) {
			t.Errorf("summary has %d fields, want %d: %s", len(m), len(want), line)
		}
		for _, k := range want {
			if _, ok := m[k]; !ok {
				t.Errorf("summary lacks %q: %s", k, line)
			}
		}
		if m["listed"] != 2.0 || m["new"] != 1.0 || m["full_scan"] != true {
			t.Errorf("summary values: %s", line)
		}
	}
	if found != 1 {
		t.Errorf("%d summary objects on stderr, want 1:\n%s", found, r.stderr)
	}
}

// --full-scan-every must be shorter than --lookback − 48h (spec §5.2):
// otherwise exit 2, before any database is made.
func TestPollFullScanEveryValidation(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t, "SUCCEEDED")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--full-scan-every", "24h"}, exitUsage, "must be shorter than --lookback − 48h (24h0m0s)"},
		{[]string{"--lookback", "100h", "--full-scan-every", "60h"}, exitUsage, "shorter than --lookback − 48h (52h0m0s)"},
		{[]string{"--lookback", "24h"}, exitUsage, "not longer than the 48h0m0s"},
		{[]string{"--full-scan-every", "-1h"}, exitUsage, "negative"},
		{[]string{"--lookback", "0", "--full-scan-every", "1000h"}, exitOK, ""},
		{[]string{"--lookback", "100h", "--full-scan-every", "51h"}, exitOK, ""},
		{[]string{"--full-scan-every", "0"}, exitOK, ""},
	} {
		db := filepath.Join(t.TempDir(), "s.db")
		r := gemrecon(t, pollArgs(db, api, tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q: %s", tc.args, r.code, tc.code, tc.want, r.stderr)
		}
		if _, err := os.Stat(db); tc.code == exitUsage && !os.IsNotExist(err) {
			t.Errorf("%v: a usage error left a database behind", tc.args)
		}
	}
	// serve validates them too when it polls.
	r := gemrecon(t, "--db", filepath.Join(t.TempDir(), "s.db"), "serve", "--insecure-no-verify", "--poll-every", "1m", "--full-scan-every", "30h")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--full-scan-every") {
		t.Errorf("serve --full-scan-every 30h: %v", r)
	}
}
