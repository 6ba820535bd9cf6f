package dispatch

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// openAt opens (creating) the sink at path for the parent's own use, with
// the busy timeout the child processes use.
func openAt(t *testing.T, path string) *sqlite.Sink {
	t.Helper()
	return sqlitetest.Open(t, path, sink.Options{BusyTimeout: 30 * time.Second})
}

// writeLockFree reports whether a write transaction can begin on the
// database now (within 200ms).
func writeLockFree(t *testing.T, path string) bool {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(200)&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		return false
	}
	_ = tx.Rollback()
	return true
}

// TestR1EightProcessesOneEffectPerKey: eight dispatcher processes drain the
// same 200 keys through an exec effect; each key's effect runs exactly once.
// It runs on SQLite and on PostgreSQL.
func TestR1EightProcessesOneEffectPerKey(t *testing.T) {
	testkit.ParallelUnlessRace(t)
	if testing.Short() {
		t.Skip("multi-process")
	}
	forEachBackend(t, testR1)
}

func testR1(t *testing.T, db, dir string) {
	logPath := filepath.Join(dir, "effects.log")
	ks := keys(200)
	s := openDB(t, db)
	recordMany(t, s, ks)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The log's path is in the command itself, not in the environment
	// (t.Setenv), so that the test can run in parallel.
	cfg := childConfig{DB: db, Effect: "exec", Exec: `echo "$GEMRECON_KEY $GEMRECON_TOKEN" >> '` + strings.ReplaceAll(logPath, "'", `'\''`) + `'`,
		Concurrency: 4, Mode: "until-done"}
	start := time.Now()
	var children []*child
	for range 8 {
		children = append(children, startChild(t, cfg))
	}
	var total Summary
	for i, c := range children {
		sum := c.wait(t, 60*time.Second)
		t.Logf("process %d: %+v", i, sum)
		total.Claimed += sum.Claimed
		total.OK += sum.OK
		total.Failed += sum.Failed
		total.Fenced += sum.Fenced
	}
	t.Logf("R1: 8 processes drained 200 keys in %v", time.Since(start).Round(time.Millisecond))
	lines, perKey := effectLog(t, logPath)
	if lines != 200 || len(perKey) != 200 {
		t.Errorf("effect log: %d lines for %d keys, want 200 for 200", lines, len(perKey))
	}
	for _, k := range ks {
		if got := perKey[k]; len(got) != 1 || got[0] != 1 {
			t.Errorf("key %s: effect tokens %v, want exactly [1]", k, got)
		}
	}
	if total != (Summary{Claimed: 200, OK: 200}) {
		t.Errorf("processes together = %+v, want 200 claimed and ok", total)
	}
	s = openDB(t, db)
	defer s.Close()
	done, err := s.List(context.Background(), sink.ListOptions{State: sink.StateDone})
	if err != nil || len(done) != 200 {
		t.Errorf("done keys = %d, %v, want 200", len(done), err)
	}
	if isSQLite(db) {
		sqlitetest.IntegrityCheck(t, db)
	}
}

