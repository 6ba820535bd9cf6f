package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// What a user types, and what each command answers, is tested by the
// scripts in testdata/script (script_test.go). The Go tests here are for
// what a script cannot say as well: the command tree itself, and (in the
// other files) signals, kills, several processes, byte-exact inputs.

// result is one in-process command line's outcome.
type result struct {
	code           int
	stdout, stderr string
}

// gemrecon runs one command line in-process with buffers for streams.
func gemrecon(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(context.Background(), &interrupts{}, args, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// gemreconWith runs one command line as a child process (child) with env
// added to the test's environment: what gemrecon (in-process) does for a
// test that must not change its own environment (t.Setenv), so that it can
// run in parallel.
func gemreconWith(t *testing.T, env []string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := child(t, args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("gemrecon %s: %v", strings.Join(args, " "), err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

func (r result) String() string {
	return "exit " + itoa(r.code) + "\nstdout:\n" + r.stdout + "\nstderr:\n" + r.stderr
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
}

// newDB creates an empty, migrated SQLite sink file and returns its path.
func newDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sink.db")
	s, err := sqlite.Open(context.Background(), path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// withSink opens the database at path for a test to arrange rows.
func withSink(t *testing.T, path string, opt sink.Options, fn func(s sink.Sink)) {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fn(s)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEveryCommandHasAnExample(t *testing.T) {
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("gemrecon %s has no --help example", c.Name())
		}
	}
}

// child returns a command that runs this test binary as gemrecon (a real
// process: signals, kills, several instances).
func child(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	return testkit.Command("gemrecon", args...)
}

// startServing starts cmd, a child that serves HTTP, with its stderr in the
// returned buffer, kills it when the test ends, and returns once url
// answers 200 (waitHealthy).
func startServing(t *testing.T, cmd *exec.Cmd, url string) *testkit.Buffer {
	t.Helper()
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitHealthy(t, url, &stderr)
	return &stderr
}

// postJSON POSTs body as application/json with the headers h and returns
// the status and the response body.
func postJSON(t *testing.T, url, body string, h http.Header) (int, string) {
	t.Helper()
	code, _, b := testkit.Call(t, http.MethodPost, url, body, h)
	return code, string(b)
}

// initDB runs gemrecon init on db, as a user does once before the commands
// that write (issue 24), and returns db.
func initDB(t *testing.T, db string) string {
	t.Helper()
	wantCode(t, gemrecon(t, "--db", db, "init"), exitOK)
	return db
}
