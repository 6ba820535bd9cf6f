package reconcile

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/sink"
)

// The pass lease and the fleet's interval (spec §5.5), against the stand-in
// over HTTP and real databases, with the clock injected and the lease's
// renewals timed by the test.

const intruder = "other-host:4242:9f3a0c"

// isList reports whether a stand-in request is a list request.
func isList(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/batches")
}

// listRequests counts the list requests the stand-in received.
func listRequests(api *geminifake.Server) int {
	n := 0
	for _, r := range api.Requests() {
		if r.Method == http.MethodGet && strings.HasSuffix(r.Path, "/batches") {
			n++
		}
	}
	return n
}

// addDone adds n SUCCEEDED batches named prefix-00… created an hour before t0.
func addDone(api *geminifake.Server, prefix string, n int) []string {
	var names []string
	for i := range n {
		name := geminifake.GeminiName(fmt.Sprintf("%s-%02d", prefix, i))
		api.Add(geminifake.Batch{Name: name, State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour)})
		names = append(names, name)
	}
	return names
}

// scopeRecord reads one scope's pass record from the database.
func (e *env) scopeRecord(t *testing.T, scope string) sink.PassRecord {
	t.Helper()
	recs, err := e.sink.PassRecords(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Scope == scope {
			return r
		}
	}
	return sink.PassRecord{Scope: scope}
}

// passCount reads gemrecon_poll_passes_total for the scope and outcome.
func passCount(t *testing.T, e *env, scope, outcome string) string {
	t.Helper()
	prefix := fmt.Sprintf("gemrecon_poll_passes_total{outcome=%q,scope=%q} ", outcome, scope)
	for _, l := range strings.Split(metricsText(t, e.metrics), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			return v
		}
	}
	return "absent"
}

