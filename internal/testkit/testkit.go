// Package testkit holds the helpers that tests of several packages share: a
// buffer a child process and a test may use at once, a manual clock, one
// HTTP call, a signed webhook delivery's headers, a process's peak RSS, and
// the one way a test binary runs itself as a child (the real gemrecon, a
// crashing dispatcher, a second process on the same database). It is a
// non-test package so that every package's tests can import it; nothing
// but tests and test and benchmark support (sqlitetest, sinktest, loadgen,
// floors) may import it.
// (What tests do with a real SQLite file is sink/sqlite/sqlitetest's; with
// the Gemini SDK, internal/genaitest's.)
//
// Children are started the way testscript starts the commands it registers:
// Main makes the test binary act as a named command when its argv[0] is that
// name, and Command starts the test binary with argv[0] set to it (with
// arguments; CommandJSON and WithJSON for a configuration). No environment
// variable decides, so a child's environment is the test's to choose, and a
// script's `exec gemrecon` and a Go test's Command run the same code.
package testkit

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// Buffer is a bytes.Buffer for concurrent use: a child's output goroutine,
// a logger or a server writes to it while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Reset empties the buffer.
func (b *Buffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}

// Bytes returns a copy of what was written so far.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.b.Bytes())
}

// Main is TestMain's body for a package whose tests start children: when
// the test binary was started as one of commands (argv[0]'s base name is the
// command's name: Command, or a testscript script's `exec NAME`), it runs
// that command and exits with its status; otherwise it runs the tests. The
// commands are also installed in $PATH for the tests and their children
// (testscript.Main), so that a shell command an effect runs can call them by
// name.
//
// Before the tests run it sets GORACE for every child they start (RaceEnv),
// and -parallel to at least ParallelTests.
//
// m is the package's *testing.M, or something that runs it and more (work
// to do after every test of the binary has run).
func Main(m testscript.TestingM, commands map[string]func() int) {
	if name, value, ok := strings.Cut(RaceEnv(), "="); ok && os.Getenv(name) != value {
		os.Setenv(name, value) // read by each child's race runtime, not by this process's
	}
	if want := os.Getenv(envCommand); want != "" {
		// Started by Command: as no command of this binary's, the test
		// binary would run every test in the child instead.
		if commands[filepath.Base(os.Args[0])] == nil {
			fmt.Fprintf(os.Stderr, "testkit: %q is no command of this test binary's TestMain\n", want)
			os.Exit(2)
		}
		os.Unsetenv(envCommand) // for this child only, not for its own children
	}
	cmds := make(map[string]func(), len(commands))
	for name, fn := range commands {
		cmds[name] = func() { os.Exit(fn()) }
	}
	testscript.Main(waitingTests{m}, cmds)
}

// ParallelTests is how many parallel tests (t.Parallel) of a package whose
// TestMain is Main run at once, unless go test's -parallel says otherwise
// or the race detector is on. Such tests spend their time waiting (on
// children, on their sleeps and timeouts, on the disk), not computing, so
// go test's default, GOMAXPROCS, would leave a two-core machine idle while
// they wait. Under the race detector the children compute several times
// as much, so the default stays.
const ParallelTests = 6

// waitingTests runs m with -parallel at least ParallelTests when go test's
// command line did not set it and the race detector is off.
type waitingTests struct{ m testscript.TestingM }

func (w waitingTests) Run() int {
	if Race {
		return w.m.Run()
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if f := flag.Lookup("test.parallel"); f != nil && !set {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n < ParallelTests {
			_ = f.Value.Set(strconv.Itoa(ParallelTests))
		}
	}
	return w.m.Run()
}

// envCommand names the command Command started, so that Main can refuse a
// name it does not know. It is a check only: argv[0] decides.
const envCommand = "GEMRECON_TESTKIT_COMMAND"

// Command returns a command that runs this test binary as the named command
// of Main, with args and the test's environment (cmd.Env is set, so that a
// test may append to it). A name Main was not given makes the child exit 2.
func Command(name string, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, args...)
	cmd.Args[0] = name // what Main dispatches on
	cmd.Env = append(os.Environ(), envCommand+"="+name)
	return cmd
}

// CommandJSON returns Command(name, the JSON of cfg): the way to tell a
// child more than a few words. Its function in Main is WithJSON's.
func CommandJSON(t testing.TB, name string, cfg any) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Command(name, string(b))
}

// WithJSON returns a command for Main that decodes its one argument (the
// JSON of CommandJSON) into a C and runs main with it; a bad argument exits
// 2.
func WithJSON[C any](main func(C) int) func() int {
	return func() int {
		var cfg C
		if len(os.Args) != 2 {
			fmt.Fprintln(os.Stderr, "usage:", os.Args[0], "CONFIG-JSON")
			return 2
		}
		if err := json.Unmarshal([]byte(os.Args[1]), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, os.Args[0]+":", err)
			return 2
		}
		return main(cfg)
	}
}

// PeakRSS returns this process's peak resident set size in KiB (VmHWM in
// /proc/self/status), or -1 where that is not known. A child reports its
// own: rusage's ru_maxrss of a child is useless here, as Go starts
// children with CLONE_VM, so the kernel records the parent's peak.
func PeakRSS() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kib int64
			if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d", &kib); err != nil {
				return -1
			}
			return kib
		}
	}
	return -1
}

// Call sends one HTTP request with header (and, when body is not empty,
// body as application/json) and returns the response's status, header and
// body. A request that gets no response fails the test.
func Call(t testing.TB, method, url, body string, header http.Header) (status int, respHeader http.Header, respBody []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// RaceEnv returns the GORACE setting for the children of a test built with
// -race: the race detector's default makes every process that exits 0
// sleep a second first (atexit_sleep_ms=1000, so that reports from
// goroutines still running can come out); a child's reports still go to its
// stderr, which the tests read, and the tests start hundreds of children
// that exit 0. Options already in GORACE are kept, and an atexit_sleep_ms
// already there wins.
func RaceEnv() string {
	old := os.Getenv("GORACE")
	if strings.Contains(old, "atexit_sleep_ms=") {
		return "GORACE=" + old
	}
	return "GORACE=" + strings.TrimSpace(old+" atexit_sleep_ms=0")
}

// ParallelUnlessRace is t.Parallel for a test whose children keep the CPU
// busy (many processes racing on one database, a kill nemesis): under the
// race detector they compute several times as much, and such a test runs
// alone, as a lease-bound test must, rather than beside others.
func ParallelUnlessRace(t *testing.T) {
	if !Race {
		t.Parallel()
	}
}

// Nobody is the user and group id tests drop to where file modes must
// count: root may write any file.
const Nobody = 65534

// DropToNobody makes the calling process run as the nobody user from now
// on, when it runs as root, so that file modes count as they do for an
// ordinary user; it does nothing for any other user. First it makes the
// working directory and every directory above it searchable by others
// (adding only o+x), so that the files of the test's temporary directories
// stay reachable. A command registered with Main calls it before it does
// its work.
func DropToNobody() error {
	if os.Geteuid() != 0 {
		return nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	for {
		if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(dir, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	if err := syscall.Setgroups(nil); err != nil {
		return err
	}
	if err := syscall.Setgid(Nobody); err != nil {
		return err
	}
	return syscall.Setuid(Nobody)
}
