package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/genaitest"
	"github.com/gemrecon/gemrecon/sink"
)

// The Gemini API as it really answers (issue 25), against the stand-in over
// HTTP through the poller: answers the SDK cannot map, embedding batches,
// operations of unknown types, results that expired or came cut short.

// poisoned are shapes on which the genai SDK's mapping panics (v1.77.0
// on the first; v1.79.1 still on the others, docs/gemini-api.md "Panics").
var poisoned = []geminifake.Batch{
	{Name: "batches/p-null", Raw: json.RawMessage(`null`)},
	{Name: "batches/p-out", Raw: json.RawMessage(`{"name":"batches/p-out","metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch","name":"batches/p-out","state":"BATCH_STATE_SUCCEEDED","output":"files/p-out","createTime":"2025-11-30T22:00:00Z","endTime":"2025-11-30T23:00:00Z"},"done":true}`)},
	{Name: "batches/p-inl", State: "SUCCEEDED", CreateTime: t0.Add(-2 * time.Hour), EndTime: t0.Add(-time.Hour),
		InlinedResponses: []json.RawMessage{json.RawMessage(`"a"`), json.RawMessage(`"b"`)}},
	// Not one of the SDK's panics, but an operation gemrecon cannot read:
	// its state is a number.
	{Name: "batches/p-state", Raw: json.RawMessage(`{"name":"batches/p-state","metadata":{"state":7},"done":true}`)},
}

// One poisoned operation never stops the listing: every pass reads every
// page, records every operation that parses (the SDK's panics among them),
// and counts and names the ones that do not (invalid=, a WARN with the
// name). The two that parse but whose results do not (metadata.output a
// string, inlined responses that are strings) are failed attempts, retried,
// never a crash.
func TestPoisonedOperationsDoNotStopTheListing(t *testing.T) {
	var logs bytes.Buffer
	w := newWorld(t, worldOptions{resultsDir: filepath.Join(t.TempDir(), "results"), pageSize: 3, logs: &logs})
	for i := range 12 {
		w.api.Add(geminifake.Batch{Name: fmt.Sprintf("batches/ok-%02d", i), State: "SUCCEEDED",
			CreateTime: t0.Add(-2 * time.Hour), EndTime: t0.Add(-time.Hour)})
	}
	w.api.Add(poisoned...)
	for pass := 1; pass <= 2; pass++ {
		r := w.pass()
		if r.Invalid != 2 || r.New+r.Duplicates != 14 || !r.FullScan() || r.List.Pages != 6 {
			t.Fatalf("pass %d: %s (pages %d); want invalid=2, 14 recorded, every page read", pass, r.Summary(), r.List.Pages)
		}
		if pass == 1 && (r.Effects.OK != 12 || r.Effects.Failed != 2) {
			t.Fatalf("pass 1 effects %+v; want 12 run and the two with unreadable results failed", r.Effects)
		}
		w.advance(time.Hour)
	}
	if !strings.Contains(logs.String(), `name="\"batches/p-state\""`) || strings.Count(logs.String(), "cannot be a key; skipped") != 4 {
		t.Errorf("want a WARN per pass for each of the two, naming batches/p-state:\n%s", logs.String())
	}
	for _, id := range []string{"p-out", "p-inl"} {
		e := w.entry("gemini:batches/" + id)
		if e.State != sink.StatePending || !strings.Contains(e.LastError, "results") || e.Attempts == 0 {
			t.Errorf("%s: %+v; want a failed attempt on its results, pending for a retry", id, e)
		}
	}
}

// Confirmation reads the operation itself too: a webhook-first key whose
// Batches.Get answer has an output the SDK cannot map is confirmed and
// fails on its results (a retryable attempt); one whose answer is null is
// a counted, retryable failure; neither crashes the dispatcher.
func TestPoisonedConfirmationIsAFailedAttempt(t *testing.T) {
	w := newWorld(t, worldOptions{resultsDir: filepath.Join(t.TempDir(), "results")})
	w.api.Add(poisoned[0], poisoned[1])
	w.hook("p-null", "batch.succeeded", ingest.VerifiedStatic)
	w.hook("p-out", "batch.succeeded", ingest.VerifiedStatic)
	if sum := w.drain(); sum.Failed != 2 || sum.OK != 0 {
		t.Fatalf("drain = %+v, want two failed attempts", sum)
	}
	e := w.entry("gemini:batches/p-null")
	if e.State != sink.StatePending || e.Attempts != 1 || !strings.Contains(e.LastError, "not an operation") {
		t.Errorf("p-null: %+v", e)
	}
	e = w.entry("gemini:batches/p-out")
	if e.State != sink.StatePending || e.Attempts != 1 || !e.Confirmed || !strings.Contains(e.LastError, "results") {
		t.Errorf("p-out: %+v", e)
	}
}

