package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestFencedOutcomeExits4 (issue 12 item 12): an attempt whose key was
// taken over while its effect ran has its outcome fenced: the effect may
// have run twice. drain and poll say so and exit 4, not 0.
func TestFencedOutcomeExits4(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		db, key := fencedDB(t)
		r := runTakenOver(t, db, key, "--db", db, "drain")
		wantCode(t, r, exitNotDone)
		if !strings.Contains(r.stderr, "fenced=1") || !strings.Contains(r.stderr, "may have run twice") {
			t.Errorf("drain's summary does not say that an outcome was fenced:\n%s", r.stderr)
		}
	})
	t.Run("drain --log-format json", func(t *testing.T) {
		db, key := fencedDB(t)
		r := runTakenOver(t, db, key, "--log-format", "json", "--db", db, "drain")
		wantCode(t, r, exitNotDone)
		var summaries, warnings int
		for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("stderr line is not JSON: %q\n%s", line, r.stderr)
			}
			if m["claimed"] == 1.0 && m["fenced"] == 1.0 {
				summaries++
			}
			if m["level"] == "WARN" && m["fenced"] == 1.0 && strings.Contains(fmt.Sprint(m["msg"]), "may have run twice") {
				warnings++
			}
		}
		if summaries != 1 || warnings != 1 {
			t.Errorf("want one summary object with fenced 1 and one warning record saying an effect may have run twice; got %d and %d:\n%s", summaries, warnings, r.stderr)
		}
	})
	t.Run("poll", func(t *testing.T) {
		t.Setenv("GEMINI_API_KEY", testAPIKey)
		t.Setenv("GOOGLE_API_KEY", "")
		api := fakeAPI(t, "SUCCEEDED")
		db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
		r := runTakenOver(t, db, "gemini:"+geminifake.GeminiName("b0"), pollArgs(db, api)...)
		wantCode(t, r, exitNotDone)
	})
}

// Under --log-format json every line on stderr is one JSON object, an
// --exec command's own output included: each of its lines comes as an
// "effect output" record with the key and the stream. In text format the
// lines come as they are.
func TestExecOutputUnderJSONLogs(t *testing.T) {
	parallel(t)
	effect := `echo "out line"; printf 'err ' >&2; sleep 0.05; echo 'line {not json' >&2`
	t.Run("json", func(t *testing.T) {
		db, key := fencedDB(t)
		r := gemrecon(t, "--log-format", "json", "--db", db, "drain", "--exec", effect)
		wantCode(t, r, 0)
		got := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("stderr line is not JSON: %q\n%s", line, r.stderr)
			}
			if m["msg"] == "effect output" {
				if m["key"] != key {
					t.Errorf("effect output record %v: key %v, want %s", m, m["key"], key)
				}
				got[fmt.Sprint(m["stream"])] += fmt.Sprint(m["line"]) + "|"
			}
		}
		if got["stdout"] != "out line|" || got["stderr"] != "err line {not json|" {
			t.Errorf("effect output records: %q, want stdout %q and stderr %q\n%s", got, "out line|", "err line {not json|", r.stderr)
		}
	})
	t.Run("text", func(t *testing.T) {
		db, _ := fencedDB(t)
		r := gemrecon(t, "--db", db, "drain", "--exec", effect)
		wantCode(t, r, 0)
		if !strings.Contains(r.stderr, "\nout line\n") && !strings.HasPrefix(r.stderr, "out line\n") ||
			!strings.Contains(r.stderr, "err line {not json\n") {
			t.Errorf("the command's lines are not on stderr as they are:\n%s", r.stderr)
		}
	})
}

