package main

import (
	"bytes"
	"context"
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
		if !strings.Contains(r.stderr, "listed=5 terminal=3 new=3 duplicates=0 effects ok=3 failed=0") {
			t.Errorf("summary line: %q", r.stderr)
		}
		lines := readLines(t, log)
		if len(lines) != 3 {
			t.Fatalf("effect ran %d times, want 3: %q", len(lines), lines)
		}
		// A second pass delivers nothing new and counts duplicates.
		r = gemrecon(t, pollArgs(db, api, "--exec", `echo "$GEMRECON_KEY" >> `+shellQuote(log))...)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stderr, "new=0 duplicates=3 effects ok=0") {
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
		if !strings.Contains(r.stderr, "failed=2") {
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
