package sinktest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The pass records and pass lease of spec §5.5 (sink.Passes). Choices the
// suite pins down, which every backend shares:
//   - A pass lease is live while now < until, as a key's lease; at until it
//     has expired and another owner takes it over (token + 1).
//   - Every acquisition increments the scope's token, including one by the
//     owner that already holds the lease (its earlier lease is then fenced).
//   - ErrPassHeld is checked before ErrPassRecent; the minimum interval is
//     measured from when the last pass was recorded (EndPass), by the
//     sink's clock, not from the end time the pass reported, and a recorded
//     time ahead of the clock (the clock went back) does not count as recent.
//   - RenewPass and EndPass need the current token and owner of a lease not
//     yet ended (EndPass ends it: a second EndPass or a renewal after it is
//     ErrFenced); like a key's Renew, they still succeed after the lease
//     expired as long as nobody took it over. A scope without a record is
//     ErrNotFound.
//   - EndPass with token 0 records without touching the lease; an
//     unsuccessful or partial pass leaves LastSuccess and LastFullScan as
//     they were.
//   - Empty or oversized scopes and owners, text with NUL, non-positive
//     leases, negative tokens, an outcome without times and RenewPass of
//     token 0 are errors, none of them ErrPassHeld/ErrPassRecent/ErrFenced.

// passTests are run by Run.
var passTests = []struct {
	name string
	f    func(t *testing.T, open Opener)
}{
	{"PassAcquire", testPassAcquire},
	{"PassTakeoverAfterExpiry", testPassTakeoverAfterExpiry},
	{"PassSameOwner", testPassSameOwner},
	{"PassRecent", testPassRecent},
	{"PassRecentClockBack", testPassRecentClockBack},
	{"PassRecentByRecordTime", testPassRecentByRecordTime},
	{"PassRenew", testPassRenew},
	{"PassFencedRenew", testPassFencedRenew},
	{"PassEnd", testPassEnd},
	{"PassFencedEnd", testPassFencedEnd},
	{"PassZeroToken", testPassZeroToken},
	{"PassScopesIndependent", testPassScopesIndependent},
	{"PassRecordsOrdered", testPassRecordsOrdered},
	{"PassBadInput", testPassBadInput},
	{"PassConcurrentAcquire", testPassConcurrentAcquire},
	{"PassUnfinished", testPassUnfinished},
}

func (e *env) acquire(scope, owner string, lease, minInterval time.Duration) (sink.PassLease, sink.PassRecord) {
	e.t.Helper()
	l, r, err := e.s.AcquirePass(e.ctx, scope, owner, lease, minInterval)
	if err != nil {
		e.t.Fatalf("AcquirePass(%q, %q) error: %v", scope, owner, err)
	}
	if l.Scope != scope || l.Owner != owner || l.Token < 1 || !l.Until.Equal(e.clk.Now().Add(lease)) {
		e.t.Fatalf("AcquirePass(%q, %q) = %+v, want the lease until %v", scope, owner, l, e.clk.Now().Add(lease))
	}
	if r.Scope != scope || r.Holder != owner || r.Token != l.Token || !r.HeldUntil.Equal(l.Until) {
		e.t.Fatalf("AcquirePass(%q, %q) record = %+v, want held by it with token %d", scope, owner, r, l.Token)
	}
	return l, r
}

func (e *env) passRecord(scope string) (sink.PassRecord, bool) {
	e.t.Helper()
	recs, err := e.s.PassRecords(e.ctx)
	if err != nil {
		e.t.Fatalf("PassRecords: %v", err)
	}
	for _, r := range recs {
		if r.Scope == scope {
			return r, true
		}
	}
	return sink.PassRecord{}, false
}

func (e *env) mustPassRecord(scope string) sink.PassRecord {
	e.t.Helper()
	r, ok := e.passRecord(scope)
	if !ok {
		e.t.Fatalf("PassRecords has no record of %q", scope)
	}
	return r
}

// samePass compares records by instant (Equal), not by representation.
func samePass(a, b sink.PassRecord) bool {
	return a.Scope == b.Scope && a.LastStart.Equal(b.LastStart) && a.LastEnd.Equal(b.LastEnd) &&
		a.LastHolder == b.LastHolder && a.LastSuccess.Equal(b.LastSuccess) && a.LastFullScan.Equal(b.LastFullScan) &&
		a.Holder == b.Holder && a.HeldUntil.Equal(b.HeldUntil) && a.Token == b.Token
}

