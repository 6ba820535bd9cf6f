package reconcile

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/results"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/dial"
)

// Spec §9 end to end, in one process: the stand-in over HTTP, the real SDK
// (one poller for list, get and downloads), a real SQLite file or a
// PostgreSQL schema, ingest's webhook and poll paths, and the dispatcher
// confirming keys before their effect. Time is the test's clock.

// docs records every event document an effect received.
type docs struct {
	mu   sync.Mutex
	evs  []effect.Event
	fail map[string]bool
}

func (d *docs) Run(_ context.Context, ev effect.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.evs = append(d.evs, ev)
	if d.fail[ev.Key] {
		return io.ErrUnexpectedEOF
	}
	return nil
}

func (d *docs) of(key string) []effect.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []effect.Event
	for _, ev := range d.evs {
		if ev.Key == key {
			out = append(out, ev)
		}
	}
	return out
}

// world is one test's stand-in, sink, poller, dispatcher and ingest paths.
type world struct {
	t       *testing.T
	clock   *testkit.Clock
	api     *geminifake.Server
	sink    sink.Sink
	poller  *poller.Poller
	disp    *dispatch.Dispatcher
	hooks   *ingest.Webhooks
	poll    *Poll
	docs    *docs
	metrics *metrics.Metrics
	results *results.Dir
}

type worldOptions struct {
	postgres   bool
	noConfirm  bool // a dispatcher without the API (no credentials, or --confirm never)
	resultsDir string
	api        *geminifake.Server // share a stand-in between two worlds
	pageSize   int                // the poller's (0: its default)
	logs       io.Writer          // the poll pass's log (nil: discarded)
}