// Embedding batches (asyncBatchEmbedContent), created through the real SDK,
// are completions like any batch: listed or confirmed, their key, state and
// outcome are read, the document carries the operation as the API sent it
// (not the SDK's mapping, which loses an embedding batch's inlined results,
// go-genai #712), and their results — inlined or a responses file — are
// written. An operation of an unknown @type is recorded with its raw
// operation and counted (unknown_types=).
func TestEmbeddingAndUnknownBatchesAreCompletions(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "results")
	w := newWorld(t, worldOptions{resultsDir: dir})
	c := genaitest.Client(t, w.api.URL(), testKey)
	ctx := context.Background()
	var embeds []string
	for range 3 {
		job, err := c.Batches.CreateEmbeddings(ctx, genai.Ptr("models/gemini-embedding-001"), &genai.EmbeddingsBatchJobSource{
			InlinedRequests: &genai.EmbedContentBatch{Contents: []*genai.Content{genai.NewContentFromText("hello", genai.RoleUser)}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		embeds = append(embeds, job.Name)
	}
	vector := json.RawMessage(`{"response":{"embedding":{"values":[0.25,-0.5]}}}`)
	w.api.Update(embeds[0], func(b *geminifake.Batch) {
		b.State, b.EndTime, b.InlinedResponses = "SUCCEEDED", t0, []json.RawMessage{vector}
	})
	w.api.AddFile(geminifake.File{Name: "files/batch-emb", Data: []byte(`{"key":"1","response":{"embedding":{"values":[1]}}}` + "\n")})
	w.api.Update(embeds[1], func(b *geminifake.Batch) {
		b.State, b.EndTime, b.ResponsesFile, b.RequestCount = "SUCCEEDED", t0, "files/batch-emb", 1
	})
	w.api.Update(embeds[2], func(b *geminifake.Batch) {
		b.State, b.EndTime, b.Error = "FAILED", t0, &geminifake.Status{Code: 3, Message: "bad embedding input"}
	})
	w.api.Add(geminifake.Batch{Name: "batches/new-kind", Type: "SomeFutureBatch", State: "SUCCEEDED", CreateTime: t0.Add(-time.Hour), EndTime: t0})

	r := w.pass()
	if r.New != 4 || r.Invalid != 0 || r.List.UnknownTypes != 1 || !strings.Contains(r.Summary().String(), " unknown_types=1") || r.Effects.OK != 4 {
		t.Fatalf("pass: %s; want 4 new, one of an unknown type, 4 effects", r.Summary())
	}
	for i, name := range embeds {
		evs := w.docs.of("gemini:" + name)
		if len(evs) != 1 || !strings.Contains(string(evs[0].Operation), "EmbedContentBatch") || !evs[0].Confirmed {
			t.Fatalf("%s: documents %+v", name, evs)
		}
		want := []string{"SUCCEEDED", "SUCCEEDED", "FAILED"}[i]
		if evs[0].BatchState != want {
			t.Errorf("%s: batch state %q, want %q", name, evs[0].BatchState, want)
		}
		if i == 2 && !strings.Contains(string(evs[0].Operation), "bad embedding input") {
			t.Errorf("the failed embedding batch's document lacks its error: %s", evs[0].Operation)
		}
	}
	got, err := os.ReadFile(w.docs.of("gemini:" + embeds[0])[0].ResultsFile)
	if err != nil || string(got) != `{"response":{"embedding":{"values":[0.25,-0.5]}}}`+"\n" {
		t.Errorf("inlined embedding results %q, %v", got, err)
	}
	got, err = os.ReadFile(w.docs.of("gemini:" + embeds[1])[0].ResultsFile)
	if err != nil || !strings.Contains(string(got), `"values":[1]`) {
		t.Errorf("embedding responses file %q, %v", got, err)
	}
	if evs := w.docs.of("gemini:batches/new-kind"); len(evs) != 1 || !strings.Contains(string(evs[0].Operation), "SomeFutureBatch") {
		t.Errorf("unknown type: documents %+v", evs)
	}

	// Webhook-first: confirmation accepts an embedding batch.
	job, err := c.Batches.CreateEmbeddings(ctx, genai.Ptr("models/gemini-embedding-001"), &genai.EmbeddingsBatchJobSource{
		InlinedRequests: &genai.EmbedContentBatch{Contents: []*genai.Content{genai.NewContentFromText("hi", genai.RoleUser)}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.api.Update(job.Name, func(b *geminifake.Batch) {
		b.State, b.EndTime, b.InlinedResponses = "SUCCEEDED", t0, []json.RawMessage{vector}
	})
	w.hook(strings.TrimPrefix(job.Name, "batches/"), "batch.succeeded", ingest.VerifiedStatic)
	if sum := w.drain(); sum.OK != 1 {
		t.Fatalf("drain = %+v", sum)
	}
	if evs := w.docs.of("gemini:" + job.Name); len(evs) != 1 || !evs[0].Confirmed || evs[0].BatchState != "SUCCEEDED" || evs[0].ResultsFile == "" {
		t.Fatalf("webhook-first embedding batch: %+v", evs)
	}
}

// filesAnswer makes the stand-in answer requests for a file with f:
// download for the :download path, get for files.get (nil: normally).
func filesAnswer(api *geminifake.Server, file string, download, get *geminifake.Fault) {
	api.SetHook(func(r *http.Request) *geminifake.Fault {
		switch r.URL.Path {
		case "/v1beta/" + file + ":download":
			return download
		case "/v1beta/" + file:
			return get
		}
		return nil
	})
}

// Results that are gone: a 404 (or a 403 while the key works) on the
// responses file, or on its files.get, for a batch that ended more than
// 48 h ago makes the key dead at once as results_expired. The same answer
// for a batch that ended an hour ago is an ordinary failed attempt.
func TestResultsExpired(t *testing.T) {
	t.Parallel()
	notFound := &geminifake.Fault{Status: http.StatusNotFound, Message: "Requested entity was not found."}
	for _, tc := range []struct {
		name          string
		ended         time.Duration // before now
		download, get *geminifake.Fault
		deny          bool
		want          string // dead reason, "" for a retry
	}{
		{name: "404", ended: 49 * time.Hour, download: notFound, want: sink.DeadResultsExpired},
		{name: "403", ended: 49 * time.Hour, deny: true, want: sink.DeadResultsExpired},
		{name: "files.get 404", ended: 49 * time.Hour, get: notFound, want: sink.DeadResultsExpired},
		{name: "recent 404", ended: time.Hour, download: notFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, worldOptions{resultsDir: filepath.Join(t.TempDir(), "results")})
			file := "files/batch-gone"
			// Cut short and unframed, for the files.get case: only its
			// answer can tell.
			w.api.AddFile(geminifake.File{Name: file, Data: []byte("{}\n{}\n"), Unframed: true, CutAfter: 4})
			w.api.Add(geminifake.Batch{Name: "batches/gone", State: "SUCCEEDED", CreateTime: t0.Add(-tc.ended - time.Hour),
				EndTime: t0.Add(-tc.ended), ResponsesFile: file, RequestCount: 2})
			filesAnswer(w.api, file, tc.download, tc.get)
			if tc.deny {
				w.api.Deny(file)
			}
			w.pass()
			e := w.entry("gemini:batches/gone")
			switch {
			case tc.want != "" && (e.State != sink.StateDead || e.DeadReason != tc.want || e.Attempts != 1 || !strings.Contains(e.LastError, "results expired")):
				t.Fatalf("entry %+v; want dead at once as %s", e, tc.want)
			case tc.want == "" && (e.State != sink.StatePending || e.DeadReason != "" || e.Attempts != 1):
				t.Fatalf("entry %+v; want a failed attempt, pending", e)
			}
			if len(w.docs.evs) != 0 {
				t.Fatalf("the effect ran: %+v", w.docs.evs)
			}
		})
	}
}

// A responses file without a length whose size the API does not give
// (files.get answers without sizeBytes) is complete only when it holds a
// line per request and ends in a newline: cut short, the attempt fails and
// no file is handed over; the retry that gets the whole file runs.
func TestUnframedFileWithoutSizeCountsLines(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	w := newWorld(t, worldOptions{resultsDir: dir})
	file, data := "files/batch-cut", []byte("{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n")
	w.api.AddFile(geminifake.File{Name: file, Data: data, Unframed: true, CutAfter: int64(len(data) - 3)})
	w.api.Add(geminifake.Batch{Name: "batches/cut", State: "SUCCEEDED", CreateTime: t0.Add(-2 * time.Hour),
		EndTime: t0.Add(-time.Hour), ResponsesFile: file, RequestCount: 3})
	filesAnswer(w.api, file, nil, &geminifake.Fault{Body: `{"name":"` + file + `","mimeType":"application/jsonl"}`})
	if r := w.pass(); r.Effects.Failed != 1 {
		t.Fatalf("pass: %s; want the attempt failed", r.Summary())
	}
	e := w.entry("gemini:batches/cut")
	if e.State != sink.StatePending || !strings.Contains(e.LastError, "cut short") || len(w.docs.evs) != 0 {
		t.Fatalf("entry %+v (documents %d); want pending, cut short, no effect", e, len(w.docs.evs))
	}
	if _, err := os.Stat(filepath.Join(dir, "cut.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("a partial results file was published: %v", err)
	}
	w.api.AddFile(geminifake.File{Name: file, Data: data, Unframed: true})
	w.clock.Set(e.NextAttemptAt)
	if sum := w.drain(); sum.OK != 1 {
		t.Fatalf("drain = %+v", sum)
	}
	got, err := os.ReadFile(filepath.Join(dir, "cut.jsonl"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("results %q, %v", got, err)
	}
}
