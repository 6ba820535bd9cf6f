package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// Replicas of one fleet on one database (issue 14, spec §5.5): real
// gemrecon processes, the stand-in over HTTP with completions arriving
// throughout, real SQLite files and a real PostgreSQL server. Each test
// runs a single replica of a second scope (another stand-in: another
// project) on the same database over the same time, which is both the
// measure of "one replica's list requests" and the proof that two scopes
// do not block each other. The tests run in parallel with each other: each
// is mostly waiting for ~10 s of completions.

const replicaSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// completions drives batches on one stand-in: each step adds a running
// batch and turns the one added lag steps before terminal, cycling through
// the terminal states.
type completions struct {
	api    *geminifake.Server
	prefix string
	n      int // batches added
	ended  int // of them made terminal
}

var replicaEndStates = []string{"SUCCEEDED", "FAILED", "SUCCEEDED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED"}

func (c *completions) name(i int) string {
	return geminifake.GeminiName(fmt.Sprintf("%s-%03d", c.prefix, i))
}

func (c *completions) step(lag int) {
	c.api.Add(geminifake.Batch{Name: c.name(c.n), State: "RUNNING", CreateTime: time.Now().Add(-time.Minute)})
	c.n++
	for c.ended < c.n-lag {
		c.end(c.ended)
	}
}

func (c *completions) end(i int) {
	st := replicaEndStates[i%len(replicaEndStates)]
	c.api.Update(c.name(i), func(b *geminifake.Batch) {
		b.State, b.EndTime = st, time.Now()
		if st == "FAILED" {
			b.Error = &geminifake.Status{Code: 8, Message: "quota"}
		}
	})
	c.ended = i + 1
}

// endAll turns every batch terminal.
func (c *completions) endAll() {
	for c.ended < c.n {
		c.end(c.ended)
	}
}

func (c *completions) keys() []string {
	var ks []string
	for i := range c.n {
		ks = append(ks, "gemini:"+c.name(i))
	}
	return ks
}

// listRequests counts the stand-in's list requests received in [from, to),
// and of them the first pages (one per pass that listed).
func listRequests(api *geminifake.Server, from, to time.Time) (requests, passes int) {
	for _, r := range api.Requests() {
		if r.Method != http.MethodGet || !strings.HasSuffix(r.Path, "/batches") || r.Time.Before(from) || !r.Time.Before(to) {
			continue
		}
		requests++
		if r.Query.Get("pageToken") == "" {
			passes++
		}
	}
	return requests, passes
}

// slowLists holds every list response of api for d.
func slowLists(api *geminifake.Server, d time.Duration) {
	api.SetHook(func(r *http.Request) *geminifake.Fault {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/batches") {
			return &geminifake.Fault{Delay: d}
		}
		return nil
	})
}

func effectArg(log string) string {
	return `--exec=echo "$GEMRECON_KEY $GEMRECON_TOKEN" >> ` + shellQuote(log)
}

// replica is one running `gemrecon serve --poll-every` process.
type replica struct {
	cmd    *exec.Cmd
	stderr *testkit.Buffer
	addr   string
}

// startServe starts `serve --poll-every 1s` on db, polling api, with the
// effect appending to log; extra flags come last (and win).
func startServe(t *testing.T, db string, api *geminifake.Server, log string, extra ...string) *replica {
	t.Helper()
	r := &replica{addr: freeAddr(t), stderr: &testkit.Buffer{}}
	args := append([]string{"--db", db, "--log-level", "warn", "serve", "--listen", r.addr, "--poll-every", "1s",
		"--base-url", api.URL(), "--qps", "0", "--page-size", "10", effectArg(log)}, extra...)
	r.cmd = child(t, args...)
	r.cmd.Env = append(r.cmd.Env, "GEMRECON_WEBHOOK_SECRET="+replicaSecret, "GEMINI_API_KEY="+testAPIKey)
	r.cmd.Stderr = r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.cmd.Process.Kill(); _ = r.cmd.Wait() })
	waitHealthy(t, "http://"+r.addr+"/healthz", r.stderr)
	return r
}

// stop sends SIGTERM and wants exit 0 within 30 s.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve pid %d exited with %v\n%s", r.cmd.Process.Pid, err, r.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("serve pid %d did not stop within 30s of SIGTERM", r.cmd.Process.Pid)
	}
}

