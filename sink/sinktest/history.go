package sinktest

import (
	"fmt"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The key's history (spec §3 "History"): every attempt from its claim to
// its outcome, with its token, holder, claiming command, start, end and
// error; fenced outcomes and operator actions appended; bounded to
// sink.HistoryKept entries with the older ones counted; gone with the key.
var historyTests = []struct {
	name string
	f    func(*testing.T, Opener)
}{
	{"HistoryOfAttempts", testHistoryOfAttempts},
	{"HistoryTakeoverAndFenced", testHistoryTakeoverAndFenced},
	{"HistoryOperatorActions", testHistoryOperatorActions},
	{"HistoryBounded", testHistoryBounded},
}

// attemptLine renders an entry for comparison: kind token command holder
// outcome error, and its start and end as offsets from the suite's start.
func attemptLine(a sink.Attempt) string {
	end := "-"
	if !a.End.IsZero() {
		end = a.End.Sub(start()).String()
	}
	return fmt.Sprintf("%s %d %s %s %s %q %s..%s", a.Kind, a.Token, a.Command, a.Holder, a.Outcome, a.Error, a.Start.Sub(start()), end)
}

func (e *env) history(key string, want ...string) sink.Entry {
	e.t.Helper()
	en := e.get(key)
	if len(en.History) != len(want) {
		e.t.Fatalf("history of %s has %d entries, want %d:\n%s", key, len(en.History), len(want), historyText(en.History))
	}
	for i, a := range en.History {
		if got := attemptLine(a); got != want[i] {
			e.t.Errorf("history of %s, entry %d = %s\nwant %s", key, i, got, want[i])
		}
	}
	return en
}

func historyText(h []sink.Attempt) string {
	s := ""
	for _, a := range h {
		s += attemptLine(a) + "\n"
	}
	return s
}

func (e *env) claimAs(key, owner, command string) sink.Claim {
	e.t.Helper()
	c, err := e.s.Claim(e.ctx, key, owner, time.Minute, sink.ClaimOptions{Command: command})
	if err != nil {
		e.t.Fatalf("Claim(%s): %v", key, err)
	}
	return c
}

// testHistoryOfAttempts: failed, handed back, interrupted and ok attempts,
// each with its own token; one claimed where it was recorded.
func testHistoryOfAttempts(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claimAs("k", "a", "poll")
	e.clk.Advance(time.Second)
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "exit status 1"}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	c = e.claimAs("k", "b", "drain")
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "not yet", NoAttempt: true}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	c = e.claimAs("k", "b", "drain")
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "interrupted by shutdown", Interrupted: true}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	c = e.claimAs("k", "c", "serve")
	e.clk.Advance(2 * time.Second)
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatal(err)
	}
	e.history("k",
		`attempt 1 poll a failed "exit status 1" 0s..1s`,
		`attempt 2 drain b handed back "not yet" 1h0m1s..1h0m1s`,
		`attempt 3 drain b interrupted "interrupted by shutdown" 2h0m1s..2h0m1s`,
		`attempt 4 serve c ok "" 3h0m1s..3h0m3s`)
	_, rc, err := e.s.RecordAndClaim(e.ctx, sink.Sighting{Key: "n", Source: sink.SourceWebhook},
		sink.ClaimRequest{Owner: "w", Lease: time.Minute, Opts: sink.ClaimOptions{Command: "serve"}})
	if err != nil || rc == nil {
		t.Fatalf("RecordAndClaim(n) = %v, %v", rc, err)
	}
	e.history("n", `attempt 1 serve w running "" 3h0m3s..-`)
}

