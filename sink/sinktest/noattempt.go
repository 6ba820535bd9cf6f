package sinktest

import (
	"fmt"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// Failures that do not count (sink.Failure.NoAttempt): the suite pins down
// that the attempt counter goes back to its value before the claim (a
// takeover's counted expired attempt stays counted), the key goes to pending
// — never dead, Permanent ignored — at NotBefore exactly (due now if it has
// passed; unlike a counted failure, where NotBefore is a floor under the
// backoff), or after the backoff of the restored count when NotBefore is
// zero; the token is not reused, the cause becomes the last error, and a
// stale token is fenced (and counted) like any Fail.

// noAttemptTests are run by Run.
var noAttemptTests = []struct {
	name string
	f    func(t *testing.T, open Opener)
}{
	{"NoAttemptNeverDead", testNoAttemptNeverDead},
	{"NoAttemptKeepsAttempts", testNoAttemptKeepsAttempts},
	{"NoAttemptBackoff", testNoAttemptBackoff},
	{"NoAttemptNotBefore", testNoAttemptNotBefore},
	{"NoAttemptFenced", testNoAttemptFenced},
}

// failNoAttempt claims key and fails the attempt without counting it.
func (e *env) failNoAttempt(key string, f sink.Failure) sink.Claim {
	e.t.Helper()
	c := e.claim(key, time.Minute)
	f.NoAttempt = true
	st, err := e.s.Fail(e.ctx, key, c.Token, f)
	if err != nil || st != sink.StatePending {
		e.t.Fatalf("Fail(NoAttempt, attempt %d) = %s, %v; want pending", c.Attempt, st, err)
	}
	return c
}

func testNoAttemptNeverDead(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 2; o.Rand = FixedRand(0) })
	e.record("k", sink.SourcePoll, "p")
	for i := range 2*2 + 3 {
		// Permanent is ignored: an uncounted failure is never the effect's verdict.
		c := e.failNoAttempt("k", sink.Failure{Cause: fmt.Sprintf("stdout gone %d", i), Permanent: i%2 == 1})
		if c.Attempt != 1 {
			t.Fatalf("claim %d: Attempt = %d, want 1 (no failure counted)", i, c.Attempt)
		}
		en := e.get("k")
		if en.State != sink.StatePending || en.Attempts != 0 || en.LastError != fmt.Sprintf("stdout gone %d", i) {
			t.Fatalf("after uncounted failure %d: %+v, want pending, 0 attempts, last error kept", i, en)
		}
	}
	if st := e.stats(); st.ByState[sink.StateDead] != 0 || st.ByState[sink.StatePending] != 1 {
		t.Fatalf("ByState = %v, want 1 pending, none dead", st.ByState)
	}
}

func testNoAttemptKeepsAttempts(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 3; o.Rand = FixedRand(0) })
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "counted"}); err != nil {
		t.Fatal(err)
	}
	c = e.failNoAttempt("k", sink.Failure{Cause: "uncounted"})
	if c.Attempt != 2 {
		t.Fatalf("Attempt = %d, want 2", c.Attempt)
	}
	if en := e.get("k"); en.Attempts != 1 || en.Token != c.Token {
		t.Fatalf("after an uncounted failure of attempt 2: attempts %d token %d, want 1 and %d (the token never goes back)", en.Attempts, en.Token, c.Token)
	}
	// The counted budget is untouched: attempts 2 and 3 still run, 3 is the last.
	for attempt := 2; attempt <= 3; attempt++ {
		c := e.claim("k", time.Minute)
		if c.Attempt != attempt {
			t.Fatalf("Claim.Attempt = %d, want %d", c.Attempt, attempt)
		}
		st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "counted"})
		want := sink.StatePending
		if attempt == 3 {
			want = sink.StateDead
		}
		if err != nil || st != want {
			t.Fatalf("Fail(attempt %d) = %s, %v; want %s", attempt, st, err, want)
		}
	}
}

