// Package sinktest is the one conformance suite every sink backend must pass
// (spec §3). It uses only the sink.Sink interface, an injected clock
// (Options.Now) and an injected random source (Options.Rand), so that SQLite
// and PostgreSQL run it unchanged.
//
// Choices the suite pins down, which every backend shares:
//   - A lease is live while now < lease_until; at lease_until it has expired
//     and the key can be taken over.
//   - A takeover counts the expired attempt as failed ("lease expired"); when
//     that attempt was attempt MaxAttempts the key goes dead and Claim
//     returns ErrNotClaimable.
//   - A conflict is a sighting whose terminal state differs from the stored
//     batch state (spec §9.4); bytes do not matter. See confirm.go for the
//     rules of confirmation.
//   - Complete, Fail and Renew by the current token succeed even after the
//     lease expired, as long as nobody took the key over.
//   - Retry gives a dead key a fresh attempt budget (its next claim is
//     attempt 1); the token keeps increasing.
//   - Complete/Fail/Renew of an unknown key return ErrNotFound (not counted
//     as fenced).
package sinktest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/sink"
)

// Opener opens a fresh, empty sink for one test with the given options and
// arranges for it to be closed when the test ends.
type Opener func(t *testing.T, opt sink.Options) sink.Sink

// start is the suite's clock origin.
func start() time.Time { return time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) }

// env is one test's sink and clock.
type env struct {
	t   *testing.T
	s   sink.Sink
	clk *Clock
	ctx context.Context
}

func newEnv(t *testing.T, open Opener, mod func(*sink.Options)) *env {
	t.Helper()
	clk := NewClock(start())
	opt := sink.Options{Now: clk.Now, Rand: FixedRand(0.5), RetryBase: 10 * time.Second, RetryMax: time.Hour, MaxAttempts: 5}
	if mod != nil {
		mod(&opt)
	}
	return &env{t: t, s: open(t, opt), clk: clk, ctx: context.Background()}
}

func (e *env) record(key, source, payload string) sink.RecordResult {
	e.t.Helper()
	r, err := e.s.Record(e.ctx, sink.Sighting{Key: key, Source: source, Payload: []byte(payload)})
	if err != nil {
		e.t.Fatalf("Record(%q, %q) error: %v", key, source, err)
	}
	return r
}

func (e *env) claim(key string, lease time.Duration) sink.Claim {
	e.t.Helper()
	c, err := e.s.Claim(e.ctx, key, "owner-"+key, lease, sink.ClaimOptions{})
	if err != nil {
		e.t.Fatalf("Claim(%q) error: %v", key, err)
	}
	return c
}

func (e *env) get(key string) sink.Entry {
	e.t.Helper()
	en, err := e.s.Get(e.ctx, key)
	if err != nil {
		e.t.Fatalf("Get(%q) error: %v", key, err)
	}
	return en
}

func (e *env) stats() sink.Stats {
	e.t.Helper()
	if err := e.s.Flush(e.ctx); err != nil {
		e.t.Fatalf("Flush: %v", err)
	}
	st, err := e.s.Stats(e.ctx)
	if err != nil {
		e.t.Fatalf("Stats: %v", err)
	}
	return st
}

func (e *env) wantErr(what string, err, want error) {
	e.t.Helper()
	if !errors.Is(err, want) {
		e.t.Fatalf("%s error = %v, want %v", what, err, want)
	}
}

func (e *env) due(limit int) []string {
	e.t.Helper()
	keys, err := e.s.Due(e.ctx, limit, sink.ClaimOptions{})
	if err != nil {
		e.t.Fatalf("Due(%d): %v", limit, err)
	}
	return keys
}

// Run runs the conformance suite; open must return a fresh empty sink.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		f    func(t *testing.T, open Opener)
	}{
		{"RecordNew", testRecordNew},
		{"RecordDuplicate", testRecordDuplicate},
		{"RecordConflict", testRecordConflict},
		{"RecordRefusesInvalidKeys", testRecordRefusesInvalidKeys},
		{"ErrorsQuoteLongKeysShort", testErrorsQuoteLongKeysShort},
		{"Claim", testClaim},
		{"Complete", testComplete},
		{"Fenced", testFenced},
		{"LeaseBoundary", testLeaseBoundary},
		{"LongestLease", testLongestLease},
		{"Renew", testRenew},
		{"Backoff", testBackoff},
		{"AttemptsExhausted", testAttemptsExhausted},
		{"TakeoverOfLastAttempt", testTakeoverOfLastAttempt},
		{"Permanent", testPermanent},
		{"NotBefore", testNotBefore},
		{"ErrorTruncated", testErrorTruncated},
		{"ErrorNotText", testErrorNotText},
		{"Retry", testRetry},
		{"DueOrder", testDueOrder},
		{"ClaimDue", testClaimDue},
		{"Purge", testPurge},
		{"MaxLookback", testMaxLookback},
		{"ListAndStats", testListAndStats},
		{"Latency", testLatency},
		{"ConcurrentClaim", testConcurrentClaim},
		{"ConcurrentClaimDue", testConcurrentClaimDue},
		{"RecordAndClaim", testRecordAndClaim},
		{"RecordAll", testRecordAll},
		{"PingFlush", testPingFlush},
	}
	for _, tt := range slices.Concat(tests, passTests, noAttemptTests, confirmTests, historyTests) {
		t.Run(tt.name, func(t *testing.T) { tt.f(t, open) })
	}
}

