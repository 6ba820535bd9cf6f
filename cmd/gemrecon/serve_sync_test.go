package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestServeSyncSIGTERMLeavesNoClaim: SIGTERM while a `serve --sync`
// request runs its effect. The effect gets --grace, as the background
// workers' effects do; then its process group is killed, the attempt is
// recorded as a retryable failure, the request is answered and serve exits —
// within --drain-timeout, cleanly. Before, the request's effect was out of
// the shutdown's reach: serve waited --drain-timeout, closed the connection,
// exited 1 and left the key claimed for a whole --lease with the effect
// still running on its own; after the lease the takeover ran it again.
func TestServeSyncSIGTERMLeavesNoClaim(t *testing.T) {
	parallel(t)
	cmd, stderr, db, answered, pgid := serveSyncEffect(t, "slow", "--grace", "1s", "--drain-timeout", "8s")

	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := waitExit(t, cmd, 30*time.Second, stderr)
	if took := time.Since(sent); took > 6*time.Second {
		t.Errorf("serve took %v to stop after SIGTERM with --grace 1s", took)
	}
	if code != exitOK {
		t.Errorf("serve exited %d after SIGTERM, want 0 (the request finished within --drain-timeout)\n%s", code, stderr)
	}
	if c := <-answered; c != http.StatusInternalServerError {
		t.Errorf("the interrupted --sync request was answered %d, want 500 (the sender retries)", c)
	}
	// The effect's process group is gone (a grandchild, sleep, included).
	waitFor(t, 5*time.Second, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) })

	e := storedEntry(t, db, "gemini:batches/slow")
	if e.State != sink.StatePending || !strings.Contains(e.LastError, "interrupted by shutdown") {
		t.Errorf("after SIGTERM the key is %s (last error %q), want pending, interrupted by shutdown\n%s", e.State, e.LastError, stderr)
	}
}

// serveSyncEffect starts `serve --sync` with serveArgs, sends it a webhook
// for batches/id whose effect writes its process group id and sleeps, and
// returns once that effect runs: serve, its stderr, its database, the
// channel the request's status arrives on (0: no answer, the connection was
// cut) and the effect's process group, killed when the test ends (the
// command leads its own group; whatever the test leaves of it must not
// outlive the test).
func serveSyncEffect(t *testing.T, id string, serveArgs ...string) (*exec.Cmd, *testkit.Buffer, string, <-chan int, int) {
	t.Helper()
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	pidFile := filepath.Join(dir, "effect.pid")
	addr := freeAddr(t)
	args := append([]string{"--db", db, "serve", "--insecure-no-verify", "--confirm", "never", "--listen", addr, "--sync"}, serveArgs...)
	cmd := child(t, append(args,
		"--exec", "echo $$ > "+shellQuote(pidFile)+".tmp && mv "+shellQuote(pidFile)+".tmp "+shellQuote(pidFile)+"; sleep 60")...)
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")

	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post("http://"+addr+"/webhook", "application/json",
			strings.NewReader(`{"type":"batch.succeeded","data":{"id":"`+id+`"}}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	pgid := effectGroup(t, pidFile)
	return cmd, stderr, db, answered, pgid
}

// storedEntry reads key from the SQLite database db, read-only.
func storedEntry(t *testing.T, db, key string) sink.Entry {
	t.Helper()
	s, err := sqlite.Open(context.Background(), db, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// effectGroup waits for an --exec effect to write its pid ($$, the leader
// of its process group) into pidFile, and returns it; the group is killed
// at cleanup, whatever the test left running.
func effectGroup(t *testing.T, pidFile string) int {
	t.Helper()
	waitFile(t, pidFile, 30*time.Second)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	return pgid
}