func (e *env) endPass(l sink.PassLease, o sink.PassOutcome) {
	e.t.Helper()
	if err := e.s.EndPass(e.ctx, l, o); err != nil {
		e.t.Fatalf("EndPass(%+v) error: %v", l, err)
	}
}

func testPassAcquire(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	if recs, err := e.s.PassRecords(e.ctx); err != nil || recs == nil || len(recs) != 0 {
		t.Fatalf("PassRecords(empty) = %#v, %v; want an empty, non-nil slice", recs, err)
	}
	if st := e.stats(); st.Passes == nil || len(st.Passes) != 0 {
		t.Fatalf("Stats.Passes(empty) = %#v, want an empty, non-nil slice", st.Passes)
	} else if b, _ := json.Marshal(st); !strings.Contains(string(b), `"passes":[]`) {
		t.Fatalf("Stats JSON = %s, want \"passes\":[]", b)
	}
	l, _ := e.acquire("gemini|https://api|abc", "a", time.Minute, 0)
	if l.Token != 1 {
		t.Fatalf("first AcquirePass token = %d, want 1", l.Token)
	}
	e.clk.Advance(10 * time.Second)
	_, r, err := e.s.AcquirePass(e.ctx, "gemini|https://api|abc", "b", time.Minute, 0)
	e.wantErr("AcquirePass(held)", err, sink.ErrPassHeld)
	if r.Holder != "a" || !r.HeldUntil.Equal(start().Add(time.Minute)) || r.Token != 1 {
		t.Fatalf("AcquirePass(held) record = %+v, want held by a until %v, token 1", r, start().Add(time.Minute))
	}
	// ErrPassHeld wins over ErrPassRecent, whatever the interval.
	_, _, err = e.s.AcquirePass(e.ctx, "gemini|https://api|abc", "b", time.Minute, time.Hour)
	e.wantErr("AcquirePass(held, with an interval)", err, sink.ErrPassHeld)
	got := e.mustPassRecord("gemini|https://api|abc")
	if got.Holder != "a" || got.Token != 1 || !got.LastStart.IsZero() || !got.LastEnd.IsZero() || got.LastHolder != "" {
		t.Fatalf("PassRecords = %+v, want held by a, no pass recorded yet", got)
	}
	st := e.stats()
	if len(st.Passes) != 1 || !samePass(st.Passes[0], got) {
		t.Fatalf("Stats.Passes = %+v, want [%+v]", st.Passes, got)
	}
}

func testPassTakeoverAfterExpiry(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	lease := 30 * time.Second
	a, _ := e.acquire("s", "a", lease, 0)
	e.clk.Set(start().Add(lease - time.Millisecond))
	_, _, err := e.s.AcquirePass(e.ctx, "s", "b", lease, 0)
	e.wantErr("AcquirePass at until-1ms", err, sink.ErrPassHeld)
	e.clk.Set(start().Add(lease))
	b, _ := e.acquire("s", "b", lease, 0)
	if b.Token != a.Token+1 {
		t.Fatalf("takeover token = %d, want %d", b.Token, a.Token+1)
	}
	_, err = e.s.RenewPass(e.ctx, a, lease)
	e.wantErr("RenewPass by the expired holder", err, sink.ErrFenced)
	_, _, err = e.s.AcquirePass(e.ctx, "s", "a", lease, 0)
	e.wantErr("AcquirePass by the expired holder", err, sink.ErrPassHeld)
	if r := e.mustPassRecord("s"); r.Holder != "b" || r.Token != b.Token {
		t.Fatalf("PassRecords = %+v, want held by b", r)
	}
}

