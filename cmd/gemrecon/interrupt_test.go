package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// TestSecondInterruptStopsEffectsNow: a second SIGINT (or SIGTERM) ends the
// grace at once. drain and poll, with an --exec effect that ignores SIGTERM
// and sleeps, under --grace 1m: after the second signal the command exits
// within seconds, the effect's process group is gone, and the key is left
// as a grace that runs out leaves it — pending after one attempt,
// "interrupted by shutdown" —, with the same exit status. Each case runs
// twice: once with a second signal, once (the reference) with --grace 1s
// and one signal.
func TestSecondInterruptStopsEffectsNow(t *testing.T) {
	parallel(t)
	api := fakeAPI(t, "SUCCEEDED")
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		args func(db string) []string
	}{
		{"drain SIGINT", syscall.SIGINT, func(db string) []string {
			withSink(t, db, sink.Options{}, func(s sink.Sink) {
				if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/b0", Source: sink.SourcePoll,
					Payload: []byte(`{"name":"batches/b0","done":true}`), State: "SUCCEEDED", FromAPI: true}); err != nil {
					t.Fatal(err)
				}
			})
			return []string{"--db", db, "drain", "--confirm", "never"}
		}},
		{"poll SIGTERM", syscall.SIGTERM, func(db string) []string { return pollArgs(db, api) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type outcome struct {
				code  int
				entry sink.Entry
			}
			run := func(t *testing.T, grace string, signals int) outcome {
				dir := t.TempDir()
				db := initDB(t, filepath.Join(dir, "s.db"))
				pidFile := filepath.Join(dir, "effect.pid")
				args := append(tc.args(db), "--grace", grace, "--lease", "5m", "--effect-timeout", "4m", "--exec",
					"trap '' TERM; echo $$ > "+shellQuote(pidFile)+".tmp && mv "+shellQuote(pidFile)+".tmp "+shellQuote(pidFile)+"; sleep 60")
				cmd := child(t, args...)
				cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
				var stderr testkit.Buffer
				cmd.Stderr = &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cmd.Process.Kill() })
				pgid := effectGroup(t, pidFile)

				if err := cmd.Process.Signal(tc.sig); err != nil {
					t.Fatal(err)
				}
				if signals == 2 {
					// The second signal only once the first was taken (two
					// signals sent at once may arrive as one).
					const first = "interrupt again to stop them now"
					for deadline := time.Now().Add(10 * time.Second); !strings.Contains(stderr.String(), first); time.Sleep(20 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Errorf("no %q line 10s after the first signal\n%s", first, stderr.String())
							break
						}
					}
					if err := cmd.Process.Signal(tc.sig); err != nil {
						t.Fatal(err)
					}
				}
				sent := time.Now()
				code := waitExit(t, cmd, 30*time.Second, &stderr)
				if took := time.Since(sent); took > 15*time.Second {
					t.Errorf("exit took %v after the last signal", took)
				}
				// The effect's whole group is gone (sleep, a grandchild, included).
				waitFor(t, 5*time.Second, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) })
				if signals == 2 && !strings.Contains(stderr.String(), "second interrupt: stopping effects now") {
					t.Errorf("no line says the second interrupt stops the effects:\n%s", stderr.String())
				}
				r := gemrecon(t, "--db", db, "status", "batches/b0")
				wantCode(t, r, exitNotDone)
				t.Logf("exit status %d", code)
				return outcome{code: code, entry: storedEntry(t, db, "gemini:batches/b0")}
			}
			var ref outcome
			t.Run("grace runs out", func(t *testing.T) { ref = run(t, "1s", 1) })
			t.Run("second signal", func(t *testing.T) {
				got := run(t, "1m", 2)
				if got.code != ref.code {
					t.Errorf("exit status %d after the second signal, %d after the grace ran out; want the same", got.code, ref.code)
				}
				for _, o := range []outcome{ref, got} {
					e := o.entry
					if e.State != sink.StatePending || e.Attempts != 1 || !strings.Contains(e.LastError, "interrupted by shutdown") {
						t.Errorf("key left %s after %d attempt(s), last error %q; want pending after 1, interrupted by shutdown", e.State, e.Attempts, e.LastError)
					}
				}
			})
		})
	}
}

