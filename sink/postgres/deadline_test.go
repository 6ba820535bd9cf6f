package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/tcpproxy"
	"github.com/gemrecon/gemrecon/sink"
)

func TestRoundTripTimeoutFromStatementTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"":       DefaultStatementTimeout + RoundTripMargin,
		"0":      DefaultStatementTimeout + RoundTripMargin,
		"30000":  30*time.Second + RoundTripMargin,
		"1500ms": 1500*time.Millisecond + RoundTripMargin,
		"'20s'":  20*time.Second + RoundTripMargin,
		"2min":   2*time.Minute + RoundTripMargin,
		"1h":     time.Hour + RoundTripMargin,
		"bogus":  DefaultStatementTimeout + RoundTripMargin,
	} {
		if got := roundTripTimeout(in); got != want {
			t.Errorf("roundTripTimeout(%q) = %v, want %v", in, got, want)
		}
	}
}

// bounded runs op and fails unless it returns an error containing want
// within max (the operation would hang forever without a client-side
// deadline: the test waits at most twice max for it).
func bounded(t *testing.T, what string, max time.Duration, want string, op func() error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		elapsed := time.Since(start)
		if err == nil {
			t.Fatalf("%s against a stalled server succeeded", what)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %q, want it to say %q", what, err, want)
		}
		if elapsed > max {
			t.Fatalf("%s failed after %v, want within %v: %v", what, elapsed, max, err)
		}
		t.Logf("%s: failed after %v: %v", what, elapsed.Round(time.Millisecond), err)
	case <-time.After(2 * max):
		t.Fatalf("%s against a stalled server still running after %v", what, 2*max)
	}
}

// A server that stops answering mid-run (the proxy holds every byte both
// ways and answers no new connection), each operation on a connection
// established before: it fails within the round-trip deadline plus, for a
// write whose outcome is then unknown, the bounded attempts to settle and read
// it back (connect timeouts here, as no new connection is answered either).
// Once the server answers again, the sink works again.
func TestStalledServerFailsWithinTheDeadline(t *testing.T) {
	t.Parallel()
	dsn, _ := testSchema(t)
	p, pdsn := tcpproxy.ForDSN(t, dsn)
	pdsn = withParam(pdsn, "connect_timeout", "1")
	const rt = time.Second
	ctx := context.Background()
	s := openDSN(t, oneConn(pdsn), sink.Options{}, WithRoundTripTimeout(rt))
	key := "gemini:batches/stall"
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "w", time.Hour, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// ready resumes the proxy and waits until the sink's one pooled
	// connection answers again.
	ready := func() {
		t.Helper()
		p.Resume()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := s.Get(ctx, key)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sink does not recover after Resume: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// A read: one round trip. A write: the round trip, then settling (a
	// connection to terminate the backend) and the read-back: connects
	// that time out after 1 s each.
	const readMax, writeMax = rt + 3*time.Second, rt + 6*time.Second
	const noReply = "no reply from the PostgreSQL server within 1s"
	for _, tt := range []struct {
		name string
		max  time.Duration
		op   func() error
	}{
		{"Get", readMax, func() error { _, err := s.Get(ctx, key); return err }},
		{"Stats", readMax, func() error { _, err := s.Stats(ctx); return err }},
		{"Ping", writeMax, func() error { return s.Ping(ctx) }},
		{"Record", writeMax, func() error {
			_, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/stall-new", Source: sink.SourcePoll})
			return err
		}},
		{"ClaimDue", writeMax, func() error { _, err := s.ClaimDue(ctx, "w", time.Minute, 10, sink.ClaimOptions{}); return err }},
		{"Complete", writeMax, func() error { return s.Complete(ctx, key, c.Token) }},
	} {
		ready()
		p.Stall()
		bounded(t, tt.name, tt.max, noReply, tt.op)
	}
	ready()
	if err := s.Complete(ctx, key, c.Token); err != nil {
		t.Fatalf("Complete after the server answers again: %v", err)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateDone {
		t.Fatalf("Get after recovery = %+v, %v", e, err)
	}
}

// A server that accepts TCP and never answers: Open fails within the
// connect timeout (connect_timeout in the DSN), saying so.
func TestStalledConnectFailsWithinTheConnectTimeout(t *testing.T) {
	t.Parallel()
	dsn, _ := testSchema(t)
	p, pdsn := tcpproxy.ForDSN(t, dsn)
	p.Stall()
	for _, ro := range []bool{false, true} {
		bounded(t, "Open", 5*time.Second, "could not connect within the connect timeout of 1s", func() error {
			s, err := Open(context.Background(), withParam(pdsn, "connect_timeout", "1"), sink.Options{ReadOnly: ro})
			if err == nil {
				s.Close()
			}
			return err
		})
	}
	if p.Accepted() == 0 {
		t.Fatal("the proxy accepted no connection: the test did not exercise a stalled connect")
	}
}

// Without connect_timeout in the DSN, DefaultConnectTimeout bounds it.
func TestStalledConnectDefaultTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("takes DefaultConnectTimeout")
	}
	t.Parallel()
	dsn, _ := testSchema(t)
	p, pdsn := tcpproxy.ForDSN(t, dsn)
	p.Stall()
	start := time.Now()
	bounded(t, "Open", DefaultConnectTimeout+5*time.Second, "could not connect within the connect timeout of 10s", func() error {
		s, err := Open(context.Background(), pdsn, sink.Options{})
		if err == nil {
			s.Close()
		}
		return err
	})
	if elapsed := time.Since(start); elapsed < DefaultConnectTimeout {
		t.Fatalf("Open failed after %v, before the connect timeout of %v", elapsed, DefaultConnectTimeout)
	}
}
