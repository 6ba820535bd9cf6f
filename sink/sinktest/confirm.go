package sinktest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The API is the truth (spec §9.2–§9.5). The suite pins down, for every
// backend:
//   - A new key is confirmed when its first sighting is the API's own
//     operation (FromAPI), carries the sighting's batch state, and needs
//     confirmation when that sighting was only dynamically verified.
//   - A sighting from the API of an unconfirmed key confirms it: the
//     operation becomes the payload, the first webhook body is kept apart
//     (Entry.Webhook, Claim.Webhook), the batch state is the API's (a
//     different terminal state is one conflict), needs-confirmation is
//     cleared, a pending key is due now, and a key dead as unknown to the
//     API is pending again, due now, with a fresh attempt budget. Other
//     states keep their state (a done key stays done; an ordinary dead key
//     stays dead).
//   - Every other sighting of a known key changes no state; a poll-first
//     key's first webhook body is kept (lazily: after Flush); a sighting
//     not only dynamically verified lifts needs-confirmation (lazily).
//   - Confirm is fenced like Renew; a key confirmed meanwhile keeps what it
//     holds (a differing state is one conflict).
//   - With SkipNeedsConfirm, Claim, ClaimDue and Due leave keys that need
//     confirmation alone.
//   - A failure's DeadReason is kept while the key is dead and counted in
//     Stats.DeadByReason; Retry clears it.
//   - NoteResults is fenced and shows in Entry and Claim; Purge
//     returns what it deleted.
var confirmTests = []struct {
	name string
	f    func(t *testing.T, open Opener)
}{
	{"RecordNewCarriesWhatCanonComputed", testRecordNewCarries},
	{"SightingFromTheAPIConfirms", testSightingConfirms},
	{"SightingFromTheAPIRevivesUnknownToTheAPI", testSightingRevives},
	{"SightingFromTheAPIConfirmsDone", testSightingConfirmsDone},
	{"ConfirmFenced", testConfirmFenced},
	{"ConfirmOfAConfirmedKey", testConfirmConfirmed},
	{"NeedsConfirmation", testNeedsConfirmation},
	{"WebhookBodyOfAPollFirstKey", testWebhookOfPollFirst},
	{"DeadByReason", testDeadByReason},
	{"NoteResults", testNoteResults},
	{"PurgeKeys", testPurgeKeys},
	{"ResultsExpiring", testResultsExpiring},
}

const (
	hookBody = `{"type":"batch.succeeded","data":{"id":"k"}}`
	apiOp    = `{"name":"batches/k","metadata":{"state":"BATCH_STATE_FAILED"},"done":true,"error":{"code":8,"message":"quota"}}`
)

func (e *env) sight(sg sink.Sighting) sink.RecordResult {
	e.t.Helper()
	r, err := e.s.Record(e.ctx, sg)
	if err != nil {
		e.t.Fatalf("Record(%+v): %v", sg, err)
	}
	return r
}

func hook(key, body, state string) sink.Sighting {
	return sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(body), State: state}
}

func listed(key, op, state string) sink.Sighting {
	return sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(op), State: state, FromAPI: true}
}

func testRecordNewCarries(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(listed("p", apiOp, "FAILED"))
	e.sight(hook("w", hookBody, "SUCCEEDED"))
	dyn := hook("d", hookBody, "SUCCEEDED")
	dyn.Dynamic = true
	e.sight(dyn)
	for _, tc := range []struct {
		key             string
		confirmed, need bool
		state, webhook  string
	}{
		{"p", true, false, "FAILED", ""},
		{"w", false, false, "SUCCEEDED", hookBody},
		{"d", false, true, "SUCCEEDED", hookBody},
	} {
		en := e.get(tc.key)
		if en.Confirmed != tc.confirmed || en.NeedsConfirm != tc.need || en.BatchState != tc.state || string(en.Webhook) != tc.webhook {
			t.Fatalf("Get(%s) = confirmed %v, needs %v, batch %q, webhook %q; want %v, %v, %q, %q",
				tc.key, en.Confirmed, en.NeedsConfirm, en.BatchState, en.Webhook, tc.confirmed, tc.need, tc.state, tc.webhook)
		}
		c := e.claim(tc.key, time.Minute)
		if c.Confirmed != tc.confirmed || c.NeedsConfirm != tc.need || c.BatchState != tc.state || string(c.Webhook) != tc.webhook ||
			!c.FirstSeenAt.Equal(start()) {
			t.Fatalf("Claim(%s) = %+v; want confirmed %v, needs %v, batch %q, webhook %q, first seen %v",
				tc.key, c, tc.confirmed, tc.need, tc.state, tc.webhook, start())
		}
	}
}