func newWorld(t *testing.T, o worldOptions) *world {
	t.Helper()
	w := &world{t: t, clock: testkit.NewClock(t0), docs: &docs{fail: map[string]bool{}}, api: o.api}
	if w.api == nil {
		w.api = geminifake.New(geminifake.Options{APIKey: testKey, Seed: 1})
		if _, err := w.api.Start(""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.api.Close() })
	}
	db := filepath.Join(t.TempDir(), "sink.db")
	if o.postgres {
		db = pgtest.Schema(t)
	}
	s, err := dial.Open(context.Background(), db, sink.Options{Now: w.clock.Now, RetryBase: time.Second, RetryMax: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	w.sink = s
	pc := poller.DefaultConfig()
	pc.APIKey, pc.BaseURL, pc.Now = testKey, w.api.URL(), w.clock.Now
	pc.Sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	pc.PageSize = cmp.Or(o.pageSize, pc.PageSize)
	if w.poller, err = poller.New(context.Background(), pc); err != nil {
		t.Fatal(err)
	}
	dc := dispatch.Config{Sink: s, Effect: w.docs, Now: w.clock.Now, Concurrency: 2, Logger: slog.New(slog.DiscardHandler),
		Rand: func() float64 { return 0 }, RecheckBase: time.Second, RecheckMax: time.Minute}
	if !o.noConfirm {
		dc.Confirm, dc.API = true, w.poller
	}
	if o.resultsDir != "" {
		if w.results, err = results.Open(o.resultsDir); err != nil {
			t.Fatal(err)
		}
		dc.Results, dc.API = w.results, w.poller
	}
	if w.disp, err = dispatch.New(dc); err != nil {
		t.Fatal(err)
	}
	w.metrics = metrics.New(nil)
	w.hooks = ingest.NewWebhooks(ingest.WebhookConfig{Sink: s, Metrics: w.metrics})
	var logger *slog.Logger
	if o.logs != nil {
		logger = slog.New(slog.NewTextHandler(o.logs, nil))
	}
	if w.poll, err = NewPoll(PollConfig{Sink: s, Poller: w.poller, Dispatcher: w.disp, Metrics: w.metrics,
		FullScanEvery: DefaultFullScanEvery, Now: w.clock.Now, Logger: logger}); err != nil {
		t.Fatal(err)
	}
	return w
}

// hook delivers a webhook event for batch id (type e.g. "batch.succeeded").
func (w *world) hook(id, typ string, v ingest.Verification) ingest.Answer {
	w.t.Helper()
	body, _ := json.Marshal(map[string]any{"type": typ, "version": "v1", "timestamp": "2025-12-01T00:00:00Z",
		"data": map[string]any{"id": id}})
	a := w.hooks.Event(context.Background(), body, v)
	if a.Kind != ingest.Recorded {
		w.t.Fatalf("Event(%s) = %+v, want recorded", body, a)
	}
	return a
}

func (w *world) drain() dispatch.Summary {
	w.t.Helper()
	sum, err := w.disp.Drain(context.Background())
	if err != nil {
		w.t.Fatalf("Drain: %v", err)
	}
	return sum
}

func (w *world) pass() Result {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := w.poll.Pass(ctx)
	if err := r.Err(); err != nil {
		w.t.Fatalf("pass: %v", err)
	}
	return r
}

func (w *world) entry(key string) sink.Entry {
	w.t.Helper()
	if err := w.sink.Flush(context.Background()); err != nil {
		w.t.Fatal(err)
	}
	e, err := w.sink.Get(context.Background(), key)
	if err != nil {
		w.t.Fatal(err)
	}
	return e
}

func (w *world) advance(d time.Duration) { w.clock.Set(w.clock.Now().Add(d)) }

// gets counts the stand-in's Batches.Get requests for a batch id.
func (w *world) gets(id string) int { return w.api.Count(http.MethodGet, "/v1beta/batches/"+id) }

// requestCounts counts the requests the stand-in received, by what they
// were for, retries included.
type requestCounts struct{ List, Get, Probe, Download int }

// counts reads s's record of requests: a list (of batches, or of Vertex
// jobs) of page size 1 is a credential probe, anything under files/ a
// download (files.get too).
func counts(s *geminifake.Server) requestCounts {
	var c requestCounts
	for _, r := range s.Requests() {
		list := strings.HasSuffix(r.Path, "/batches") || strings.HasSuffix(r.Path, "/batchPredictionJobs")
		switch {
		case strings.Contains(r.Path, "/files/"):
			c.Download++
		case list && r.Query.Get("pageSize") == "1":
			c.Probe++
		case list:
			c.List++
		default:
			c.Get++
		}
	}
	return c
}

// A failed batch as the API renders it: state, error, stats.
func failedBatch(id string) geminifake.Batch {
	return geminifake.Batch{Name: geminifake.GeminiName(id), State: "FAILED", DisplayName: id,
		CreateTime: t0.Add(-2 * time.Hour), EndTime: t0.Add(-time.Hour), RequestCount: 3,
		Error: &geminifake.Status{Code: 8, Message: "Enqueued token quota exceeded for this model."}}
}

// Done when 1: a webhook-first key's effect document equals, field for
// field, what a poll-first key's would be — except source ("webhook" vs
// "poll") and webhook (the first webhook body, absent for the poll-first
// key): operation, state, batch_state, confirmed, results are the API's
// either way. Each order costs what it should: the webhook-first key one
// Batches.Get, the poll-first key none.
func TestWebhookFirstDocumentEqualsPollFirst(t *testing.T) {
	backends(t, func(t *testing.T, pg bool) {
		api := geminifake.New(geminifake.Options{APIKey: testKey, Seed: 1})
		if _, err := api.Start(""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { api.Close() })
		api.Add(failedBatch("same"))
		hookFirst := newWorld(t, worldOptions{postgres: pg, api: api})
		pollFirst := newWorld(t, worldOptions{postgres: pg, api: api})
		key := "gemini:batches/same"

		hookFirst.hook("same", "batch.failed", ingest.VerifiedStatic)
		if sum := hookFirst.drain(); sum.OK != 1 {
			t.Fatalf("webhook-first drain = %+v, want one effect", sum)
		}
		if n := api.Count(http.MethodGet, "/v1beta/batches/same"); n != 1 {
			t.Fatalf("the webhook-first key cost %d Batches.Get, want 1", n)
		}
		api.ResetRequests()
		if r := pollFirst.pass(); r.New != 1 || r.Effects.OK != 1 {
			t.Fatalf("poll-first pass = %+v, want the key new and its effect run", r)
		}
		if n := api.Count(http.MethodGet, "/v1beta/batches/same"); n != 0 {
			t.Fatalf("the poll-first key cost %d Batches.Get, want none", n)
		}

		a, b := hookFirst.docs.of(key), pollFirst.docs.of(key)
		if len(a) != 1 || len(b) != 1 {
			t.Fatalf("documents: %d webhook-first, %d poll-first; want one each", len(a), len(b))
		}
		ja, jb := docMap(t, a[0]), docMap(t, b[0])
		if ja["source"] != "webhook" || jb["source"] != "poll" {
			t.Fatalf("sources %v and %v", ja["source"], jb["source"])
		}
		if _, ok := ja["webhook"]; !ok {
			t.Fatalf("the webhook-first document has no webhook body: %v", ja)
		}
		if _, ok := jb["webhook"]; ok {
			t.Fatalf("the poll-first document has a webhook body: %v", jb)
		}
		delete(ja, "source")
		delete(jb, "source")
		delete(ja, "webhook")
		if !jsonEqual(ja, jb) {
			t.Fatalf("documents differ beyond source and webhook:\nwebhook-first %v\npoll-first    %v", ja, jb)
		}
		if ja["batch_state"] != "FAILED" || ja["confirmed"] != true || !strings.Contains(string(a[0].Operation), "Enqueued token quota") {
			t.Fatalf("document = %v, want the API's failed operation, confirmed", ja)
		}
	})
}

func docMap(t *testing.T, ev effect.Event) map[string]any {
	t.Helper()
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// Done when 1: a webhook for a batch the API still calls RUNNING does not
// run the effect until the API says it finished, however many rechecks
// that takes; each recheck is one Batches.Get and uses no attempt, and they
// space out as the key ages.
func TestRunningBatchWaitsForTheAPI(t *testing.T) {
	backends(t, func(t *testing.T, pg bool) {
		w := newWorld(t, worldOptions{postgres: pg})
		w.api.Add(geminifake.Batch{Name: "batches/slow", State: "RUNNING", CreateTime: t0.Add(-time.Hour)})
		key := "gemini:batches/slow"
		w.hook("slow", "batch.succeeded", ingest.VerifiedStatic)
		var last time.Time
		for i := range 12 {
			sum := w.drain()
			if sum.Unconfirmed != 1 || sum.OK != 0 || sum.Failed != 0 {
				t.Fatalf("recheck %d: drain = %+v, want the key handed back unconfirmed", i, sum)
			}
			e := w.entry(key)
			if e.State != sink.StatePending || e.Attempts != 0 || e.Confirmed {
				t.Fatalf("recheck %d: %+v, want pending, no attempt used, unconfirmed", i, e)
			}
			if gap := e.NextAttemptAt.Sub(w.clock.Now()); gap <= 0 || (i > 0 && e.NextAttemptAt.Sub(last) < 0) {
				t.Fatalf("recheck %d: next check in %v", i, gap)
			}
			last = e.NextAttemptAt
			w.clock.Set(e.NextAttemptAt) // due again
			w.advance(time.Minute * time.Duration(i*i))
		}
		if n := len(w.docs.of(key)); n != 0 {
			t.Fatalf("the effect ran %d times while the API said RUNNING", n)
		}
		if n := w.gets("slow"); n != 12 {
			t.Fatalf("%d Batches.Get for 12 rechecks, want 12", n)
		}
		w.api.SetState("batches/slow", "SUCCEEDED")
		if sum := w.drain(); sum.OK != 1 {
			t.Fatalf("drain after the batch finished = %+v, want one effect", sum)
		}
		evs := w.docs.of(key)
		if len(evs) != 1 || evs[0].Attempt != 1 || !evs[0].Confirmed || evs[0].BatchState != "SUCCEEDED" {
			t.Fatalf("documents = %+v, want one, attempt 1, confirmed SUCCEEDED", evs)
		}
	})
}

// A batch the API still calls RUNNING 48 h after it was created should
// have expired: from then on "still not terminal" counts as an attempt, so
// that the key ends dead instead of being rechecked forever.
func TestStillRunningAfter48HoursCounts(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.api.Add(geminifake.Batch{Name: "batches/stuck", State: "RUNNING", CreateTime: t0.Add(-49 * time.Hour)})
	w.hook("stuck", "batch.succeeded", ingest.VerifiedStatic)
	if sum := w.drain(); sum.Failed != 1 || sum.Unconfirmed != 0 {
		t.Fatalf("drain = %+v, want one counted failure", sum)
	}
	e := w.entry("gemini:batches/stuck")
	if e.Attempts != 1 || !strings.Contains(e.LastError, "counted as an attempt") {
		t.Fatalf("entry = %+v, want one attempt used and the reason", e)
	}
}

// Done when 1: 404 → dead as "unknown to the API", counted under its own
// label; a later poll sighting revives it, due now, and the effect runs on
// the listed operation. A 403 for another project's batch (the credential
// itself lists) is the same.
func TestUnknownToTheAPIDeadThenRevivedByPoll(t *testing.T) {
	backends(t, func(t *testing.T, pg bool) {
		w := newWorld(t, worldOptions{postgres: pg})
		w.hook("ghost", "batch.succeeded", ingest.VerifiedStatic) // the API knows no such batch: 404
		w.hook("foreign", "batch.failed", ingest.VerifiedStatic)  // another project's: 403
		w.api.Deny("batches/foreign")
		if sum := w.drain(); sum.Dead != 2 {
			t.Fatalf("drain = %+v, want both keys dead", sum)
		}
		for _, k := range []string{"gemini:batches/ghost", "gemini:batches/foreign"} {
			if e := w.entry(k); e.State != sink.StateDead || e.DeadReason != sink.DeadUnknownToAPI || e.Attempts != 1 ||
				!strings.Contains(e.LastError, "unknown to the API") {
				t.Fatalf("%s = %+v, want dead as unknown to the API after one attempt", k, e)
			}
		}
		st, err := w.sink.Stats(context.Background())
		if err != nil || st.DeadByReason[sink.DeadUnknownToAPI] != 2 || st.DeadByReason[sink.DeadEffect] != 0 {
			t.Fatalf("Stats = %+v, %v; want 2 dead as unknown to the API", st.DeadByReason, err)
		}
		if len(w.docs.evs) != 0 {
			t.Fatalf("effects ran: %+v", w.docs.evs)
		}
		// The batch shows up in the listing after all.
		w.api.Add(geminifake.Batch{Name: "batches/ghost", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
		r := w.pass()
		if r.Duplicates != 1 || r.Effects.OK != 1 {
			t.Fatalf("pass = %+v, want the ghost seen again and run", r)
		}
		evs := w.docs.of("gemini:batches/ghost")
		if len(evs) != 1 || !evs[0].Confirmed || evs[0].BatchState != "SUCCEEDED" || evs[0].Attempt != 1 {
			t.Fatalf("documents = %+v, want one, confirmed, a fresh first attempt", evs)
		}
		if e := w.entry("gemini:batches/ghost"); e.State != sink.StateDone || e.DeadReason != "" {
			t.Fatalf("ghost = %+v, want done", e)
		}
	})
}

// Done when 1: a webhook that says SUCCEEDED for a batch the API says
// FAILED runs once with FAILED, and counts one conflict.
func TestWebhookSaysSucceededAPISaysFailed(t *testing.T) {
	backends(t, func(t *testing.T, pg bool) {
		w := newWorld(t, worldOptions{postgres: pg})
		w.api.Add(failedBatch("liar"))
		w.hook("liar", "batch.succeeded", ingest.VerifiedStatic)
		if sum := w.drain(); sum.OK != 1 {
			t.Fatalf("drain = %+v, want one effect", sum)
		}
		w.hook("liar", "batch.succeeded", ingest.VerifiedStatic) // a redelivery after done: another conflict? no: counted, nothing runs
		w.drain()
		evs := w.docs.of("gemini:batches/liar")
		if len(evs) != 1 || evs[0].BatchState != "FAILED" || evs[0].State != "FAILED" || !evs[0].Confirmed {
			t.Fatalf("documents = %+v, want one run with FAILED", evs)
		}
		e := w.entry("gemini:batches/liar")
		if e.BatchState != "FAILED" || e.Conflicts != 2 {
			t.Fatalf("entry = batch %q, conflicts %d; want FAILED, 2 (the confirmation, and the redelivery after done)", e.BatchState, e.Conflicts)
		}
	})
}

// Done when 1: a 429 storm during confirmation uses no attempts: each
// drain's Batches.Get is refused after the poller's retries, the key is
// handed back (not before the server's delay), and once the storm is over
// the effect runs as attempt 1. A 401 is handled the same way.
func TestConfirmationStormUsesNoAttempts(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.api.Add(geminifake.Batch{Name: "batches/busy", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
	w.hook("busy", "batch.succeeded", ingest.VerifiedStatic)
	key := "gemini:batches/busy"
	perGet := poller.DefaultMaxRetries + 1
	for round := range 4 {
		status := http.StatusTooManyRequests
		if round == 3 {
			status = http.StatusUnauthorized
		}
		faults := make([]geminifake.Fault, perGet)
		if status == http.StatusUnauthorized {
			faults = faults[:1] // never retried
		}
		for i := range faults {
			faults[i] = geminifake.Fault{Status: status, RetryDelay: 30 * time.Second}
		}
		w.api.InjectFault(faults...)
		sum := w.drain()
		if sum.OK != 0 || sum.Dead != 0 {
			t.Fatalf("round %d: drain = %+v, want nothing run", round, sum)
		}
		e := w.entry(key)
		if e.Attempts != 0 || e.State != sink.StatePending {
			t.Fatalf("round %d: %+v, want pending with no attempt used", round, e)
		}
		if status == http.StatusTooManyRequests && e.NextAttemptAt.Before(w.clock.Now().Add(30*time.Second)) {
			t.Fatalf("round %d: next check at %v, want not before the server's delay (30s)", round, e.NextAttemptAt)
		}
		w.clock.Set(e.NextAttemptAt)
	}
	if n := w.api.PendingFaults(); n != 0 {
		t.Fatalf("%d faults left: the storm was not met", n)
	}
	if sum := w.drain(); sum.OK != 1 {
		t.Fatalf("drain after the storm = %+v, want one effect", sum)
	}
	if evs := w.docs.of(key); len(evs) != 1 || evs[0].Attempt != 1 {
		t.Fatalf("documents = %+v, want one, attempt 1", evs)
	}
	// 3 rounds of 429 with every retry, a 401 (not retried), and the get that answered.
	if n := w.gets("busy"); n != 3*perGet+1+1 {
		t.Fatalf("%d Batches.Get, want %d", n, 3*perGet+2)
	}
}

// An operation larger than the 64 MiB the poller reads of one answer
// decides nothing, and asking again gets the same answer: the Batches.Get is
// sent once (no transport retry), and the confirmation is a failed attempt
// whose last error says why — not "the API did not answer", rechecked
// without end at no cost of attempts, nor a malformed body.
func TestConfirmationAnswerTooLarge(t *testing.T) {
	t.Parallel()
	w := newWorld(t, worldOptions{})
	w.api.Add(geminifake.Batch{Name: "batches/huge", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
	w.hook("huge", "batch.succeeded", ingest.VerifiedStatic)
	const head, tail = `{"name":"batches/huge","done":true,"metadata":{"displayName":"`, `"}}`
	w.api.InjectFault(geminifake.Fault{Body: head + strings.Repeat("x", poller.MaxResponseBody+1-len(head)-len(tail)) + tail})
	if sum := w.drain(); sum.Failed != 1 || sum.OK != 0 || sum.Unconfirmed != 0 {
		t.Fatalf("drain = %+v, want one failed attempt", sum)
	}
	e := w.entry("gemini:batches/huge")
	if e.Attempts != 1 || e.State != sink.StatePending || !strings.Contains(e.LastError, "larger than 64 MiB") ||
		strings.Contains(e.LastError, "did not answer") || strings.Contains(e.LastError, "not an operation") {
		t.Fatalf("entry: %d attempts, %s, last error %q; want one attempt that says the answer is larger than 64 MiB", e.Attempts, e.State, e.LastError)
	}
	if n := w.gets("huge"); n != 1 {
		t.Fatalf("%d Batches.Get, want 1", n)
	}
	if len(w.docs.of("gemini:batches/huge")) != 0 {
		t.Fatal("the effect ran unconfirmed")
	}
}

// Requests counted: poll-first keys cost none, webhook-first keys one
// Batches.Get each — checked against the stand-in's request log.
func TestConfirmationRequestsCounted(t *testing.T) {
	w := newWorld(t, worldOptions{})
	for _, id := range []string{"h1", "h2", "h3", "p1", "p2"} {
		w.api.Add(geminifake.Batch{Name: geminifake.GeminiName(id), State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
	}
	for _, id := range []string{"h1", "h2", "h3"} {
		w.hook(id, "batch.succeeded", ingest.VerifiedStatic)
	}
	w.api.ResetRequests()
	r := w.pass()
	if r.New != 2 || r.Duplicates != 3 || r.Effects.OK != 5 {
		t.Fatalf("pass = %+v", r)
	}
	// The listing confirmed the three webhook-first keys before dispatch
	// ran: nobody needed a Batches.Get.
	for _, id := range []string{"h1", "h2", "h3", "p1", "p2"} {
		if n := w.gets(id); n != 0 {
			t.Fatalf("batch %s cost %d Batches.Get, want 0", id, n)
		}
	}
	// Webhook first, drained before any listing: one each.
	for _, id := range []string{"h4", "h5"} {
		w.api.Add(geminifake.Batch{Name: geminifake.GeminiName(id), State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
		w.hook(id, "batch.succeeded", ingest.VerifiedStatic)
	}
	if sum := w.drain(); sum.OK != 2 {
		t.Fatalf("drain = %+v", sum)
	}
	for _, id := range []string{"h4", "h5"} {
		if n := w.gets(id); n != 1 {
			t.Fatalf("batch %s cost %d Batches.Get, want 1", id, n)
		}
	}
	if c := counts(w.api); c.Get != 2 {
		t.Fatalf("the stand-in counted %+v, want 2 gets", c)
	}
}

// Keys seen only through a dynamic signature never run unconfirmed: a
// dispatcher that cannot confirm does not claim them (no claim spent, no
// busy loop: Drain claims nothing, however often); one that can confirms
// them. An operations/… name, which Batches.Get cannot fetch, runs
// unconfirmed when seen by HMAC, and goes dead as unknown to the API when
// seen only dynamically — no request sent for either.
func TestDynamicOnlyKeysNeedConfirmation(t *testing.T) {
	backends(t, func(t *testing.T, pg bool) {
		w := newWorld(t, worldOptions{postgres: pg, noConfirm: true})
		w.api.Add(geminifake.Batch{Name: "batches/dyn", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
		w.hook("dyn", "batch.succeeded", ingest.VerifiedDynamic)
		w.hook("hmac", "batch.succeeded", ingest.VerifiedStatic)
		if sum := w.drain(); sum.Claimed != 1 || sum.OK != 1 {
			t.Fatalf("drain without confirmation = %+v, want only the HMAC key run", sum)
		}
		if evs := w.docs.of("gemini:batches/hmac"); len(evs) != 1 || evs[0].Confirmed || evs[0].BatchState != "SUCCEEDED" {
			t.Fatalf("HMAC key documents = %+v, want one, unconfirmed, the webhook's state", evs)
		}
		for range 5 {
			if sum := w.drain(); sum.Claimed != 0 {
				t.Fatalf("drain = %+v, want nothing claimed", sum)
			}
		}
		if e := w.entry("gemini:batches/dyn"); !e.NeedsConfirm || e.Token != 0 || e.State != sink.StatePending {
			t.Fatalf("dynamic key = %+v, want pending, never claimed, needing confirmation", e)
		}
		// A process that can confirm takes it.
		c := newWorldSharing(t, w, false)
		if sum := c.drain(); sum.OK != 1 {
			t.Fatalf("confirming drain = %+v", sum)
		}
		if evs := c.docs.of("gemini:batches/dyn"); len(evs) != 1 || !evs[0].Confirmed {
			t.Fatalf("documents = %+v, want one, confirmed", evs)
		}
		// operations/…: never fetched.
		before := len(w.api.Requests())
		for _, v := range []ingest.Verification{ingest.VerifiedStatic, ingest.VerifiedDynamic} {
			name := map[ingest.Verification]string{ingest.VerifiedStatic: "operations/op-hmac", ingest.VerifiedDynamic: "operations/op-dyn"}[v]
			if a := c.hooks.Event(context.Background(), []byte(`{"name":"`+name+`"}`), v); a.Kind != ingest.Recorded {
				t.Fatalf("Event(%s) = %+v", name, a)
			}
		}
		sum := c.drain()
		if sum.OK != 1 || sum.Dead != 1 {
			t.Fatalf("drain = %+v, want operations/op-hmac run and operations/op-dyn dead", sum)
		}
		if evs := c.docs.of("gemini:operations/op-hmac"); len(evs) != 1 || evs[0].Confirmed {
			t.Fatalf("documents = %+v, want one, unconfirmed", evs)
		}
		if e := c.entry("gemini:operations/op-dyn"); e.DeadReason != sink.DeadUnknownToAPI {
			t.Fatalf("dynamic operations key = %+v, want dead as unknown to the API", e)
		}
		if n := len(w.api.Requests()) - before; n != 0 {
			t.Fatalf("%d requests for operations/… keys, want none", n)
		}
	})
}

// newWorldSharing is another process on w's database and stand-in, with
// its own dispatcher (confirming unless noConfirm) and effect.
func newWorldSharing(t *testing.T, w *world, noConfirm bool) *world {
	t.Helper()
	c := *w
	c.docs = &docs{fail: map[string]bool{}}
	dc := dispatch.Config{Sink: w.sink, Effect: c.docs, Now: w.clock.Now, Concurrency: 2, Logger: slog.New(slog.DiscardHandler),
		Rand: func() float64 { return 0 }, RecheckBase: time.Second, RecheckMax: time.Minute}
	if !noConfirm {
		dc.Confirm, dc.API = true, w.poller
	}
	var err error
	if c.disp, err = dispatch.New(dc); err != nil {
		t.Fatal(err)
	}
	return &c
}

// A re-rendered payload with the same state is no conflict: the stand-in
// re-renders every batch (a new updateTime) between two passes, and a
// webhook redelivery with the same state comes in between.
func TestReRenderedPayloadIsNoConflict(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, pg bool) {
		w := newWorld(t, worldOptions{postgres: pg})
		for _, id := range []string{"r1", "r2", "r3"} {
			w.api.Add(geminifake.Batch{Name: geminifake.GeminiName(id), State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})
		}
		w.pass()
		for _, id := range []string{"r1", "r2", "r3"} {
			w.api.Update(geminifake.GeminiName(id), func(b *geminifake.Batch) { b.UpdateTime = t0.Add(time.Minute); b.DisplayName = "re-rendered" })
			w.hook(id, "batch.succeeded", ingest.VerifiedStatic)
		}
		w.advance(time.Minute)
		w.pass()
		st, err := w.sink.Stats(context.Background())
		if err != nil || st.Conflicts != 0 || st.DuplicatesSuppressed != 6 {
			t.Fatalf("Stats = conflicts %d duplicates %d, %v; want 0 and 6", st.Conflicts, st.DuplicatesSuppressed, err)
		}
		if e := w.entry("gemini:batches/r1"); !strings.Contains(string(e.Webhook), "batch.succeeded") || strings.Contains(string(e.Payload), "re-rendered") {
			t.Fatalf("entry = payload %s webhook %s; want the first listed operation and the webhook body kept apart", e.Payload, e.Webhook)
		}
	})
}

// Done when 1: results arrive at results_file byte for byte — a responses
// file (generated by the stand-in, streamed through the poller) and inlined
// responses (one JSON object per line) — and a file at the final name is
// not fetched again. Vertex operations carry results_location only.
func TestResultsArriveByteForByte(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	w := newWorld(t, worldOptions{resultsDir: dir})
	const size = 3<<20 + 17
	w.api.AddFile(geminifake.File{Name: "files/out-big", Size: size, Seed: 7})
	w.api.Add(geminifake.Batch{Name: "batches/big", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0,
		ResponsesFile: "files/out-big"})
	inlined := []json.RawMessage{json.RawMessage(`{"response": {"text": "a"}}`), json.RawMessage(`{"error":{"code":3}}`)}
	w.api.Add(geminifake.Batch{Name: "batches/inl", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0,
		InlinedResponses: inlined})
	w.api.Add(failedBatch("nores"))
	w.hook("big", "batch.succeeded", ingest.VerifiedStatic)
	if r := w.pass(); r.Effects.OK != 3 {
		t.Fatalf("pass = %+v, want three effects", r)
	}
	var want bytes.Buffer
	if _, err := io.Copy(&want, geminifake.Content(7, size)); err != nil {
		t.Fatal(err)
	}
	evs := w.docs.of("gemini:batches/big")
	if len(evs) != 1 || evs[0].ResultsFile != filepath.Join(dir, "big.jsonl") {
		t.Fatalf("documents = %+v, want results_file %s", evs, filepath.Join(dir, "big.jsonl"))
	}
	got, err := os.ReadFile(evs[0].ResultsFile)
	if err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("results file: %d bytes, %v; want the responses file's %d bytes exactly", len(got), err, size)
	}
	if e := w.entry("gemini:batches/big"); e.ResultsFile != evs[0].ResultsFile {
		t.Fatalf("entry results_file = %q", e.ResultsFile)
	}
	inl := w.docs.of("gemini:batches/inl")
	got, err = os.ReadFile(filepath.Join(dir, "inl.jsonl"))
	if len(inl) != 1 || inl[0].ResultsFile == "" || err != nil || string(got) != `{"response":{"text":"a"}}`+"\n"+`{"error":{"code":3}}`+"\n" {
		t.Fatalf("inlined: documents %+v, file %q, %v", inl, got, err)
	}
	if evs := w.docs.of("gemini:batches/nores"); len(evs) != 1 || evs[0].ResultsFile != "" {
		t.Fatalf("failed batch documents = %+v, want no results file", evs)
	}
	// A retry finds the complete file and fetches nothing.
	downloads := counts(w.api).Download
	w.api.Add(geminifake.Batch{Name: "batches/again", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0, ResponsesFile: "files/out-big"})
	if err := os.WriteFile(filepath.Join(dir, "again.jsonl"), []byte("already here\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.pass()
	if n := counts(w.api).Download; n != downloads {
		t.Fatalf("%d more downloads, want none (the file is at its final name)", n-downloads)
	}
	if evs := w.docs.of("gemini:batches/again"); len(evs) != 1 || evs[0].ResultsFile != filepath.Join(dir, "again.jsonl") {
		t.Fatalf("documents = %+v", evs)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
}

// A download that fails is a failure of the attempt: counted, retried with
// backoff, no results file, the effect not run; the next attempt downloads.
func TestFailedDownloadIsAFailedAttempt(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "results")
	w := newWorld(t, worldOptions{resultsDir: dir})
	w.api.Add(geminifake.Batch{Name: "batches/lost", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0,
		ResponsesFile: "files/missing"})
	w.api.Deny("files/missing")
	if r := w.pass(); r.Effects.Failed != 1 {
		t.Fatalf("pass = %+v, want one failed attempt", r)
	}
	e := w.entry("gemini:batches/lost")
	if e.Attempts != 1 || e.State != sink.StatePending || !strings.Contains(e.LastError, "results") {
		t.Fatalf("entry = %+v, want one attempt used, pending, a results error", e)
	}
	if len(w.docs.evs) != 0 {
		t.Fatalf("the effect ran without its results: %+v", w.docs.evs)
	}
	w.api.Allow("files/missing")
	w.api.AddFile(geminifake.File{Name: "files/missing", Data: []byte("{\"ok\":1}\n")})
	w.clock.Set(e.NextAttemptAt)
	if sum := w.drain(); sum.OK != 1 {
		t.Fatalf("drain = %+v", sum)
	}
	if evs := w.docs.of("gemini:batches/lost"); len(evs) != 1 || evs[0].Attempt != 2 || evs[0].ResultsFile == "" {
		t.Fatalf("documents = %+v, want attempt 2 with its results", evs)
	}
}

// bearer adds the Vertex stand-in's bearer token (no Application Default
// Credentials in tests).
type bearer struct{ tok string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return http.DefaultTransport.RoundTrip(r)
}

// Vertex AI: a listed job's document carries results_location (its
// outputInfo), and with --results-dir nothing is fetched.
func TestVertexResultsLocation(t *testing.T) {
	api := geminifake.New(geminifake.Options{BearerToken: "tok"})
	if _, err := api.Start(""); err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	name := geminifake.VertexName("123", "us-central1", "777")
	api.Add(geminifake.Batch{Name: name, State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0, SuccessfulCount: 2})
	clk := testkit.NewClock(t0)
	s, err := dial.Open(context.Background(), filepath.Join(t.TempDir(), "sink.db"), sink.Options{Now: clk.Now}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pc := poller.DefaultConfig()
	pc.Backend, pc.Project, pc.Location, pc.NoCredentials = poller.BackendVertex, "123", "us-central1", true
	pc.BaseURL, pc.Now, pc.HTTPClient = api.URL(), clk.Now, &http.Client{Transport: bearer{"tok"}}
	p, err := poller.New(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := results.Open(filepath.Join(t.TempDir(), "results"))
	if err != nil {
		t.Fatal(err)
	}
	d := &docs{}
	disp, err := dispatch.New(dispatch.Config{Sink: s, Effect: d, Now: clk.Now, Confirm: true, API: p, Results: dir,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	poll, err := NewPoll(PollConfig{Sink: s, Poller: p, Dispatcher: disp, FullScanEvery: DefaultFullScanEvery, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if r := poll.Pass(context.Background()); r.Err() != nil || r.Effects.OK != 1 {
		t.Fatalf("pass = %+v", r)
	}
	evs := d.of("gemini:batchPredictionJobs/777")
	if len(evs) != 1 || evs[0].ResultsLocation != "gs://geminifake-bucket/out/prediction-777" || evs[0].ResultsFile != "" ||
		!evs[0].Confirmed || evs[0].BatchState != "SUCCEEDED" {
		t.Fatalf("documents = %+v, want results_location only", evs)
	}
	if c := counts(api); c.Download != 0 || c.Get != 0 {
		t.Fatalf("requests %+v, want no get and no download", c)
	}
	// A job named by an event (Vertex has no webhooks, but a body may name
	// one) is confirmed by its numeric id through the client's own project
	// and location.
	name2 := geminifake.VertexName("123", "us-central1", "778")
	api.Add(geminifake.Batch{Name: name2, State: "FAILED", CreateTime: t0.Add(-time.Hour), EndTime: t0,
		Error: &geminifake.Status{Code: 3, Message: "bad input"}})
	hooks := ingest.NewWebhooks(ingest.WebhookConfig{Sink: s})
	if a := hooks.Event(context.Background(), []byte(`{"name":"`+name2+`"}`), ingest.VerifiedStatic); a.Kind != ingest.Recorded {
		t.Fatalf("Event = %+v", a)
	}
	if sum, err := disp.Drain(context.Background()); err != nil || sum.OK != 1 {
		t.Fatalf("Drain = %+v, %v", sum, err)
	}
	evs = d.of("gemini:batchPredictionJobs/778")
	if len(evs) != 1 || !evs[0].Confirmed || evs[0].BatchState != "FAILED" || !strings.Contains(string(evs[0].Operation), "bad input") {
		t.Fatalf("documents = %+v, want the job confirmed as FAILED", evs)
	}
	if n := api.Count(http.MethodGet, "/v1beta1/"+name2); n != 1 {
		t.Fatalf("%d gets of the job, want 1", n)
	}
}