func testPassSameOwner(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	first, _ := e.acquire("s", "a", time.Minute, 0)
	e.clk.Advance(time.Second)
	second, _ := e.acquire("s", "a", time.Minute, 0)
	if second.Token != first.Token+1 {
		t.Fatalf("AcquirePass again by the holder: token %d, want %d", second.Token, first.Token+1)
	}
	_, err := e.s.RenewPass(e.ctx, first, time.Minute)
	e.wantErr("RenewPass of the superseded lease", err, sink.ErrFenced)
	e.wantErr("EndPass of the superseded lease",
		e.s.EndPass(e.ctx, first, sink.PassOutcome{Start: start(), End: e.clk.Now()}), sink.ErrFenced)
	e.endPass(second, sink.PassOutcome{Start: start(), End: e.clk.Now()})
}

func testPassRecent(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	// No pass recorded yet: an interval does not stop the first one.
	l, _ := e.acquire("s", "a", time.Minute, time.Hour)
	passStart := e.clk.Now()
	end := e.clk.Advance(5 * time.Second)
	e.endPass(l, sink.PassOutcome{Start: passStart, End: end, Success: true})

	e.clk.Set(end.Add(time.Minute - time.Millisecond))
	_, r, err := e.s.AcquirePass(e.ctx, "s", "b", time.Minute, time.Minute)
	e.wantErr("AcquirePass within the interval", err, sink.ErrPassRecent)
	if !r.LastEnd.Equal(end) || r.LastHolder != "a" || r.Holder != "" {
		t.Fatalf("AcquirePass(recent) record = %+v, want last end %v by a, free", r, end)
	}
	// The one that ran the last pass is held to the interval as well.
	_, _, err = e.s.AcquirePass(e.ctx, "s", "a", time.Minute, time.Minute)
	e.wantErr("AcquirePass within the interval by the last holder", err, sink.ErrPassRecent)
	// Without an interval (cron poll) or with a negative one, only the lease counts.
	for _, d := range []time.Duration{0, -time.Minute} {
		l2, _ := e.acquire("s", "c", time.Minute, d)
		e.endPass(l2, sink.PassOutcome{Start: end, End: end})
		e.clk.Set(end.Add(time.Minute - time.Millisecond))
	}
	// The interval counts from the last recorded pass (the clock read
	// end+1m-1ms when c's passes were recorded).
	recorded := end.Add(time.Minute - time.Millisecond)
	e.clk.Set(recorded.Add(time.Minute - time.Millisecond))
	_, _, err = e.s.AcquirePass(e.ctx, "s", "b", time.Minute, time.Minute)
	e.wantErr("AcquirePass within the interval of the latest pass", err, sink.ErrPassRecent)
	e.clk.Set(recorded.Add(time.Minute))
	e.acquire("s", "b", time.Minute, time.Minute)
}

func testPassRecentClockBack(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	l, _ := e.acquire("s", "a", time.Minute, 0)
	e.endPass(l, sink.PassOutcome{Start: start(), End: start()})
	// The clock went back an hour: a pass recorded "in the future" does not
	// hold the fleet off until the clock catches up.
	e.clk.Set(start().Add(-time.Hour))
	e.acquire("s", "b", time.Minute, 10*time.Minute)
}

func testPassRecentByRecordTime(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	l, _ := e.acquire("s", "a", time.Minute, 0)
	// The pass's process reports times two hours behind the sink's clock (a
	// host whose clock is off): the interval counts from when the sink
	// recorded the pass, by its own clock, not from the reported end.
	skewed := e.clk.Now().Add(-2 * time.Hour)
	e.endPass(l, sink.PassOutcome{Start: skewed, End: skewed.Add(time.Second), Success: true})
	if r := e.mustPassRecord("s"); !r.LastEnd.Equal(skewed.Add(time.Second)) || !r.LastSuccess.Equal(skewed.Add(time.Second)) {
		t.Fatalf("PassRecords = %+v, want the reported times as given", r)
	}
	e.clk.Advance(30 * time.Second)
	_, _, err := e.s.AcquirePass(e.ctx, "s", "b", time.Minute, time.Minute)
	e.wantErr("AcquirePass 30s after a pass reported as 2h old", err, sink.ErrPassRecent)
	e.clk.Advance(30 * time.Second)
	e.acquire("s", "b", time.Minute, time.Minute)
}