func testSightingConfirms(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(hook("k", hookBody, "SUCCEEDED"))
	// The API said "not terminal": rechecked later, no attempt used.
	c := e.claim("k", time.Minute)
	later := e.clk.Now().Add(time.Hour)
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "running", NoAttempt: true, NotBefore: later}); err != nil {
		t.Fatal(err)
	}
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due = %q, want nothing before the recheck", got)
	}
	now := e.clk.Advance(time.Minute)
	r := e.sight(listed("k", apiOp, "FAILED"))
	if !r.Confirmed || !r.Conflict || r.New || r.State != sink.StatePending {
		t.Fatalf("Record(listed) = %+v, want confirmed, a conflict, pending", r)
	}
	en := e.get("k")
	if !en.Confirmed || en.BatchState != "FAILED" || string(en.Payload) != apiOp || string(en.Webhook) != hookBody ||
		en.Conflicts != 1 || en.NextAttemptAt.After(now) || en.Attempts != 0 {
		t.Fatalf("Get = %+v (payload %s, webhook %s); want confirmed, FAILED, the API's operation, the webhook body kept, 1 conflict, due now", en, en.Payload, en.Webhook)
	}
	if got := e.due(0); !slices.Equal(got, []string{"k"}) {
		t.Fatalf("Due = %q, want [k] (due now)", got)
	}
	// Once confirmed, later sightings are duplicates: the API's state stays.
	if r := e.sight(listed("k", apiOp+" ", "FAILED")); r.Confirmed || r.Conflict {
		t.Fatalf("Record(listed again) = %+v, want a plain duplicate", r)
	}
	if r := e.sight(hook("k", hookBody, "SUCCEEDED")); !r.Conflict {
		t.Fatalf("Record(webhook after confirmation) = %+v, want a conflict", r)
	}
	c = e.claim("k", time.Minute)
	if !c.Confirmed || string(c.Payload) != apiOp || string(c.Webhook) != hookBody || c.BatchState != "FAILED" {
		t.Fatalf("Claim = %+v; want the API's operation and state, the webhook body", c)
	}
	if st := e.stats(); st.Conflicts != 2 || st.DuplicatesSuppressed != 3 {
		t.Fatalf("Stats conflicts %d duplicates %d, want 2 and 3", st.Conflicts, st.DuplicatesSuppressed)
	}
}

func testSightingRevives(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for _, k := range []string{"unknown", "failed"} {
		e.sight(hook(k, hookBody, "SUCCEEDED"))
		c := e.claim(k, time.Minute)
		f := sink.Failure{Cause: "unknown to the API: 404", Permanent: true, DeadReason: sink.DeadUnknownToAPI}
		if k == "failed" {
			f = sink.Failure{Cause: "exit status 1", Permanent: true}
		}
		if st, err := e.s.Fail(e.ctx, k, c.Token, f); err != nil || st != sink.StateDead {
			t.Fatalf("Fail(%s) = %s, %v; want dead", k, st, err)
		}
	}
	if en := e.get("unknown"); en.DeadReason != sink.DeadUnknownToAPI || en.Attempts != 1 {
		t.Fatalf("Get(unknown) = %+v, want dead as unknown to the API after 1 attempt", en)
	}
	now := e.clk.Advance(time.Hour)
	if r := e.sight(listed("unknown", apiOp, "SUCCEEDED")); !r.Confirmed || r.State != sink.StatePending || r.Conflict {
		t.Fatalf("Record(listed unknown) = %+v, want confirmed, pending again", r)
	}
	en := e.get("unknown")
	if en.State != sink.StatePending || en.DeadReason != "" || en.Attempts != 0 || en.NextAttemptAt.After(now) || !en.Confirmed {
		t.Fatalf("revived = %+v, want pending, due now, no reason, a fresh budget, confirmed", en)
	}
	if r := e.sight(listed("failed", apiOp, "SUCCEEDED")); !r.Confirmed || r.State != sink.StateDead {
		t.Fatalf("Record(listed failed) = %+v, want confirmed and still dead (the operator's)", r)
	}
	if got := e.due(0); !slices.Equal(got, []string{"unknown"}) {
		t.Fatalf("Due = %q, want [unknown]", got)
	}
	if c := e.claim("unknown", time.Minute); c.Attempt != 1 || !c.Confirmed {
		t.Fatalf("Claim(revived) = %+v, want attempt 1, confirmed", c)
	}
}

