package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestMain makes the test binary one of the child processes of the tests
// when started under its name (child; the lock holder of sqlitetest).
func TestMain(m *testing.M) {
	onPath := func(f func(path string) int) func() int {
		return func() int {
			if len(os.Args) < 2 {
				fmt.Fprintln(os.Stderr, "usage:", os.Args[0], "PATH [ARGS...]")
				return 2
			}
			return f(os.Args[1])
		}
	}
	testkit.Main(afterAll{m}, map[string]func() int{
		"sqlite-race": onPath(raceChild),
		"sqlite-open": onPath(openChild),
		"sqlite-open-as-nobody": onPath(func(path string) int {
			if err := testkit.DropToNobody(); err != nil {
				fmt.Println("error: dropping to nobody:", err)
				return 1
			}
			return openChild(path)
		}),
		"sqlite-open-read-only-as-nobody": onPath(func(path string) int {
			if err := testkit.DropToNobody(); err != nil {
				fmt.Println("error: dropping to nobody:", err)
				return 1
			}
			return openChildOpt(path, sink.Options{ReadOnly: true})
		}),
		"sqlite-start":             onPath(startChild),
		"sqlite-crash":             onPath(crashChild),
		sqlitetest.HoldLockCommand: sqlitetest.HoldLockMain,
	})
}

// afterAll runs the tests, then the cleanups.
type afterAll struct{ m *testing.M }

func (a afterAll) Run() int {
	code := a.m.Run()
	for _, f := range cleanups {
		f()
	}
	return code
}

// cleanups run after every test of the binary (for fixtures shared by tests).
var cleanups []func()

// child starts the test binary as the child process sqlite-ROLE on path,
// with args after path.
func child(t *testing.T, role, path string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := testkit.Command("sqlite-"+role, append([]string{path}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// openChild opens path for writing and prints "ok" or the error, one line.
func openChild(path string) int { return openChildOpt(path, sink.Options{}) }

// openChildOpt is openChild with opt (its busy timeout set).
func openChildOpt(path string, opt sink.Options) int {
	opt.BusyTimeout = 200 * time.Millisecond
	s, err := sqlite.Open(context.Background(), path, opt, quiet)
	if err != nil {
		fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", `\n`))
		return 0
	}
	s.Close()
	fmt.Println("ok")
	return 0
}
