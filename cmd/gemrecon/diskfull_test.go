//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// setChildFileSizeLimit sets the soft file-size limit (RLIMIT_FSIZE) of the
// process pid, a child of this user's: what `prlimit --pid PID --fsize`
// does. limit may go up to the child's hard limit, which it keeps.
func setChildFileSizeLimit(t *testing.T, pid int, limit uint64) {
	t.Helper()
	var old syscall.Rlimit
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_FSIZE, 0, uintptr(unsafe.Pointer(&old)), 0, 0); e != 0 {
		t.Fatalf("prlimit(%d) read: %v", pid, e)
	}
	rl := syscall.Rlimit{Cur: min(limit, old.Max), Max: old.Max}
	if _, _, e := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_FSIZE, uintptr(unsafe.Pointer(&rl)), 0, 0, 0); e != 0 {
		t.Fatalf("prlimit(%d) set: %v", pid, e)
	}
}

// fileSize is the size of path, 0 when it does not exist.
func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestServeDiskFull: `serve` records webhooks until its database cannot
// grow (here a file-size limit, RLIMIT_FSIZE, a little above the files'
// sizes: what a full disk does to SQLite's writes, without needing a small
// file system). From then on webhooks are answered 503 with Retry-After,
// saying why and naming the database, and the log says the same; the
// process keeps running, and once there is room again (the limit raised from
// outside, as freeing space would) it records and answers 202 again, without
// a restart. Every key answered 202, before the limit and after, is in the
// database afterwards.
func TestServeDiskFull(t *testing.T) {
	parallel(t)
	db := newDB(t)
	addr := freeAddr(t)
	base := "http://" + addr
	// Room for a few dozen records in the WAL, which SQLite appends to
	// (the database file itself grows only at a checkpoint).
	limit := max(fileSize(t, db), fileSize(t, db+"-wal")) + 96<<10
	cmd := testkit.Command("gemrecon-fsize-limited", strconv.FormatInt(limit, 10), "--db", db, "serve", "--listen", addr, "--print")
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+unusableSecret)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitHealthy(t, base+"/readyz", &stderr)

	deliver := func(id string) (int, http.Header, string) {
		t.Helper()
		body := fmt.Sprintf(`{"type":"batch.succeeded","version":"v1","data":{"id":%q}}`, id)
		h, err := testkit.SignWebhook(unusableSecret, "msg-"+id, time.Now(), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		code, rh, b := testkit.Call(t, http.MethodPost, base+"/webhook", body, h)
		return code, rh, string(b)
	}

	var acked, refused []string
	for i := 0; len(refused) < 3; i++ {
		if i == 2000 {
			t.Fatalf("2000 webhooks recorded under a file-size limit of %d bytes; the database should have hit it\n%s", limit, &stderr)
		}
		id := fmt.Sprintf("full-%04d", i)
		code, rh, body := deliver(id)
		switch {
		case code == http.StatusAccepted:
			// Also after a 503: a smaller commit may still fit where a
			// failed one was cut off (so does a disk that another
			// process frees a little of).
			acked = append(acked, id)
		case code == http.StatusServiceUnavailable:
			if rh.Get("Retry-After") == "" {
				t.Errorf("the 503 for %s has no Retry-After", id)
			}
			if !strings.Contains(body, "no room to grow the database") || !strings.Contains(body, db+"-wal") ||
				!strings.Contains(body, "file-size limit") || !strings.Contains(body, "then try again") {
				t.Errorf("the 503 for %s does not say why (no room, which file, the limit, what to do):\n%s", id, body)
			}
			refused = append(refused, id)
		default:
			t.Fatalf("webhook %s answered %d after %d acknowledged and %d refused, want 202 or (no room) 503: %s\n%s",
				id, code, len(acked), len(refused), body, &stderr)
		}
	}
	if len(acked) < 2 {
		t.Fatalf("only %d webhooks were acknowledged before the limit; the test wants some\n%s", len(acked), &stderr)
	}
	// The child logs before it answers, but its stderr reaches the buffer
	// through a pipe, a little later.
	logged := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if logged = grepLines(stderr.String(), "answering 503"); strings.Count(logged, "no room to grow the database") >= len(refused) {
			break
		}
	}
	if n := strings.Count(logged, "no room to grow the database"); n < len(refused) || strings.Count(logged, db) < len(refused) {
		t.Errorf("the log should say, for each 503, that the database %s has no room to grow; it says:\n%s", db, logged)
	}
	if strings.Contains(stderr.String(), "THE DATABASE IS UNUSABLE") {
		t.Errorf("a full disk marked the sink unusable; it should recover once there is room:\n%s", &stderr)
	}

	// Room again: the refused webhooks, sent again as their senders do,
	// and a new one are recorded by the same process.
	setChildFileSizeLimit(t, cmd.Process.Pid, ^uint64(0))
	for _, id := range append(refused, "after-room") {
		if code, _, body := deliver(id); code != http.StatusAccepted {
			t.Fatalf("webhook %s after the limit was raised answered %d, want 202: %s\n%s", id, code, body, &stderr)
		}
		acked = append(acked, id)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 30*time.Second, &stderr); code != exitOK {
		t.Fatalf("serve exited %d after SIGTERM, want 0: the sink recovered\n%s", code, &stderr)
	}

	for _, id := range acked {
		// storedEntry fails the test when the key is not there.
		if e := storedEntry(t, db, "gemini:batches/"+id); e.State != sink.StatePending && e.State != sink.StateDone {
			t.Errorf("acknowledged key %s is %s, want pending or done", id, e.State)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(db), "sink.db-journal")); err == nil {
		t.Errorf("a rollback journal was left next to the WAL database")
	}
}