func testRecordNew(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	r := e.record("gemini:batches/a", sink.SourceWebhook, `{"name":"batches/a"}`)
	if !r.New || r.State != sink.StatePending {
		t.Fatalf("Record(new) = %+v, want New pending", r)
	}
	en := e.get("gemini:batches/a")
	if en.State != sink.StatePending || en.SeenCount != 1 || en.FirstSource != sink.SourceWebhook ||
		!slices.Equal(en.Sources, []string{sink.SourceWebhook}) || en.Attempts != 0 || en.Token != 0 {
		t.Fatalf("Get = %+v, want pending seen once from webhook", en)
	}
	if !en.FirstSeenAt.Equal(start()) || !en.LastSeenAt.Equal(start()) || en.NextAttemptAt.After(start()) {
		t.Fatalf("Get times first=%v last=%v next=%v, want %v and due now", en.FirstSeenAt, en.LastSeenAt, en.NextAttemptAt, start())
	}
	if string(en.Payload) != `{"name":"batches/a"}` {
		t.Fatalf("Payload = %q", en.Payload)
	}
	if got := e.due(0); !slices.Equal(got, []string{"gemini:batches/a"}) {
		t.Fatalf("Due = %q, want the new key", got)
	}
	_, err := e.s.Get(e.ctx, "gemini:batches/unknown")
	e.wantErr("Get(unknown)", err, sink.ErrNotFound)
}

func testRecordDuplicate(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "first")
	e.clk.Advance(time.Second)
	if r := e.record("k", sink.SourceWebhook, "hook"); r.New || r.State != sink.StatePending {
		t.Fatalf("Record(dup) = %+v, want not new, pending", r)
	}
	last := e.clk.Advance(time.Second)
	e.record("k", sink.SourcePoll, "first")
	if err := e.s.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	en := e.get("k")
	if en.SeenCount != 3 || en.FirstSource != sink.SourcePoll || !en.LastSeenAt.Equal(last) || !en.FirstSeenAt.Equal(start()) {
		t.Fatalf("Get = seen %d first %q last %v firstSeen %v, want 3 poll %v %v", en.SeenCount, en.FirstSource, en.LastSeenAt, en.FirstSeenAt, last, start())
	}
	if got := slices.Sorted(slices.Values(en.Sources)); !slices.Equal(got, []string{"poll", "webhook"}) {
		t.Fatalf("Sources = %q, want poll and webhook", en.Sources)
	}
	if string(en.Payload) != "first" {
		t.Fatalf("Payload = %q, want the first one", en.Payload)
	}
	if st := e.stats(); st.DuplicatesSuppressed != 2 || st.FirstSource[sink.SourcePoll] != 1 {
		t.Fatalf("Stats = %+v, want 2 duplicates, 1 first seen by poll", st)
	}
}