func testPassRenew(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	l, _ := e.acquire("s", "a", 10*time.Second, 0)
	e.clk.Advance(9 * time.Second)
	nl, err := e.s.RenewPass(e.ctx, l, 10*time.Second)
	if err != nil {
		t.Fatalf("RenewPass: %v", err)
	}
	want := start().Add(19 * time.Second)
	if nl.Token != l.Token || nl.Owner != "a" || nl.Scope != "s" || !nl.Until.Equal(want) {
		t.Fatalf("RenewPass = %+v, want token %d until %v", nl, l.Token, want)
	}
	if r := e.mustPassRecord("s"); !r.HeldUntil.Equal(want) || r.Holder != "a" {
		t.Fatalf("PassRecords = %+v, want held by a until %v", r, want)
	}
	e.clk.Set(want.Add(-time.Millisecond))
	_, _, err = e.s.AcquirePass(e.ctx, "s", "b", time.Minute, 0)
	e.wantErr("AcquirePass before the renewed lease ends", err, sink.ErrPassHeld)
	// Renewing with the lease it was renewed to, or the one it was acquired
	// with: the token is what matters.
	if _, err := e.s.RenewPass(e.ctx, l, time.Second); err != nil {
		t.Fatalf("RenewPass with the first lease value: %v", err)
	}
	// After it expired, the current token may still renew while nobody took over.
	e.clk.Advance(time.Hour)
	if nl, err = e.s.RenewPass(e.ctx, nl, time.Minute); err != nil || !nl.Until.Equal(e.clk.Now().Add(time.Minute)) {
		t.Fatalf("RenewPass after expiry without takeover = %+v, %v", nl, err)
	}
	_, err = e.s.RenewPass(e.ctx, sink.PassLease{Scope: "nope", Owner: "a", Token: 1}, time.Minute)
	e.wantErr("RenewPass(unknown scope)", err, sink.ErrNotFound)
	_, err = e.s.RenewPass(e.ctx, sink.PassLease{Scope: "s", Owner: "a", Token: 0}, time.Minute)
	if err == nil || errors.Is(err, sink.ErrFenced) {
		t.Fatalf("RenewPass(token 0) error = %v, want an error that is not ErrFenced", err)
	}
}

func testPassFencedRenew(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	a, _ := e.acquire("s", "a", time.Minute, 0)
	for _, bad := range []sink.PassLease{
		{Scope: "s", Owner: "a", Token: a.Token + 1}, // a token not yet granted
		{Scope: "s", Owner: "z", Token: a.Token},     // another owner's lease
	} {
		_, err := e.s.RenewPass(e.ctx, bad, time.Minute)
		e.wantErr(fmt.Sprintf("RenewPass(%+v)", bad), err, sink.ErrFenced)
	}
	e.clk.Advance(time.Minute)
	b, _ := e.acquire("s", "b", time.Minute, 0)
	_, err := e.s.RenewPass(e.ctx, a, time.Minute)
	e.wantErr("RenewPass after a takeover", err, sink.ErrFenced)
	if r := e.mustPassRecord("s"); r.Holder != "b" || r.Token != b.Token || !r.HeldUntil.Equal(b.Until) {
		t.Fatalf("PassRecords after a fenced renewal = %+v, want b's lease untouched", r)
	}
	e.endPass(b, sink.PassOutcome{Start: e.clk.Now(), End: e.clk.Now()})
	_, err = e.s.RenewPass(e.ctx, b, time.Minute)
	e.wantErr("RenewPass after EndPass", err, sink.ErrFenced)
}

