package sink

import (
	"errors"
	"math"
	"testing"
	"time"
)

// The decisions of rules.go without a database: sinktest checks that each
// backend stores them; these check the decisions themselves.

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestSighting(t *testing.T) {
	hook := Sighting{Key: "k", Source: SourceWebhook, Payload: []byte("{}"), State: "SUCCEEDED"}
	api := Sighting{Key: "k", Source: SourcePoll, Payload: []byte("{}"), State: "FAILED", FromAPI: true}
	for _, tc := range []struct {
		name     string
		row      Row
		found    bool
		sg       Sighting
		kind     sightKind
		conflict bool
		check    func(Row) bool
	}{
		{"new from a webhook", Row{}, false, hook, sightNew, false, func(r Row) bool {
			return r.State == StatePending && r.NextAttempt.Equal(t0) && !r.Confirmed && r.BatchState == "SUCCEEDED" && r.FirstSource == SourceWebhook
		}},
		{"new, dynamic only", Row{}, false, Sighting{Key: "k", Source: SourceWebhook, Dynamic: true}, sightNew, false, func(r Row) bool { return r.NeedsConfirm }},
		{"new from the API", Row{}, false, api, sightNew, false, func(r Row) bool { return r.Confirmed && !r.NeedsConfirm }},
		{"a duplicate", Row{Key: "k", State: StateDone, BatchState: "SUCCEEDED"}, true, hook, sightDuplicate, false, nil},
		{"a duplicate that conflicts", Row{Key: "k", State: StateDone, BatchState: "FAILED"}, true, hook, sightDuplicate, true, nil},
		{"the API's sighting of a confirmed key", Row{Key: "k", State: StateDone, Confirmed: true, BatchState: "SUCCEEDED"}, true, api, sightDuplicate, true, nil},
		{"the API confirms a key backing off", Row{Key: "k", State: StatePending, NextAttempt: t0.Add(time.Hour), BatchState: "SUCCEEDED"}, true, api, sightConfirm, true, func(r Row) bool {
			return r.Confirmed && r.BatchState == "FAILED" && r.Conflicts == 1 && r.NextAttempt.Equal(t0)
		}},
		{"the API revives a key dead as unknown to it", Row{Key: "k", State: StateDead, Attempts: 3, DeadReason: DeadUnknownToAPI}, true, api, sightConfirm, false, func(r Row) bool {
			return r.State == StatePending && r.Attempts == 0 && r.DeadReason == "" && r.NextAttempt.Equal(t0)
		}},
		{"the API confirms a key dead for its effect, which stays dead", Row{Key: "k", State: StateDead, Attempts: 3}, true, api, sightConfirm, false, func(r Row) bool {
			return r.State == StateDead && r.Attempts == 3 && r.Confirmed
		}},
	} {
		kind, out, conflict := sighting(tc.row, tc.found, tc.sg, t0)
		if kind != tc.kind || conflict != tc.conflict || tc.check != nil && !tc.check(out) {
			t.Errorf("%s: sighting = %v, conflict %v, %+v; want %v, conflict %v", tc.name, kind, conflict, out, tc.kind, tc.conflict)
		}
	}
}

func TestClaim(t *testing.T) {
	const max = 3
	for _, tc := range []struct {
		name    string
		row     Row
		opts    ClaimOptions
		store   bool
		err     error
		state   State
		token   int64
		attempt int
	}{
		{"pending and due", Row{State: StatePending, NextAttempt: t0, Token: 4, Attempts: 1}, ClaimOptions{}, true, nil, StateClaimed, 5, 2},
		{"pending, not due", Row{State: StatePending, NextAttempt: t0.Add(time.Nanosecond)}, ClaimOptions{}, false, ErrNotClaimable, StatePending, 0, 0},
		{"claimed, lease live", Row{State: StateClaimed, LeaseUntil: t0.Add(time.Nanosecond), Token: 1, Attempts: 1}, ClaimOptions{}, false, ErrNotClaimable, StateClaimed, 1, 1},
		{"claimed, lease ends now: a takeover", Row{State: StateClaimed, LeaseUntil: t0, Token: 1, Attempts: 1}, ClaimOptions{}, true, nil, StateClaimed, 2, 2},
		{"a takeover of the last attempt: dead", Row{State: StateClaimed, LeaseUntil: t0, Token: 3, Attempts: max}, ClaimOptions{}, true, ErrNotClaimable, StateDead, 3, max},
		{"done", Row{State: StateDone}, ClaimOptions{}, false, ErrNotClaimable, StateDone, 0, 0},
		{"dead", Row{State: StateDead}, ClaimOptions{}, false, ErrNotClaimable, StateDead, 0, 0},
		{"needs confirmation, for one who cannot", Row{State: StatePending, NextAttempt: t0, NeedsConfirm: true}, ClaimOptions{SkipNeedsConfirm: true}, false, ErrNotClaimable, StatePending, 0, 0},
		{"needs confirmation, for one who can", Row{State: StatePending, NextAttempt: t0, NeedsConfirm: true}, ClaimOptions{}, true, nil, StateClaimed, 1, 1},
	} {
		out, store, err := claim(tc.row, "o", time.Minute, t0, max, tc.opts)
		if store != tc.store || !errors.Is(err, tc.err) || out.State != tc.state || out.Token != tc.token || out.Attempts != tc.attempt {
			t.Errorf("%s: claim = %s token %d attempt %d, store %v, %v; want %s token %d attempt %d, store %v, %v",
				tc.name, out.State, out.Token, out.Attempts, store, err, tc.state, tc.token, tc.attempt, tc.store, tc.err)
		}
		if err == nil && (out.Owner != "o" || !out.LeaseUntil.Equal(t0.Add(time.Minute)) || out.TookOver != (tc.row.State == StateClaimed)) {
			t.Errorf("%s: claimed row %+v", tc.name, out)
		}
		if store && out.State == StateDead && (out.LastError != leaseExpired || out.Owner != "") {
			t.Errorf("%s: dead row %+v, want the lease expired and no owner", tc.name, out)
		}
	}
}