// testRecordConflict: conflicts are by meaning (spec §9.4): a terminal
// state that differs from the stored batch state. A re-rendered payload
// with the same state, or one that says nothing of its state, is none; the
// stored payload and state stay (without confirmation, the first).
func testRecordConflict(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	rec := func(source, payload, state string) sink.RecordResult {
		t.Helper()
		r, err := e.s.Record(e.ctx, sink.Sighting{Key: "k", Source: source, Payload: []byte(payload), State: state})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rec(sink.SourceWebhook, `{"type":"batch.succeeded","data":{"id":"k"}}`, "SUCCEEDED")
	for _, sg := range []struct{ source, payload, state string }{
		{sink.SourceWebhook, `{"type":"batch.succeeded","data":{"id":"k"},"timestamp":"later"}`, "SUCCEEDED"}, // re-rendered
		{sink.SourceWebhook, `{"type":"batch.completed","data":{"id":"k"}}`, ""},                              // says nothing
		{sink.SourceWebhook, ``, ""},
		{sink.SourceWebhook, `{"data":{"id":"k","state":"RUNNING"}}`, "RUNNING"}, // not terminal: no conflict
	} {
		if r := rec(sg.source, sg.payload, sg.state); r.Conflict {
			t.Fatalf("Record(%s) = %+v, want no conflict", sg.payload, r)
		}
	}
	if r := rec(sink.SourceWebhook, `{"type":"batch.failed","data":{"id":"k"}}`, "FAILED"); !r.Conflict {
		t.Fatalf("Record(failed after succeeded) = %+v, want a conflict", r)
	}
	if st := e.stats(); st.Conflicts != 1 {
		t.Fatalf("Stats.Conflicts = %d, want 1", st.Conflicts)
	}
	en := e.get("k")
	if en.Conflicts != 1 || en.BatchState != "SUCCEEDED" || en.Confirmed || en.SeenCount != 6 ||
		string(en.Payload) != `{"type":"batch.succeeded","data":{"id":"k"}}` {
		t.Fatalf("Get = conflicts %d batch %q confirmed %v seen %d payload %q; want 1, the first state, unconfirmed, 6, the first payload",
			en.Conflicts, en.BatchState, en.Confirmed, en.SeenCount, en.Payload)
	}
}

func testClaim(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	if c.Token != 1 || c.Attempt != 1 || c.Takeover || c.Key != "k" || c.Owner != "owner-k" ||
		!c.LeaseUntil.Equal(start().Add(time.Minute)) || string(c.Payload) != "p" || c.FirstSource != sink.SourcePoll {
		t.Fatalf("Claim = %+v, want token 1 attempt 1 lease until %v", c, start().Add(time.Minute))
	}
	en := e.get("k")
	if en.State != sink.StateClaimed || en.Token != 1 || en.Attempts != 1 || en.LeaseOwner != "owner-k" || !en.LeaseUntil.Equal(c.LeaseUntil) {
		t.Fatalf("Get = %+v, want claimed by owner-k", en)
	}
	_, err := e.s.Claim(e.ctx, "k", "other", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim(live lease)", err, sink.ErrNotClaimable)
	_, err = e.s.Claim(e.ctx, "nope", "other", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim(unknown)", err, sink.ErrNotFound)
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due = %q while claimed under a live lease, want none", got)
	}
	if st := e.stats(); st.ByState[sink.StateClaimed] != 1 {
		t.Fatalf("Stats.ByState = %v, want 1 claimed", st.ByState)
	}
}

func testComplete(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	done := e.clk.Advance(3 * time.Second)
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	en := e.get("k")
	if en.State != sink.StateDone || !en.DoneAt.Equal(done) {
		t.Fatalf("Get = state %s done %v, want done at %v", en.State, en.DoneAt, done)
	}
	for _, src := range []string{sink.SourcePoll, sink.SourceWebhook} {
		if r := e.record("k", src, "p"); r.New || r.State != sink.StateDone {
			t.Fatalf("Record(done key from %s) = %+v, want not new, done", src, r)
		}
	}
	_, err := e.s.Claim(e.ctx, "k", "o", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim(done)", err, sink.ErrNotClaimable)
	e.clk.Advance(24 * time.Hour)
	_, err = e.s.Claim(e.ctx, "k", "o", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim(done, a day later)", err, sink.ErrNotClaimable)
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due = %q, want none", got)
	}
	err = e.s.Complete(e.ctx, "nope", 1)
	e.wantErr("Complete(unknown)", err, sink.ErrNotFound)
	if err := e.s.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	if en := e.get("k"); en.SeenCount != 3 {
		t.Fatalf("SeenCount = %d, want 3", en.SeenCount)
	}
}

func testFenced(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	a := e.claim("k", time.Minute)
	e.clk.Advance(time.Minute)
	b, err := e.s.Claim(e.ctx, "k", "b", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatalf("takeover Claim: %v", err)
	}
	if !b.Takeover || b.Token <= a.Token || b.Attempt != 2 {
		t.Fatalf("takeover = %+v, want Takeover, token > %d, attempt 2", b, a.Token)
	}
	if en := e.get("k"); en.LastError != "lease expired" || en.LeaseOwner != "b" {
		t.Fatalf("after takeover LastError = %q owner %q, want lease expired, b", en.LastError, en.LeaseOwner)
	}
	e.wantErr("stale Renew", e.s.Renew(e.ctx, "k", a.Token, time.Minute), sink.ErrFenced)
	e.wantErr("stale Complete", e.s.Complete(e.ctx, "k", a.Token), sink.ErrFenced)
	_, err = e.s.Fail(e.ctx, "k", a.Token, sink.Failure{Cause: "stale"})
	e.wantErr("stale Fail", err, sink.ErrFenced)
	if en := e.get("k"); en.State != sink.StateClaimed || en.Token != b.Token || en.LastError != "lease expired" {
		t.Fatalf("after stale outcomes Get = %+v, want untouched claim by b", en)
	}
	if st := e.stats(); st.Fenced != 3 {
		t.Fatalf("Stats.Fenced = %d, want 3", st.Fenced)
	}
	if err := e.s.Complete(e.ctx, "k", b.Token); err != nil {
		t.Fatalf("current Complete: %v", err)
	}
	e.wantErr("second Complete", e.s.Complete(e.ctx, "k", b.Token), sink.ErrFenced)
	if st := e.stats(); st.Fenced != 4 {
		t.Fatalf("Stats.Fenced = %d, want 4", st.Fenced)
	}
}

func testLeaseBoundary(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	lease := 30 * time.Second
	c := e.claim("k", lease)
	e.clk.Set(start().Add(lease - time.Millisecond))
	_, err := e.s.Claim(e.ctx, "k", "x", lease, sink.ClaimOptions{})
	e.wantErr("Claim at lease-1ms", err, sink.ErrNotClaimable)
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due at lease-1ms = %q, want none", got)
	}
	e.clk.Set(start().Add(lease))
	if got := e.due(0); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("Due at lease = %q, want [k]", got)
	}
	x, err := e.s.Claim(e.ctx, "k", "x", lease, sink.ClaimOptions{})
	if err != nil || !x.Takeover || x.Token != c.Token+1 {
		t.Fatalf("Claim at lease = %+v, %v; want a takeover with token %d", x, err, c.Token+1)
	}
}

// testLongestLease: a lease as long as a time.Duration goes (what
// "--lease 2562047h" asks for) is live until then, or until the end of the
// backend's time range, never already over: now + lease must not wrap
// around to a time in the past, which would let anyone take the key over
// while its holder runs.
func testLongestLease(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	const longest = time.Duration(math.MaxInt64)
	for _, k := range []string{"claimed", "renewed", "recorded"} {
		if k != "recorded" {
			e.record(k, sink.SourcePoll, "p")
		}
	}
	c := e.claim("claimed", longest)
	r := e.claim("renewed", time.Minute)
	if err := e.s.Renew(e.ctx, "renewed", r.Token, longest); err != nil {
		t.Fatalf("Renew with the longest lease: %v", err)
	}
	keys := []string{"claimed", "renewed"}
	if err := e.s.Complete(e.ctx, "renewed", r.Token); err != nil { // nothing due: a new key is claimed at once
		t.Fatal(err)
	}
	if _, c, err := e.s.RecordAndClaim(e.ctx, sink.Sighting{Key: "recorded", Source: sink.SourcePoll}, sink.ClaimRequest{Owner: "o", Lease: longest}); err != nil || c == nil {
		t.Fatalf("RecordAndClaim with the longest lease: %v, %v", c, err)
	}
	keys = []string{"claimed", "recorded"}
	if !c.LeaseUntil.After(start().Add(100 * 365 * 24 * time.Hour)) {
		t.Errorf("Claim with the longest lease: LeaseUntil %v, want a century away at least", c.LeaseUntil)
	}
	e.clk.Advance(time.Hour)
	for _, k := range keys {
		if en := e.get(k); !en.LeaseUntil.After(e.clk.Now()) {
			t.Errorf("%s: LeaseUntil %v is not after now (%v)", k, en.LeaseUntil, e.clk.Now())
		}
		_, err := e.s.Claim(e.ctx, k, "x", time.Minute, sink.ClaimOptions{})
		e.wantErr("Claim of "+k+" an hour into the longest lease", err, sink.ErrNotClaimable)
	}
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due an hour into the longest leases = %q, want none", got)
	}
}