func testPassEnd(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	l, _ := e.acquire("s", "a", time.Minute, 0)
	s1 := e.clk.Now()
	e1 := e.clk.Advance(7 * time.Second)
	e.endPass(l, sink.PassOutcome{Start: s1, End: e1, Success: true, FullScan: true})
	want := sink.PassRecord{Scope: "s", LastStart: s1, LastEnd: e1, LastHolder: "a", LastSuccess: e1, LastFullScan: s1, Token: l.Token}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords after EndPass = %+v, want %+v", r, want)
	}
	e.wantErr("second EndPass", e.s.EndPass(e.ctx, l, sink.PassOutcome{Start: e1, End: e1}), sink.ErrFenced)
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords after a fenced EndPass = %+v, want %+v", r, want)
	}

	// The lease is free at once; a failed, partial pass moves only its own times.
	b, _ := e.acquire("s", "b", time.Minute, 0)
	if b.Token != l.Token+1 {
		t.Fatalf("AcquirePass after EndPass token = %d, want %d", b.Token, l.Token+1)
	}
	s2 := e.clk.Advance(time.Minute)
	e2 := e.clk.Advance(2 * time.Minute) // past the lease: nobody took over, so it still ends
	e.endPass(b, sink.PassOutcome{Start: s2, End: e2})
	want = sink.PassRecord{Scope: "s", LastStart: s2, LastEnd: e2, LastHolder: "b", LastSuccess: e1, LastFullScan: s1, Token: b.Token}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords after a failed pass = %+v, want %+v", r, want)
	}
	// Success without a full scan, and a full scan that did not succeed.
	c, _ := e.acquire("s", "c", time.Minute, 0)
	s3, e3 := e.clk.Now(), e.clk.Advance(time.Second)
	e.endPass(c, sink.PassOutcome{Start: s3, End: e3, Success: true})
	d, _ := e.acquire("s", "d", time.Minute, 0)
	s4, e4 := e.clk.Now(), e.clk.Advance(time.Second)
	e.endPass(d, sink.PassOutcome{Start: s4, End: e4, FullScan: true})
	want = sink.PassRecord{Scope: "s", LastStart: s4, LastEnd: e4, LastHolder: "d", LastSuccess: e3, LastFullScan: s4, Token: d.Token}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords = %+v, want %+v", r, want)
	}
	// An end before the start (the wall clock went back mid-pass) is kept as given.
	f, _ := e.acquire("s", "f", time.Minute, 0)
	e.endPass(f, sink.PassOutcome{Start: e4, End: s4})
	if r := e.mustPassRecord("s"); !r.LastStart.Equal(e4) || !r.LastEnd.Equal(s4) {
		t.Fatalf("PassRecords = %+v, want start %v end %v as given", r, e4, s4)
	}
	if st := e.stats(); st.Fenced != 0 {
		t.Fatalf("Stats.Fenced = %d after a fenced EndPass, want 0 (it counts key outcomes only)", st.Fenced)
	}
}

func testPassFencedEnd(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	a, _ := e.acquire("s", "a", time.Minute, 0)
	e.clk.Advance(time.Minute)
	b, _ := e.acquire("s", "b", time.Minute, 0)
	err := e.s.EndPass(e.ctx, a, sink.PassOutcome{Start: start(), End: e.clk.Now(), Success: true, FullScan: true})
	e.wantErr("EndPass after a takeover", err, sink.ErrFenced)
	want := sink.PassRecord{Scope: "s", Holder: "b", HeldUntil: b.Until, Token: b.Token}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords after a fenced EndPass = %+v, want nothing recorded: %+v", r, want)
	}
	err = e.s.EndPass(e.ctx, sink.PassLease{Scope: "s", Owner: "z", Token: b.Token}, sink.PassOutcome{Start: start(), End: e.clk.Now()})
	e.wantErr("EndPass with the right token by another owner", err, sink.ErrFenced)
	err = e.s.EndPass(e.ctx, sink.PassLease{Scope: "nope", Owner: "a", Token: 3}, sink.PassOutcome{Start: start(), End: e.clk.Now()})
	e.wantErr("EndPass(unknown scope)", err, sink.ErrNotFound)
	if _, ok := e.passRecord("nope"); ok {
		t.Fatal("EndPass(unknown scope) created a record")
	}
	e.endPass(b, sink.PassOutcome{Start: start(), End: e.clk.Now()})
}