// waitUntil polls cond until it holds or 10 s have passed.
func waitUntil(t *testing.T, what string, cond func() bool) bool {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("after 10s: %s", what)
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// While another process holds the scope's pass lease a pass lists nothing,
// still runs the due keys' effects, succeeds, and says skipped=held with the
// holder and the lease's end; nothing is recorded for it. Once the lease has
// run out (now = its end: a lease is live while now < until), the next pass
// takes it over, lists, and releases it when it ends.
func TestPassSkipsWhileLeaseHeld(t *testing.T) { backends(t, testPassSkipsWhileLeaseHeld) }

func testPassSkipsWhileLeaseHeld(t *testing.T, pg bool) {
	ctx := context.Background()
	e := newEnv(t, envOptions{postgres: pg})
	addDone(e.api, "l", 2)
	due := "gemini:batches/due"
	if _, err := e.sink.Record(ctx, sink.Sighting{Key: due, Source: sink.SourceWebhook, Payload: []byte(`{"name":"batches/due"}`)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.sink.AcquirePass(ctx, e.poll.scope, intruder, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	r := e.pass(t)
	want := Skip{Reason: SkipHeld, Holder: intruder, Until: t0.Add(time.Minute)}
	if !r.Skipped() || r.Skip.Reason != want.Reason || r.Skip.Holder != want.Holder || !r.Skip.Until.Equal(want.Until) {
		t.Errorf("skip = %+v, want %+v", r.Skip, want)
	}
	if !r.Success() || r.Err() != nil || r.Effects.OK != 1 || e.eff.count(due) != 1 {
		t.Errorf("a skipped pass should drain and succeed: err %v, effects %+v, due ran %d", r.Err(), r.Effects, e.eff.count(due))
	}
	if n := listRequests(e.api); n != 0 {
		t.Errorf("a skipped pass sent %d list requests", n)
	}
	line := r.Summary().String()
	if !strings.HasSuffix(line, " skipped=held holder="+intruder+" until=2025-12-01T00:01:00Z") || !strings.HasPrefix(line, "poll: listed=0 ") {
		t.Errorf("summary line %q", line)
	}
	if rec := e.scopeRecord(t, e.poll.scope); !rec.LastEnd.IsZero() || rec.Holder != intruder || rec.Token != 1 {
		t.Errorf("a skipped pass changed the record: %+v", rec)
	}
	if got := passCount(t, e, e.poll.scope, "skipped_held"); got != "1" {
		t.Errorf("skipped_held passes = %s, want 1", got)
	}

	e.clock.Set(t0.Add(time.Minute))
	r = e.pass(t)
	if r.Skipped() || !r.Success() || r.New != 2 || listRequests(e.api) != 1 {
		t.Fatalf("after the lease's end: %s (err %v)", r.Summary(), r.Err())
	}
	rec := e.scopeRecord(t, e.poll.scope)
	if rec.LastHolder != e.poll.cfg.Owner || rec.Holder != "" || rec.Token != 2 || !rec.LastEnd.Equal(t0.Add(time.Minute)) {
		t.Errorf("after taking over: %+v (owner %s)", rec, e.poll.cfg.Owner)
	}
	if got := passCount(t, e, e.poll.scope, "listed"); got != "1" {
		t.Errorf("listed passes = %s, want 1", got)
	}
}

// The fleet's interval: two replicas (two Polls on one database and scope)
// tick every 10 minutes, each on its own phase, and every listing takes 2
// minutes (the stand-in moves the clock). A tick lists unless a pass of the
// scope started less than 9 minutes ago. In particular the replica that
// listed last lists again on its own next tick, 10 minutes after its start
// — a plain "a pass ended less than one interval ago" rule would skip it
// (that pass ended only 8 minutes before) and stretch the fleet's gap
// towards two intervals.
func TestFleetInterval(t *testing.T) { backends(t, testFleetInterval) }

func testFleetInterval(t *testing.T, pg bool) {
	const d = 10 * time.Minute
	e := newEnv(t, envOptions{interval: d, postgres: pg})
	addDone(e.api, "f", 2)
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if isList(r) {
			e.clock.Set(e.clock.Now().Add(2 * time.Minute))
		}
		return nil
	})
	a := e.poll
	b, _ := e.newPoll(t, envOptions{interval: d})
	steps := []struct {
		who    string
		at     time.Duration
		listed bool
		until  time.Duration // the skip's until, from t0
	}{
		{"a", 0, true, 0},
		{"b", 5 * time.Minute, false, 9 * time.Minute},
		{"b", 9*time.Minute - 1, false, 9 * time.Minute},
		{"a", 10 * time.Minute, true, 0}, // its own next tick
		{"b", 19*time.Minute - 1, false, 19 * time.Minute},
		{"b", 19 * time.Minute, true, 0},
		{"a", 22 * time.Minute, false, 28 * time.Minute}, // b's pass ended at +21m
	}
	lists := 0
	for _, st := range steps {
		e.clock.Set(t0.Add(st.at))
		if st.who == "a" {
			e.poll = a
		} else {
			e.poll = b
		}
		r := e.pass(t)
		if r.Err() != nil {
			t.Fatalf("%s at +%v: %v", st.who, st.at, r.Err())
		}
		if st.listed {
			lists++
		}
		if r.Skipped() == st.listed || listRequests(e.api) != lists {
			t.Errorf("%s at +%v: listed %v (%d list requests in all), want %v: %s", st.who, st.at, !r.Skipped(), listRequests(e.api), st.listed, r.Summary())
			continue
		}
		if !st.listed && (r.Skip.Reason != SkipRecent || !r.Skip.Until.Equal(t0.Add(st.until))) {
			t.Errorf("%s at +%v: skip %+v, want recent until +%v", st.who, st.at, r.Skip, st.until)
		}
	}
	if got := passCount(t, e, a.scope, "skipped_recent"); got != "4" {
		t.Errorf("skipped_recent = %s, want 4", got)
	}
}

func TestFleetGap(t *testing.T) {
	rec := func(d time.Duration) sink.PassRecord { return sink.PassRecord{LastStart: t0, LastEnd: t0.Add(d)} }
	for _, tc := range []struct {
		interval time.Duration
		last     sink.PassRecord
		want     time.Duration
	}{
		{0, rec(time.Second), 0},                                  // no interval: the lease only
		{-time.Minute, rec(time.Second), 0},                       //
		{10 * time.Minute, sink.PassRecord{}, 9 * time.Minute},    // no pass yet
		{10 * time.Minute, rec(2 * time.Minute), 7 * time.Minute}, // 9 min from the start
		{10 * time.Minute, rec(-time.Minute), 9 * time.Minute},    // a clock stepped back: duration 0
		{10 * time.Minute, rec(9 * time.Minute), 0},               // the last pass took the whole gap
		{10 * time.Minute, rec(time.Hour), 0},                     //
		{time.Second, rec(100 * time.Millisecond), 800 * time.Millisecond},
	} {
		if got := fleetGap(tc.interval, tc.last); got != tc.want {
			t.Errorf("fleetGap(%v, last pass %v) = %v, want %v", tc.interval, tc.last.LastEnd.Sub(tc.last.LastStart), got, tc.want)
		}
	}
}

// The lease is renewed while the pass lists: each page moves the clock by
// 40 s and lets one renewal happen, so after three pages the clock is past
// the lease first granted (1 minute) and another process still finds it
// held; the pass ends with its own token and records.
func TestPassLeaseRenewedWhileListing(t *testing.T) { backends(t, testPassLeaseRenewedWhileListing) }

func testPassLeaseRenewedWhileListing(t *testing.T, pg bool) {
	ticks := make(chan time.Time)
	e := newEnv(t, envOptions{postgres: pg, pageSize: 5, passLease: time.Minute, renewTicks: ticks})
	addDone(e.api, "r", 12) // 3 pages
	scope := e.poll.scope
	var (
		mu        sync.Mutex
		intrusion error
		pages     int
	)
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !isList(r) {
			return nil
		}
		now := e.clock.Now().Add(40 * time.Second)
		e.clock.Set(now)
		ticks <- now
		waitUntil(t, "a renewal at the new time", func() bool {
			return e.scopeRecord(t, scope).HeldUntil.Equal(now.Add(time.Minute))
		})
		mu.Lock()
		defer mu.Unlock()
		if pages++; pages == 3 {
			_, _, intrusion = e.sink.AcquirePass(context.Background(), scope, intruder, time.Minute, 0)
		}
		return nil
	})
	r := e.pass(t)
	if r.Err() != nil || !r.Success() || r.New != 12 || r.List.Pages != 3 {
		t.Fatalf("pass: %s (err %v)", r.Summary(), r.Err())
	}
	if !errors.Is(intrusion, sink.ErrPassHeld) {
		t.Errorf("another process's AcquirePass at +2m = %v, want ErrPassHeld (the lease was renewed)", intrusion)
	}
	rec := e.scopeRecord(t, scope)
	if rec.Token != 1 || rec.Holder != "" || rec.LastHolder != e.poll.cfg.Owner || !rec.LastEnd.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("record after the pass: %+v", rec)
	}
}