func testRenew(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", 10*time.Second)
	e.clk.Advance(9 * time.Second)
	if err := e.s.Renew(e.ctx, "k", c.Token, 10*time.Second); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if en := e.get("k"); !en.LeaseUntil.Equal(start().Add(19 * time.Second)) {
		t.Fatalf("LeaseUntil = %v, want %v", en.LeaseUntil, start().Add(19*time.Second))
	}
	e.clk.Set(start().Add(19*time.Second - time.Millisecond))
	_, err := e.s.Claim(e.ctx, "k", "x", time.Second, sink.ClaimOptions{})
	e.wantErr("Claim before the renewed lease ends", err, sink.ErrNotClaimable)
	e.wantErr("Renew(unknown)", e.s.Renew(e.ctx, "nope", 1, time.Second), sink.ErrNotFound)
	e.wantErr("Renew(wrong token)", e.s.Renew(e.ctx, "k", c.Token+7, time.Second), sink.ErrFenced)
	// The current token may still finish after its lease ran out, as long as
	// nobody took the key over.
	e.clk.Advance(time.Hour)
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatalf("Complete after expiry without takeover: %v", err)
	}
}

func testBackoff(t *testing.T, open Opener) {
	for _, r := range []float64{0, 0.999} {
		t.Run(fmt.Sprint(r), func(t *testing.T) {
			base, maxB := 10*time.Second, 5*time.Minute
			e := newEnv(t, open, func(o *sink.Options) {
				o.Rand, o.RetryBase, o.RetryMax, o.MaxAttempts = FixedRand(r), base, maxB, 8
			})
			e.record("k", sink.SourcePoll, "p")
			for attempt := 1; attempt < 8; attempt++ {
				c := e.claim("k", time.Minute)
				if c.Attempt != attempt {
					t.Fatalf("Claim.Attempt = %d, want %d", c.Attempt, attempt)
				}
				now := e.clk.Advance(time.Second)
				st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "boom"})
				if err != nil || st != sink.StatePending {
					t.Fatalf("Fail(attempt %d) = %s, %v; want pending", attempt, st, err)
				}
				ceiling := min(base<<(attempt-1), maxB)
				want := time.Duration(r * float64(ceiling))
				en := e.get("k")
				got := en.NextAttemptAt.Sub(now)
				if got != want || got < 0 || got > ceiling {
					t.Fatalf("attempt %d: delay = %v, want %v (ceiling %v)", attempt, got, want, ceiling)
				}
				if en.LastError != "boom" || en.State != sink.StatePending {
					t.Fatalf("Get = %+v, want pending with last error", en)
				}
				if got > 0 {
					e.clk.Set(en.NextAttemptAt.Add(-time.Millisecond))
					_, err := e.s.Claim(e.ctx, "k", "x", time.Minute, sink.ClaimOptions{})
					e.wantErr("Claim before next attempt", err, sink.ErrNotClaimable)
				}
				e.clk.Set(en.NextAttemptAt)
			}
		})
	}
}

func testAttemptsExhausted(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 3; o.Rand = FixedRand(0) })
	e.record("k", sink.SourcePoll, "p")
	for attempt := 1; attempt <= 3; attempt++ {
		c := e.claim("k", time.Minute)
		st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: fmt.Sprintf("fail %d", attempt)})
		want := sink.StatePending
		if attempt == 3 {
			want = sink.StateDead
		}
		if err != nil || st != want {
			t.Fatalf("Fail(attempt %d) = %s, %v; want %s", attempt, st, err, want)
		}
	}
	en := e.get("k")
	if en.State != sink.StateDead || en.Attempts != 3 || en.LastError != "fail 3" {
		t.Fatalf("Get = %+v, want dead after 3 attempts", en)
	}
	_, err := e.s.Claim(e.ctx, "k", "x", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim(dead)", err, sink.ErrNotClaimable)
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due = %q, want none", got)
	}
	if st := e.stats(); st.ByState[sink.StateDead] != 1 {
		t.Fatalf("ByState = %v, want 1 dead", st.ByState)
	}
}

func testTakeoverOfLastAttempt(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 2; o.Rand = FixedRand(0) })
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "x"}); err != nil {
		t.Fatal(err)
	}
	c2 := e.claim("k", time.Minute)
	e.clk.Advance(time.Minute)
	_, err := e.s.Claim(e.ctx, "k", "y", time.Minute, sink.ClaimOptions{})
	e.wantErr("Claim after the last attempt's lease expired", err, sink.ErrNotClaimable)
	en := e.get("k")
	if en.State != sink.StateDead || en.LastError != "lease expired" {
		t.Fatalf("Get = %+v, want dead, lease expired", en)
	}
	e.wantErr("Complete by the expired holder", e.s.Complete(e.ctx, "k", c2.Token), sink.ErrFenced)
}

func testPermanent(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "400 bad request", Permanent: true})
	if err != nil || st != sink.StateDead {
		t.Fatalf("Fail(permanent) = %s, %v; want dead", st, err)
	}
	if en := e.get("k"); en.State != sink.StateDead || en.Attempts != 1 || en.LastError != "400 bad request" {
		t.Fatalf("Get = %+v, want dead after one attempt", en)
	}
}

