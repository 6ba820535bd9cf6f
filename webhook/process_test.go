package webhook_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
)

// TestMain makes the test binary a serve process when started as
// webhook-serve (startChild).
func TestMain(m *testing.M) {
	testkit.Main(m, map[string]func() int{"webhook-serve": childServe})
}

// appendEffect is a real side effect: it appends the key to a file, one
// line per run, so that runs can be counted across processes.
type appendEffect struct {
	path string
	fail func(ctx context.Context, key string) error // nil: always succeed
	mu   sync.Mutex
}

func (e *appendEffect) Run(ctx context.Context, ev effect.Event) error {
	if e.fail != nil {
		if err := e.fail(ctx, ev.Key); err != nil {
			return err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(ev.Key + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// effectLines returns the keys appended to path, one per effect run.
func effectLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// childServe is a whole `gemrecon serve` in miniature: sink, optional
// dispatcher, verifying receiver, graceful shutdown on SIGTERM. Its
// arguments: the database, the file the effect appends keys to, and
// "dispatch" to run background dispatch (or "none").
func childServe() int {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: webhook-serve DB EFFECTS dispatch|none")
		return 2
	}
	db, effects, dispatchOn := os.Args[1], os.Args[2], os.Args[3] == "dispatch"
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := sqlite.Open(ctx, db, sink.Options{}, sqlite.WithLogger(log))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	defer s.Close()
	cfg := webhook.Config{Sink: s, Secrets: []string{testSecret}, Logger: log}
	var d *dispatch.Dispatcher
	if dispatchOn {
		d, err = dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects}, Logger: log, Interval: 50 * time.Millisecond})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		cfg.Dispatcher = d
	}
	h, err := newHandler(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Printf("ADDR %s\n", ln.Addr())
	var wg sync.WaitGroup
	if d != nil {
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(ctx) }()
	}
	err = webhook.Serve(ctx, ln, h, webhook.ServerOptions{DrainTimeout: 10 * time.Second})
	wg.Wait()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "child: close:", err)
		return 1
	}
	return 0
}

// child is a running serve process.
type child struct {
	cmd    *exec.Cmd
	base   string
	stderr *testkit.Buffer
	done   chan error
}

// startChild re-executes the test binary as a serve process on db.
func startChild(t *testing.T, db, effects string, dispatchOn bool) *child {
	t.Helper()
	mode := "none"
	if dispatchOn {
		mode = "dispatch"
	}
	cmd := testkit.Command("webhook-serve", db, effects, mode)
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stderr: &stderr, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				addr <- a
			}
		}
	}()
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
		}
	})
	select {
	case a := <-addr:
		c.base = "http://" + a
	case err := <-c.done:
		t.Fatalf("child exited before listening: %v\n%s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not listen within 30s\n%s", stderr.String())
	}
	return c
}

// term sends SIGTERM and waits for a clean exit.
func (c *child) term(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.done:
		c.done <- err // for Cleanup
		if err != nil {
			t.Fatalf("child exit after SIGTERM = %v, want 0\n%s", err, c.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not exit within 30s of SIGTERM\n%s", c.stderr.String())
	}
}
