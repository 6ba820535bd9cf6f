package tcpproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/tcpproxy"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func start(t *testing.T) *tcpproxy.Proxy {
	t.Helper()
	p, err := tcpproxy.Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

func dial(t *testing.T, p *tcpproxy.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends line and reads the echo within wait.
func roundTrip(c net.Conn, r *bufio.Reader, line string, wait time.Duration) (string, error) {
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	got, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestRelay(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, "hello", 10*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	if p.Accepted() != 1 || p.Open() != 1 {
		t.Fatalf("Accepted = %d, Open = %d; want 1, 1", p.Accepted(), p.Open())
	}
}

func TestDropReplies(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "warm-up", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.DropReplies()
	if got, err := roundTrip(c, r, "lost", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip after DropReplies = %q, %v; want a timeout", got, err)
	}
	if p.Dropped() != int64(len("lost\n")) {
		t.Fatalf("Dropped = %d, want %d", p.Dropped(), len("lost\n"))
	}
	// A new connection is relayed normally.
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "fresh", 10*time.Second); err != nil || got != "fresh" {
		t.Fatalf("new connection round trip = %q, %v", got, err)
	}
}

func TestReset(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "warm-up", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset = %d, want 1 connection", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadString('\n'); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after Reset = %v, want ECONNRESET", err)
	}
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "after", 10*time.Second); err != nil || got != "after" {
		t.Fatalf("new connection after Reset = %q, %v", got, err)
	}
}

// resetOnConnect connects and reads: the error of whichever fails (the RST
// can arrive before connect returns).
func resetOnConnect(p *tcpproxy.Proxy) error {
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	return err
}

func TestSetResetting(t *testing.T) {
	p := start(t)
	p.SetResetting(true)
	if err := resetOnConnect(p); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection made while resetting = %v, want ECONNRESET", err)
	}
	if p.Resets() != 1 {
		t.Fatalf("Resets = %d, want 1", p.Resets())
	}
	p.SetResetting(false)
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "back", 10*time.Second); err != nil || got != "back" {
		t.Fatalf("after resetting = %q, %v", got, err)
	}
}

func TestResetFor(t *testing.T) {
	p := start(t)
	p.ResetFor(100 * time.Millisecond)
	if err := resetOnConnect(p); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a connection made during ResetFor = %v, want ECONNRESET", err)
	}
	// After the period, connections are relayed again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := func() (string, error) {
			c2, err := net.Dial("tcp", p.Addr())
			if err != nil {
				return "", err
			}
			defer c2.Close()
			return roundTrip(c2, bufio.NewReader(c2), "later", 10*time.Second)
		}()
		if err == nil && got == "later" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still not relaying 10s after ResetFor(100ms): %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStallResume(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "warm-up", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if got, err := roundTrip(c, r, "held", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip while stalled = %q, %v; want a timeout", got, err)
	}
	// A connection made while stalled is accepted but never answered.
	c2, r2 := dial(t, p)
	if got, err := roundTrip(c2, r2, "new", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection while stalled = %q, %v; want a timeout", got, err)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("held bytes after Resume = %q, %v", got, err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("held connection after Resume = %q, %v", got, err)
	}
}

// Close ends stalled relays too.
func TestCloseWhileStalled(t *testing.T) {
	p, err := tcpproxy.Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := dial(t, p)
	p.Stall()
	if _, err := io.WriteString(c, "x\n"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while stalled")
	}
}

// StallWhenClientSends holds back the request that carries the pattern, and
// everything after it, until Resume.
func TestStallWhenClientSends(t *testing.T) {
	p := start(t)
	c, r := dial(t, p)
	p.StallWhenClientSends([]byte("SKIP"))
	if got, err := roundTrip(c, r, "relayed", 10*time.Second); err != nil || got != "relayed" {
		t.Fatalf("round trip before the pattern = %q, %v", got, err)
	}
	if got, err := roundTrip(c, r, "SELECT SKIP LOCKED", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip with the pattern = %q, %v; want a timeout", got, err)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "SELECT SKIP LOCKED\n" {
		t.Fatalf("after Resume = %q, %v", got, err)
	}
	// One shot: the pattern does not stall again.
	if got, err := roundTrip(c, r, "SKIP again", 10*time.Second); err != nil || got != "SKIP again" {
		t.Fatalf("the pattern again = %q, %v", got, err)
	}
}
