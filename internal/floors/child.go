package floors

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gemrecon/gemrecon/internal/loadgen"
)

// Build builds ./cmd/gemrecon of the module in moduleDir into outDir.
func Build(ctx context.Context, moduleDir, outDir string) (string, error) {
	out := filepath.Join(outDir, "gemrecon")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/gemrecon")
	cmd.Dir = moduleDir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("floors: go build ./cmd/gemrecon in %s: %v: %s", moduleDir, err, b)
	}
	return out, nil
}

// initDB makes the database db the way a user must before a writing
// command: `gemrecon init`.
func initDB(ctx context.Context, bin, db string) error {
	if out, err := exec.CommandContext(ctx, bin, "--db", db, "init").CombinedOutput(); err != nil {
		return fmt.Errorf("floors: gemrecon init: %v: %s", err, out)
	}
	return nil
}

// lineWaiter is a child's output, kept, with a wait for the first line
// that matches.
type lineWaiter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func newLineWaiter() *lineWaiter { return &lineWaiter{lines: make(chan string, 64)} }

// pipe copies r into the buffer, line by line.
func (l *lineWaiter) pipe(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l.mu.Lock()
		l.buf.WriteString(sc.Text() + "\n")
		l.mu.Unlock()
		select {
		case l.lines <- sc.Text():
		default: // nobody waits for it
		}
	}
	close(l.lines)
}

func (l *lineWaiter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// wait returns the first submatches of re in a line to come, within d.
func (l *lineWaiter) wait(re *regexp.Regexp, d time.Duration) ([]string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				return nil, fmt.Errorf("floors: the child ended before printing %s:\n%s", re, l)
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m, nil
			}
		case <-t.C:
			return nil, fmt.Errorf("floors: no %s within %v:\n%s", re, d, l)
		}
	}
}

// child is a started process whose stderr (and, unless given a writer,
// stdout) a lineWaiter keeps.
type child struct {
	cmd  *exec.Cmd
	out  *lineWaiter
	done chan struct{} // closed once it has exited
}

