package dispatch

// A child dispatcher process for the --sql tests: the parent starts this
// test binary as dispatch-sql-child (TestMain) with a sqlChildEnv. The
// child prints protocol lines starting with "SQLCHILD " on stdout.

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect/sqlscript"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// sqlChildEnv is what a --sql child is told (its argument).
type sqlChildEnv struct {
	Role    string        // "drain": drain until no key is pending or claimed; "stale": RunKeyWithin(Key), stopping itself before CompleteSQL
	DB      string        // sink/dial DSN or path
	File    string        // the --sql file
	Lease   time.Duration // lease
	Timeout time.Duration // effect timeout
	Conc    int           // concurrency
	Key     string        // stale: the key
}

func sqlChildMain(e sqlChildEnv) int {
	say := func(format string, args ...any) { fmt.Printf("SQLCHILD "+format+"\n", args...) }
	ctx := context.Background()
	q, err := sqlscript.Load(e.File)
	if err != nil {
		say("ERROR %v", err)
		return 1
	}
	s, err := dial.Open(ctx, e.DB, sink.Options{BusyTimeout: 30 * time.Second, RetryBase: time.Millisecond, RetryMax: time.Millisecond}, nil)
	if err != nil {
		say("ERROR %v", err)
		return 1
	}
	defer s.Close()
	var sk sink.Sink = s
	if e.Role == "stale" {
		sk = &stoppingSink{Sink: s, inner: s.(sink.SQLCompleter), say: say}
	}
	d, err := New(Config{Sink: sk, SQL: q, Lease: e.Lease, EffectTimeout: e.Timeout, Concurrency: e.Conc, Logger: quietLogger()})
	if err != nil {
		say("ERROR %v", err)
		return 1
	}
	say("READY")
	switch e.Role {
	case "drain":
		for {
			sum, err := d.Drain(ctx)
			if err != nil {
				say("DRAINERR %v", err)
			}
			if sum.Claimed > 0 {
				say("DRAINED %d", sum.OK)
			}
			st, err := s.Stats(ctx)
			if err != nil {
				say("ERROR %v", err)
				return 1
			}
			if st.ByState[sink.StatePending]+st.ByState[sink.StateClaimed] == 0 {
				say("DONE")
				return 0
			}
			time.Sleep(50 * time.Millisecond) // waiting for leases of killed children to run out
		}
	case "stale":
		out, err := d.RunKeyWithin(ctx, e.Key, 0)
		say("OUTCOME %s %v", out, err)
		return 0
	}
	say("ERROR unknown role %q", e.Role)
	return 1
}

// stoppingSink stops its own process (SIGSTOP) when CompleteSQL is called,
// after the claim and before the transaction begins, so that it holds no
// lock of any database while stopped (on SQLite a stopped process holding
// the write lock would block everyone, the takeover included). After SIGCONT
// it runs the real CompleteSQL. Its context is detached: the stop outlives
// the effect timeout on purpose, and the test wants to see the fence, not
// the deadline. The dispatcher's lease renewals share a mutex with the stop
// and wait for their commit (the dispatcher gives up on a renewal after
// Lease/3, which under load can leave it running in the sink's writer), so
// that no renewal is in flight (holding the write lock) when the process
// stops, and none starts while it is stopped.
type stoppingSink struct {
	sink.Sink
	inner sink.SQLCompleter
	say   func(string, ...any)
	mu    sync.Mutex
}

func (s *stoppingSink) Renew(ctx context.Context, key string, token int64, lease time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Sink.Renew(context.WithoutCancel(ctx), key, token, lease)
}

func (s *stoppingSink) CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error {
	s.mu.Lock()
	// kill(self, SIGSTOP) is not synchronous in a multi-threaded process:
	// the calling thread can run on for a while before the group stop
	// reaches it (under load, long enough to begin the transaction and
	// take the write lock). So wait for the SIGCONT that ends the stop.
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	s.say("STOPPING %s %d", key, token)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
	signal.Stop(cont)
	s.mu.Unlock()
	err := s.inner.CompleteSQL(context.WithoutCancel(ctx), key, token, script, params)
	s.say("COMPLETESQL %v", err)
	return err
}

// sqlChild is a running child process.
type sqlChild struct {
	cmd    *exec.Cmd
	lines  chan string
	done   chan struct{}
	stderr testkit.Buffer
}

func startSQLChild(t *testing.T, e sqlChildEnv) *sqlChild {
	t.Helper()
	cmd := testkit.CommandJSON(t, "dispatch-sql-child", e)
	c := &sqlChild{cmd: cmd, lines: make(chan string, 4096), done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "SQLCHILD "); ok {
				select {
				case c.lines <- l:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// waitFor waits (bounded) for a protocol line with the prefix.
func (c *sqlChild) waitFor(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l := <-c.lines:
			if strings.HasPrefix(l, "ERROR") {
				t.Fatalf("child: %s; stderr:\n%s", l, c.stderr.String())
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-c.done:
			select {
			case l := <-c.lines:
				if strings.HasPrefix(l, prefix) {
					return l
				}
				continue
			default:
			}
			t.Fatalf("child exited before printing %q; stderr:\n%s", prefix, c.stderr.String())
		case <-deadline:
			t.Fatalf("child did not print %q within %v; stderr:\n%s", prefix, within, c.stderr.String())
		}
	}
}

// kill9 kills the child with SIGKILL and waits for it.
func (c *sqlChild) kill9(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Kill()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Fatal("killed child did not exit")
	}
}

// stopped reports whether the child is in the stopped state (T in
// /proc/PID/stat).
func (c *sqlChild) stopped() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't')
}
