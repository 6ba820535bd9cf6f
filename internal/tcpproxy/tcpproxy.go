// Package tcpproxy is a TCP relay for tests: it listens on 127.0.0.1 at a
// random port, relays every connection to a target (a PostgreSQL server, an
// HTTP server), and misbehaves on demand the ways a network or a sick server
// does:
//
//   - DropReplies: on the connections open now, the target's replies are read
//     and thrown away (the statement runs and commits; the client never
//     hears so). Connections made later are relayed normally.
//   - Reset / ResetFor / SetResetting: every open connection is reset (RST,
//     both to the client and to the target), and while resetting is on,
//     every new connection is accepted and reset at once.
//   - Stall / Resume: nothing is relayed in either direction and new
//     connections are accepted but never answered (a peer that accepts TCP
//     and never replies); Resume delivers what was held back and relays
//     again. StallWhenClientSends stalls at a chosen moment: when a client
//     sends given bytes (a statement's text), before they are relayed.
//
// Everything it does is counted, so that a test can assert that it exercised
// what it meant to (Dropped, Resets, Accepted).
package tcpproxy

import (
	"bytes"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy relays 127.0.0.1:random to a target. Its methods are safe for
// concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	dropped  atomic.Int64 // reply bytes swallowed by DropReplies
	resets   atomic.Int64 // connections reset
	accepted atomic.Int64 // connections accepted

	mu        sync.Mutex
	conns     map[*relay]struct{}
	resetting bool
	resetEnd  *time.Timer
	gate      chan struct{} // closed while relaying; open (not closed) while stalled
	trigger   []byte        // StallWhenClientSends; nil when none
	closed    chan struct{}
	wg        sync.WaitGroup
}

type relay struct {
	client net.Conn
	drop   atomic.Bool
	once   sync.Once
	done   chan struct{}

	mu     sync.Mutex
	server net.Conn // nil until dialled
}

// close ends the relay; with reset, each side gets an RST instead of a FIN.
func (r *relay) close(reset bool) {
	r.once.Do(func() {
		close(r.done)
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range []net.Conn{r.client, r.server} {
			if c == nil {
				continue
			}
			if tc, ok := c.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0) // close sends RST
			}
			_ = c.Close()
		}
	})
}

// Start relays 127.0.0.1:random to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, target: target, conns: map[*relay]struct{}{}, gate: open, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// ForDSN starts a proxy to the host of a postgres:// URL DSN, closed when the
// test ends, and returns it with dsn rewritten to go through it. A DSN that
// is not a URL with a host skips the test.
func ForDSN(tb testing.TB, dsn string) (*Proxy, string) {
	tb.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		tb.Skipf("the proxy tests need a URL DSN with a host, got %q", dsn)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	p, err := Start(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return p, u.String()
}

// Addr is the proxy's listening address, 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy relays to.
func (p *Proxy) Target() string { return p.target }

// Dropped is how many reply bytes DropReplies swallowed.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Resets is how many connections the proxy reset.
func (p *Proxy) Resets() int64 { return p.resets.Load() }

// Accepted is how many connections the proxy accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Open is how many connections are being relayed (or held) now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// DropReplies swallows the target's replies on every connection open now;
// connections made later are relayed normally.
func (p *Proxy) DropReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r := range p.conns {
		r.drop.Store(true)
	}
}

// Reset resets every open connection (RST to the client and to the target)
// and returns how many.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	rs := make([]*relay, 0, len(p.conns))
	for r := range p.conns {
		rs = append(rs, r)
		delete(p.conns, r)
	}
	p.mu.Unlock()
	for _, r := range rs {
		p.resets.Add(1)
		r.close(true)
	}
	return len(rs)
}

// SetResetting turns resetting on (every open connection is reset now, and
// every new one as soon as it is accepted) or off (new connections are
// relayed again). It cancels a pending ResetFor.
func (p *Proxy) SetResetting(on bool) {
	p.mu.Lock()
	p.resetting = on
	if p.resetEnd != nil {
		p.resetEnd.Stop()
		p.resetEnd = nil
	}
	p.mu.Unlock()
	if on {
		p.Reset()
	}
}

// ResetFor resets every connection, open or new, for d of real time (an
// outage), then relays normally again.
func (p *Proxy) ResetFor(d time.Duration) {
	p.SetResetting(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.resetEnd == t {
			p.resetting = false
			p.resetEnd = nil
		}
	})
	p.resetEnd = t
}

// Stall stops relaying in both directions on every connection, and new
// connections are accepted but neither answered nor relayed, until Resume.
// Bytes already read are held, not lost.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// StallWhenClientSends stalls the proxy (see Stall), once, when a client
// sends data containing pattern, before that data is relayed: the request
// never reaches the target. (A pattern split across two reads is not seen:
// use a short one.)
func (p *Proxy) StallWhenClientSends(pattern []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = bytes.Clone(pattern)
}

// triggered reports whether b fires the StallWhenClientSends pattern, and
// stalls if so.
func (p *Proxy) triggered(b []byte) {
	p.mu.Lock()
	fire := p.trigger != nil && bytes.Contains(b, p.trigger)
	if fire {
		p.trigger = nil
	}
	p.mu.Unlock()
	if fire {
		p.Stall()
	}
}

// Resume ends a Stall: held bytes are delivered and held connections are
// relayed.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// pass blocks while the proxy is stalled; false when r or the proxy ended.
func (p *Proxy) pass(r *relay) bool {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	select {
	case <-gate:
		select {
		case <-r.done:
			return false
		default:
			return true
		}
	case <-r.done:
		return false
	case <-p.closed:
		return false
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		r := &relay{client: c, done: make(chan struct{})}
		p.mu.Lock()
		select {
		case <-p.closed:
			p.mu.Unlock()
			r.close(false)
			return
		default:
		}
		if p.resetting {
			p.mu.Unlock()
			p.resets.Add(1)
			r.close(true)
			continue
		}
		p.conns[r] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.run(r)
	}
}

// run dials the target once the proxy is not stalled and relays r both ways.
func (p *Proxy) run(r *relay) {
	defer p.wg.Done()
	defer p.forget(r)
	if !p.pass(r) {
		return
	}
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		r.close(false)
		return
	}
	r.mu.Lock()
	select {
	case <-r.done: // reset or closed while dialling
		r.mu.Unlock()
		_ = s.Close()
		return
	default:
		r.server = s
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(r, s, r.client, false) })
	wg.Go(func() { p.pump(r, r.client, s, true) })
	wg.Wait()
}

// pump copies src to dst until either side ends, holding bytes while the
// proxy is stalled and swallowing replies (fromServer) under DropReplies.
func (p *Proxy) pump(r *relay, dst, src net.Conn, fromServer bool) {
	defer r.close(false)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !fromServer {
				p.triggered(buf[:n])
			}
			if !p.pass(r) {
				return
			}
			if fromServer && r.drop.Load() {
				p.dropped.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forget(r *relay) {
	p.mu.Lock()
	delete(p.conns, r)
	p.mu.Unlock()
}

// Close stops listening, closes every connection and waits for the relays to
// end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return nil
	default:
	}
	close(p.closed)
	if p.resetEnd != nil {
		p.resetEnd.Stop()
	}
	rs := make([]*relay, 0, len(p.conns))
	for r := range p.conns {
		rs = append(rs, r)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, r := range rs {
		r.close(false)
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
