package floors

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/internal/testkit"
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

// child is a started process whose output (stdout and stderr) it keeps.
type child struct {
	testkit.Buffer
	done chan struct{} // closed once it has exited
	stop func()        // SIGTERM (SIGKILL 30 s later), then waits for the exit
}

// startChild starts bin with args, env added to this process's
// environment.
func startChild(ctx context.Context, env []string, bin string, args ...string) (*child, error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, bin, args...)
	c := &child{done: make(chan struct{})}
	cmd.Env, cmd.Stdout, cmd.Stderr = append(os.Environ(), env...), c, c
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	c.stop = func() { cancel(); <-c.done }
	return c, nil
}

// wait returns the submatches of re's first match in the child's output,
// waiting up to a minute for it.
func (c *child) wait(re *regexp.Regexp) ([]string, error) {
	timeout := time.After(time.Minute)
	for {
		if m := re.FindStringSubmatch(c.String()); m != nil {
			return m, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("floors: the child ended before printing %s:\n%s", re, c)
		case <-timeout:
			return nil, fmt.Errorf("floors: no %s within a minute:\n%s", re, c)
		case <-time.After(10 * time.Millisecond):
		}
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
	type arrival struct {
		key string
		at  time.Time
	}
	arrivals := make(chan arrival, 2*n)
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
		case arrivals <- arrival{ev.Key, at}:
		default: // more effects than deliveries: the first of each counts
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
	srv, err := startChild(ctx, []string{"GEMRECON_WEBHOOK_SECRET=" + secret}, bin, "--db", db, "serve", "--listen", "127.0.0.1:0",
		"--forward", "http://"+ln.Addr().String()+"/effect", "--confirm", "never")
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	m, err := srv.wait(servingAddr)
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
			timeout := time.After(time.Minute)
			for done := false; !done; {
				select {
				case ar := <-arrivals:
					if done = ar.key == a.Key; done { // else a repeated effect of an earlier key
						lat = append(lat, ar.at.Sub(acked))
					}
				case <-timeout:
					if failed == nil {
						failed = fmt.Errorf("floors: %s's effect did not start within a minute of its %d", a.Key, a.Code)
					}
					done = true
				}
			}
			time.Sleep(time.Until(last.Add(gap)))
			last = time.Now()
		}})
	if err == nil {
		err = failed
	}
	if err == nil && len(lat) != n {
		err = fmt.Errorf("floors: %d of %d deliveries answered 2xx; serve's log:\n%s", len(lat), n, srv)
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

var emulatorURL = regexp.MustCompile(`GOOGLE_GEMINI_BASE_URL=(\S+)`)

// PollPass starts `bin emulator --batches n --finish-within 0` (every batch
// listed finished) and runs one `bin poll --print` pass against it on a
// fresh database in dir, with the NDJSON effect and no request rate limit
// (--qps 0: the stand-in is on loopback). Every completion must come out
// as one NDJSON line.
//
// The pass's peak RSS is its ru_maxrss. Go starts a child with CLONE_VM,
// so at exec the kernel counts this process's peak RSS as the child's:
// PollPass first returns this process's freed memory to the system and
// resets its peak to its current RSS (/proc/self/clear_refs, 5), which
// is then the only floor under the figure.
func PollPass(ctx context.Context, bin, dir string, n int) (Pass, error) {
	emulator, err := startChild(ctx, nil, bin, "emulator", "--batches", strconv.Itoa(n), "--finish-within", "0",
		"--listen", "127.0.0.1:0", "--seed", "1", "--log-level", "warn", "--api-key", secret)
	if err != nil {
		return Pass{}, err
	}
	defer emulator.stop()
	url, err := emulator.wait(emulatorURL)
	if err != nil {
		return Pass{}, err
	}
	db := filepath.Join(dir, "poll.db")
	if err := initDB(ctx, bin, db); err != nil {
		return Pass{}, err
	}
	cmd := exec.CommandContext(ctx, bin, "--db", db, "--log-level", "warn", "poll", "--base-url", url[1], "--qps", "0", "--print")
	lines := &lineCounter{}
	var stderr bytes.Buffer
	cmd.Env, cmd.Stdout, cmd.Stderr = append(os.Environ(), "GEMINI_API_KEY="+secret), lines, &stderr
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return Pass{}, err
	}
	start := time.Now()
	err = cmd.Run()
	p := Pass{N: n, Elapsed: time.Since(start)}
	if err != nil {
		return p, fmt.Errorf("floors: %s: %v: %s", strings.Join(cmd.Args, " "), err, stderr.Bytes())
	}
	p.MaxRSSKiB = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
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