func testSightingConfirmsDone(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(hook("k", hookBody, "SUCCEEDED"))
	c := e.claim("k", time.Minute)
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatal(err)
	}
	e.sight(hook("k", hookBody, "SUCCEEDED")) // from memory where the backend caches done keys
	if r := e.sight(listed("k", apiOp, "FAILED")); !r.Confirmed || !r.Conflict || r.State != sink.StateDone {
		t.Fatalf("Record(listed done) = %+v, want confirmed, a conflict, still done", r)
	}
	if r := e.sight(listed("k", apiOp, "FAILED")); r.Confirmed || r.Conflict || r.State != sink.StateDone {
		t.Fatalf("Record(listed done again) = %+v, want a plain duplicate", r)
	}
	en := e.get("k")
	if en.State != sink.StateDone || !en.Confirmed || en.BatchState != "FAILED" || en.Conflicts != 1 || string(en.Webhook) != hookBody {
		t.Fatalf("Get = %+v, want done, confirmed FAILED, 1 conflict, the webhook body kept", en)
	}
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due = %q, want nothing: done is final", got)
	}
}

func testConfirmFenced(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(hook("k", hookBody, "SUCCEEDED"))
	conf := sink.Confirmation{Operation: []byte(apiOp), State: "FAILED"}
	e.wantErr("Confirm(unknown)", e.s.Confirm(e.ctx, "nope", 1, conf), sink.ErrNotFound)
	e.wantErr("Confirm(pending)", e.s.Confirm(e.ctx, "k", 0, conf), sink.ErrFenced)
	c := e.claim("k", time.Minute)
	e.wantErr("Confirm(stale token)", e.s.Confirm(e.ctx, "k", c.Token+1, conf), sink.ErrFenced)
	if err := e.s.Confirm(e.ctx, "k", c.Token, conf); err != nil {
		t.Fatalf("Confirm: %v", err)
	}
	en := e.get("k")
	if en.State != sink.StateClaimed || !en.Confirmed || en.BatchState != "FAILED" || en.Conflicts != 1 ||
		string(en.Payload) != apiOp || string(en.Webhook) != hookBody {
		t.Fatalf("Get = %+v (payload %s webhook %s); want still claimed, confirmed FAILED, 1 conflict, the API's operation, the body kept",
			en, en.Payload, en.Webhook)
	}
	if err := e.s.Complete(e.ctx, "k", c.Token); err != nil {
		t.Fatalf("Complete after Confirm: %v", err)
	}
	if st := e.stats(); st.Fenced != 2 {
		t.Fatalf("Stats.Fenced = %d, want 2 (both fenced Confirms)", st.Fenced)
	}
}

func testConfirmConfirmed(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(hook("k", hookBody, "SUCCEEDED"))
	c := e.claim("k", time.Minute)
	// A poll pass confirms the key while its holder asks the API.
	if r := e.sight(listed("k", apiOp, "FAILED")); !r.Confirmed || r.State != sink.StateClaimed {
		t.Fatalf("Record(listed, claimed) = %+v, want confirmed, still claimed", r)
	}
	if err := e.s.Confirm(e.ctx, "k", c.Token, sink.Confirmation{Operation: []byte(`{"name":"batches/k","x":1}`), State: "SUCCEEDED"}); err != nil {
		t.Fatalf("Confirm of a confirmed key: %v", err)
	}
	en := e.get("k")
	if string(en.Payload) != apiOp || en.BatchState != "FAILED" || en.Conflicts != 2 || string(en.Webhook) != hookBody {
		t.Fatalf("Get = %+v (payload %s); want what the first confirmation stored, 2 conflicts", en, en.Payload)
	}
}