// testHistoryTakeoverAndFenced: a takeover ends the expired attempt at its
// lease's end; a stale holder's outcome is appended as a fenced entry and
// changes nothing of the current attempt's.
func testHistoryTakeoverAndFenced(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	old := e.claimAs("k", "a", "poll")
	e.clk.Advance(time.Minute)
	cur := e.claimAs("k", "b", "serve")
	if err := e.s.Complete(e.ctx, "k", old.Token); err == nil {
		t.Fatal("stale Complete = nil, want ErrFenced")
	}
	e.history("k",
		`attempt 1 poll a lease expired "" 0s..1m0s`,
		`attempt 2 serve b running "" 1m0s..-`,
		`fenced 1   fenced "complete" 1m0s..1m0s`)
	if err := e.s.Complete(e.ctx, "k", cur.Token); err != nil {
		t.Fatal(err)
	}
	e.history("k",
		`attempt 1 poll a lease expired "" 0s..1m0s`,
		`attempt 2 serve b ok "" 1m0s..1m0s`,
		`fenced 1   fenced "complete" 1m0s..1m0s`)
}

// testHistoryOperatorActions: retry and rerun are on record with who asked.
func testHistoryOperatorActions(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 1 })
	e.record("k", sink.SourcePoll, "p")
	c := e.claimAs("k", "a", "poll")
	if st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "boom"}); err != nil || st != sink.StateDead {
		t.Fatalf("Fail = %s, %v; want dead", st, err)
	}
	if err := e.s.Retry(e.ctx, "k", sink.RetryOptions{By: "ops@host"}); err != nil {
		t.Fatal(err)
	}
	c = e.claimAs("k", "a", "drain")
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatal(err)
	}
	e.wantErr("Retry of a done key", e.s.Retry(e.ctx, "k", sink.RetryOptions{}), sink.ErrNotDead)
	e.wantErr("Rerun of an unknown key", e.s.Retry(e.ctx, "nope", sink.RetryOptions{Rerun: true}), sink.ErrNotFound)
	if err := e.s.Retry(e.ctx, "k", sink.RetryOptions{Rerun: true, By: "me@there"}); err != nil {
		t.Fatal(err)
	}
	e.wantErr("Rerun of a pending key", e.s.Retry(e.ctx, "k", sink.RetryOptions{Rerun: true}), sink.ErrNotDone)
	c = e.claimAs("k", "a", "poll")
	if c.Token != 3 || c.Attempt != 1 || !c.Rerun {
		t.Fatalf("claim after a rerun = token %d, attempt %d, rerun %v; want 3, 1, true", c.Token, c.Attempt, c.Rerun)
	}
	en := e.history("k",
		`attempt 1 poll a failed "boom" 0s..0s`,
		`retry 1  ops@host  "" 0s..-`,
		`attempt 2 drain a ok "" 0s..0s`,
		`rerun 2  me@there  "" 0s..-`,
		`attempt 3 poll a running "" 0s..-`)
	if en.Reruns != 1 {
		t.Errorf("Reruns = %d, want 1", en.Reruns)
	}
}

// testHistoryBounded: the last sink.HistoryKept entries are kept and the
// older ones counted; a purged key's history goes with it.
func testHistoryBounded(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 100 })
	e.record("k", sink.SourcePoll, "p")
	n := sink.HistoryKept + 5
	for range n {
		c := e.claimAs("k", "a", "poll")
		if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "x", NoAttempt: true, NotBefore: e.clk.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	en := e.get("k")
	if len(en.History) != sink.HistoryKept || en.Dropped != n-sink.HistoryKept {
		t.Fatalf("history: %d entries, %d dropped; want %d and %d", len(en.History), en.Dropped, sink.HistoryKept, n-sink.HistoryKept)
	}
	if first := en.History[0].Token; first != int64(n-sink.HistoryKept+1) {
		t.Fatalf("oldest kept entry has token %d, want %d", first, n-sink.HistoryKept+1)
	}
	c := e.claimAs("k", "a", "poll")
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	if keys, err := e.s.Purge(e.ctx, time.Minute); err != nil || len(keys) != 1 {
		t.Fatalf("Purge = %q, %v", keys, err)
	}
	e.record("k", sink.SourcePoll, "p")
	if en := e.get("k"); len(en.History) != 0 || en.Dropped != 0 {
		t.Fatalf("history of a purged key seen again = %d entries, %d dropped; want none", len(en.History), en.Dropped)
	}
}
