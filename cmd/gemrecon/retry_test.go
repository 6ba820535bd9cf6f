package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
)

// retryRace is a real `gemrecon retry --all-dead` child against a private
// PostgreSQL schema holding dead keys, some of them row-locked by the test
// (SELECT … FOR UPDATE in a transaction of their own): the child's listing
// (a plain SELECT) sees them dead, and its UPDATE of a locked key waits
// until the test ends that transaction. So a key can be changed between
// the listing and its retry deterministically, without a test hook.
type retryRace struct {
	t     *testing.T
	ctx   context.Context
	dsn   string
	watch *pgx.Conn // looks at pg_stat_activity
	cmd   *exec.Cmd
	out   testkit.Buffer
	errb  testkit.Buffer
	done  chan error // the child's Wait
}

// lock is one test transaction holding the row lock of one key.
type lock struct {
	key string
	pid uint32 // its backend, the one the child waits for
	tx  pgx.Tx
}

// newRetryRace creates the schema with names dead (one failed attempt
// each, in this order) and returns the harness.
func newRetryRace(t *testing.T, names ...string) *retryRace {
	t.Helper()
	dsn := pgtest.Schema(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := postgres.Open(ctx, dsn, sink.Options{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		k := "gemini:batches/" + n
		if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{"name":"batches/` + n + `"}`)}); err != nil {
			t.Fatal(err)
		}
		c, err := s.Claim(ctx, k, "test", time.Minute, sink.ClaimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := s.Fail(ctx, c.Key, c.Token, sink.Failure{Cause: "the effect failed"}); err != nil || st != sink.StateDead {
			t.Fatalf("Fail(%s) = %s, %v; want dead", k, st, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := &retryRace{t: t, ctx: ctx, dsn: dsn, done: make(chan error, 1)}
	r.watch = r.connect()
	return r
}

func (r *retryRace) connect() *pgx.Conn {
	r.t.Helper()
	c, err := pgx.Connect(r.ctx, r.dsn)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

// lock takes the row lock of gemini:batches/NAME in a transaction of its
// own, held until the caller commits or rolls it back.
func (r *retryRace) lock(name string) *lock {
	r.t.Helper()
	c := r.connect()
	l := &lock{key: "gemini:batches/" + name}
	if err := c.QueryRow(r.ctx, `SELECT pg_backend_pid()`).Scan(&l.pid); err != nil {
		r.t.Fatal(err)
	}
	tx, err := c.Begin(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	var state string
	if err := tx.QueryRow(r.ctx, `SELECT state FROM gemrecon_keys WHERE key = $1 FOR UPDATE`, l.key).Scan(&state); err != nil || state != "dead" {
		r.t.Fatalf("lock %s: state %q, %v; want dead", l.key, state, err)
	}
	l.tx = tx
	return l
}

// start runs gemrecon --db DSN retry --all-dead as a child process.
func (r *retryRace) start() {
	r.t.Helper()
	r.cmd = child(r.t, "--db", r.dsn, "retry", "--all-dead")
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.errb
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = r.cmd.Process.Kill() })
	go func() { r.done <- r.cmd.Wait() }()
}

// waitBlockedBy waits (at most 20s) until the child's retry UPDATE waits
// for one of the locks, and returns that lock and the child's backend.
// The child exiting first fails the test: its listing or its UPDATE did
// not wait, so the race was not arranged.
func (r *retryRace) waitBlockedBy(locks ...*lock) (*lock, uint32) {
	r.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, l := range locks {
			var pid uint32
			var query string
			err := r.watch.QueryRow(r.ctx, `SELECT pid, query FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, l.pid).Scan(&pid, &query)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil {
				r.t.Fatal(err)
			}
			if !strings.Contains(query, "FROM gemrecon_keys WHERE key = $1 FOR UPDATE") {
				r.t.Fatalf("the child waits for the lock of %s in a statement that is not retry's read of the row: %s", l.key, query)
			}
			return l, pid
		}
		select {
		case err := <-r.done:
			r.t.Fatalf("the child ended (%v) before its retry waited for a locked key\nstdout:\n%s\nstderr:\n%s", err, r.out.String(), r.errb.String())
		case <-time.After(10 * time.Millisecond): // polling pg_stat_activity
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the child's retry did not wait for a locked key within 20s\nstdout:\n%s\nstderr:\n%s", r.out.String(), r.errb.String())
		}
	}
}

// wait waits (at most 20s) for the child and returns its exit status.
func (r *retryRace) wait() int {
	r.t.Helper()
	select {
	case err := <-r.done:
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.ExitCode()
		}
		r.t.Fatal(err)
	case <-time.After(20 * time.Second):
		r.t.Fatalf("the child did not end within 20s\nstdout:\n%s\nstderr:\n%s", r.out.String(), r.errb.String())
	}
	return -1
}

