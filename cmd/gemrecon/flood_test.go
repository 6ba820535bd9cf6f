package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
)

// Unauthenticated traffic is bounded (issue 25 item 7), against a real
// serve process on loopback: 1,000 connections, each sending a 1 MiB body
// but its last byte.

const (
	floodConns = 1000
	floodBody  = 1 << 20
)

// flood is floodConns connections that each POST a floodBody-byte body to
// addr's /webhook with the headers of header(i), all but its last byte,
// and then hold the connection. Each reads its answer; answers counts them
// by status (0: none).
type flood struct {
	conns   []net.Conn
	sent    sync.WaitGroup // the headers of every request are sent
	done    sync.WaitGroup // every connection has its answer, or none came
	mu      sync.Mutex
	answers map[int]int
	n503    atomic.Int64
}

func startFlood(t *testing.T, addr string, header func(i int) http.Header) *flood {
	t.Helper()
	f := &flood{answers: map[int]int{}}
	body := make([]byte, floodBody-1) // shared, read-only
	f.sent.Add(floodConns)
	f.done.Add(floodConns)
	for i := range floodConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		f.conns = append(f.conns, c)
		go func() {
			defer f.done.Done()
			var head strings.Builder
			fmt.Fprintf(&head, "POST /webhook HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", addr, floodBody)
			for k, vs := range header(i) {
				fmt.Fprintf(&head, "%s: %s\r\n", k, vs[0])
			}
			head.WriteString("\r\n")
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			_, err := c.Write([]byte(head.String()))
			f.sent.Done()
			if err != nil {
				return
			}
			go func() { _, _ = c.Write(body) }() // until the server stops reading
			code := 0
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				code = resp.StatusCode
			}
			if code == http.StatusServiceUnavailable {
				f.n503.Add(1)
			}
			f.mu.Lock()
			f.answers[code]++
			f.mu.Unlock()
		}()
	}
	t.Cleanup(f.stop)
	f.sent.Wait()
	return f
}

// stop closes every connection and waits for their readers.
func (f *flood) stop() {
	for _, c := range f.conns {
		c.Close()
	}
	f.done.Wait()
}

// peakRSS is a process's peak resident set size in MiB (VmHWM; VmRSS is
// never above it).
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib >> 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// floodServe starts serve on db with --exec true and returns its address,
// its stderr and its pid.
func floodServe(t *testing.T, db string) (string, fmt.Stringer, int) {
	t.Helper()
	addr := freeAddr(t)
	cmd := child(t, "--db", db, "serve", "--listen", addr, "--confirm", "never", "--exec", "true")
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+unusableSecret)
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")
	return addr, stderr, cmd.Process.Pid
}

// Bodies without signature headers are refused before they are read: the
// flood keeps serve's memory small, and a signed delivery sent meanwhile
// is accepted. (Before, every body was read first: 1.7 GB.)
func TestServeUnsignedFloodStaysSmall(t *testing.T) {
	parallel(t)
	db := newDB(t)
	addr, stderr, pid := floodServe(t, db)
	f := startFlood(t, addr, func(int) http.Header { return http.Header{} })
	if code, body := deliverOnce(t, "http://"+addr+"/webhook", "amid-the-flood"); code != 202 {
		t.Fatalf("a signed delivery during the flood = %d %s\n%s", code, body, stderr)
	}
	f.done.Wait()
	if f.answers[http.StatusUnauthorized] == 0 || f.answers[http.StatusAccepted] != 0 {
		t.Errorf("the flood's answers by status: %v, want 401s", f.answers)
	}
	if mib := peakRSS(t, pid); mib >= 300 {
		t.Errorf("serve's peak RSS under the flood = %d MiB, want under 300", mib)
	} else {
		t.Logf("serve's peak RSS under the flood: %d MiB; answers %v", mib, f.answers)
	}
}

// With plausible signature headers the flood's bodies are read, up to the
// cap on unverified bytes: beyond it each gets 503 with Retry-After before
// its body is read, and so does a signed delivery sent while the cap is
// full. The sender retries and nothing is lost.
func TestServePlausibleFloodDeliveryRetried(t *testing.T) {
	parallel(t)
	db := newDB(t)
	addr, stderr, pid := floodServe(t, db)
	f := startFlood(t, addr, func(i int) http.Header {
		h := http.Header{}
		h.Set("webhook-id", fmt.Sprint("msg-flood-", i))
		h.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
		h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
		return h
	})
	// 64 MiB hold 64 bodies of 1 MiB: the others are refused.
	waitFor(t, 30*time.Second, func() bool { return f.n503.Load() >= floodConns-64 })
	url := "http://" + addr + "/webhook"
	event := `{"type":"batch.succeeded","version":"v1","data":{"id":"behind-the-flood"}}`
	h, err := testkit.SignWebhook(unusableSecret, "msg-behind", time.Now(), []byte(event))
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, body := testkit.Call(t, http.MethodPost, url, event, h)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(string(body), "unverified") {
		t.Fatalf("a signed delivery while the cap is full = %d %s (Retry-After %q), want 503 with Retry-After\n%s", code, body, hdr.Get("Retry-After"), stderr)
	}
	// The held bodies end short (400), and their bytes are free again; the
	// sender retries.
	f.stop()
	waitFor(t, 30*time.Second, func() bool {
		h, err := testkit.SignWebhook(unusableSecret, "msg-behind", time.Now(), []byte(event))
		if err != nil {
			t.Fatal(err)
		}
		code, _, _ := testkit.Call(t, http.MethodPost, url, event, h)
		return code == http.StatusAccepted
	})
	waitFor(t, 30*time.Second, func() bool {
		return gemrecon(t, "--db", db, "status", "gemini:batches/behind-the-flood").code == exitOK
	})
	t.Logf("serve's peak RSS: %d MiB; the flood's answers: %v", peakRSS(t, pid), f.answers)
}

// The caps' flags are checked before anything is opened (exit 2, naming
// the flags).
func TestServeLimitFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-connections", "0"}, "--max-connections must be positive"},
		{[]string{"--max-body", "2000", "--max-unverified-bytes", "1000"}, "--max-unverified-bytes 1000 is below --max-body 2000"},
	} {
		db := filepath.Join(t.TempDir(), "s.db")
		r := gemrecon(t, append([]string{"--db", db, "serve", "--insecure-no-verify", "--exec", "true", "--listen", "127.0.0.1:0"}, tt.args...)...)
		wantCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, tt.want) {
			t.Errorf("serve %v: want %q in\n%s", tt.args, tt.want, r.stderr)
		}
		if _, err := os.Stat(db); !os.IsNotExist(err) {
			t.Errorf("serve %v made the database (%v)", tt.args, err)
		}
	}
}
