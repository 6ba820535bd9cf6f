package webhook

import (
	"errors"
	"net"
	"testing"
)

// The connection limit's listener may be closed more than once (by Serve,
// Shutdown and Close alike): a second Close must not panic, and Accept
// after it answers net.ErrClosed.
func TestLimitListenerClosesTwice(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := &limitListener{Listener: ln, max: 1, slots: make(chan struct{}, 1+ProbeConns), done: make(chan struct{})}
	if err := ll.Close(); err != nil {
		t.Fatal(err)
	}
	_ = ll.Close()
	if _, err := ll.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}
