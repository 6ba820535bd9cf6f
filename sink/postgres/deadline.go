package postgres

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Client-side deadlines (issue 12 item 8). statement_timeout makes the
// server end a slow statement, but a server or network that accepts TCP and
// never answers would hang a command until the peer dies. So every
// connection this backend dials bounds each round trip: a read waiting for
// the server's reply, or a write waiting for the server to take the
// request, fails after the round-trip deadline; connecting (TCP, TLS,
// authentication) is bounded by the connect timeout.
const (
	// DefaultConnectTimeout bounds connecting, unless the DSN sets
	// connect_timeout.
	DefaultConnectTimeout = 10 * time.Second
	// RoundTripMargin is how much longer than statement_timeout the client
	// waits for a reply: the server's own cancellation (a clean error)
	// comes first whenever the server is alive.
	RoundTripMargin = 5 * time.Second
)

// roundTripTimeout is the round-trip deadline for a statement_timeout
// setting as the server reads it ("30000", "30s", "1min", …; 0 or
// unreadable: DefaultStatementTimeout).
func roundTripTimeout(statementTimeout string) time.Duration {
	d, ok := parsePGDuration(statementTimeout)
	if !ok || d <= 0 {
		d = DefaultStatementTimeout
	}
	return d + RoundTripMargin
}

// parsePGDuration reads a PostgreSQL time setting whose default unit is
// milliseconds.
func parsePGDuration(s string) (time.Duration, bool) {
	s = strings.Trim(strings.TrimSpace(s), `'"`)
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	v, err := strconv.ParseFloat(s[:i], 64)
	if err != nil {
		return 0, false
	}
	unit := map[string]time.Duration{"": time.Millisecond, "us": time.Microsecond, "ms": time.Millisecond,
		"s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}
	u, ok := unit[strings.TrimSpace(s[i:])]
	if !ok {
		return 0, false
	}
	return time.Duration(v * float64(u)), true
}

// deadlineConn bounds every Read and Write of a connection by d from its
// start, combined with the deadlines pgx sets itself (to interrupt an
// operation whose context ended, or while connecting): the earlier wins.
// Idle connections are not affected: nothing reads them.
type deadlineConn struct {
	net.Conn
	d time.Duration

	mu   sync.Mutex
	r, w half
}

// half is one direction's deadlines: the one set by SetDeadline,
// SetReadDeadline or SetWriteDeadline (ext), and ours while a Read or Write
// runs (own).
type half struct{ ext, own time.Time }

// earlier is the earlier of two deadlines, zero meaning none.
func earlier(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// run is a Read or Write (do) bounded by d, in the direction h whose
// deadline set sets; what says what a timeout of ours means.
func (c *deadlineConn) run(h *half, set func(time.Time) error, do func([]byte) (int, error), b []byte, what string) (int, error) {
	c.mu.Lock()
	own := time.Now().Add(c.d)
	h.own = own
	err := set(earlier(h.ext, own))
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := do(b)
	c.mu.Lock()
	h.own = time.Time{}
	ext := h.ext
	c.mu.Unlock()
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && (ext.IsZero() || own.Before(ext)) {
		err = &noReply{what: what, d: c.d, err: err}
	}
	return n, err
}

func (c *deadlineConn) Read(b []byte) (int, error) {
	return c.run(&c.r, c.Conn.SetReadDeadline, c.Conn.Read, b, "no reply from the PostgreSQL server")
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	return c.run(&c.w, c.Conn.SetWriteDeadline, c.Conn.Write, b, "the PostgreSQL server took no data")
}

// set records t as h's deadline, applied at once (with ours, while a call
// runs) by the connection's set.
func (c *deadlineConn) set(h *half, set func(time.Time) error, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h.ext = t
	return set(earlier(t, h.own))
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	return c.set(&c.r, c.Conn.SetReadDeadline, t)
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	return c.set(&c.w, c.Conn.SetWriteDeadline, t)
}

// noReply is a round trip that ran out of its client-side deadline.
type noReply struct {
	what string
	d    time.Duration
	err  error
}

func (e *noReply) Error() string {
	return fmt.Sprintf("%s within %v (gemrecon's client-side deadline for one round trip)", e.what, e.d)
}
func (e *noReply) Unwrap() error   { return e.err }
func (e *noReply) Timeout() bool   { return true }
func (e *noReply) Temporary() bool { return false }