func TestLeaseEndSaturates(t *testing.T) {
	if got := LeaseEnd(t0, time.Duration(math.MaxInt64)); got.UnixNano() != math.MaxInt64 {
		t.Fatalf("LeaseEnd(now, max) = %v, want the last instant", got)
	}
}

func TestFence(t *testing.T) {
	r := Row{Key: "k", State: StateClaimed, Token: 2}
	if err := fence(r, 2); err != nil {
		t.Fatalf("fence(current) = %v", err)
	}
	for _, bad := range []Row{{State: StateClaimed, Token: 3}, {State: StatePending, Token: 2}, {State: StateDone, Token: 2}} {
		if err := fence(bad, 2); !errors.Is(err, ErrFenced) {
			t.Errorf("fence(%s token %d) = %v, want ErrFenced", bad.State, bad.Token, err)
		}
	}
}

func TestFail(t *testing.T) {
	o := Options{MaxAttempts: 3, RetryBase: 10 * time.Second, RetryMax: time.Hour, Rand: func() float64 { return 0.5 }}
	claimed := Row{State: StateClaimed, Token: 2, Attempts: 2, Owner: "o", LeaseUntil: t0.Add(time.Minute)}
	for _, tc := range []struct {
		name     string
		attempts int
		f        Failure
		delay    time.Duration
		hasDelay bool
		state    State
		next     time.Time
		attempt  int
	}{
		{"backoff of attempt 2", 2, Failure{Cause: "x"}, 0, false, StatePending, t0.Add(10 * time.Second), 2},
		{"a longer Retry-After wins", 2, Failure{Cause: "x"}, time.Minute, true, StatePending, t0.Add(time.Minute), 2},
		{"a shorter one does not", 2, Failure{Cause: "x"}, time.Second, true, StatePending, t0.Add(10 * time.Second), 2},
		{"the last attempt: dead", 3, Failure{Cause: "x"}, 0, false, StateDead, time.Time{}, 3},
		{"permanent: dead", 1, Failure{Cause: "x", Permanent: true, DeadReason: DeadUnknownToAPI}, 0, false, StateDead, time.Time{}, 1},
		{"not counted: the attempt given back", 3, Failure{Cause: "x", NoAttempt: true}, 0, false, StatePending, t0.Add(10 * time.Second), 2},
		{"not counted, due at NotBefore", 3, Failure{Cause: "x", NoAttempt: true, Permanent: true}, time.Minute, true, StatePending, t0.Add(time.Minute), 2},
		{"not counted, NotBefore passed", 1, Failure{Cause: "x", NoAttempt: true}, -time.Minute, true, StatePending, t0, 0},
	} {
		r := claimed
		r.Attempts = tc.attempts
		out := fail(r, tc.f, tc.delay, tc.hasDelay, t0, o)
		if out.State != tc.state || !out.NextAttempt.Equal(tc.next) || out.Attempts != tc.attempt || out.Owner != "" || !out.LeaseUntil.IsZero() || out.LastError != "x" {
			t.Errorf("%s: fail = %s next %v attempts %d (%+v); want %s next %v attempts %d", tc.name, out.State, out.NextAttempt, out.Attempts, out, tc.state, tc.next, tc.attempt)
		}
		if out.State == StateDead && out.DeadReason != tc.f.DeadReason {
			t.Errorf("%s: dead reason %q, want %q", tc.name, out.DeadReason, tc.f.DeadReason)
		}
	}
}

