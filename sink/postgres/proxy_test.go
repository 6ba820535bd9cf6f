package postgres

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// proxy is a TCP relay between the sink and the test server that can stop
// delivering the server's replies on the connections open at a given
// moment: the statement runs and commits, and the client never hears so.
type proxy struct {
	ln      net.Listener
	target  string
	dropped atomic.Int64 // reply bytes swallowed

	mu    sync.Mutex
	conns []*relay
	wg    sync.WaitGroup
}

type relay struct {
	client, server net.Conn
	drop           atomic.Bool
}

// startProxy relays 127.0.0.1:random to the host of dsn and returns the
// proxy and dsn rewritten to go through it.
func startProxy(t *testing.T, dsn string) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Skipf("the proxy tests need a URL DSN with a host, got %q", dsn)
	}
	target := u.Host
	if u.Port() == "" {
		target = net.JoinHostPort(u.Hostname(), "5432")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		r := &relay{client: c, server: s}
		p.mu.Lock()
		p.conns = append(p.conns, r)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(s, c)
			_ = s.Close()
		}()
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if r.drop.Load() {
						p.dropped.Add(int64(n))
					} else if _, werr := c.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = c.Close()
		}()
	}
}

// blackhole swallows the server's replies on every connection open now;
// connections made later are relayed normally.
func (p *proxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.conns {
		r.drop.Store(true)
	}
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, r := range p.conns {
		_ = r.client.Close()
		_ = r.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