func testNeedsConfirmation(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for _, k := range []string{"dyn", "dyn2", "dyn3"} {
		sg := hook(k, hookBody, "SUCCEEDED")
		sg.Dynamic = true
		e.sight(sg)
	}
	e.sight(hook("plain", hookBody, "SUCCEEDED"))
	skip := sink.ClaimOptions{SkipNeedsConfirm: true}
	if got := e.dueWith(skip); !slices.Equal(got, []string{"plain"}) {
		t.Fatalf("Due(skip) = %q, want [plain]", got)
	}
	_, err := e.s.Claim(e.ctx, "dyn", "w", time.Minute, skip)
	e.wantErr("Claim(needs confirmation, skip)", err, sink.ErrNotClaimable)
	cs, err := e.s.ClaimDue(e.ctx, "w", time.Minute, 0, skip)
	if err != nil || len(cs) != 1 || cs[0].Key != "plain" {
		t.Fatalf("ClaimDue(skip) = %+v, %v; want only plain", cs, err)
	}
	// Another dynamically verified sighting changes nothing; one that is not
	// (HMAC, or unverified) lifts it, lazily; a sighting from the API
	// confirms the key.
	sg := hook("dyn", hookBody, "SUCCEEDED")
	sg.Dynamic = true
	e.sight(sg)
	e.sight(hook("dyn2", hookBody, "SUCCEEDED"))
	e.sight(listed("dyn3", apiOp, "SUCCEEDED"))
	if err := e.s.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]bool{"dyn": true, "dyn2": false, "dyn3": false} {
		if en := e.get(k); en.NeedsConfirm != want {
			t.Fatalf("Get(%s).NeedsConfirm = %v, want %v", k, en.NeedsConfirm, want)
		}
	}
	if got := e.dueWith(skip); !slices.Equal(got, []string{"dyn2", "dyn3"}) {
		t.Fatalf("Due(skip) = %q, want [dyn2 dyn3]", got)
	}
	// A takeover is a claim too: an expired claim of a key that needs
	// confirmation is not taken over by a claimer that cannot confirm.
	c := e.claim("dyn", time.Minute)
	e.clk.Advance(2 * time.Minute)
	cs, err = e.s.ClaimDue(e.ctx, "w", time.Minute, 0, skip)
	var got []string
	for _, c := range cs {
		got = append(got, c.Key)
	}
	if slices.Sort(got); err != nil || !slices.Equal(got, []string{"dyn2", "dyn3", "plain"}) {
		t.Fatalf("ClaimDue(skip) after the leases expired = %q, %v; want dyn2, dyn3 and plain (taken over), not dyn", got, err)
	}
	c2, err := e.s.Claim(e.ctx, "dyn", "w2", time.Minute, sink.ClaimOptions{})
	if err != nil || !c2.Takeover || c2.Token <= c.Token || !c2.NeedsConfirm {
		t.Fatalf("Claim(dyn) without skip = %+v, %v; want a takeover that needs confirmation", c2, err)
	}
}

func (e *env) dueWith(o sink.ClaimOptions) []string {
	e.t.Helper()
	keys, err := e.s.Due(e.ctx, 0, o)
	if err != nil {
		e.t.Fatalf("Due: %v", err)
	}
	return keys
}

func testWebhookOfPollFirst(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(listed("k", apiOp, "FAILED"))
	e.sight(hook("k", hookBody, "FAILED"))
	e.sight(hook("k", `{"type":"batch.failed","data":{"id":"k"},"second":true}`, "FAILED"))
	if err := e.s.Flush(e.ctx); err != nil {
		t.Fatal(err)
	}
	en := e.get("k")
	if string(en.Payload) != apiOp || string(en.Webhook) != hookBody || en.Conflicts != 0 || en.SeenCount != 3 {
		t.Fatalf("Get = payload %s webhook %s conflicts %d seen %d; want the operation, the first webhook body, 0, 3",
			en.Payload, en.Webhook, en.Conflicts, en.SeenCount)
	}
	if c := e.claim("k", time.Minute); string(c.Webhook) != hookBody || string(c.Payload) != apiOp {
		t.Fatalf("Claim = %+v, want the webhook body apart from the operation", c)
	}
}

func testDeadByReason(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for _, k := range []string{"a", "b", "c"} {
		e.sight(hook(k, hookBody, "SUCCEEDED"))
		c := e.claim(k, time.Minute)
		f := sink.Failure{Cause: "unknown to the API", Permanent: true, DeadReason: sink.DeadUnknownToAPI}
		if k == "c" {
			f = sink.Failure{Cause: "HTTP 400", Permanent: true}
		}
		if _, err := e.s.Fail(e.ctx, k, c.Token, f); err != nil {
			t.Fatal(err)
		}
	}
	st := e.stats()
	if st.DeadByReason[sink.DeadUnknownToAPI] != 2 || st.DeadByReason[sink.DeadEffect] != 1 || st.ByState[sink.StateDead] != 3 {
		t.Fatalf("Stats = dead %d by reason %v; want 3: 2 unknown to the API, 1 effect", st.ByState[sink.StateDead], st.DeadByReason)
	}
	if err := e.s.Retry(e.ctx, "a", sink.RetryOptions{}); err != nil {
		t.Fatal(err)
	}
	if en := e.get("a"); en.DeadReason != "" || en.State != sink.StatePending {
		t.Fatalf("Get(retried) = %+v, want pending without a dead reason", en)
	}
	// A counted failure that goes dead later carries no stale reason.
	c := e.claim("a", time.Minute)
	if _, err := e.s.Fail(e.ctx, "a", c.Token, sink.Failure{Cause: "exit 2", Permanent: true}); err != nil {
		t.Fatal(err)
	}
	if st := e.stats(); st.DeadByReason[sink.DeadUnknownToAPI] != 1 || st.DeadByReason[sink.DeadEffect] != 2 {
		t.Fatalf("DeadByReason = %v, want 1 unknown to the API, 2 effect", st.DeadByReason)
	}
}

