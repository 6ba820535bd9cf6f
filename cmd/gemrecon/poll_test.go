package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
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

// --watch stopped by SIGTERM mid-effect exits within the grace period and
// leaves no key claimed (issue 4, test 11).
func TestPollWatchSIGTERMLeavesNoClaim(t *testing.T) {
	parallel(t)
	api := fakeAPI(t, "SUCCEEDED")
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	started := filepath.Join(dir, "started")
	cmd := child(t, pollArgs(db, api, "--watch", "--interval", "1h", "--grace", "1s",
		"--exec", "touch "+shellQuote(started)+"; sleep 60")...)
	cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
	var stderr testkit.Buffer
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
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	r := gemrecon(t, pollArgs(db, api, "--page-size", "5", "--print")...)
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
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	r := gemrecon(t, append([]string{"--log-format", "json"}, pollArgs(db, api, "--print")...)...)
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
