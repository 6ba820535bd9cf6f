package dispatch

// The multi-process harness: TestMain makes this test binary a dispatcher
// process when started as dispatch-child (startChild), so the crash and
// concurrency tests (R1–R3) run real processes against one database: a
// SQLite file, or (R1, R3) a PostgreSQL schema, whichever childConfig.DB
// names.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestMain makes the test binary one of the tests' child processes when
// started under its name: a dispatcher (startChild), a --sql dispatcher
// (startSQLChild) or a holder of a SQLite write lock (sqlitetest.HoldLock).
func TestMain(m *testing.M) {
	testkit.Main(m, map[string]func() int{
		"dispatch-child":           testkit.WithJSON(childMain),
		"dispatch-sql-child":       testkit.WithJSON(sqlChildMain),
		sqlitetest.HoldLockCommand: sqlitetest.HoldLockMain,
	})
}

// childConfig is what a child dispatcher process is told (its argument).
type childConfig struct {
	DB          string        // a SQLite path or a postgres:// DSN (sink/dial)
	Effect      string        // "append" (appendEffect on Log) or "exec" (Exec)
	Log         string        // the append effect's file
	Exec        string        // the exec effect's command
	Lease       time.Duration // the dispatcher's lease
	Timeout     time.Duration // its effect timeout
	Concurrency int           // its concurrency
	Hold        time.Duration // appendEffect holds this long after writing, announcing it
	Mode        string        // "once" (one Drain) or "until-done"
}

// childSummary is the last line a child prints: "SUMMARY {json}".
type childSummary struct {
	Summary
	Drains int
	Errors int
}

func childMain(cfg childConfig) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// dial.Open takes no logger: the backends log to slog.Default, which in
	// this child process (not the test binary's parent) is the quiet logger.
	slog.SetDefault(logger)
	ctx := context.Background()
	s, err := dial.Open(ctx, cfg.DB, sink.Options{BusyTimeout: 30 * time.Second}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		return 1
	}
	defer s.Close()
	var eff effect.Effect
	switch cfg.Effect {
	case "append":
		a, err := newAppendEffect(cfg.Log)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		a.hold = cfg.Hold
		eff = a
	case "exec":
		eff = effect.NewExec(cfg.Exec, effect.ExecOutput(os.Stderr))
	default:
		fmt.Fprintln(os.Stderr, "child: unknown effect", cfg.Effect)
		return 1
	}
	d, err := New(Config{Sink: s, Effect: eff, Lease: cfg.Lease, EffectTimeout: cfg.Timeout,
		Concurrency: cfg.Concurrency, Logger: logger})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println("READY")
	var total childSummary
	for {
		sum, err := d.Drain(ctx)
		total.Drains++
		total.Claimed += sum.Claimed
		total.OK += sum.OK
		total.Failed += sum.Failed
		total.Dead += sum.Dead
		total.Fenced += sum.Fenced
		if err != nil {
			total.Errors++
			fmt.Fprintln(os.Stderr, "child: drain:", err)
		}
		if os.Getenv("GDT_VERBOSE") != "" {
			fmt.Fprintf(os.Stderr, "%s drain %+v\n", time.Now().Format("15:04:05.000"), sum)
		}
		if cfg.Mode == "once" {
			break
		}
		if cfg.Mode == "until-done" && err == nil {
			left := 0
			for _, st := range []sink.State{sink.StatePending, sink.StateClaimed} {
				es, err := s.List(ctx, sink.ListOptions{State: st, Limit: 1})
				if err != nil {
					fmt.Fprintln(os.Stderr, "child: list:", err)
					left++
				}
				left += len(es)
			}
			if left == 0 {
				break
			}
		}
		if sum.Claimed == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	b, _ := json.Marshal(total)
	fmt.Println("SUMMARY " + string(b))
	return 0
}