// fencedDB returns a new database with one pending key for runTakenOver.
func fencedDB(t *testing.T) (db, key string) {
	t.Helper()
	db = initDB(t, filepath.Join(t.TempDir(), "s.db"))
	key = "gemini:batches/fenced"
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, err := s.Record(context.Background(), sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"name":"batches/fenced"}`)}); err != nil {
			t.Fatal(err)
		}
	})
	return db, key
}

// runTakenOver runs the command line args (drain or poll on db) with an
// --exec effect that waits for a file; meanwhile another holder, an hour
// later by its clock (past the command's lease), takes key over; then the
// effect exits 0 and the command's outcome is fenced.
func runTakenOver(t *testing.T, db, key string, args ...string) result {
	t.Helper()
	dir := t.TempDir()
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	effect := "touch " + shellQuote(started) + "; while [ ! -e " + shellQuote(goOn) + " ]; do sleep 0.01; done; exit 0"
	args = append(args, "--exec", effect, "--lease", "1m", "--effect-timeout", "50s")
	done := make(chan result, 1)
	go func() { done <- gemrecon(t, args...) }()
	waitFor(t, 30*time.Second, func() bool { _, err := os.Stat(started); return err == nil })

	ctx := context.Background()
	later := func() time.Time { return time.Now().Add(time.Hour) }
	s, err := sqlite.Open(ctx, db, sink.Options{Now: later})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "thief", time.Hour, sink.ClaimOptions{})
	if cerr := s.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil || !c.Takeover || c.Token != 2 {
		t.Fatalf("Claim by the other holder = %+v, %v; want a takeover with token 2", c, err)
	}
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// recordBig records keys whose event documents are far larger than a
// pipe's buffer (1 MiB each), so that writing one line to a pipe blocks
// until the reader takes it, and fails if the reader goes away.
func recordBig(t *testing.T, db string, keys ...string) {
	t.Helper()
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		for _, k := range keys {
			name := strings.TrimPrefix(k, "gemini:")
			payload := `{"name":"` + name + `","pad":"` + strings.Repeat("x", 1<<20) + `"}`
			if _, err := s.Record(context.Background(), sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(payload)}); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// wantPendingUncharged checks that every key is pending with no attempt
// used: a broken stdout is not the key's fault.
func wantPendingUncharged(t *testing.T, db string, keys ...string) {
	t.Helper()
	s, err := sqlite.Open(context.Background(), db, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range keys {
		e, err := s.Get(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		if e.State != sink.StatePending || e.Attempts != 0 {
			t.Errorf("%s is %s after %d attempts (last error %q), want pending with no attempt used", k, e.State, e.Attempts, e.LastError)
		}
	}
}

// waitExit waits up to max for cmd to exit and returns its exit code (-1
// when a signal killed it); it kills cmd and fails the test when max passes.
func waitExit(t *testing.T, cmd *exec.Cmd, max time.Duration, stderr fmt.Stringer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(max):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not exit within %v\nstderr:\n%s", cmd.Args, max, stderr)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Errorf("%s was killed by %v, want an exit status\nstderr:\n%s", cmd.Args, ws.Signal(), stderr)
	}
	return cmd.ProcessState.ExitCode()
}

// TestDrainIntoHeadExits1 (issue 12 item 6): `gemrecon drain | head -c 10`.
// head goes away after 10 bytes of a line it cannot take whole: the write
// gets EPIPE. drain exits 1 (not 141: SIGPIPE is handled) with a message,
// claims nothing more, and every key is pending again with no attempt used
// (no key waits for its lease).
func TestDrainIntoHeadExits1(t *testing.T) {
	parallel(t)
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	ks := []string{"gemini:batches/h1", "gemini:batches/h2", "gemini:batches/h3"}
	recordBig(t, db, ks...)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	head := exec.Command("head", "-c", "10")
	head.Stdin = pr
	gem := child(t, "--db", db, "drain", "--print", "--concurrency", "1")
	gem.Stdout = pw
	var stderr testkit.Buffer
	gem.Stderr = &stderr
	if err := head.Start(); err != nil {
		t.Fatal(err)
	}
	if err := gem.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	pw.Close()
	code := waitExit(t, gem, 60*time.Second, &stderr)
	_ = head.Wait()
	if code != exitFatal {
		t.Errorf("drain | head -c 10 exited %d, want 1\nstderr:\n%s", code, stderr.String())
	}
	if s := stderr.String(); !strings.Contains(s, "stdout is broken") || !strings.Contains(s, "broken pipe") || !strings.Contains(s, "stopped claiming") {
		t.Errorf("stderr does not say that stdout broke and claiming stopped:\n%s", s)
	}
	wantPendingUncharged(t, db, ks...)
}

// stalledPipe returns the write end of a pipe whose read end is held open
// (until the test ends) and never read: a stdout reader that stopped.
func stalledPipe(t *testing.T) *os.File {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	return pw
}

// TestDrainStalledStdoutEndsWithinTheEffectTimeout (issue 12 item 6): a
// reader that stops reading (a pipe nobody drains) holds the attempt no
// longer than --effect-timeout; drain then exits 1 with a message, and the
// key is pending with no attempt used.
func TestDrainStalledStdoutEndsWithinTheEffectTimeout(t *testing.T) {
	parallel(t)
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	key := "gemini:batches/stalled"
	recordBig(t, db, key)
	pw := stalledPipe(t)
	gem := child(t, "--db", db, "drain", "--print", "--effect-timeout", "1s", "--lease", "1m")
	gem.Stdout = pw
	var stderr testkit.Buffer
	gem.Stderr = &stderr
	start := time.Now()
	if err := gem.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	code := waitExit(t, gem, 60*time.Second, &stderr)
	if took := time.Since(start); took > 1*time.Second+15*time.Second {
		t.Errorf("drain took %v with a stalled stdout, want about the 1s effect timeout", took)
	}
	if code != exitFatal || !strings.Contains(stderr.String(), "stdout stalled") {
		t.Errorf("drain exited %d, want 1 with a message that stdout stalled\nstderr:\n%s", code, stderr.String())
	}
	wantPendingUncharged(t, db, key)
}

// TestServeSIGTERMWithStalledStdout (issue 12 item 6): serve whose stdout
// reader stopped reading mid-line still stops within --grace (+ a bound)
// of SIGTERM, says why, and leaves the key pending with no attempt used.
func TestServeSIGTERMWithStalledStdout(t *testing.T) {
	parallel(t)
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	key := "gemini:batches/stalled"
	recordBig(t, db, key)
	pw := stalledPipe(t)
	gem := child(t, "--db", db, "serve", "--insecure-no-verify", "--listen", "127.0.0.1:0", "--print",
		"--effect-timeout", "1m", "--lease", "2m", "--grace", "1s")
	gem.Stdout = pw
	var stderr testkit.Buffer
	gem.Stderr = &stderr
	if err := gem.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	defer gem.Process.Kill()
	// serve's dispatcher claims the key at once and blocks writing its line.
	waitFor(t, 30*time.Second, func() bool {
		s, err := sqlite.Open(context.Background(), db, sink.Options{ReadOnly: true})
		if err != nil {
			return false
		}
		defer s.Close()
		e, err := s.Get(context.Background(), key)
		return err == nil && e.State == sink.StateClaimed
	})
	sent := time.Now()
	if err := gem.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := waitExit(t, gem, 30*time.Second, &stderr)
	if took := time.Since(sent); took > 1*time.Second+10*time.Second {
		t.Errorf("serve took %v to stop after SIGTERM with --grace 1s", took)
	}
	if code != exitFatal || !strings.Contains(stderr.String(), "stdout stalled") {
		t.Errorf("serve exited %d, want 1 with a message that stdout stalled\nstderr:\n%s", code, stderr.String())
	}
	wantPendingUncharged(t, db, key)
}