func testPassZeroToken(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	// A forced pass on a scope never seen: the record is created, no lease.
	s1, e1 := e.clk.Now(), e.clk.Advance(time.Second)
	e.endPass(sink.PassLease{Scope: "s", Owner: "forced"}, sink.PassOutcome{Start: s1, End: e1, Success: true, FullScan: true})
	want := sink.PassRecord{Scope: "s", LastStart: s1, LastEnd: e1, LastHolder: "forced", LastSuccess: e1, LastFullScan: s1}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords after a zero-token EndPass = %+v, want %+v", r, want)
	}
	// While another holds the lease, a forced pass records and leaves the lease alone.
	b, _ := e.acquire("s", "b", time.Minute, 0)
	if b.Token != 1 {
		t.Fatalf("first acquisition token = %d, want 1", b.Token)
	}
	s2, e2 := e.clk.Now(), e.clk.Advance(time.Second)
	e.endPass(sink.PassLease{Scope: "s", Owner: "forced"}, sink.PassOutcome{Start: s2, End: e2})
	want = sink.PassRecord{Scope: "s", LastStart: s2, LastEnd: e2, LastHolder: "forced", LastSuccess: e1, LastFullScan: s1,
		Holder: "b", HeldUntil: b.Until, Token: b.Token}
	if r := e.mustPassRecord("s"); !samePass(r, want) {
		t.Fatalf("PassRecords = %+v, want %+v", r, want)
	}
	if _, err := e.s.RenewPass(e.ctx, b, time.Minute); err != nil {
		t.Fatalf("RenewPass after a forced pass: %v", err)
	}
	e.endPass(b, sink.PassOutcome{Start: s2, End: e.clk.Now()})
}

func testPassScopesIndependent(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	a, _ := e.acquire("gemini|https://a|k1", "x", time.Minute, 0)
	b, _ := e.acquire("gemini|https://a|k2", "y", time.Minute, 0)
	if a.Token != 1 || b.Token != 1 {
		t.Fatalf("tokens = %d, %d; want 1 each (per scope)", a.Token, b.Token)
	}
	e.endPass(a, sink.PassOutcome{Start: start(), End: e.clk.Now()})
	// A recent pass of one scope does not hold off the other.
	_, _, err := e.s.AcquirePass(e.ctx, "gemini|https://a|k1", "y", time.Minute, time.Hour)
	e.wantErr("AcquirePass(recent scope)", err, sink.ErrPassRecent)
	if _, err := e.s.RenewPass(e.ctx, b, time.Minute); err != nil {
		t.Fatalf("RenewPass of the other scope: %v", err)
	}
	if r := e.mustPassRecord("gemini|https://a|k2"); r.Holder != "y" || !r.LastEnd.IsZero() {
		t.Fatalf("the other scope's record = %+v, want held by y, no pass", r)
	}
	_, err = e.s.RenewPass(e.ctx, sink.PassLease{Scope: "gemini|https://a|k2", Owner: "x", Token: a.Token}, time.Minute)
	e.wantErr("RenewPass with a token of another scope", err, sink.ErrFenced)
}

func testPassRecordsOrdered(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	// Byte order, whatever the database's collation: "B" < "a" < "a b" < "a/b" < "ä".
	for _, scope := range []string{"ä", "a/b", "B", "a b", "a"} {
		l, _ := e.acquire(scope, "o", time.Minute, 0)
		e.endPass(l, sink.PassOutcome{Start: start(), End: start()})
	}
	recs, err := e.s.PassRecords(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Scope)
	}
	want := []string{"B", "a", "a b", "a/b", "ä"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("PassRecords scopes = %q, want %q", got, want)
	}
	st := e.stats()
	if len(st.Passes) != len(recs) {
		t.Fatalf("Stats.Passes = %+v, want %+v", st.Passes, recs)
	}
	for i := range recs {
		if !samePass(st.Passes[i], recs[i]) {
			t.Fatalf("Stats.Passes[%d] = %+v, want %+v", i, st.Passes[i], recs[i])
		}
	}
}