// appendEffect appends "key token\n" to a file opened with O_APPEND (one
// write per line, so concurrent writers never interleave) and fdatasyncs it:
// the effect has durably happened before Run returns, as a real downstream
// write would have.
type appendEffect struct {
	f    *os.File
	hold time.Duration
	once sync.Once
}

func newAppendEffect(path string) (*appendEffect, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &appendEffect{f: f}, nil
}

func (a *appendEffect) Run(ctx context.Context, ev effect.Event) error {
	if _, err := a.f.WriteString(ev.Key + " " + strconv.FormatInt(ev.Token, 10) + "\n"); err != nil {
		return err
	}
	if err := syscall.Fdatasync(int(a.f.Fd())); err != nil {
		return err
	}
	if a.hold > 0 {
		fmt.Printf("EFFECT-STARTED %s %d\n", ev.Key, ev.Token)
		select {
		case <-time.After(a.hold):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// child is a running child dispatcher process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string // stdout lines
	stderr *lockedBuffer
	done   chan struct{}
	err    error // Wait's result, after done
	mu     sync.Mutex
	last   string // the SUMMARY line
}

func startChild(t *testing.T, cfg childConfig) *child {
	t.Helper()
	cmd := testkit.CommandJSON(t, "dispatch-child", cfg)
	c := &child{cmd: cmd, lines: make(chan string, 1024), stderr: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
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
			line := sc.Text()
			if strings.HasPrefix(line, "SUMMARY ") {
				c.mu.Lock()
				c.last = line
				c.mu.Unlock()
			}
			select {
			case c.lines <- line:
			default:
			}
		}
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// waitLine waits (bounded) for a stdout line with the prefix.
func (c *child) waitLine(t *testing.T, prefix string, within time.Duration) (string, bool) {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case l := <-c.lines:
			if strings.HasPrefix(l, prefix) {
				return l, true
			}
		case <-c.done:
			// Drain what was printed before exit.
			for {
				select {
				case l := <-c.lines:
					if strings.HasPrefix(l, prefix) {
						return l, true
					}
				default:
					return "", false
				}
			}
		case <-timer.C:
			return "", false
		}
	}
}

// wait waits (bounded) for the child to exit and returns its summary.
func (c *child) wait(t *testing.T, within time.Duration) childSummary {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(within):
		// A goroutine dump says where it hung.
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		t.Fatalf("child did not finish within %v; stderr:\n%s", within, c.stderr.String())
	}
	if c.err != nil {
		t.Fatalf("child: %v; stderr:\n%s", c.err, c.stderr.String())
	}
	c.mu.Lock()
	line := c.last
	c.mu.Unlock()
	var s childSummary
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "SUMMARY ")), &s); err != nil {
		t.Fatalf("child summary %q: %v; stderr:\n%s", line, err, c.stderr.String())
	}
	return s
}

// exited reports whether the child has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// recordMany records keys from many goroutines, so the sink's group commit
// batches them.
func recordMany(t testing.TB, s sink.Sink, ks []string) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(ks))
	next := make(chan string)
	for range 32 {
		wg.Go(func() {
			for k := range next {
				name := strings.TrimPrefix(k, "gemini:")
				p := fmt.Sprintf(`{"name":%q,"done":true,"metadata":{"state":"JOB_STATE_SUCCEEDED"}}`, name)
				if _, err := s.Record(context.Background(), sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(p)}); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, k := range ks {
		next <- k
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Record: %v", err)
	}
}

// effectLog reads an effect log of "key token" lines: lines per key and the
// tokens seen per key.
func effectLog(t *testing.T, path string) (lines int, perKey map[string][]int64) {
	t.Helper()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, map[string][]int64{}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	perKey = map[string][]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, tok, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseInt(tok, 10, 64)
		if !ok || err != nil {
			t.Fatalf("effect log line %q is not \"key token\"", sc.Text())
		}
		perKey[k] = append(perKey[k], n)
		lines++
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return lines, perKey
}