func testNoAttemptBackoff(t *testing.T, open Opener) {
	// Rand 0.5, base 10s: the delay after n counted failures is half of
	// 10s·2^(n-1) (n = 0 counts as 1).
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 10 })
	e.record("k", sink.SourcePoll, "p")
	for counted := 0; counted < 4; counted++ {
		now := e.clk.Now()
		e.failNoAttempt("k", sink.Failure{Cause: "uncounted"})
		want := time.Duration(0.5 * float64(10*time.Second<<max(counted-1, 0)))
		en := e.get("k")
		if got := en.NextAttemptAt.Sub(now); got != want || en.Attempts != counted {
			t.Fatalf("after %d counted failures: next attempt in %v with %d attempts, want %v and %d", counted, got, en.Attempts, want, counted)
		}
		e.clk.Set(en.NextAttemptAt.Add(-time.Millisecond))
		_, err := e.s.Claim(e.ctx, "k", "x", time.Minute, sink.ClaimOptions{})
		e.wantErr("Claim before the backoff", err, sink.ErrNotClaimable)
		e.clk.Set(en.NextAttemptAt)
		c := e.claim("k", time.Minute)
		if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "counted"}); err != nil {
			t.Fatal(err)
		}
		e.clk.Set(e.get("k").NextAttemptAt)
	}
}

func testNoAttemptNotBefore(t *testing.T, open Opener) {
	for _, tc := range []struct {
		name      string
		notBefore time.Duration
		want      time.Duration
	}{
		{"shorter than the backoff", time.Second, time.Second}, // NotBefore, not the backoff (5s)
		{"longer than the backoff", time.Hour, time.Hour},
		{"in the past", -time.Hour, 0}, // due now
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, open, nil)
			e.record("k", sink.SourcePoll, "p")
			now := e.clk.Now()
			e.failNoAttempt("k", sink.Failure{Cause: "api unreachable", NotBefore: now.Add(tc.notBefore)})
			en := e.get("k")
			if got := en.NextAttemptAt.Sub(now); got != tc.want || en.Attempts != 0 || en.LastError != "api unreachable" {
				t.Fatalf("next attempt in %v, attempts %d, last error %q; want %v, 0, api unreachable", got, en.Attempts, en.LastError, tc.want)
			}
			if tc.want > 0 {
				e.clk.Set(now.Add(tc.want - time.Millisecond))
				_, err := e.s.Claim(e.ctx, "k", "x", time.Minute, sink.ClaimOptions{})
				e.wantErr("Claim before NotBefore", err, sink.ErrNotClaimable)
			}
			e.clk.Set(now.Add(tc.want))
			if c := e.claim("k", time.Minute); c.Attempt != 1 {
				t.Fatalf("Claim.Attempt = %d, want 1", c.Attempt)
			}
		})
	}
}

func testNoAttemptFenced(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	a := e.claim("k", time.Minute)
	e.clk.Advance(time.Minute)
	b, err := e.s.Claim(e.ctx, "k", "b", time.Minute, sink.ClaimOptions{})
	if err != nil || !b.Takeover || b.Attempt != 2 {
		t.Fatalf("takeover = %+v, %v", b, err)
	}
	_, err = e.s.Fail(e.ctx, "k", a.Token, sink.Failure{Cause: "stale", NoAttempt: true})
	e.wantErr("stale Fail(NoAttempt)", err, sink.ErrFenced)
	if en := e.get("k"); en.State != sink.StateClaimed || en.Token != b.Token || en.Attempts != 2 || en.LastError != "lease expired" {
		t.Fatalf("after a stale uncounted failure Get = %+v, want b's claim untouched", en)
	}
	if st := e.stats(); st.Fenced != 1 {
		t.Fatalf("Stats.Fenced = %d, want 1", st.Fenced)
	}
	// The takeover counted the expired attempt; b's uncounted failure
	// returns to that count, not below it.
	if st, err := e.s.Fail(e.ctx, "k", b.Token, sink.Failure{Cause: "uncounted", NoAttempt: true}); err != nil || st != sink.StatePending {
		t.Fatalf("Fail(NoAttempt) = %s, %v", st, err)
	}
	if en := e.get("k"); en.Attempts != 1 {
		t.Fatalf("attempts = %d, want 1 (the expired attempt counts)", en.Attempts)
	}
	e.wantErr("Fail(NoAttempt) of an unknown key", func() error {
		_, err := e.s.Fail(e.ctx, "nope", 1, sink.Failure{NoAttempt: true})
		return err
	}(), sink.ErrNotFound)
}