// passCounts scrapes the replica's gemrecon_poll_passes_total by outcome.
func (r *replica) passCounts(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	got := map[string]float64{}
	re := regexp.MustCompile(`(?m)^gemrecon_poll_passes_total\{outcome="([a-z_]+)",scope="[^"]*"\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(b.String(), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		got[m[1]] += v
	}
	return got
}

// statsJSON reads `gemrecon stats --json`.
func statsJSON(t *testing.T, db string) sink.Stats {
	t.Helper()
	r := gemrecon(t, "--db", db, "stats", "--json")
	var st sink.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%v", err, r)
	}
	return st
}

// scopeOf returns the pass record of the scope that polls api.
func scopeOf(st sink.Stats, api *geminifake.Server) (sink.PassRecord, bool) {
	u, _ := url.Parse(api.URL())
	for _, p := range st.Passes {
		if strings.Contains(p.Scope, "//"+u.Host+"/") {
			return p, true
		}
	}
	return sink.PassRecord{}, false
}

// holderPid is the process id in an owner "host:pid:random" (0 if none).
func holderPid(owner string) int {
	parts := strings.Split(owner, ":")
	if len(parts) < 3 {
		return 0
	}
	pid, _ := strconv.Atoi(parts[len(parts)-2])
	return pid
}

// waitKeysDone waits (at most 60 s) until n keys are done and none other.
func waitKeysDone(t *testing.T, db string, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st := statsJSON(t, db)
		if st.ByState[sink.StateDone] == n && st.ByState[sink.StatePending]+st.ByState[sink.StateClaimed]+st.ByState[sink.StateDead] == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s: %v, want %d done", st.ByState, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// effectsPerKey counts the effect log's lines per key, and fails the test
// for a key of keys without one, or for a line of an unknown key.
func effectsPerKey(t *testing.T, log string, keys []string) map[string]int {
	t.Helper()
	per := map[string]int{}
	for _, l := range readLines(t, log) {
		per[strings.Fields(l)[0]]++
	}
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
		if per[k] == 0 {
			t.Errorf("completion %s: its effect never ran", k)
		}
	}
	for k := range per {
		if !want[k] {
			t.Errorf("an effect ran for %s, which no stand-in listed", k)
		}
	}
	return per
}

// The fleet's list requests over the window are at most 1.5 × the single
// replica's, which itself kept listing about once a second.
func checkListRatio(t *testing.T, fleet, single *geminifake.Server, from, to time.Time) {
	t.Helper()
	fr, fp := listRequests(fleet, from, to)
	sr, sp := listRequests(single, from, to)
	t.Logf("over %v: the fleet of 3 sent %d list requests (%d passes), the single replica %d (%d passes)",
		to.Sub(from).Round(time.Millisecond), fr, fp, sr, sp)
	if 2*fr > 3*sr {
		t.Errorf("the fleet sent %d list requests, more than 1.5 × the single replica's %d", fr, sr)
	}
	if secs := int(to.Sub(from) / time.Second); sp < secs*6/10 {
		t.Errorf("the single replica of the other scope listed %d times in %ds: blocked by the fleet's scope?", sp, secs)
	}
	if fp == 0 {
		t.Error("the fleet never listed")
	}
}

// 3 `serve --poll-every 1s` replicas of one scope plus one replica of
// another scope on one database, ~10 s of completions.
func testServeReplicas(t *testing.T, db string) {
	log := filepath.Join(t.TempDir(), "effects.log")
	apiA, apiB := fakeAPI(t), fakeAPI(t)
	a := &completions{api: apiA, prefix: "fleet"}
	b := &completions{api: apiB, prefix: "single"}
	var fleet []*replica
	for range 3 {
		fleet = append(fleet, startServe(t, db, apiA, log))
	}
	single := startServe(t, db, apiB, log)

	from := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	for range 40 {
		<-tick.C
		a.step(3)
		b.step(3)
	}
	tick.Stop()
	to := time.Now()
	a.endAll()
	b.endAll()
	checkListRatio(t, apiA, apiB, from, to)
	waitKeysDone(t, db, int64(a.n+b.n))

	// Every replica counted its passes; some of the fleet's were skipped,
	// and their summary lines say by whom and until when.
	var counts []map[string]float64
	skipped, listed := 0.0, 0.0
	for _, r := range fleet {
		c := r.passCounts(t)
		counts = append(counts, c)
		skipped += c["skipped_held"] + c["skipped_recent"]
		listed += c["listed"]
	}
	if skipped == 0 || listed == 0 {
		t.Errorf("gemrecon_poll_passes_total of the fleet: %v", counts)
	}
	skipLine := regexp.MustCompile(`(?m)^poll: listed=0 .* skipped=(held|recent) holder=\S+:\d+:\S+ until=\S+$`)
	lines := 0
	for _, r := range fleet {
		lines += len(skipLine.FindAllString(r.stderr.String(), -1))
	}
	if lines == 0 {
		t.Errorf("no skipped summary line in the fleet's stderr:\n%s", fleet[0].stderr)
	}

	// stats shows each scope's last pass and the process that ran it.
	st := statsJSON(t, db)
	pids := map[int]bool{}
	for _, r := range fleet {
		pids[r.cmd.Process.Pid] = true
	}
	recA, okA := scopeOf(st, apiA)
	recB, okB := scopeOf(st, apiB)
	if !okA || !okB || len(st.Passes) != 2 {
		t.Fatalf("stats passes: %+v", st.Passes)
	}
	if !pids[holderPid(recA.LastHolder)] || holderPid(recB.LastHolder) != single.cmd.Process.Pid {
		t.Errorf("last holders %q (scope A), %q (scope B); fleet pids %v, single %d", recA.LastHolder, recB.LastHolder, pids, single.cmd.Process.Pid)
	}
	text := gemrecon(t, "--db", db, "stats").stdout
	for _, rec := range []sink.PassRecord{recA, recB} {
		re := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(rec.Scope) + `\n    last pass: +\S+ → \S+ by ` + regexp.QuoteMeta(rec.LastHolder) + `$`)
		if !re.MatchString(text) {
			t.Errorf("stats does not show %s's last pass by %s:\n%s", rec.Scope, rec.LastHolder, text)
		}
	}

	for _, r := range append(fleet, single) {
		r.stop(t)
	}
	for k, n := range effectsPerKey(t, log, append(a.keys(), b.keys()...)) {
		if n != 1 {
			t.Errorf("%s: effect ran %d times, want once", k, n)
		}
	}
}

// Issue 14, "Done when" 1 and 3, PostgreSQL.
func TestReplicasServePostgres(t *testing.T) {
	dsn := pgtest.Schema(t)
	parallelTimed(t)
	initDB(t, dsn)
	testServeReplicas(t, dsn)
}

// Issue 14, "Done when" 1 and 3, SQLite.
func TestReplicasServeSQLite(t *testing.T) {
	parallelTimed(t)
	testServeReplicas(t, newDB(t))
}

// Issue 14, "Done when" 1 and 3: cron on three hosts — three `poll
// --min-interval 1s` processes started at the same instants every second,
// overlapping (the stand-in answers each list request after 100 ms) — and a
// plain `poll` of another scope every second, on one SQLite file.
func TestReplicasOverlappingPolls(t *testing.T) {
	parallelTimed(t)
	db := newDB(t)
	log := filepath.Join(t.TempDir(), "effects.log")
	apiA, apiB := fakeAPI(t), fakeAPI(t)
	slowLists(apiA, 100*time.Millisecond)
	slowLists(apiB, 100*time.Millisecond)
	a := &completions{api: apiA, prefix: "cron"}
	b := &completions{api: apiB, prefix: "single"}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []result
	)
	poll := func(api *geminifake.Server, extra ...string) {
		defer wg.Done()
		args := append([]string{"--db", db, "poll", "--base-url", api.URL(), "--qps", "0", "--page-size", "10", effectArg(log)}, extra...)
		cmd := child(t, args...)
		cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		r := result{code: cmd.ProcessState.ExitCode(), stderr: stderr.String()}
		if err != nil {
			r.stderr += "\n" + err.Error()
		}
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	}
	from := time.Now()
	tick := time.NewTicker(250 * time.Millisecond)
	for i := range 40 {
		<-tick.C
		a.step(3)
		b.step(3)
		if i%4 == 0 {
			wg.Add(4)
			for range 3 {
				go poll(apiA, "--min-interval", "1s")
			}
			go poll(apiB)
		}
	}
	tick.Stop()
	wg.Wait()
	to := time.Now()
	checkListRatio(t, apiA, apiB, from, to)
	skipped := 0
	for _, r := range results {
		if r.code != exitOK {
			t.Errorf("a poll run: %v", r)
		}
		if regexp.MustCompile(`(?m)^poll: listed=0 .* skipped=(held|recent) holder=\S+ until=\S+$`).MatchString(r.stderr) {
			skipped++
		}
	}
	if skipped == 0 {
		t.Errorf("none of the %d poll runs skipped its listing", len(results))
	}

	// The last completions: one forced pass per scope lists regardless.
	a.endAll()
	b.endAll()
	wg.Add(2)
	go poll(apiA, "--force")
	go poll(apiB, "--force")
	wg.Wait()
	for _, r := range results[len(results)-2:] {
		if r.code != exitOK || strings.Contains(r.stderr, "skipped=") {
			t.Errorf("a forced pass: %v", r)
		}
	}
	waitKeysDone(t, db, int64(a.n+b.n))
	st := statsJSON(t, db)
	if rec, ok := scopeOf(st, apiA); !ok || holderPid(rec.LastHolder) == 0 || rec.LastEnd.IsZero() {
		t.Errorf("stats: scope A's last pass %+v", rec)
	}
	for k, n := range effectsPerKey(t, log, append(a.keys(), b.keys()...)) {
		if n != 1 {
			t.Errorf("%s: effect ran %d times, want once", k, n)
		}
	}
}

// Issue 14, "Done when" 2: kill -9 of the replica holding the pass lease
// mid-pass. Passes are long (5+ pages, each list response held 250 ms),
// --pass-lease 2s, --poll-every 1s: another replica starts a pass within
// lease + interval of the kill (plus 1 s for scheduling) and completes it,
// and no completion is missed.
func TestReplicasKillHolderMidPass(t *testing.T) {
	parallelTimed(t)
	const lease, interval = 2 * time.Second, time.Second
	db := newDB(t)
	log := filepath.Join(t.TempDir(), "effects.log")
	api := fakeAPI(t)
	slowLists(api, 250*time.Millisecond)
	c := &completions{api: api, prefix: "kill"}
	for range 25 {
		c.step(0)
	}
	var fleet []*replica
	for range 3 {
		// --lease 4s: the killed process may hold effect claims (claimed at
		// listing, before their effects ran); the others take them over once
		// that lease has run out, not after the default 10 minutes.
		fleet = append(fleet, startServe(t, db, api, log, "--page-size", "5", "--pass-lease", lease.String(),
			"--lease", "4s", "--effect-timeout", "3s"))
	}
	byPid := map[int]*replica{}
	for _, r := range fleet {
		byPid[r.cmd.Process.Pid] = r
	}

	// A pass in progress: a live lease, and a list request served after it
	// was seen, by a holder that still holds it.
	var victim *replica
	var holder string
	deadline := time.Now().Add(30 * time.Second)
	for victim == nil {
		if time.Now().After(deadline) {
			t.Fatal("no pass in progress within 30s")
		}
		rec, _ := scopeOf(statsJSON(t, db), api)
		if rec.Holder == "" || !time.Now().Before(rec.HeldUntil) || byPid[holderPid(rec.Holder)] == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		before, _ := listRequests(api, time.Time{}, time.Now().Add(time.Hour))
		waitFor(t, 10*time.Second, func() bool {
			n, _ := listRequests(api, time.Time{}, time.Now().Add(time.Hour))
			return n > before
		})
		if again, _ := scopeOf(statsJSON(t, db), api); again.Holder == rec.Holder && again.Token == rec.Token {
			holder, victim = rec.Holder, byPid[holderPid(rec.Holder)]
		}
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	// Completions keep arriving while the others wait out the lease.
	var took sink.PassRecord
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for took.LastHolder == "" {
		if time.Since(killed) > lease+interval+20*time.Second {
			t.Fatalf("no pass by another replica within %v of the kill", time.Since(killed))
		}
		select {
		case <-tick.C:
			c.step(2)
		default:
			time.Sleep(20 * time.Millisecond)
		}
		rec, _ := scopeOf(statsJSON(t, db), api)
		if rec.LastHolder != "" && rec.LastHolder != holder && rec.LastEnd.After(killed) {
			took = rec
		}
	}
	t.Logf("killed %s mid-pass; %s started a pass %v later and completed it %v after the kill (lease %v + interval %v)",
		holder, took.LastHolder, took.LastStart.Sub(killed).Round(time.Millisecond), took.LastEnd.Sub(killed).Round(time.Millisecond), lease, interval)
	if took.LastStart.Sub(killed) > lease+interval+time.Second {
		t.Errorf("the takeover pass started %v after the kill, later than lease + interval + 1s", took.LastStart.Sub(killed))
	}
	if byPid[holderPid(took.LastHolder)] == nil || took.LastHolder == holder {
		t.Errorf("the pass after the kill was by %q", took.LastHolder)
	}

	c.endAll()
	waitKeysDone(t, db, int64(c.n))
	for _, r := range fleet {
		if r != victim {
			r.stop(t)
		}
	}
	// Only the killed process can have left an effect that ran without its
	// done record (at most --concurrency, 4): those ran twice.
	twice := 0
	for k, n := range effectsPerKey(t, log, c.keys()) {
		if n > 1 {
			twice++
			t.Logf("%s ran %d times (in flight in the killed process)", k, n)
		}
	}
	if twice > 4 {
		t.Errorf("%d effects ran more than once; the killed process had at most 4 in flight", twice)
	}
}

// poll's replica flags: a pass that finds the scope's pass lease held by
// another process skips its listing, exits 0 and says so (text and JSON);
// --force lists anyway and leaves the lease alone; contradictory flags are
// usage errors.
func TestPollSkipsWhileLeaseHeld(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	api := fakeAPI(t, "SUCCEEDED", "RUNNING")
	db := newDB(t)
	log := filepath.Join(t.TempDir(), "effects.log")
	for _, bad := range [][]string{
		{"--watch", "--force"},
		{"--watch", "--min-interval", "1m"},
		{"--force", "--min-interval", "1m"},
		{"--min-interval", "-1s"},
		{"--pass-lease", "500ms"},
	} {
		if r := gemrecon(t, pollArgs(db, api, bad...)...); r.code != exitUsage {
			t.Errorf("poll %v: want exit 2, got %v", bad, r)
		}
	}
	// The scope as the poll computes it: run one forced pass first.
	r := gemrecon(t, pollArgs(db, api, "--force", effectArg(log))...)
	wantCode(t, r, exitOK)
	st := statsJSON(t, db)
	if len(st.Passes) != 1 || st.Passes[0].Holder != "" {
		t.Fatalf("after a forced pass: %+v", st.Passes)
	}
	scope := st.Passes[0].Scope
	until := time.Now().Add(time.Hour)
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, _, err := s.AcquirePass(t.Context(), scope, "host-b:7:beef", time.Hour, 0); err != nil {
			t.Fatal(err)
		}
	})
	before, _ := listRequests(api, time.Time{}, until)
	r = gemrecon(t, pollArgs(db, api, effectArg(log))...)
	wantCode(t, r, exitOK)
	if !regexp.MustCompile(`(?m)^poll: listed=0 .* api_requests=0 full_scan=false duration=\S+ skipped=held holder=host-b:7:beef until=\S+$`).MatchString(r.stderr) {
		t.Errorf("summary of a skipped pass:\n%s", r.stderr)
	}
	r = gemrecon(t, append([]string{"--log-format", "json"}, pollArgs(db, api, effectArg(log))...)...)
	wantCode(t, r, exitOK)
	var sum map[string]any
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum["skipped"] != "held" || sum["holder"] != "host-b:7:beef" || sum["until"] == nil {
		t.Errorf("JSON summary of a skipped pass: %v\n%s", err, r.stderr)
	}
	if after, _ := listRequests(api, time.Time{}, until); after != before {
		t.Errorf("skipped passes sent %d list requests", after-before)
	}
	r = gemrecon(t, pollArgs(db, api, "--force", effectArg(log))...)
	wantCode(t, r, exitOK)
	if strings.Contains(r.stderr, "skipped=") {
		t.Errorf("a forced pass skipped: %s", r.stderr)
	}
	if rec := statsJSON(t, db).Passes[0]; rec.Holder != "host-b:7:beef" || rec.Token != 1 {
		t.Errorf("a forced pass touched the lease: %+v", rec)
	}
	if lines := readLines(t, log); len(lines) != 1 {
		t.Errorf("effect log %q: want the one terminal batch once", lines)
	}
}
