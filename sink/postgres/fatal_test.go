package postgres

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// fatalRelay relays one client at a time to a PostgreSQL server and, on
// demand, swallows the server's reply and answers the client with a FATAL
// ErrorResponse instead, then closes the connection: what a client sees
// when the server crashes (another backend's crash makes the postmaster
// terminate every backend, each telling its client "terminating connection
// because of crash of another server process", SQLSTATE 57P02) after the
// statement's commit record was flushed but before its reply was sent.
type fatalRelay struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	client  net.Conn
	server  net.Conn
	swallow bool
	dropped int
}

func startFatalRelay(t *testing.T, dsn string) (*fatalRelay, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Skipf("the relay needs a URL DSN with a host, got %q", dsn)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &fatalRelay{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go r.serve()
	u.Host = ln.Addr().String()
	return r, u.String()
}

func (r *fatalRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		r.client, r.server = c, s
		r.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				r.mu.Lock()
				swallow := r.swallow
				if swallow {
					r.dropped += n
				}
				r.mu.Unlock()
				if !swallow && n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		}()
	}
}

// swallowReplies makes the server's replies on the open connection vanish.
func (r *fatalRelay) swallowReplies() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.swallow = true
}

// fatal sends the client a FATAL ErrorResponse and closes both sides; it
// reports how many reply bytes were swallowed before. Later connections are
// relayed as usual.
func (r *fatalRelay) fatal(code, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var body []byte
	for _, f := range []struct {
		k byte
		v string
	}{{'S', "FATAL"}, {'V', "FATAL"}, {'C', code}, {'M', msg}} {
		body = append(append(append(body, f.k), f.v...), 0)
	}
	body = append(body, 0)
	m := append([]byte{'E'}, binary.BigEndian.AppendUint32(nil, uint32(len(body)+4))...)
	_, _ = r.client.Write(append(m, body...))
	r.client.Close()
	r.server.Close()
	r.swallow = false // the server is back: new connections are relayed
	return r.dropped
}

// TestCompleteCommittedThenFatal: the server commits Complete and the
// client then receives a FATAL error instead of the reply (a crash of the
// server after the commit record was flushed). A FATAL error ends the
// connection, not necessarily the statement: the outcome is unknown and
// must be asked for. It was taken for an error reply of a statement that
// rolled back, so Complete reported a failure for a completion the database
// holds (and CompleteSQL did so for a COMMIT that succeeded).
func TestCompleteCommittedThenFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, _ := testSchema(t)
	r, rdsn := startFatalRelay(t, dsn)
	s := openDSN(t, oneConn(rdsn), sink.Options{})
	key := "gemini:batches/fatal"
	c := claimedForComplete(ctx, t, s, sink.Sighting{Key: key, Source: sink.SourcePoll})
	swallow := r.swallowReplies // from its COMMIT on
	s.pg.beforeCommit.Store(&swallow)
	completed := make(chan error, 1)
	go func() { completed <- s.Complete(ctx, key, c.Token) }()
	admin := adminConn(t, dsn)
	for state := ""; state != string(sink.StateDone); {
		select {
		case err := <-completed:
			t.Fatalf("Complete returned (%v) before the relay answered", err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := admin.QueryRow(ctx, `SELECT state FROM gemrecon_keys WHERE key = $1`, key).Scan(&state); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.fatal("57P02", "terminating connection because of crash of another server process"); n == 0 {
		t.Fatal("no reply bytes were swallowed: the test did not replace a reply")
	}
	if err := <-completed; err != nil {
		t.Fatalf("Complete that committed, answered FATAL = %v; want nil (the transaction's status: committed)", err)
	}
}