func testPassBadInput(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	long := strings.Repeat("x", 1025)
	domain := []error{sink.ErrPassHeld, sink.ErrPassRecent, sink.ErrFenced, sink.ErrNotFound}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		for _, d := range domain {
			if errors.Is(err, d) {
				t.Fatalf("%s error = %v, want a plain input error, not %v", what, err, d)
			}
		}
	}
	for _, tc := range []struct {
		scope, owner string
		lease        time.Duration
	}{
		{"", "o", time.Minute},
		{"s", "", time.Minute},
		{"s", "o", 0},
		{"s", "o", -time.Second},
		{"s\x00t", "o", time.Minute},
		{"s", "o\x00", time.Minute},
		{"s\xff", "o", time.Minute},
		{long, "o", time.Minute},
		{"s", long, time.Minute},
	} {
		_, _, err := e.s.AcquirePass(e.ctx, tc.scope, tc.owner, tc.lease, 0)
		check(fmt.Sprintf("AcquirePass(%.20q, %.20q, %v)", tc.scope, tc.owner, tc.lease), err)
	}
	l, _ := e.acquire("s", "o", time.Minute, 0)
	for _, lease := range []time.Duration{0, -time.Second} {
		_, err := e.s.RenewPass(e.ctx, l, lease)
		check(fmt.Sprintf("RenewPass(lease %v)", lease), err)
	}
	neg := l
	neg.Token = -1
	_, err := e.s.RenewPass(e.ctx, neg, time.Minute)
	check("RenewPass(token -1)", err)
	check("EndPass(token -1)", e.s.EndPass(e.ctx, neg, sink.PassOutcome{Start: start(), End: start()}))
	check("EndPass(no times)", e.s.EndPass(e.ctx, l, sink.PassOutcome{}))
	check("EndPass(no end)", e.s.EndPass(e.ctx, l, sink.PassOutcome{Start: start()}))
	check("EndPass(empty scope)", e.s.EndPass(e.ctx, sink.PassLease{Owner: "o"}, sink.PassOutcome{Start: start(), End: start()}))
	// None of them changed anything: the lease is still held and ends normally.
	if r := e.mustPassRecord("s"); r.Holder != "o" || r.Token != l.Token || !r.LastEnd.IsZero() {
		t.Fatalf("PassRecords after bad input = %+v, want o's lease untouched", r)
	}
	if recs, _ := e.s.PassRecords(e.ctx); len(recs) != 1 {
		t.Fatalf("PassRecords = %+v, want only s", recs)
	}
	e.endPass(l, sink.PassOutcome{Start: start(), End: start()})
}

func testPassConcurrentAcquire(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	tokens, errs := race8(sink.ErrPassHeld, func(owner string) (int64, error) {
		l, _, err := e.s.AcquirePass(e.ctx, "s", owner, time.Minute, 0)
		return l.Token, err
	})
	if len(tokens) != 1 || tokens[0] != 1 || len(errs) != 0 {
		t.Fatalf("8 concurrent AcquirePass granted tokens %v with errors %v, want exactly token 1", tokens, errs)
	}
}

// testPassUnfinished: what a pass listed unfinished is kept with the scope's
// record (for stats in any process); a pass whose listing failed (no
// figures) keeps the last ones; an empty count replaces them.
func testPassUnfinished(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	oldest := start().Add(-30 * time.Hour)
	l, _ := e.acquire("s", "a", time.Minute, 0)
	e.endPass(l, sink.PassOutcome{Start: e.clk.Now(), End: e.clk.Now(), Unfinished: map[string]int64{"PENDING": 3, "RUNNING": 1}, OldestUnfinished: oldest})
	r := e.mustPassRecord("s")
	if r.Unfinished["PENDING"] != 3 || r.Unfinished["RUNNING"] != 1 || len(r.Unfinished) != 2 || !r.OldestUnfinished.Equal(oldest) {
		t.Fatalf("record = %v, oldest %v; want PENDING 3, RUNNING 1, oldest %v", r.Unfinished, r.OldestUnfinished, oldest)
	}
	l, _ = e.acquire("s", "a", time.Minute, 0)
	e.endPass(l, sink.PassOutcome{Start: e.clk.Now(), End: e.clk.Now()})
	if r := e.mustPassRecord("s"); r.Unfinished["PENDING"] != 3 || !r.OldestUnfinished.Equal(oldest) {
		t.Fatalf("after a failed listing: %v, oldest %v; want the last figures", r.Unfinished, r.OldestUnfinished)
	}
	l, _ = e.acquire("s", "a", time.Minute, 0)
	e.endPass(l, sink.PassOutcome{Start: e.clk.Now(), End: e.clk.Now(), Unfinished: map[string]int64{}})
	if r := e.mustPassRecord("s"); len(r.Unfinished) != 0 || !r.OldestUnfinished.IsZero() {
		t.Fatalf("after a listing with nothing unfinished: %v, oldest %v; want none", r.Unfinished, r.OldestUnfinished)
	}
	if st := e.stats(); len(st.Passes) != 1 || len(st.Passes[0].Unfinished) != 0 {
		t.Fatalf("Stats.Passes = %+v", st.Passes)
	}
}