// A renewal that finds the lease taken over (fenced: the holder was paused
// past its lease, say, and another process took it) stops the listing at
// once, is logged, fails the pass (ErrPassLost), records nothing, and the
// keys recorded before still have their effects run.
func TestLostLeaseStopsListing(t *testing.T) { backends(t, testLostLeaseStopsListing) }

func testLostLeaseStopsListing(t *testing.T, pg bool) {
	ticks := make(chan time.Time)
	e := newEnv(t, envOptions{postgres: pg, pageSize: 5, passLease: time.Minute, renewTicks: ticks})
	addDone(e.api, "x", 12)
	scope := e.poll.scope
	var takeover error
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !isList(r) || r.URL.Query().Get("pageToken") == "" {
			return nil
		}
		// Page 2: the lease has run out unrenewed, another process takes it
		// over, and then this holder's renewal comes.
		e.clock.Set(t0.Add(time.Minute))
		_, _, takeover = e.sink.AcquirePass(context.Background(), scope, intruder, time.Minute, 0)
		ticks <- e.clock.Now()
		return &geminifake.Fault{Delay: 30 * time.Second} // until the client gives up
	})
	r := e.pass(t)
	if takeover != nil {
		t.Fatalf("taking the expired lease over: %v", takeover)
	}
	if !errors.Is(r.ListErr, ErrPassLost) || !errors.Is(r.ListErr, sink.ErrFenced) || r.Success() {
		t.Fatalf("list err = %v, want ErrPassLost wrapping ErrFenced", r.ListErr)
	}
	if r.List.Duration > 20*time.Second {
		t.Errorf("the listing went on for %v after the lease was lost", r.List.Duration)
	}
	if r.List.Pages != 1 || r.New != 5 || r.Effects.OK != 5 {
		t.Errorf("want one page, 5 new keys, their 5 effects run: %s", r.Summary())
	}
	rec := e.scopeRecord(t, scope)
	if rec.Holder != intruder || rec.Token != 2 || !rec.LastEnd.IsZero() {
		t.Errorf("the lost pass recorded something or touched the new lease: %+v", rec)
	}
	if !strings.Contains(e.logs.String(), "lost the pass lease") {
		t.Errorf("the loss was not logged:\n%s", e.logs)
	}
	if got := passCount(t, e, scope, "lease_lost"); got != "1" {
		t.Errorf("lease_lost = %s, want 1", got)
	}
}

