package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// serve --drain-timeout 0 does not wait for requests in flight: SIGTERM
// closes their connections at once (the sender gets no answer, so it
// retries), serve exits 0, and what the request recorded is durable. Here
// the request is a --sync one running its effect: before, 0 meant the 30 s
// default, and the request was answered 500 once the effect's --grace ran
// out.
func TestServeDrainTimeoutZeroClosesAtOnce(t *testing.T) {
	parallel(t)
	cmd, stderr, db, answered, pgid := serveSyncEffect(t, "cut", "--grace", "2s", "--drain-timeout", "0")

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var c int
	select {
	case c = <-answered:
	case <-time.After(30 * time.Second):
		t.Fatalf("the request in flight was neither answered nor cut 30s after SIGTERM\n%s", stderr)
	}
	if c != 0 {
		t.Errorf("the request in flight was answered %d, want its connection closed at SIGTERM\n%s", c, stderr)
	}
	if code := waitExit(t, cmd, 30*time.Second, stderr); code != exitOK {
		t.Errorf("serve --drain-timeout 0 exited %d after SIGTERM, want 0 (the cut was asked for)\n%s", code, stderr)
	}
	// serve still ended the effect and recorded it before exiting.
	waitFor(t, 5*time.Second, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) })
	e := storedEntry(t, db, "gemini:batches/cut")
	if e.State != sink.StatePending || !strings.Contains(e.LastError, "interrupted by shutdown") {
		t.Errorf("after SIGTERM the key is %s (last error %q), want pending, interrupted by shutdown\n%s", e.State, e.LastError, stderr)
	}
}

// serveStderr starts serve with args on a free port and the database db,
// waits until it answers /healthz, stops it with SIGTERM and returns its
// stderr (what it logged at start, and its shutdown).
func serveStderr(t *testing.T, db string, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := child(t, append([]string{"--db", db, "serve", "--confirm", "never", "--listen", addr, "--print"}, args...)...)
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 30*time.Second, stderr); code != exitOK {
		t.Errorf("serve %q exited %d after SIGTERM\n%s", args, code, stderr)
	}
	return stderr.String()
}

// --sync-wait without --sync does nothing; serve says so at start (a
// warning, not exit 2, as poll's --interval without --watch). Before, it
// was silently ignored.
func TestServeSyncWaitWithoutSyncWarns(t *testing.T) {
	parallel(t)
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	const warning = "--sync-wait has no effect without --sync"
	if out := serveStderr(t, db, "--insecure-no-verify", "--sync-wait", "3s"); !strings.Contains(out, `level=WARN msg="`+warning) {
		t.Errorf("serve --sync-wait without --sync: no warning\n%s", out)
	}
	for _, args := range [][]string{
		{"--insecure-no-verify", "--sync", "--sync-wait", "3s"},
		{"--insecure-no-verify"},
	} {
		if out := serveStderr(t, db, args...); strings.Contains(out, "sync-wait") {
			t.Errorf("serve %q warns about --sync-wait:\n%s", args, out)
		}
	}
}

// serve warns at start when its --secret-file is readable by group or
// others, as `webhooks rotate` does (same check, same words); a 0600 file
// gets no warning. Before, serve said nothing.
func TestServeWarnsOfALooseSecretFile(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	for _, tc := range []struct {
		mode os.FileMode
		warn bool
	}{{0o644, true}, {0o640, true}, {0o600, false}} {
		path := filepath.Join(dir, "whsec-"+strconv.FormatUint(uint64(tc.mode), 8))
		if err := os.WriteFile(path, []byte("# test\n"+replicaSecret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		out := serveStderr(t, db, "--secret-file", path)
		want := fmt.Sprintf(`level=WARN msg="--secret-file %s is readable by others (mode %04o); run: chmod 600 %s"`, path, tc.mode, path)
		if got := strings.Contains(out, want); got != tc.warn {
			t.Errorf("serve --secret-file of mode %04o: warned %v, want %v (%s)\n%s", tc.mode, got, tc.warn, want, out)
		}
		if !tc.warn && strings.Contains(out, "chmod") {
			t.Errorf("serve --secret-file of mode %04o warns:\n%s", tc.mode, out)
		}
		if strings.Contains(out, replicaSecret) {
			t.Errorf("serve logged the secret:\n%s", out)
		}
	}
}