// TestR2KillNemesis: a dispatcher process is SIGKILLed at random moments at
// least ten times and restarted until all keys are done.
//
// The effect is appendEffect (append "key token" with O_APPEND, fdatasync):
// an exec per key would make 2,000 keys too slow under -race on two cores.
// One dispatcher runs at a time, so leases only expire through kills.
//
// Bound asserted: duplicate effect lines <= kills × Concurrency. A duplicate
// is an attempt whose effect ran but whose done record was not committed, and
// only a killed process leaves such attempts behind (its claims are taken
// over when their lease expires); a process has at most Concurrency attempts
// running, so one kill leaves at most Concurrency of them.
func TestR2KillNemesis(t *testing.T) {
	testkit.ParallelUnlessRace(t)
	if testing.Short() {
		t.Skip("multi-process")
	}
	const (
		nKeys       = 2000
		concurrency = 16
		minKills    = 10
		lease       = 2 * time.Second
	)
	dir := t.TempDir()
	if d := os.Getenv("GDT_KEEP"); d != "" {
		dir = d // debugging: keep the database and the effect log
	}
	db, logPath := filepath.Join(dir, "gemrecon.db"), filepath.Join(dir, "effects.log")
	ks := keys(nKeys)
	s := openAt(t, db)
	recordMany(t, s, ks)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := childConfig{DB: db, Effect: "append", Log: logPath, Lease: lease, Timeout: lease / 2,
		Concurrency: concurrency, Mode: "until-done"}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	start := time.Now()
	kills := 0
	var last *child
	for kills < minKills+2 && time.Since(start) < 45*time.Second {
		c := startChild(t, cfg)
		if _, ok := c.waitLine(t, "READY", 20*time.Second); !ok {
			t.Fatalf("child never became ready; stderr:\n%s", c.stderr.String())
		}
		time.Sleep(time.Duration(rng.Int64N(int64(600 * time.Millisecond))))
		if c.exited() {
			// It finished all the work before its kill.
			if kills >= minKills {
				last = c
				break
			}
			// A fast machine: give the nemesis more work to interrupt.
			c.wait(t, 10*time.Second)
			more := keyRange(len(ks), 1000)
			s := openAt(t, db)
			recordMany(t, s, more)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			ks = append(ks, more...)
			continue
		}
		if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-c.done
		kills++
	}
	t.Logf("R2: %d kills in %v", kills, time.Since(start).Round(time.Millisecond))
	if last == nil {
		last = startChild(t, cfg)
	}
	sum := last.wait(t, 60*time.Second)
	elapsed := time.Since(start)

	if kills < minKills {
		t.Errorf("kills = %d, want at least %d (the work finished too soon)", kills, minKills)
	}
	lines, perKey := effectLog(t, logPath)
	dups := lines - len(perKey)
	s = openAt(t, db)
	defer s.Close()
	ctx := context.Background()
	notDone := 0
	for _, k := range ks {
		e, err := s.Get(ctx, k)
		if err != nil || e.State != sink.StateDone {
			notDone++
			if notDone < 5 {
				t.Errorf("Get(%q) = %s, %v, want done", k, e.State, err)
			}
			continue
		}
		// The attempt recorded as done is one whose effect ran.
		if !slices.Contains(perKey[k], e.Token) {
			t.Errorf("key %s done with token %d, but the effect log has tokens %v", k, e.Token, perKey[k])
		}
	}
	if notDone > 0 {
		t.Errorf("%d of %d keys not done", notDone, len(ks))
	}
	if len(perKey) != len(ks) || lines < len(ks) {
		t.Errorf("effect log: %d lines for %d keys, want >= %d lines for %d keys", lines, len(perKey), len(ks), len(ks))
	}
	if bound := kills * concurrency; dups > bound {
		t.Errorf("duplicate effect lines = %d, want <= kills × concurrency = %d × %d = %d", dups, kills, concurrency, bound)
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("R2: %d keys, %d kills, %d effect lines, %d duplicates (bound %d), fenced %d, last process %+v, %v",
		len(ks), kills, lines, dups, kills*concurrency, st.Fenced, sum, elapsed.Round(time.Millisecond))
	sqlitetest.IntegrityCheck(t, db)
}

// TestR3StoppedHolderIsFenced: a holder SIGSTOPped mid-effect past its lease
// is taken over; the new holder finishes; after SIGCONT the stale holder's
// outcome is rejected as fenced. It runs on SQLite and on PostgreSQL.
func TestR3StoppedHolderIsFenced(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("multi-process")
	}
	forEachBackend(t, testR3)
}