func testNoteResults(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	e.sight(listed("k", apiOp, "SUCCEEDED"))
	c := e.claim("k", time.Minute)
	e.wantErr("NoteResults(stale)", e.s.NoteResults(e.ctx, "k", c.Token+1, "/r/k.jsonl"), sink.ErrFenced)
	if err := e.s.NoteResults(e.ctx, "k", c.Token, "/r/k.jsonl"); err != nil {
		t.Fatalf("NoteResults: %v", err)
	}
	if en := e.get("k"); en.ResultsFile != "/r/k.jsonl" {
		t.Fatalf("Get.ResultsFile = %q", en.ResultsFile)
	}
	if _, err := e.s.Fail(e.ctx, "k", c.Token, sink.Failure{Cause: "x"}); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(2 * time.Hour)
	if c := e.claim("k", time.Minute); c.ResultsFile != "/r/k.jsonl" {
		t.Fatalf("Claim.ResultsFile = %q", c.ResultsFile)
	}
}

func testPurgeKeys(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	for _, k := range []string{"a", "b", "c"} {
		e.sight(listed(k, apiOp, "SUCCEEDED"))
		if k == "c" {
			continue
		}
		c := e.claim(k, time.Minute)
		if err := e.s.Complete(e.ctx, k, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	e.clk.Advance(time.Hour)
	keys, err := e.s.Purge(e.ctx, 30*time.Minute)
	if slices.Sort(keys); err != nil || !slices.Equal(keys, []string{"a", "b"}) {
		t.Fatalf("Purge = %q, %v; want [a b]", keys, err)
	}
	if keys, err := e.s.Purge(e.ctx, 30*time.Minute); err != nil || len(keys) != 0 {
		t.Fatalf("Purge again = %q, %v; want none", keys, err)
	}
	if _, err := e.s.Get(e.ctx, "a"); !errors.Is(err, sink.ErrNotFound) {
		t.Fatalf("Get(purged) = %v", err)
	}
	if en := e.get("c"); !strings.Contains(string(en.Payload), "batches/k") {
		t.Fatalf("Get(c) = %+v", en)
	}
}

// testResultsExpiring: the batch's end by the API's word is kept (from a
// sighting or a confirmation), and Stats counts the succeeded keys not yet
// done whose results expire within sink.ResultsWarning of now.
func testResultsExpiring(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	now := start()
	soon := now.Add(-sink.ResultsKept + time.Hour) // expires in 1h
	later := now.Add(-sink.ResultsKept + 7*time.Hour)
	gone := now.Add(-sink.ResultsKept - time.Hour)
	for key, end := range map[string]time.Time{"soon": soon, "later": later, "gone": gone} {
		sg := listed(key, `{}`, "SUCCEEDED")
		sg.EndTime = end
		e.sight(sg)
	}
	failed := listed("failed", `{}`, "FAILED")
	failed.EndTime = soon
	e.sight(failed)
	e.sight(hook("hooked", `{}`, "SUCCEEDED"))
	c := e.claim("hooked", time.Minute)
	if err := e.s.Confirm(e.ctx, "hooked", c.Token, sink.Confirmation{Operation: []byte(`{}`), State: "SUCCEEDED", EndTime: soon}); err != nil {
		t.Fatal(err)
	}
	if en := e.get("hooked"); !en.BatchEnd.Equal(soon) {
		t.Fatalf("BatchEnd after Confirm = %v, want %v", en.BatchEnd, soon)
	}
	if en := e.get("later"); !en.BatchEnd.Equal(later) {
		t.Fatalf("BatchEnd of a listed key = %v, want %v", en.BatchEnd, later)
	}
	if st := e.stats(); st.ResultsExpiring != 2 {
		t.Fatalf("ResultsExpiring = %d, want 2 (soon and hooked)", st.ResultsExpiring)
	}
	e.finish("soon")
	if st := e.stats(); st.ResultsExpiring != 1 {
		t.Fatalf("ResultsExpiring after one is done = %d, want 1", st.ResultsExpiring)
	}
}
