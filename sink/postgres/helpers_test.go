package postgres

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/tcpproxy"
	"github.com/gemrecon/gemrecon/sink"
)

// baseDSN returns the test server's DSN or skips the test.
func baseDSN(tb testing.TB) string { tb.Helper(); return pgtest.DSN(tb) }

// adminConn connects to the test server directly (no sink).
func adminConn(tb testing.TB, dsn string) *pgx.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("connect %s: %v", pgtest.EnvDSN, err)
	}
	tb.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// withParam returns dsn with one more parameter (URL or key=value form).
func withParam(dsn, name, value string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(name, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + name + "=" + value
}

// testSchema creates a fresh schema, dropped at cleanup, and returns a DSN
// whose search_path is that schema, and the schema's name.
func testSchema(tb testing.TB) (dsn, schema string) {
	tb.Helper()
	return pgtest.NewSchema(tb)
}

// openTest opens a sink in a fresh schema, closed at cleanup.
func openTest(tb testing.TB, opt sink.Options, opts ...Option) (*Sink, string) {
	tb.Helper()
	dsn, _ := testSchema(tb)
	s := openDSN(tb, dsn, opt, opts...)
	return s, dsn
}

// openDSN opens a sink on dsn, closed at cleanup.
func openDSN(tb testing.TB, dsn string, opt sink.Options, opts ...Option) *Sink {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, opt, opts...)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil && !strings.Contains(err.Error(), "does not exist") {
			tb.Errorf("Close: %v", err)
		}
	})
	return s
}

// lostReplySink opens a sink in a fresh schema through a proxy that can
// drop the server's replies, with one connection: a warm-up call then
// prepares its statement on it, so that the call whose reply is lost sends
// Bind/Execute at once instead of waiting for a Describe reply. dsn is the
// schema's own, not through the proxy.
func lostReplySink(t *testing.T) (s *Sink, p *tcpproxy.Proxy, dsn string) {
	t.Helper()
	dsn, _ = testSchema(t)
	p, pdsn := tcpproxy.ForDSN(t, dsn)
	return openDSN(t, oneConn(pdsn), sink.Options{}), p, dsn
}

// lostCommit makes p drop the server's replies from the next COMMIT s
// sends on, and returns the context for the one call whose commit's answer
// is lost (it ends after 300ms); dropped, called after that call, fails the
// test unless bytes of a reply were dropped (else the test did not exercise
// a lost answer).
func lostCommit(t *testing.T, s *Sink, p *tcpproxy.Proxy) (ctx context.Context, dropped func()) {
	t.Helper()
	hook := p.DropReplies
	s.pg.beforeCommit.Store(&hook)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	t.Cleanup(cancel)
	return ctx, func() {
		t.Helper()
		if p.Dropped() == 0 {
			t.Fatal("no reply bytes were dropped: the test did not exercise a lost reply")
		}
	}
}

// claimedForComplete records sg, claims its key and prepares Complete's
// statement on the sink's one connection (a Complete with a stale token,
// fenced), so that a later Complete whose reply is cut off sends
// Bind/Execute at once instead of waiting for a Describe reply.
func claimedForComplete(ctx context.Context, t *testing.T, s *Sink, sg sink.Sighting) sink.Claim {
	t.Helper()
	if _, err := s.Record(ctx, sg); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, sg.Key, "w", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, sg.Key, c.Token+100); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("warm-up Complete = %v, want ErrFenced", err)
	}
	return c
}

// lockRow begins a transaction on its own connection that holds key's row
// FOR UPDATE (rolled back at cleanup unless committed), and returns it with
// a second connection to watch pg_stat_activity from (waitForLockWait).
func lockRow(ctx context.Context, tb testing.TB, dsn, key string) (pgx.Tx, *pgx.Conn) {
	tb.Helper()
	holder, watcher := adminConn(tb, dsn), adminConn(tb, dsn)
	tx, err := holder.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctx, `SELECT 1 FROM gemrecon_keys WHERE key = $1 FOR UPDATE`, key); err != nil {
		tb.Fatal(err)
	}
	return tx, watcher
}