func TestConfirm(t *testing.T) {
	out, apply, conflict := confirm(Row{BatchState: "SUCCEEDED"}, Confirmation{State: "FAILED"})
	if !apply || !conflict || !out.Confirmed || out.BatchState != "FAILED" || out.Conflicts != 1 {
		t.Fatalf("confirm(unconfirmed, differing) = %+v, %v, %v", out, apply, conflict)
	}
	out, apply, conflict = confirm(Row{Confirmed: true, BatchState: "SUCCEEDED"}, Confirmation{State: "FAILED"})
	if apply || !conflict || out.BatchState != "SUCCEEDED" || out.Conflicts != 1 {
		t.Fatalf("confirm(confirmed meanwhile) = %+v, %v, %v; want it to keep what it holds", out, apply, conflict)
	}
}

func TestRetryAndRerun(t *testing.T) {
	dead := Row{State: StateDead, Attempts: 3, Token: 3, DeadReason: DeadUnknownToAPI, LastError: "boom"}
	out, err := retry(dead, RetryOptions{WithoutResults: true}, t0)
	if err != nil || out.State != StatePending || out.Attempts != 0 || out.Token != 3 || out.Retries != 1 || !out.NextAttempt.Equal(t0) ||
		out.DeadReason != "" || out.LastError != "boom" || !out.NoResults {
		t.Fatalf("retry(dead) = %+v, %v", out, err)
	}
	if _, err := retry(Row{State: StateDone}, RetryOptions{}, t0); !errors.Is(err, ErrNotDead) {
		t.Fatalf("retry(done) = %v, want ErrNotDead", err)
	}
	out, err = retry(Row{State: StateDone, Attempts: 1, Token: 1}, RetryOptions{Rerun: true}, t0)
	if err != nil || out.State != StatePending || out.Reruns != 1 || out.Retries != 0 || out.Attempts != 0 {
		t.Fatalf("rerun(done) = %+v, %v", out, err)
	}
	if _, err := retry(dead, RetryOptions{Rerun: true}, t0); !errors.Is(err, ErrNotDone) {
		t.Fatalf("rerun(dead) = %v, want ErrNotDone", err)
	}
}

func TestPassLease(t *testing.T) {
	held := PassRow{PassRecord: PassRecord{Scope: "s", Holder: "a", HeldUntil: t0.Add(time.Second), Token: 4}}
	if _, err := acquirePass(held, "b", time.Minute, 0, t0); !errors.Is(err, ErrPassHeld) {
		t.Fatalf("acquire of a live lease = %v, want ErrPassHeld", err)
	}
	if r, err := acquirePass(held, "a", time.Minute, 0, t0); err != nil || r.Token != 5 || !r.HeldUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("acquire by its holder = %+v, %v; want token 5", r, err)
	}
	recent := PassRow{EndedAt: t0.Add(-time.Minute)}
	if _, err := acquirePass(recent, "b", time.Minute, 2*time.Minute, t0); !errors.Is(err, ErrPassRecent) {
		t.Fatalf("acquire after a recent pass = %v, want ErrPassRecent", err)
	}
	ahead := PassRow{EndedAt: t0.Add(time.Minute)} // a clock that went back
	if _, err := acquirePass(ahead, "b", time.Minute, 2*time.Minute, t0); err != nil {
		t.Fatalf("acquire after a pass recorded ahead of now = %v, want the lease", err)
	}
	l := PassLease{Scope: "s", Owner: "a", Token: 4}
	if err := passFence(held, true, l); err != nil {
		t.Fatalf("passFence(current) = %v", err)
	}
	if err := passFence(held, true, PassLease{Owner: "a", Token: 3}); !errors.Is(err, ErrFenced) {
		t.Fatalf("passFence(old token) = %v, want ErrFenced", err)
	}
	if err := passFence(PassRow{}, false, l); !errors.Is(err, ErrNotFound) {
		t.Fatalf("passFence(no record) = %v, want ErrNotFound", err)
	}
	r := endPass(held, l, PassOutcome{Start: t0, End: t0.Add(time.Second), Success: true}, t0.Add(2*time.Second))
	if r.Holder != "" || r.LastSuccess != t0.Add(time.Second) || !r.LastFullScan.IsZero() || r.EndedAt != t0.Add(2*time.Second) {
		t.Fatalf("endPass = %+v", r)
	}
	if r := endPass(held, PassLease{Owner: "f"}, PassOutcome{Start: t0, End: t0}, t0); r.Holder != "a" {
		t.Fatalf("endPass with token 0 released the lease: %+v", r)
	}
}