func testR3(t *testing.T, db, dir string) {
	const lease = 3 * time.Second
	logPath := filepath.Join(dir, "effects.log")
	key := "gemini:batches/r3"
	s := openDB(t, db)
	recordMany(t, s, []string{key})

	// A: claims, writes its effect line, announces it and holds for 1s.
	a := startChild(t, childConfig{DB: db, Effect: "append", Log: logPath, Lease: lease, Timeout: lease - 500*time.Millisecond,
		Concurrency: 1, Hold: time.Second, Mode: "once"})
	if _, ok := a.waitLine(t, "EFFECT-STARTED", 30*time.Second); !ok {
		t.Fatalf("A never started its effect; stderr:\n%s", a.stderr.String())
	}
	if isSQLite(db) {
		stopWithoutWriteLock(t, a, db)
	} else {
		// Claims, renewals and outcomes are single autocommit statements
		// on PostgreSQL: one in flight when A stops still commits on the
		// server, and a stopped A holds no row lock that B would wait on.
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	stoppedAt := time.Now()
	defer a.cmd.Process.Signal(syscall.SIGCONT)

	// Wait (bounded) until A's lease has expired.
	e, err := s.Get(context.Background(), key)
	if err != nil || e.State != sink.StateClaimed || e.Token != 1 {
		t.Fatalf("Get() = %s token %d, %v, want claimed with token 1", e.State, e.Token, err)
	}
	if wait := time.Until(e.LeaseUntil) + 100*time.Millisecond; wait > 0 {
		if wait > 2*lease {
			t.Fatalf("lease until %v is too far away", e.LeaseUntil)
		}
		time.Sleep(wait)
	}
	// B takes the key over and finishes it.
	b := startChild(t, childConfig{DB: db, Effect: "append", Log: logPath, Lease: lease, Timeout: lease - 500*time.Millisecond,
		Concurrency: 1, Mode: "once"})
	bs := b.wait(t, 30*time.Second)
	if bs.Summary != (Summary{Claimed: 1, OK: 1}) {
		t.Errorf("B = %+v, want one claim, done; stderr:\n%s", bs, b.stderr.String())
	}
	if e, err := s.Get(context.Background(), key); err != nil || e.State != sink.StateDone || e.Token != 2 {
		t.Errorf("after B: Get() = %s token %d, %v, want done with token 2", e.State, e.Token, err)
	}
	t.Logf("A stopped for %v", time.Since(stoppedAt).Round(time.Millisecond))

	// Wake A: its outcome must be fenced.
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	as := a.wait(t, 30*time.Second)
	if as.Summary != (Summary{Claimed: 1, Fenced: 1}) {
		t.Errorf("A = %+v, want one claim, fenced; stderr:\n%s", as, a.stderr.String())
	}
	if !strings.Contains(a.stderr.String(), "FENCED") {
		t.Errorf("A's log does not report the fenced outcome loudly; stderr:\n%s", a.stderr.String())
	}
	e, err = s.Get(context.Background(), key)
	if err != nil || e.State != sink.StateDone || e.Token != 2 || e.Attempts != 2 {
		t.Errorf("Get() = %s token %d attempts %d, %v, want done with token 2 after 2 attempts", e.State, e.Token, e.Attempts, err)
	}
	lines, perKey := effectLog(t, logPath)
	if got := perKey[key]; lines != 2 || len(got) != 2 || got[0] == got[1] {
		t.Errorf("effect log tokens = %v (%d lines), want two lines with distinct tokens", got, lines)
	}
	st, err := s.Stats(context.Background())
	if err != nil || st.Fenced != 1 {
		t.Errorf("Stats().Fenced = %d, %v, want 1", st.Fenced, err)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if isSQLite(db) {
		sqlitetest.IntegrityCheck(t, db)
	}
}

// stopWithoutWriteLock SIGSTOPs c at a moment it does not hold SQLite's
// write lock on path (a batch claim or a renewal may be in flight): a
// stopped process holding it would stall every other writer.
func stopWithoutWriteLock(t *testing.T, c *child, path string) {
	t.Helper()
	for i := 0; ; i++ {
		if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if writeLockFree(t, path) {
			return
		}
		if i == 100 {
			t.Fatal("the process held the write lock at every one of 100 stops")
		}
		if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