// TestDrainDiskFullBeforeDone: the effect ran, and then the database cannot
// grow (the file-size limit lowered to its files' sizes while the effect
// runs), so its done cannot be written. drain tries again while the lease
// lasts, then ends with exit 1 and a last line that names the cause and the
// database. The key is not done without the write: it stays claimed, and
// once its lease has passed, the next drain (with room) runs the effect
// again and records it done — the honest consequence, which the README's
// troubleshooting section states.
func TestDrainDiskFullBeforeDone(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	started, proceed, runs := filepath.Join(dir, "started"), filepath.Join(dir, "go"), filepath.Join(dir, "runs")
	const key = "gemini:batches/fullbeforedone"
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, err := s.Record(context.Background(), sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"name":"batches/fullbeforedone"}`)}); err != nil {
			t.Fatal(err)
		}
	})
	// The effect counts its runs, says it started and waits for the test.
	effect := "echo run >> " + shellQuote(runs) + " && touch " + shellQuote(started) +
		" && i=0; while [ ! -e " + shellQuote(proceed) + " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"
	drain := func(name string, args ...string) *exec.Cmd {
		return testkit.Command(name, append(args, "--db", db, "drain", "--concurrency", "1", "--confirm", "never",
			"--lease", "6s", "--effect-timeout", "5s", "--exec", effect)...)
	}

	cmd := drain("gemrecon-fsize-limited", strconv.Itoa(1<<30))
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFile(t, started, 30*time.Second)
	// The claim's commit is the WAL's last frame: SQLite appends the next.
	setChildFileSizeLimit(t, cmd.Process.Pid, uint64(fileSize(t, db+"-wal")))
	if err := os.WriteFile(proceed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 60*time.Second, &stderr); code != exitFatal {
		t.Fatalf("drain whose done could not be written exited %d, want 1\n%s", code, &stderr)
	}
	last := lastLine(stderr.String())
	if !strings.Contains(last, "no room to grow the database") || !strings.Contains(last, db+"-wal") || !strings.Contains(last, "file-size limit") {
		t.Errorf("drain's last line should name the cause and the database %s:\n%s", db, last)
	}
	e := storedEntry(t, db, key)
	if e.State != sink.StateClaimed {
		t.Fatalf("after the done could not be written the key is %s, want claimed (never done without the write)\n%s", e.State, &stderr)
	}

	// Room again. Once the lease has passed, the next drain runs the
	// effect a second time and records it done.
	if d := time.Until(e.LeaseUntil); d > 0 {
		time.Sleep(d + 100*time.Millisecond)
	}
	os.Remove(started)
	next := drain("gemrecon")
	var nextErr testkit.Buffer
	next.Stderr = &nextErr
	if err := next.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Process.Kill() })
	if code := waitExit(t, next, 60*time.Second, &nextErr); code != exitOK {
		t.Fatalf("the next drain exited %d, want 0\n%s", code, &nextErr)
	}
	if e := storedEntry(t, db, key); e.State != sink.StateDone {
		t.Errorf("after the next drain the key is %s, want done", e.State)
	}
	b, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "run"); n != 2 {
		t.Errorf("the effect ran %d times, want 2 (once before the disk was full, once again after its lease)", n)
	}
}

// TestPollDiskFullRecording: poll lists more completions than the database
// has room for (a file-size limit a little above its files' sizes). The
// pass ends with exit 1 and a last line that names the cause and the
// database; every completion it recorded is in the database, and the next
// poll, with room, records the rest and runs every effect once.
func TestPollDiskFullRecording(t *testing.T) {
	parallel(t)
	states := make([]string, 60)
	for i := range states {
		states[i] = "SUCCEEDED"
	}
	api := fakeAPI(t, states...)
	db := newDB(t)
	out := filepath.Join(t.TempDir(), "effects")
	args := pollArgs(db, api, "--exec", "echo $GEMRECON_KEY >> "+shellQuote(out))
	// The shared-memory file SQLite creates at open is 32 KiB; the WAL
	// may grow to about as much.
	limit := max(fileSize(t, db), 32<<10) + 8<<10
	cmd := testkit.Command("gemrecon-fsize-limited", append([]string{strconv.FormatInt(limit, 10)}, args...)...)
	cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if code := waitExit(t, cmd, 60*time.Second, &stderr); code != exitFatal {
		t.Fatalf("poll with no room for its records exited %d, want 1\n%s", code, &stderr)
	}
	last := lastLine(stderr.String())
	if !strings.Contains(last, "no room to grow the database") || !strings.Contains(last, db) {
		t.Errorf("poll's last line should name the cause and the database %s:\n%s", db, last)
	}

	cmd = testkit.Command("gemrecon", args...)
	cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
	stderr.Reset()
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 60*time.Second, &stderr); code != exitOK {
		t.Fatalf("the next poll exited %d, want 0\n%s", code, &stderr)
	}
	seen := map[string]int{}
	for _, l := range readLines(t, out) {
		seen[l]++
	}
	for i := range states {
		k := "gemini:batches/b" + itoa(i)
		if e := storedEntry(t, db, k); e.State != sink.StateDone || seen[k] != 1 {
			t.Errorf("%s is %s after its effect ran %d times, want done after one run", k, e.State, seen[k])
		}
	}
}
