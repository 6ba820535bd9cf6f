package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// errPoolClosed is returned by acquire after close.
var errPoolClosed = errors.New("postgres: sink is closed")

// pool is a small bounded pool of pgx connections.
//
// pgxpool would do, but it needs github.com/jackc/puddle/v2, which the
// module's go.sum does not list; this is the few lines of it the sink needs:
// a bound on open connections, idle reuse, and discarding any connection
// that is closed, busy or inside a transaction when it comes back.
type pool struct {
	cfg *pgx.ConnConfig
	sem chan struct{} // one slot per connection in use
	// checkIdleAfter: a connection idle longer than this is pinged before
	// use, so that one the server or the network dropped is replaced rather
	// than failing (or, for a write, leaving its outcome unknown).
	checkIdleAfter time.Duration

	mu     sync.Mutex
	idle   []idleConn
	closed bool
}

// idleConn is a pooled connection and when it was last given back.
type idleConn struct {
	c     *pgx.Conn
	since time.Time
}

// defaultCheckIdleAfter is pool.checkIdleAfter unless a test changes it.
const defaultCheckIdleAfter = 30 * time.Second

func newPool(cfg *pgx.ConnConfig, maxConns int) *pool {
	if maxConns < 1 {
		maxConns = 1
	}
	return &pool{cfg: cfg, sem: make(chan struct{}, maxConns), checkIdleAfter: defaultCheckIdleAfter}
}

// acquire returns an idle connection or dials a new one, waiting for a free
// slot while maxConns are in use.
func (p *pool) acquire(ctx context.Context) (*pgx.Conn, error) {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.sem
		return nil, errPoolClosed
	}
	var ic idleConn
	if n := len(p.idle); n > 0 {
		ic = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}
	p.mu.Unlock()
	if ic.c != nil {
		if time.Since(ic.since) < p.checkIdleAfter || ic.c.Ping(ctx) == nil {
			return ic.c, nil
		}
		closeConn(ic.c)
	}
	c, err := pgx.ConnectConfig(ctx, p.cfg)
	if err != nil {
		<-p.sem
		return nil, err
	}
	return c, nil
}

// release returns c to the pool, or closes it when it is not reusable.
func (p *pool) release(c *pgx.Conn) {
	defer func() { <-p.sem }()
	if c.IsClosed() || c.PgConn().IsBusy() || c.PgConn().TxStatus() != 'I' {
		closeConn(c)
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		closeConn(c)
		return
	}
	p.idle = append(p.idle, idleConn{c: c, since: time.Now()})
	p.mu.Unlock()
}

// close closes idle connections; connections in use are closed on release.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.closed = true
	p.mu.Unlock()
	for _, ic := range idle {
		closeConn(ic.c)
	}
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}