// TestServeSecondSIGTERMStopsSyncEffectNow: serve --sync under --grace 1m
// and --drain-timeout 2m: a second SIGTERM kills the request's effect at
// once; the request is answered 500, serve exits 0 within seconds (as it
// does once the grace runs out, TestServeSyncSIGTERMLeavesNoClaim) and the
// key is pending, interrupted by shutdown.
func TestServeSecondSIGTERMStopsSyncEffectNow(t *testing.T) {
	parallel(t)
	cmd, stderr, db, answered, pgid := serveSyncEffect(t, "slow", "--grace", "1m", "--drain-timeout", "2m")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "interrupt again to stop them now") })
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := waitExit(t, cmd, 30*time.Second, stderr)
	if took := time.Since(sent); took > 15*time.Second {
		t.Errorf("serve took %v to stop after the second SIGTERM with --grace 1m", took)
	}
	if code != exitOK {
		t.Errorf("serve exited %d after two SIGTERMs, want 0\n%s", code, stderr)
	}
	if c := <-answered; c != http.StatusInternalServerError {
		t.Errorf("the interrupted --sync request was answered %d, want 500 (the sender retries)", c)
	}
	waitFor(t, 5*time.Second, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) })
	e := storedEntry(t, db, "gemini:batches/slow")
	if e.State != sink.StatePending || !strings.Contains(e.LastError, "interrupted by shutdown") {
		t.Errorf("after two SIGTERMs the key is %s (last error %q), want pending, interrupted by shutdown\n%s", e.State, e.LastError, stderr)
	}
}

// TestServeSecondSIGTERMStopsBackgroundEffectsDuringADrain: serve (inbox
// mode) keeps its background workers through the HTTP drain after the
// first SIGTERM; a second one must stop them at once, not when the drain
// ends. Here a request whose body never comes holds the drain open (until
// the 30 s read timeout) while a background effect that ignores SIGTERM
// runs under --grace 1m: after the second SIGTERM the effect's process
// group is gone within seconds, and the key is pending, interrupted by
// shutdown. Before, the effect ran on until the drain was over.
func TestServeSecondSIGTERMStopsBackgroundEffectsDuringADrain(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	pidFile := filepath.Join(dir, "effect.pid")
	addr := freeAddr(t)
	cmd := child(t, "--db", db, "serve", "--insecure-no-verify", "--confirm", "never", "--listen", addr,
		"--grace", "1m", "--drain-timeout", "2m", "--lease", "5m", "--effect-timeout", "4m",
		"--exec", "trap '' TERM; echo $$ > "+shellQuote(pidFile)+".tmp && mv "+shellQuote(pidFile)+".tmp "+shellQuote(pidFile)+"; sleep 60")
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")
	resp, err := http.Post("http://"+addr+"/webhook", "application/json", strings.NewReader(`{"type":"batch.succeeded","data":{"id":"bg"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("webhook answered %d, want 202", resp.StatusCode)
	}
	pgid := effectGroup(t, pidFile)

	// A request in flight: headers sent, the body not.
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the server take the request

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(stderr.String(), "interrupt again to stop them now") })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	waitFor(t, 10*time.Second, func() bool { return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) })
	if took := time.Since(sent); took > 8*time.Second {
		t.Errorf("the background effect was killed %v after the second SIGTERM, with the drain still open", took)
	}
	slow.Close() // the drain ends
	if code := waitExit(t, cmd, 40*time.Second, stderr); code != exitOK {
		t.Errorf("serve exited %d, want 0\n%s", code, stderr)
	}
	e := storedEntry(t, db, "gemini:batches/bg")
	if e.State != sink.StatePending || !strings.Contains(e.LastError, "interrupted by shutdown") {
		t.Errorf("after two SIGTERMs the key is %s (last error %q), want pending, interrupted by shutdown\n%s", e.State, e.LastError, stderr)
	}
}
