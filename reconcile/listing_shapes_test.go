package reconcile

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// An operation the API lists without a top-level name must not fail the
// pass (spec §12: a poll pass logs and counts a skip). Before, one nameless
// operation made the page "malformed", so every pass failed for as long as
// the API listed it and no completion on or after that page was recorded.
// An operation whose name is only under metadata.name (where the Gemini API
// repeats it) is recorded under that name.
func TestNamelessOperationDoesNotFailThePass(t *testing.T) {
	e := newEnv(t, envOptions{})
	ct := t0.Add(-time.Hour).Format(time.RFC3339)
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !strings.HasSuffix(r.URL.Path, "/batches") {
			return nil
		}
		return &geminifake.Fault{Body: `{"operations":[` +
			`{"metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"` + ct + `"},"done":true},` +
			`{"metadata":{"name":"batches/meta-only","state":"BATCH_STATE_FAILED","createTime":"` + ct + `"},"done":true,"error":{"code":8,"message":"quota"}},` +
			`{"name":"batches/fine","metadata":{"name":"batches/fine","state":"BATCH_STATE_SUCCEEDED","createTime":"` + ct + `"},"done":true}]}`}
	})
	r := e.pass(t)
	if err := r.Err(); err != nil {
		t.Fatalf("the pass failed: %v", err)
	}
	s := r.Summary()
	if s.Invalid != 1 || s.New != 2 || s.Terminal != 3 || !r.Success() {
		t.Errorf("summary %s; want terminal=3 new=2 invalid=1", s)
	}
	for _, k := range []string{key("batches/fine"), key("batches/meta-only")} {
		if n := e.eff.count(k); n != 1 {
			t.Errorf("%s ran %d times, want 1", k, n)
		}
	}
	if !strings.Contains(e.logs.String(), "cannot be a key") {
		t.Errorf("the nameless operation was not logged:\n%s", e.logs.String())
	}
}

// A batch listed without createTime but with an endTime or updateTime
// before the window is old: it was created before it ended or was last
// updated. Before, such a batch was never "old", so it was handed over on
// every pass; once purge had deleted its done key (purge trusts that a key
// done longer ago than the lookback is never handed over again), the next
// pass recorded it as new and its effect ran a second time.
func TestPurgedKeyWithoutCreateTimeDoesNotRunAgain(t *testing.T) {
	e := newEnv(t, envOptions{})
	ended := t0.Add(-time.Hour)
	e.api.Add(
		geminifake.Batch{Name: "batches/end-only", State: "SUCCEEDED", EndTime: ended},
		geminifake.Batch{Name: "batches/update-only", State: "FAILED", UpdateTime: ended},
	)
	r := e.pass(t)
	if err := r.Err(); err != nil || r.Summary().New != 2 {
		t.Fatalf("first pass: %s, %v", r.Summary(), err)
	}
	// Three days on, purge deletes what was done before the window
	// (purge --older-than 72h, which the lookback guard allows).
	e.clock.Set(e.clock.Now().Add(80 * time.Hour))
	n, err := e.sink.Purge(context.Background(), e.poller.Lookback())
	if err != nil || len(n) != 2 {
		t.Fatalf("purge: %q, %v", n, err)
	}
	r = e.pass(t)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if s := r.Summary(); s.New != 0 || s.SkippedOld != 2 {
		t.Errorf("after the purge: %s; want new=0 skipped_old=2", s)
	}
	for _, k := range []string{key("batches/end-only"), key("batches/update-only")} {
		if n := e.eff.count(k); n != 1 {
			t.Errorf("%s ran %d times, want 1", k, n)
		}
	}
}

// A long-running operation with "done": true has finished: that is the
// operation's contract, while the batch states are an enum the API may
// extend. One whose state gemrecon does not know (a new state, or
// BATCH_STATE_UNSPECIFIED, or none at all) is a completion and must be
// recorded; before, it counted as non-terminal on every pass and its effect
// never ran. A known non-terminal state wins over done (a running batch is
// never run on partial results), and without done an unknown state stays
// non-terminal.
func TestDoneOperationWithUnknownStateIsRecorded(t *testing.T) {
	e := newEnv(t, envOptions{})
	ct := t0.Add(-time.Hour).Format(time.RFC3339)
	op := func(id, state, done string) string {
		st := ""
		if state != "" {
			st = `"state":"` + state + `",`
		}
		return `{"name":"batches/` + id + `","metadata":{"name":"batches/` + id + `",` + st + `"createTime":"` + ct + `"}` + done + `}`
	}
	const done = `,"done":true`
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !strings.HasSuffix(r.URL.Path, "/batches") {
			return nil
		}
		return &geminifake.Fault{Body: `{"operations":[` + strings.Join([]string{
			op("new-state", "BATCH_STATE_SOMETHING_NEW", done+`,"response":{"responsesFile":"files/x"}`),
			op("unspecified", "BATCH_STATE_UNSPECIFIED", done+`,"error":{"code":13,"message":"internal"}`),
			op("no-state", "", done+`,"error":{"code":8,"message":"quota"}`),
			op("running-done", "BATCH_STATE_RUNNING", done),
			op("new-not-done", "BATCH_STATE_SOMETHING_NEW", ""),
		}, ",") + `]}`}
	})
	r := e.pass(t)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if s := r.Summary(); s.Terminal != 3 || s.New != 3 {
		t.Errorf("summary %s; want terminal=3 new=3", s)
	}
	for id, want := range map[string]int{"new-state": 1, "unspecified": 1, "no-state": 1, "running-done": 0, "new-not-done": 0} {
		if n := e.eff.count(key("batches/" + id)); n != want {
			t.Errorf("batches/%s ran %d times, want %d", id, n, want)
		}
	}
}

// Spec §12: a name with an unpaired surrogate escape (or invalid UTF-8) is
// invalid, not decoded with replacement characters, on the poll path as on
// the webhook's. Before, the listing decoded names with encoding/json, so
// batches/x\ud800 and batches/x\udbff both became batches/x\ufffd: one key,
// the second completion a "duplicate" whose effect never ran.
func TestListedNameWithUnpairedSurrogateIsInvalid(t *testing.T) {
	e := newEnv(t, envOptions{})
	ct := t0.Add(-time.Hour).Format(time.RFC3339)
	op := func(name string) string {
		return `{"name":"` + name + `","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"` + ct + `"},"done":true}`
	}
	e.api.SetHook(func(r *http.Request) *geminifake.Fault {
		if !strings.HasSuffix(r.URL.Path, "/batches") {
			return nil
		}
		return &geminifake.Fault{Body: `{"operations":[` + strings.Join([]string{
			op(`batches/x\ud800`), op(`batches/x\udbff`), op("batches/x\xff"),
			op(`batches/pair-\ud83d\ude00`), op(`batches/fine`),
		}, ",") + `]}`}
	})
	r := e.pass(t)
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if s := r.Summary(); s.Invalid != 3 || s.New != 2 {
		t.Errorf("summary %s; want invalid=3 new=2", s)
	}
	if n := e.eff.count(key("batches/x\ufffd")); n != 0 {
		t.Errorf("a key with a replacement character ran %d times", n)
	}
	for _, k := range []string{key("batches/pair-\U0001F600"), key("batches/fine")} {
		if n := e.eff.count(k); n != 1 {
			t.Errorf("%q ran %d times, want 1", k, n)
		}
	}
}