// TestRetryAllDeadSkipsKeysNoLongerDead: of three dead keys, one is sent
// back to pending by another operator's retry and one deleted (retried,
// done and purged elsewhere) after retry --all-dead listed them and before
// its turn. Those two are skipped and reported as such, the third is sent
// back, the summary counts 1 sent back and 2 skipped, and the command
// exits 0: every key it listed dead is no longer dead.
func TestRetryAllDeadSkipsKeysNoLongerDead(t *testing.T) {
	r := newRetryRace(t, "b0", "b1", "b2")
	retriedElsewhere, purged := r.lock("b0"), r.lock("b1")
	r.start()
	for pending := []*lock{retriedElsewhere, purged}; len(pending) > 0; {
		l, _ := r.waitBlockedBy(pending...)
		if l == retriedElsewhere {
			// What another operator's `gemrecon retry` writes.
			if _, err := l.tx.Exec(r.ctx, `UPDATE gemrecon_keys SET state = 'pending', next_attempt_at = now(),
				attempts = 0, retries = retries + 1, lease_owner = NULL, lease_until = NULL, dead_reason = ''
				WHERE key = $1`, l.key); err != nil {
				t.Fatal(err)
			}
		} else if _, err := l.tx.Exec(r.ctx, `DELETE FROM gemrecon_keys WHERE key = $1`, l.key); err != nil {
			t.Fatal(err)
		}
		if err := l.tx.Commit(r.ctx); err != nil {
			t.Fatal(err)
		}
		pending = slices.DeleteFunc(pending, func(p *lock) bool { return p == l })
	}
	code := r.wait()
	stdout, stderr := r.out.String(), r.errb.String()
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"gemini:batches/b0: skipped, not dead when its retry ran (now pending)\n",
		"gemini:batches/b1: skipped, not dead when its retry ran (no longer recorded)\n",
		"gemini:batches/b2: pending, due now\n",
		"1 dead key(s) sent back to pending, 2 skipped: no longer dead when retried (another process changed them after the listing)\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if stderr != "" {
		t.Errorf("stderr = %q, want nothing (a skipped key is no error)", stderr)
	}
	// The other operator's retry counted once, not twice; b2 was sent back.
	for k, wantRetries := range map[string]int{"gemini:batches/b0": 1, "gemini:batches/b2": 1} {
		var state string
		var retries int
		if err := r.watch.QueryRow(r.ctx, `SELECT state, retries FROM gemrecon_keys WHERE key = $1`, k).Scan(&state, &retries); err != nil {
			t.Fatal(err)
		}
		if state != "pending" || retries != wantRetries {
			t.Errorf("%s: state %s, retries %d; want pending, %d", k, state, retries, wantRetries)
		}
	}
}

// TestRetryAllDeadDatabaseErrorExits1: a database error during retry
// --all-dead (here its UPDATE, waiting for a locked key, is cancelled by
// the server) is still exit 1, after a summary of what was sent back
// before it.
func TestRetryAllDeadDatabaseErrorExits1(t *testing.T) {
	r := newRetryRace(t, "b0", "b1", "b2")
	l := r.lock("b1")
	r.start()
	_, childPID := r.waitBlockedBy(l)
	var cancelled bool
	if err := r.watch.QueryRow(r.ctx, `SELECT pg_cancel_backend($1)`, childPID).Scan(&cancelled); err != nil || !cancelled {
		t.Fatalf("pg_cancel_backend(%d) = %v, %v", childPID, cancelled, err)
	}
	code := r.wait()
	if err := l.tx.Rollback(r.ctx); err != nil {
		t.Fatal(err)
	}
	stdout, stderr := r.out.String(), r.errb.String()
	if code != 1 {
		t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	// The keys before b1 in the listing were sent back, b1 and those after
	// it were still to go.
	re := regexp.MustCompile(`(?m)^(\d) dead key\(s\) sent back to pending, then an error stopped it with (\d) listed key\(s\) to go$`)
	m := re.FindStringSubmatch(stdout)
	if m == nil || fmt.Sprint(strings.Count(stdout, ": pending, due now\n")) != m[1] || m[1] == "3" || fmt.Sprint(3-strings.Count(stdout, ": pending, due now\n")) != m[2] {
		t.Errorf("stdout does not count what was sent back before the error:\n%s", stdout)
	}
	if !strings.Contains(stderr, "canceling statement due to user request") {
		t.Errorf("stderr does not say what failed:\n%s", stderr)
	}
}