// A lease that cannot be renewed (the SQLite write lock held elsewhere)
// stops the listing once it has run out by the local clock, and not before;
// nobody took it over, so the failed pass is still recorded and the lease
// released.
func TestUnrenewableLeaseStopsListing(t *testing.T) {
	t.Parallel()
	ticks := make(chan time.Time)
	e := newEnv(t, envOptions{pageSize: 5, passLease: time.Minute, renewEvery: 200 * time.Millisecond, renewTicks: ticks})
	for i := range 12 { // not terminal: the listing itself never writes
		e.api.Add(geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("u-%02d", i)), State: "RUNNING", CreateTime: t0.Add(-time.Hour)})
	}
	db, err := sql.Open("sqlite", "file:"+e.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var stillListing bool
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !isList(r) || r.URL.Query().Get("pageToken") == "" {
			return nil
		}
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Error(err)
			return nil
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
			t.Error(err)
			return nil
		}
		defer conn.ExecContext(ctx, "ROLLBACK")
		ticks <- e.clock.Now() // fails, but the lease is still valid
		waitUntil(t, "a failed renewal logged", func() bool { return strings.Contains(e.logs.String(), "renewing the pass lease failed") })
		stillListing = r.Context().Err() == nil
		e.clock.Set(t0.Add(time.Minute))
		ticks <- e.clock.Now() // fails, and the lease has run out
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
			t.Error("the listing went on after the lease ran out")
		}
		return &geminifake.Fault{Status: 503}
	})
	r := e.pass(t)
	if !stillListing {
		t.Error("one failed renewal of a valid lease stopped the listing")
	}
	if !errors.Is(r.ListErr, ErrPassLost) || errors.Is(r.ListErr, sink.ErrFenced) || r.RecordErr != nil {
		t.Fatalf("list err %v, record err %v: want ErrPassLost (ran out, not fenced) and the pass recorded", r.ListErr, r.RecordErr)
	}
	rec := e.scopeRecord(t, e.poll.scope)
	if rec.Holder != "" || rec.LastEnd.IsZero() || !rec.LastSuccess.IsZero() || rec.LastHolder != e.poll.cfg.Owner {
		t.Errorf("record after the failed pass: %+v", rec)
	}
}

// A pass cut short by its context (SIGTERM) releases its lease: another
// process lists at once rather than a lease later.
func TestCancelledPassReleasesLease(t *testing.T) { backends(t, testCancelledPassReleasesLease) }

func testCancelledPassReleasesLease(t *testing.T, pg bool) {
	e := newEnv(t, envOptions{postgres: pg, pageSize: 5})
	addDone(e.api, "c", 12)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if isList(r) && r.URL.Query().Get("pageToken") != "" {
			cancel()
			return &geminifake.Fault{Delay: 30 * time.Second}
		}
		return nil
	})
	r := e.poll.Pass(ctx)
	if r.ListErr == nil || errors.Is(r.ListErr, ErrPassLost) {
		t.Fatalf("list err = %v, want the context's", r.ListErr)
	}
	rec := e.scopeRecord(t, e.poll.scope)
	if rec.Holder != "" || rec.LastEnd.IsZero() || rec.LastHolder != e.poll.cfg.Owner {
		t.Errorf("the cancelled pass did not release its lease: %+v", rec)
	}
	if _, _, err := e.sink.AcquirePass(context.Background(), e.poll.scope, intruder, time.Minute, 0); err != nil {
		t.Errorf("another process could not take the released lease: %v", err)
	}
}

// Two scopes (two projects: two stand-ins) polled into one database do not
// block each other: scope A's lease held by another process skips A's
// passes only, and B's recent pass does not hold A's off.
func TestScopesDoNotBlockEachOther(t *testing.T) { backends(t, testScopesDoNotBlockEachOther) }

func testScopesDoNotBlockEachOther(t *testing.T, pg bool) {
	ctx := context.Background()
	e := newEnv(t, envOptions{interval: 10 * time.Minute, postgres: pg})
	apiB := geminifake.New(geminifake.Options{APIKey: testKey, Seed: 2})
	if _, err := apiB.Start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { apiB.Close() })
	a := e.poll
	b, _ := e.newPollOn(t, apiB, envOptions{interval: 10 * time.Minute})
	if a.scope == b.scope {
		t.Fatalf("one scope for two stand-ins: %s", a.scope)
	}
	addDone(e.api, "a", 2)
	addDone(apiB, "b", 3)
	if _, _, err := e.sink.AcquirePass(ctx, a.scope, intruder, time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	pass := func(p *Poll) Result {
		t.Helper()
		e.poll = p
		r := e.pass(t)
		if r.Err() != nil {
			t.Fatal(r.Err())
		}
		return r
	}
	if r := pass(a); r.Skip.Reason != SkipHeld {
		t.Errorf("A with its lease held: %s", r.Summary())
	}
	if r := pass(b); r.Skipped() || r.New != 3 {
		t.Errorf("B while A's lease is held: %s", r.Summary())
	}
	e.clock.Set(t0.Add(time.Minute)) // A's lease has run out; B listed a minute ago
	if r := pass(a); r.Skipped() || r.New != 2 {
		t.Errorf("A a minute after B's pass: %s", r.Summary())
	}
	if r := pass(b); r.Skip.Reason != SkipRecent {
		t.Errorf("B a minute after its own pass: %s", r.Summary())
	}
	if la, lb := listRequests(e.api), listRequests(apiB); la != 1 || lb != 1 {
		t.Errorf("list requests: A %d, B %d; want 1 each", la, lb)
	}
}

