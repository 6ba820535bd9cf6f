package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// childEnv selects a child role when the test binary re-executes itself.
const childEnv = "GEMRECON_SQLITE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		code := m.Run()
		for _, f := range cleanups {
			f()
		}
		os.Exit(code)
	case "race":
		os.Exit(raceChild(os.Args[len(os.Args)-1]))
	case "hold":
		os.Exit(holdChild(os.Args[len(os.Args)-1]))
	case "open":
		os.Exit(openChild(os.Args[len(os.Args)-1]))
	case "start":
		os.Exit(startChild(os.Args[len(os.Args)-1]))
	case "crash":
		os.Exit(crashChild(os.Args[len(os.Args)-1]))
	default:
		fmt.Fprintln(os.Stderr, "unknown child role", os.Getenv(childEnv))
		os.Exit(2)
	}
}

// cleanups run after every test of the binary (for fixtures shared by tests).
var cleanups []func()

// child starts the test binary in role on path.
func child(t *testing.T, role, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", path)
	cmd.Env = append(os.Environ(), childEnv+"="+role)
	cmd.Stderr = os.Stderr
	return cmd
}

// holdChild takes the write lock of path, says "locked", and keeps it until
// its stdin closes.
func holdChild(path string) int {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("locked")
	bufio.NewReader(os.Stdin).ReadString('\n')
	tx.Rollback()
	return 0
}

// openChild opens path for writing and prints "ok" or the error, one line.
func openChild(path string) int {
	s, err := sqlite.Open(context.Background(), path, sink.Options{BusyTimeout: 200 * time.Millisecond}, quiet)
	if err != nil {
		fmt.Println("error:", strings.ReplaceAll(err.Error(), "\n", `\n`))
		return 0
	}
	s.Close()
	fmt.Println("ok")
	return 0
}