func startChild(cmd *exec.Cmd, stdout io.Writer) (*child, error) {
	c := &child{cmd: cmd, out: newLineWaiter(), done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stderr, cmd.Stdout = pw, stdout
	if stdout == nil {
		cmd.Stdout = pw
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		pw.Close()
		close(c.done)
	}()
	go c.out.pipe(pr)
	return c, nil
}

// stop sends SIGTERM and waits for the child, killing it after 30 s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

var servingAddr = regexp.MustCompile(`serving webhooks.* addr=(\S+)`)

// ServeLatency starts `gemrecon serve --forward URL --confirm never` as a
// child on a fresh database in dir, with a forward target of its own, and
// sends n signed deliveries of new keys one at a time, gap apart (each
// once the previous one's effect has started). It returns, for each, the
// time from its 2xx to its effect's start (the forward request's arrival),
// both by this process's clock.
func ServeLatency(ctx context.Context, bin, dir string, n int, gap time.Duration) ([]time.Duration, error) {
	var mu sync.Mutex
	arrived := map[string]chan time.Time{}
	arrival := func(key string) chan time.Time {
		mu.Lock()
		defer mu.Unlock()
		if arrived[key] == nil {
			arrived[key] = make(chan time.Time, 1)
		}
		return arrived[key]
	}
	target := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		var ev struct {
			Key string `json:"key"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.Key == "" {
			http.Error(w, "no key", http.StatusBadRequest)
			return
		}
		select {
		case arrival(ev.Key) <- at:
		default: // a second delivery of the effect: the first one counts
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = target.Serve(ln) }()
	defer target.Close()

	db := filepath.Join(dir, "serve.db")
	if err := initDB(ctx, bin, db); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "--db", db, "serve", "--listen", "127.0.0.1:0",
		"--forward", "http://"+ln.Addr().String()+"/effect", "--confirm", "never")
	cmd.Env = append(os.Environ(), "GEMRECON_WEBHOOK_SECRET="+secret)
	srv, err := startChild(cmd, nil)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	m, err := srv.out.wait(servingAddr, time.Minute)
	if err != nil {
		return nil, err
	}
	var lat []time.Duration
	var failed error
	last := time.Now()
	_, err = loadgen.Run(ctx, loadgen.Config{URL: "http://" + m[1] + "/webhook", Secret: secret, Workers: 1, Count: n,
		Body: loadgen.NewKeys(fmt.Sprintf("serve-%d", time.Now().UnixNano())), StopOnTransportError: true,
		OnAck: func(a loadgen.Ack) {
			acked := time.Now()
			select {
			case at := <-arrival(a.Key):
				lat = append(lat, at.Sub(acked))
			case <-time.After(time.Minute):
				if failed == nil {
					failed = fmt.Errorf("floors: %s's effect did not start within a minute of its %d", a.Key, a.Code)
				}
			}
			time.Sleep(time.Until(last.Add(gap)))
			last = time.Now()
		}})
	if err == nil {
		err = failed
	}
	if err == nil && len(lat) != n {
		err = fmt.Errorf("floors: %d of %d deliveries answered 2xx; serve's log:\n%s", len(lat), n, srv.out)
	}
	return lat, err
}

// Pass is one `gemrecon poll` pass over new completions.
type Pass struct {
	N         int
	Elapsed   time.Duration // from the child's start to its exit
	MaxRSSKiB int64         // the child's peak RSS (ru_maxrss)
}

// Rate is completions per second.
func (p Pass) Rate() float64 { return float64(p.N) / p.Elapsed.Seconds() }

var (
	emulatorURL = regexp.MustCompile(`GOOGLE_GEMINI_BASE_URL=(\S+)`)
	emulatorKey = regexp.MustCompile(`GEMINI_API_KEY=(\S+)`)
)

// PollPass starts `bin emulator --batches n --finish-within 0` (every batch
// listed finished) and runs one `bin poll --print` pass against it on a
// fresh database in dir, with the NDJSON effect and no request rate limit (--qps 0: the stand-in is on loopback). The pass runs
// under spawner (RusageMain), which reports its peak RSS. Every completion
// must come out as one NDJSON line.
func PollPass(ctx context.Context, bin, spawner, dir string, n int) (Pass, error) {
	ecmd := exec.CommandContext(ctx, bin, "emulator", "--batches", strconv.Itoa(n), "--finish-within", "0",
		"--listen", "127.0.0.1:0", "--seed", "1", "--log-level", "warn")
	emulator, err := startChild(ecmd, nil)
	if err != nil {
		return Pass{}, err
	}
	defer emulator.stop()
	key, err := emulator.out.wait(emulatorKey, time.Minute)
	if err != nil {
		return Pass{}, err
	}
	url, err := emulator.out.wait(emulatorURL, time.Minute)
	if err != nil {
		return Pass{}, err
	}
	db := filepath.Join(dir, "poll.db")
	if err := initDB(ctx, bin, db); err != nil {
		return Pass{}, err
	}
	argv := []string{bin, "--db", db, "--log-level", "warn", "poll", "--base-url", url[1], "--qps", "0", "--print"}
	lines := &lineCounter{}
	var stderr bytes.Buffer
	start := time.Now()
	rss, err := runRusage(ctx, spawner, argv, []string{"GEMINI_API_KEY=" + key[1]}, lines, &stderr)
	p := Pass{N: n, Elapsed: time.Since(start), MaxRSSKiB: rss}
	if err != nil {
		return p, fmt.Errorf("floors: %s: %v: %s", strings.Join(argv, " "), err, stderr.Bytes())
	}
	if lines.n != n {
		return p, fmt.Errorf("floors: the pass printed %d NDJSON lines, want %d: %s", lines.n, n, stderr.Bytes())
	}
	return p, nil
}

// lineCounter counts the lines written to it.
type lineCounter struct{ n int }

func (c *lineCounter) Write(p []byte) (int, error) {
	c.n += bytes.Count(p, []byte{'\n'})
	return len(p), nil
}

// RusageCommand is the name under which an executable runs RusageMain (its
// argv[0], as internal/testkit's Main dispatches).
const RusageCommand = "floors-rusage"

// runRusage runs argv through spawner as RusageCommand and returns argv's
// peak RSS in KiB. Go starts a child with CLONE_VM, so at exec the kernel
// counts the parent's peak RSS as the child's: read here, a child's
// ru_maxrss would be at least this process's peak, tens of MiB after the
// in-process measures. The spawner is a fresh process: its own peak at
// the start (about 17 MiB for the floors command, which links SQLite) is
// then the only such floor under the figure it reports, well below a pass.
func runRusage(ctx context.Context, spawner string, argv, env []string, stdout, stderr io.Writer) (int64, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer pr.Close()
	cmd := exec.CommandContext(ctx, spawner, argv...)
	cmd.Args[0] = RusageCommand
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = stdout, stderr, []*os.File{pw}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return 0, err
	}
	report, rerr := io.ReadAll(pr)
	if err := cmd.Wait(); err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	return strconv.ParseInt(strings.TrimSpace(string(report)), 10, 64)
}

// RusageMain runs os.Args[1:] with this process's standard files and
// environment, writes its ru_maxrss (KiB) to file descriptor 3, and exits
// with its status. An executable calls it when its argv[0] is
// RusageCommand.
func RusageMain() int {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, RusageCommand+": no command")
		return 2
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		fmt.Fprintln(os.Stderr, RusageCommand+":", err)
		return 2
	}
	report := os.NewFile(3, "rusage")
	fmt.Fprintln(report, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss)
	report.Close()
	return cmd.ProcessState.ExitCode()
}