func testNotBefore(t *testing.T, open Opener) {
	for _, tc := range []struct {
		rand      float64
		notBefore time.Duration
		want      time.Duration
	}{
		{0, 5 * time.Minute, 5 * time.Minute},
		{0.5, time.Second, 5 * time.Second}, // backoff is longer: backoff wins
		{0.5, -time.Hour, 5 * time.Second},  // in the past: ignored
	} {
		t.Run(fmt.Sprint(tc.notBefore), func(t *testing.T) {
			e := newEnv(t, open, func(o *sink.Options) { o.Rand = FixedRand(tc.rand) })
			e.record("k", sink.SourcePoll, "p")
			c := e.claim("k", time.Minute)
			now := e.clk.Now()
			if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "429", NotBefore: now.Add(tc.notBefore)}); err != nil {
				t.Fatal(err)
			}
			if got := e.get("k").NextAttemptAt.Sub(now); got != tc.want {
				t.Fatalf("next attempt in %v, want %v", got, tc.want)
			}
			e.clk.Set(now.Add(tc.want - time.Millisecond))
			_, err := e.s.Claim(e.ctx, "k", "x", time.Minute, sink.ClaimOptions{})
			e.wantErr("Claim before NotBefore", err, sink.ErrNotClaimable)
			e.clk.Set(now.Add(tc.want))
			if c2 := e.claim("k", time.Minute); c2.Attempt != 2 {
				t.Fatalf("Claim.Attempt = %d, want 2", c2.Attempt)
			}
		})
	}
}

func testErrorTruncated(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	cause := strings.Repeat("x", 3*sink.MaxErrorLen) + "THE END"
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: cause}); err != nil {
		t.Fatal(err)
	}
	en := e.get("k")
	if len(en.LastError) > sink.MaxErrorLen || !strings.HasSuffix(en.LastError, "THE END") {
		t.Fatalf("LastError has %d bytes ending %q, want <= %d ending THE END", len(en.LastError), en.LastError[len(en.LastError)-10:], sink.MaxErrorLen)
	}
}

// testErrorNotText: a failure's cause is whatever the effect said (an
// --exec effect's stderr may be any bytes, in any language). Fail stores it
// as text whatever it holds — NUL, bytes that are not UTF-8, or a long
// message in a script whose characters the bound would cut in half — and
// the stored error is valid UTF-8 without NUL (invalid bytes become U+FFFD),
// bounded and ending as the cause ends.
func testErrorNotText(t *testing.T, open Opener) {
	for name, cause := range map[string]string{
		// 4093 bytes are kept after "…": this cut lands inside a character.
		"cut": "a" + strings.Repeat("エラー", 700) + "THE END!",
		"nul": "exit status 2: \x00\xff\xfe garbage\x00\nTHE END!",
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, open, nil)
			e.record("k", sink.SourcePoll, "p")
			c := e.claim("k", time.Minute)
			st, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: cause})
			if err != nil || st != sink.StatePending {
				t.Fatalf("Fail with a cause that is not clean text = %q, %v; want pending", st, err)
			}
			en := e.get("k")
			if !utf8.ValidString(en.LastError) || strings.Contains(en.LastError, "\x00") ||
				len(en.LastError) > sink.MaxErrorLen || !strings.HasSuffix(en.LastError, "THE END!") {
				t.Fatalf("LastError (%d bytes) = %q; want valid UTF-8 without NUL, <= %d bytes, ending THE END!",
					len(en.LastError), en.LastError[:min(len(en.LastError), 40)], sink.MaxErrorLen)
			}
		})
	}
}

func testRetry(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	c := e.claim("k", time.Minute)
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "gone", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	e.wantErr("Retry(unknown)", e.s.Retry(e.ctx, "nope", sink.RetryOptions{}), sink.ErrNotFound)
	now := e.clk.Advance(time.Hour)
	if err := e.s.Retry(e.ctx, "k", sink.RetryOptions{}); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	en := e.get("k")
	if en.State != sink.StatePending || en.NextAttemptAt.After(now) || en.LastError != "gone" {
		t.Fatalf("after Retry Get = %+v, want pending, due now, last error kept", en)
	}
	if got := e.due(0); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("Due = %q, want [k]", got)
	}
	e.wantErr("Retry(pending)", e.s.Retry(e.ctx, "k", sink.RetryOptions{}), sink.ErrNotDead)
	c2 := e.claim("k", time.Minute)
	if c2.Attempt != 1 || c2.Token <= c.Token {
		t.Fatalf("Claim after Retry = attempt %d token %d, want attempt 1 and token > %d", c2.Attempt, c2.Token, c.Token)
	}
	if err := e.s.Complete(e.ctx, "k", c2.Token); err != nil {
		t.Fatal(err)
	}
	e.wantErr("Retry(done)", e.s.Retry(e.ctx, "k", sink.RetryOptions{}), sink.ErrNotDead)
}