// poll --force lists while another process holds the lease, records its
// pass, and leaves the lease alone.
func TestForceListsWithoutLease(t *testing.T) { backends(t, testForceListsWithoutLease) }

func testForceListsWithoutLease(t *testing.T, pg bool) {
	e := newEnv(t, envOptions{postgres: pg, force: true})
	addDone(e.api, "force", 2)
	if _, _, err := e.sink.AcquirePass(context.Background(), e.poll.scope, intruder, time.Hour, 0); err != nil {
		t.Fatal(err)
	}
	r := e.pass(t)
	if r.Skipped() || !r.Forced || !r.Success() || r.New != 2 {
		t.Fatalf("forced pass: %s (err %v)", r.Summary(), r.Err())
	}
	rec := e.scopeRecord(t, e.poll.scope)
	if rec.Holder != intruder || rec.Token != 1 || rec.LastHolder != e.poll.cfg.Owner || rec.LastSuccess.IsZero() {
		t.Errorf("after the forced pass: %+v", rec)
	}
	if got := passCount(t, e, e.poll.scope, "forced"); got != "1" {
		t.Errorf("forced = %s, want 1", got)
	}
}

// The summary of a skipped pass, as text and JSON: skipped, holder, until
// after the spec's fields; absent from a pass that listed.
func TestSummarySkipped(t *testing.T) {
	r := Result{Start: t0, End: t0.Add(12 * time.Millisecond),
		Skip: Skip{Reason: SkipHeld, Holder: "web 2", Until: t0.Add(90 * time.Second)}}
	want := `poll: listed=0 terminal=0 skipped_old=0 new=0 duplicates=0 invalid=0 effects_ok=0 effects_failed=0 fenced=0 api_requests=0 full_scan=false duration=12ms skipped=held holder="web 2" until=2025-12-01T00:01:30Z`
	if got := r.Summary().String(); got != want {
		t.Errorf("text\n got %s\nwant %s", got, want)
	}
	var b strings.Builder
	if err := r.Summary().Write(&b, true); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(b.String()), &m); err != nil {
		t.Fatal(err)
	}
	if m["skipped"] != "held" || m["holder"] != "web 2" || m["until"] != "2025-12-01T00:01:30Z" || !strings.HasSuffix(strings.TrimSpace(b.String()), `"skipped":"held","holder":"web 2","until":"2025-12-01T00:01:30Z"}`) {
		t.Errorf("JSON %s", b.String())
	}
	b.Reset()
	if err := sampleResult().Summary().Write(&b, true); err != nil || strings.Contains(b.String(), "skipped\"") || strings.Contains(b.String(), "holder") {
		t.Errorf("a pass that listed: %s", b.String())
	}
}

// The pass lease's configuration: defaults, and a renewal period that is
// not shorter than the lease refused.
func TestPollLeaseConfig(t *testing.T) {
	e := newEnv(t, envOptions{interval: time.Minute})
	if c := e.poll.cfg; c.PassLease != DefaultPassLease || c.RenewEvery != DefaultPassLease/3 || c.MinInterval != time.Minute {
		t.Errorf("defaults: lease %v, renew every %v, min interval %v", c.PassLease, c.RenewEvery, c.MinInterval)
	}
	base := e.poll.cfg
	for _, c := range []struct{ lease, every time.Duration }{{time.Second, time.Second}, {time.Second, 2 * time.Second}, {-time.Second, 0}, {time.Second, -1}} {
		cfg := base
		cfg.PassLease, cfg.RenewEvery = c.lease, c.every
		if _, err := NewPoll(cfg); err == nil {
			t.Errorf("lease %v renewed every %v: accepted", c.lease, c.every)
		}
	}
}
