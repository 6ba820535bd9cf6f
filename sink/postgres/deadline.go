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

	mu                sync.Mutex
	readExt, writeExt time.Time // set by SetDeadline/SetReadDeadline/SetWriteDeadline
	readOwn, writeOwn time.Time // ours, while a Read/Write runs
}

func newDeadlineConn(c net.Conn, d time.Duration) *deadlineConn { return &deadlineConn{Conn: c, d: d} }

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

func (c *deadlineConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	own := time.Now().Add(c.d)
	c.readOwn = own
	ext := c.readExt
	err := c.Conn.SetReadDeadline(earlier(ext, own))
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.readOwn = time.Time{}
	ext = c.readExt
	c.mu.Unlock()
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && (ext.IsZero() || own.Before(ext)) {
		err = &noReply{what: "no reply from the PostgreSQL server", d: c.d, err: err}
	}
	return n, err
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	own := time.Now().Add(c.d)
	c.writeOwn = own
	ext := c.writeExt
	err := c.Conn.SetWriteDeadline(earlier(ext, own))
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.writeOwn = time.Time{}
	ext = c.writeExt
	c.mu.Unlock()
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && (ext.IsZero() || own.Before(ext)) {
		err = &noReply{what: "the PostgreSQL server took no data", d: c.d, err: err}
	}
	return n, err
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readExt, c.writeExt = t, t
	return errors.Join(c.Conn.SetReadDeadline(earlier(t, c.readOwn)), c.Conn.SetWriteDeadline(earlier(t, c.writeOwn)))
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readExt = t
	return c.Conn.SetReadDeadline(earlier(t, c.readOwn))
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeExt = t
	return c.Conn.SetWriteDeadline(earlier(t, c.writeOwn))
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