func testDueOrder(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.Rand = FixedRand(0) })
	e.record("k1", sink.SourcePoll, "p") // t0
	e.clk.Advance(time.Second)
	e.record("k2", sink.SourcePoll, "p") // t0+1s
	e.clk.Advance(time.Second)
	e.record("k3", sink.SourceWebhook, "p") // t0+2s
	e.clk.Advance(time.Second)
	e.record("k4", sink.SourcePoll, "p") // t0+3s
	c4 := e.claim("k4", time.Second)     // expires t0+4s
	c1 := e.claim("k1", time.Minute)
	if _, err := e.s.Fail(e.ctx, "k1", c1.Token, sink.Failure{Cause: "later", NotBefore: start().Add(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	e.record("k5", sink.SourcePoll, "p") // t0+3s, claimed, then done: never due
	c5 := e.claim("k5", time.Minute)
	if err := e.s.Complete(e.ctx, "k5", c5.Token); err != nil {
		t.Fatal(err)
	}
	_ = c4
	e.clk.Set(start().Add(time.Minute))
	if got, want := e.due(0), []string{"k2", "k3", "k4", "k1"}; !slices.Equal(got, want) {
		t.Fatalf("Due(0) = %q, want %q", got, want)
	}
	if got, want := e.due(2), []string{"k2", "k3"}; !slices.Equal(got, want) {
		t.Fatalf("Due(2) = %q, want %q", got, want)
	}
	e.clk.Set(start().Add(5 * time.Second))
	if got, want := e.due(0), []string{"k2", "k3", "k4"}; !slices.Equal(got, want) {
		t.Fatalf("Due(0) at t0+5s = %q, want %q", got, want)
	}
}

func testClaimDue(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for i := range 5 {
		e.record(fmt.Sprintf("k%d", i), sink.SourcePoll, "p")
		e.clk.Advance(time.Second)
	}
	cs, err := e.s.ClaimDue(e.ctx, "w", time.Minute, 3, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range cs {
		keys = append(keys, c.Key)
		if c.Token != 1 || c.Attempt != 1 || c.Owner != "w" || string(c.Payload) != "p" {
			t.Fatalf("ClaimDue claim = %+v", c)
		}
	}
	if want := []string{"k0", "k1", "k2"}; !slices.Equal(keys, want) {
		t.Fatalf("ClaimDue(3) keys = %q, want %q", keys, want)
	}
	cs, err = e.s.ClaimDue(e.ctx, "w", time.Minute, 10, sink.ClaimOptions{})
	if err != nil || len(cs) != 2 {
		t.Fatalf("ClaimDue(10) = %d claims, %v; want 2", len(cs), err)
	}
	cs, err = e.s.ClaimDue(e.ctx, "w", time.Minute, 10, sink.ClaimOptions{})
	if err != nil || len(cs) != 0 {
		t.Fatalf("ClaimDue(10) with nothing due = %d claims, %v; want 0", len(cs), err)
	}
	e.clk.Advance(time.Minute)
	cs, err = e.s.ClaimDue(e.ctx, "w2", time.Minute, 0, sink.ClaimOptions{})
	if err != nil || len(cs) != 5 || !cs[0].Takeover {
		t.Fatalf("ClaimDue(all) after the leases expired = %d claims, %v; want 5 takeovers", len(cs), err)
	}
}

// testPurge: Purge measures the age with the sink's clock, the one that
// wrote the done times (here the injected clock, months behind the wall
// clock: a cutoff taken from the caller's clock would purge every done
// key). A key done less than D ago, or exactly D ago, stays; a key done
// more than D ago goes; rows that are not done stay whatever their age.
func testPurge(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for _, k := range []string{"old", "new", "pending"} {
		e.record(k, sink.SourcePoll, "p")
	}
	c := e.claim("old", time.Minute)
	if err := e.s.Complete(e.ctx, "old", c.Token); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	c = e.claim("new", time.Minute)
	if err := e.s.Complete(e.ctx, "new", c.Token); err != nil {
		t.Fatal(err)
	}
	// "old" has been done for exactly 1h, "new" for 0.
	if n, err := e.s.Purge(e.ctx, time.Hour); err != nil || len(n) != 0 {
		t.Fatalf("Purge(1h) of keys done 1h and 0 ago = %q, %v; want 0 (exactly D is not older than D)", n, err)
	}
	n, err := e.s.Purge(e.ctx, time.Hour-time.Microsecond)
	if err != nil || len(n) != 1 || n[0] != "old" {
		t.Fatalf("Purge(1h-1µs) of keys done 1h and 0 ago = %q, %v; want [old]", n, err)
	}
	_, err = e.s.Get(e.ctx, "old")
	e.wantErr("Get(purged)", err, sink.ErrNotFound)
	for _, k := range []string{"new", "pending"} {
		e.get(k)
	}
	e.clk.Advance(30 * time.Minute)
	if n, err := e.s.Purge(e.ctx, 31*time.Minute); err != nil || len(n) != 0 {
		t.Fatalf("Purge(31m) of a key done 30m ago = %q, %v; want 0", n, err)
	}
	if n, err := e.s.Purge(e.ctx, 29*time.Minute); err != nil || len(n) != 1 {
		t.Fatalf("Purge(29m) of a key done 30m ago = %q, %v; want 1 (pending rows stay)", n, err)
	}
	if st := e.stats(); st.ByState[sink.StatePending] != 1 || st.ByState[sink.StateDone] != 0 {
		t.Fatalf("ByState = %v, want 1 pending", st.ByState)
	}
	if _, err := e.s.Purge(e.ctx, -time.Second); err == nil {
		t.Fatal("Purge(-1s) = nil error, want one (a negative age)")
	}
}

func testMaxLookback(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	check := func(wantD time.Duration, wantForever, wantOK bool) {
		t.Helper()
		d, forever, ok, err := e.s.MaxLookback(e.ctx)
		if err != nil || d != wantD || forever != wantForever || ok != wantOK {
			t.Fatalf("MaxLookback = %v, %v, %v, %v; want %v, %v, %v", d, forever, ok, err, wantD, wantForever, wantOK)
		}
	}
	check(0, false, false)
	for _, d := range []time.Duration{72 * time.Hour, 24 * time.Hour} {
		if err := e.s.NoteLookback(e.ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	check(72*time.Hour, false, true)
	if err := e.s.NoteLookback(e.ctx, 0); err != nil {
		t.Fatal(err)
	}
	check(72*time.Hour, true, true)
}

func testListAndStats(t *testing.T, open Opener) {
	e := newEnv(t, open, func(o *sink.Options) { o.Rand = FixedRand(0); o.MaxAttempts = 1 })
	for i, src := range []string{"poll", "webhook", "webhook", "poll"} {
		e.record(fmt.Sprintf("k%d", i), src, "p")
		e.clk.Advance(time.Second)
	}
	e.record("k0", sink.SourceWebhook, "x")
	c := e.claim("k1", time.Minute)
	if err := e.s.Complete(e.ctx, "k1", c.Token); err != nil {
		t.Fatal(err)
	}
	c = e.claim("k2", time.Minute)
	if _, err := e.s.Fail(e.ctx, "k2", c.Token, sink.Failure{Cause: "x"}); err != nil {
		t.Fatal(err)
	}
	e.claim("k3", time.Minute)
	now := e.clk.Advance(time.Minute)
	all, err := e.s.List(e.ctx, sink.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, en := range all {
		keys = append(keys, en.Key+":"+string(en.State))
	}
	if want := []string{"k0:pending", "k1:done", "k2:dead", "k3:claimed"}; !slices.Equal(keys, want) {
		t.Fatalf("List = %q, want %q", keys, want)
	}
	if all[0].SeenCount != 2 {
		t.Fatalf("List k0 SeenCount = %d, want 2", all[0].SeenCount)
	}
	for _, tc := range []struct {
		opt  sink.ListOptions
		want int
	}{{sink.ListOptions{State: sink.StateDead}, 1}, {sink.ListOptions{Limit: 2}, 2}, {sink.ListOptions{State: sink.StatePending, Limit: 5}, 1}} {
		got, err := e.s.List(e.ctx, tc.opt)
		if err != nil || len(got) != tc.want {
			t.Fatalf("List(%+v) = %d entries, %v; want %d", tc.opt, len(got), err, tc.want)
		}
	}
	st := e.stats()
	want := map[sink.State]int64{sink.StatePending: 1, sink.StateClaimed: 1, sink.StateDone: 1, sink.StateDead: 1}
	for s, n := range want {
		if st.ByState[s] != n {
			t.Fatalf("ByState = %v, want %v", st.ByState, want)
		}
	}
	if st.FirstSource["poll"] != 2 || st.FirstSource["webhook"] != 2 || st.DuplicatesSuppressed != 1 {
		t.Fatalf("Stats = %+v, want 2/2 first sources and 1 duplicate", st)
	}
	if st.OldestPendingAge != now.Sub(start()) {
		t.Fatalf("OldestPendingAge = %v, want %v", st.OldestPendingAge, now.Sub(start()))
	}
}

func testLatency(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for i := 1; i <= 100; i++ {
		k := fmt.Sprintf("k%03d", i)
		e.clk.Set(start())
		e.record(k, sink.SourcePoll, "p")
		c := e.claim(k, time.Hour)
		e.clk.Set(start().Add(time.Duration(i) * time.Second))
		if err := e.s.Complete(e.ctx, k, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	st := e.stats()
	if st.LatencyP50 != 50*time.Second || st.LatencyP99 != 99*time.Second || st.LatencyMax != 100*time.Second {
		t.Fatalf("latency p50 %v p99 %v max %v, want 50s 99s 100s", st.LatencyP50, st.LatencyP99, st.LatencyMax)
	}
}

func testConcurrentClaim(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("k", sink.SourcePoll, "p")
	tokens, errs := race8(sink.ErrNotClaimable, func(owner string) (int64, error) {
		c, err := e.s.Claim(e.ctx, "k", owner, time.Minute, sink.ClaimOptions{})
		return c.Token, err
	})
	if len(tokens) != 1 || len(errs) != 0 {
		t.Fatalf("8 concurrent Claims granted tokens %v with errors %v, want exactly one token", tokens, errs)
	}
}

// race8 runs take from 8 goroutines at once, as owners g0…g7, and returns
// the tokens of those that won and the errors other than lost (what a
// caller that lost the race is told).
func race8(lost error, take func(owner string) (int64, error)) (tokens []int64, errs []error) {
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i := range 8 {
		wg.Go(func() {
			token, err := take(fmt.Sprintf("g%d", i))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				tokens = append(tokens, token)
			} else if !errors.Is(err, lost) {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return tokens, errs
}

func testConcurrentClaimDue(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for i := range 100 {
		e.record(fmt.Sprintf("k%03d", i), sink.SourcePoll, "p")
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen = map[string]int{}
		errs []error
	)
	for w := range 4 {
		wg.Go(func() {
			for {
				cs, err := e.s.ClaimDue(e.ctx, fmt.Sprintf("w%d", w), time.Minute, 7, sink.ClaimOptions{})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, c := range cs {
					seen[c.Key]++
				}
				mu.Unlock()
				if err != nil || len(cs) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("ClaimDue errors: %v", errs)
	}
	if len(seen) != 100 {
		t.Fatalf("%d distinct keys claimed, want 100", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("key %s claimed %d times, want once", k, n)
		}
	}
}

// testRecordAndClaim: a new key is claimed in the commit that records it
// when nothing else is due (spec §4), as the dispatcher would claim it: not
// when an older key is due, not a key that needs confirmation for a claimer
// that cannot give it; a duplicate is only counted; a sighting from the
// API that makes a key due is claimed with it.
func testRecordAndClaim(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	req := sink.ClaimRequest{Owner: "o", Lease: time.Minute}
	rac := func(sg sink.Sighting, req sink.ClaimRequest) (sink.RecordResult, *sink.Claim) {
		t.Helper()
		r, c, err := e.s.RecordAndClaim(e.ctx, sg, req)
		if err != nil {
			t.Fatalf("RecordAndClaim(%s) error: %v", sg.Key, err)
		}
		return r, c
	}
	sg := sink.Sighting{Key: "k", Source: sink.SourceWebhook, Payload: []byte("p")}
	r, c := rac(sg, req)
	if !r.New || r.State != sink.StateClaimed || c == nil || c.Token != 1 || c.Attempt != 1 || c.Owner != "o" ||
		string(c.Payload) != "p" || string(c.Webhook) != "p" || c.Takeover || !c.LeaseUntil.Equal(start().Add(time.Minute)) {
		t.Fatalf("RecordAndClaim(new) = %+v, %+v; want new, claimed, token 1", r, c)
	}
	if en := e.get("k"); en.State != sink.StateClaimed || en.Token != 1 || en.Attempts != 1 || en.LeaseOwner != "o" {
		t.Fatalf("Get(k) after RecordAndClaim = %+v, want claimed by o with token 1", en)
	}
	r, c = rac(sg, sink.ClaimRequest{Owner: "o2", Lease: time.Minute})
	if r.New || r.State != sink.StateClaimed || c != nil {
		t.Fatalf("RecordAndClaim(duplicate) = %+v, %+v; want not new, claimed, no claim", r, c)
	}
	// A failed key due again is older than a new one: the new one waits.
	if _, err := e.s.Fail(e.ctx, "k", 1, sink.Failure{Cause: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(time.Hour)
	r, c = rac(sink.Sighting{Key: "n", Source: sink.SourcePoll}, req)
	if !r.New || r.State != sink.StatePending || c != nil {
		t.Fatalf("RecordAndClaim(new, an older key due) = %+v, %+v; want new and pending, no claim", r, c)
	}
	if got := e.due(0); !slices.Equal(got, []string{"k", "n"}) {
		t.Fatalf("Due = %q, want [k n]", got)
	}
	for _, k := range []string{"k", "n"} {
		e.finish(k)
	}
	// A key that needs confirmation is not claimed for a claimer that
	// cannot confirm; it is for one that can.
	dyn := sink.Sighting{Key: "d", Source: sink.SourceWebhook, Payload: []byte("{}"), Dynamic: true}
	if r, c = rac(dyn, sink.ClaimRequest{Owner: "o", Lease: time.Minute, Opts: sink.ClaimOptions{SkipNeedsConfirm: true}}); !r.New || c != nil {
		t.Fatalf("RecordAndClaim(needs confirmation, SkipNeedsConfirm) = %+v, %+v; want recorded, no claim", r, c)
	}
	e.finish("d")
	dyn.Key = "d2"
	if r, c = rac(dyn, req); !r.New || c == nil || !c.NeedsConfirm {
		t.Fatalf("RecordAndClaim(needs confirmation) = %+v, %+v; want claimed, needing confirmation", r, c)
	}
	if err := e.s.Complete(e.ctx, "d2", c.Token); err != nil {
		t.Fatal(err)
	}
	// A sighting from the API that confirms a webhook-first key backing
	// off makes it due now: it is claimed with the confirmation.
	hook := sink.Sighting{Key: "w", Source: sink.SourceWebhook, Payload: []byte(`{"hook":1}`), State: "SUCCEEDED"}
	if _, c = rac(hook, req); c == nil {
		t.Fatal("RecordAndClaim(w) gave no claim")
	}
	if _, err := e.s.Fail(e.ctx, "w", c.Token, sink.Failure{Cause: "x"}); err != nil {
		t.Fatal(err)
	}
	r, c = rac(sink.Sighting{Key: "w", Source: sink.SourcePoll, Payload: []byte(`{"op":1}`), State: "SUCCEEDED", FromAPI: true}, req)
	if !r.Confirmed || r.State != sink.StateClaimed || c == nil || c.Token != 2 || !c.Confirmed ||
		string(c.Payload) != `{"op":1}` || string(c.Webhook) != `{"hook":1}` {
		t.Fatalf("RecordAndClaim(confirming) = %+v, %+v; want confirmed and claimed with the API's operation", r, c)
	}
	if err := e.s.Complete(e.ctx, "w", c.Token); err != nil {
		t.Fatal(err)
	}
	if r, c = rac(hook, req); r.State != sink.StateDone || c != nil {
		t.Fatalf("RecordAndClaim(done) = %+v, %+v; want done, no claim", r, c)
	}
	if en := e.get("w"); en.SeenCount != 3 {
		t.Fatalf("SeenCount = %d, want 3", en.SeenCount)
	}
	if _, _, err := e.s.RecordAndClaim(e.ctx, sink.Sighting{Key: "z", Source: sink.SourcePoll}, sink.ClaimRequest{Owner: "o"}); err == nil {
		t.Fatal("RecordAndClaim with no lease = nil error, want one")
	}
}

// testRecordAll: a page of sightings recorded at once answers each as
// Record would — new, a duplicate (also of a key new in the same page), a
// confirmation — and counts every sighting.
func testRecordAll(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.record("known", sink.SourcePoll, "p")
	e.sight(hook("hooked", `{"h":1}`, "SUCCEEDED"))
	rs, err := e.s.RecordAll(e.ctx, []sink.Sighting{
		{Key: "a", Source: sink.SourcePoll, Payload: []byte("a")},
		{Key: "known", Source: sink.SourcePoll, Payload: []byte("p")},
		{Key: "a", Source: sink.SourceWebhook, Payload: []byte("a2")},
		listed("hooked", `{"op":1}`, "SUCCEEDED"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []sink.RecordResult{{New: true, State: sink.StatePending}, {State: sink.StatePending},
		{State: sink.StatePending}, {State: sink.StatePending, Confirmed: true}}
	if !slices.Equal(rs, want) {
		t.Fatalf("RecordAll = %+v, want %+v", rs, want)
	}
	if en := e.get("a"); en.SeenCount != 2 || string(en.Payload) != "a" || !slices.Equal(en.Sources, []string{"poll", "webhook"}) {
		t.Fatalf("Get(a) = seen %d, payload %q, sources %v", en.SeenCount, en.Payload, en.Sources)
	}
	if en := e.get("hooked"); !en.Confirmed || string(en.Payload) != `{"op":1}` || string(en.Webhook) != `{"h":1}` {
		t.Fatalf("Get(hooked) = %+v", en)
	}
	if rs, err := e.s.RecordAll(e.ctx, nil); err != nil || len(rs) != 0 {
		t.Fatalf("RecordAll(nothing) = %v, %v", rs, err)
	}
}

// finish claims the stored key and completes it.
func (e *env) finish(key string) {
	e.t.Helper()
	c := e.claim(key, time.Minute)
	if err := e.s.Complete(e.ctx, key, c.Token); err != nil {
		e.t.Fatalf("Complete(%s): %v", key, err)
	}
}

func testPingFlush(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	if err := e.s.Ping(e.ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	e.record("k", sink.SourcePoll, "p")
	e.record("k", sink.SourcePoll, "p")
	if err := e.s.Flush(e.ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if en := e.get("k"); en.SeenCount != 2 {
		t.Fatalf("SeenCount = %d, want 2", en.SeenCount)
	}
}
