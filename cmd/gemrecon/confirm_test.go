package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// --confirm and --results-dir at the command line (spec §9.2, §9.5): what
// needs credentials says so with exit 2; --confirm auto without them warns
// once and runs webhook-first keys unconfirmed.
func TestConfirmFlags(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", "")
	t.Setenv("GOOGLE_API_KEY", "")
	db := newDB(t)
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/w", Source: sink.SourceWebhook,
			Payload: []byte(`{"type":"batch.succeeded","data":{"id":"w"}}`), State: "SUCCEEDED"}); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--confirm", "always"}, "--confirm always needs API credentials"},
		{[]string{"--results-dir", t.TempDir()}, "--results-dir needs API credentials"},
		{[]string{"--confirm", "sometimes"}, `--confirm "sometimes": want auto, always or never`},
		{[]string{"--download-timeout", "0s"}, "--download-timeout must be positive"},
	} {
		r := gemrecon(t, append([]string{"--db", db, "drain", "--print"}, tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("drain %q = %v; want exit 2 saying %q", tc.args, r, tc.want)
		}
	}
	r := gemrecon(t, "--db", db, "drain", "--print")
	wantCode(t, r, exitOK)
	if n := strings.Count(r.stderr, "no API credentials"); n != 1 || !strings.Contains(r.stdout, `"confirmed":false`) ||
		!strings.Contains(r.stdout, `"webhook":{"type":"batch.succeeded"`) {
		t.Fatalf("drain without credentials: %d warnings, want 1, and the key run unconfirmed:\n%v", n, r)
	}
	if r := gemrecon(t, "--db", db, "drain", "--print", "--confirm", "never"); r.code != exitOK || strings.Contains(r.stderr, "no API credentials") {
		t.Fatalf("drain --confirm never = %v, want no warning", r)
	}
}

// With credentials, drain confirms a webhook-first key against the API
// (here the stand-in) before its effect: the document carries the API's
// operation, the batch's own outcome shows in status (with the reason),
// list and --json; a key the API does not know goes dead as "unknown to
// the API", which stats and --json count apart.
func TestDrainConfirmsAndInspectionShowsTheBatch(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	api := fakeAPI(t, "FAILED")
	db := newDB(t)
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		for _, id := range []string{"b0", "ghost"} {
			if _, err := s.Record(context.Background(), sink.Sighting{Key: "gemini:batches/" + id, Source: sink.SourceWebhook,
				Payload: []byte(`{"type":"batch.succeeded","data":{"id":"` + id + `"}}`), State: "SUCCEEDED"}); err != nil {
				t.Fatal(err)
			}
		}
	})
	r := gemrecon(t, "--db", db, "drain", "--print", "--base-url", api.URL(), "--qps", "0")
	wantCode(t, r, exitNotDone) // the ghost went dead
	if !strings.Contains(r.stderr, "drain: claimed=2 ok=1 failed=0 dead=1 fenced=0 unconfirmed=0") {
		t.Errorf("drain summary: %s", r.stderr)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &doc); err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	if doc["confirmed"] != true || doc["batch_state"] != "FAILED" || doc["state"] != "FAILED" ||
		!strings.Contains(r.stdout, "Enqueued token quota exceeded") || !strings.Contains(r.stdout, `"webhook":{"type":"batch.succeeded"`) {
		t.Fatalf("event document %s: want the API's failed operation, confirmed, the webhook body beside it", r.stdout)
	}
	if n := api.Count(http.MethodGet, "/v1beta/batches/b0"); n != 1 {
		t.Fatalf("%d Batches.Get for b0, want 1", n)
	}

	r = gemrecon(t, "--db", db, "status", "batches/b0")
	wantCode(t, r, exitOK)
	for _, want := range []string{"state:", "done", "batch:          FAILED (Enqueued token quota exceeded for this model.)", "confirmed:      yes", "conflicts:      1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, r.stdout)
		}
	}
	r = gemrecon(t, "--db", db, "status", "batches/b0", "--json")
	var st struct {
		State       string          `json:"state"`
		BatchState  string          `json:"batch_state"`
		BatchError  string          `json:"batch_error"`
		Confirmed   bool            `json:"confirmed"`
		ResultsFile *string         `json:"results_file"`
		Webhook     json.RawMessage `json:"webhook"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.State != "done" || st.BatchState != "FAILED" || !st.Confirmed ||
		st.ResultsFile == nil || *st.ResultsFile != "" || !strings.Contains(st.BatchError, "quota") || len(st.Webhook) == 0 {
		t.Fatalf("status --json = %s (%v)", r.stdout, err)
	}
	r = gemrecon(t, "--db", db, "status", "batches/ghost")
	wantCode(t, r, exitDead)
	for _, want := range []string{"batch:          SUCCEEDED", "confirmed:      no", "dead because:   unknown to the API", "last error:     unknown to the API"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status of the ghost lacks %q:\n%s", want, r.stdout)
		}
	}
	r = gemrecon(t, "--db", db, "list")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "BATCH") || !containsFields(r.stdout, "gemini:batches/b0", "done", "FAILED") ||
		!containsFields(r.stdout, "gemini:batches/ghost", "dead", "SUCCEEDED?") {
		t.Fatalf("list:\n%s", r.stdout)
	}
	r = gemrecon(t, "--db", db, "list", "--json")
	if !strings.Contains(r.stdout, `"batch_state": "FAILED"`) || !strings.Contains(r.stdout, `"results_file": ""`) {
		t.Fatalf("list --json:\n%s", r.stdout)
	}
	r = gemrecon(t, "--db", db, "stats")
	if !strings.Contains(r.stdout, "by reason:") || !strings.Contains(r.stdout, "unknown to the API 1, results expired 0, effect 0") {
		t.Fatalf("stats:\n%s", r.stdout)
	}
	r = gemrecon(t, "--db", db, "stats", "--json")
	if !strings.Contains(r.stdout, `"unknown_to_api": 1`) {
		t.Fatalf("stats --json:\n%s", r.stdout)
	}
}

// containsFields reports whether some line of out has these fields in order.
func containsFields(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		i := 0
		for _, x := range f {
			if i < len(fields) && x == fields[i] {
				i++
			}
		}
		if i == len(fields) {
			return true
		}
	}
	return false
}

// poll --results-dir writes a succeeded batch's results before its effect
// and hands the path to --exec; purge --results-dir deletes it with the key.
func TestPollResultsDirAndPurge(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	t.Setenv("GOOGLE_API_KEY", "")
	api := fakeAPI(t, "SUCCEEDED")
	api.Update("batches/b0", func(b *geminifake.Batch) { b.ResponsesFile = "files/b0-out" })
	api.AddFile(geminifake.File{Name: "files/b0-out", Size: 100 << 10, Seed: 3})
	dir := t.TempDir()
	db, res, log := initDB(t, filepath.Join(dir, "s.db")), filepath.Join(dir, "results"), filepath.Join(dir, "effects.log")
	r := gemrecon(t, pollArgs(db, api, "--results-dir", res, "--exec", `echo "$GEMRECON_RESULTS_FILE" >> `+shellQuote(log))...)
	wantCode(t, r, exitOK)
	lines := readLines(t, log)
	if len(lines) != 1 || lines[0] != filepath.Join(res, "b0.jsonl") {
		t.Fatalf("GEMRECON_RESULTS_FILE = %q, want %s", lines, filepath.Join(res, "b0.jsonl"))
	}
	got, err := os.ReadFile(lines[0])
	want, _ := io.ReadAll(geminifake.Content(3, 100<<10))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("results file: %d bytes, %v; want the %d bytes served", len(got), err, len(want))
	}
	r = gemrecon(t, "--db", db, "status", "batches/b0")
	if !strings.Contains(r.stdout, "results file:   "+lines[0]) {
		t.Fatalf("status:\n%s", r.stdout)
	}
	r = gemrecon(t, "--db", db, "purge", "--older-than", "1ns", "--force", "--results-dir", res)
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "purged 1 done key(s)") || !strings.Contains(r.stdout, "removed 1 results file(s)") {
		t.Fatalf("purge: %v", r)
	}
	if _, err := os.Stat(lines[0]); !os.IsNotExist(err) {
		t.Fatalf("results file after purge: %v", err)
	}
}

// Done when 1: kill -9 during a download, then restart. A real gemrecon
// process downloads an 8 MiB responses file that the stand-in holds after
// 3 MiB; it is killed there. The next process (once the dead one's lease has
// run out) finds no temporary file left, downloads the file again, and the
// effect runs once, with the complete file.
func TestKillDuringDownloadThenRestart(t *testing.T) {
	parallel(t)
	env := []string{"GEMINI_API_KEY=" + testAPIKey, "GOOGLE_API_KEY="}
	const size = 8 << 20
	api := fakeAPI(t, "SUCCEEDED")
	api.Update("batches/b0", func(b *geminifake.Batch) { b.ResponsesFile = "files/big" })
	api.AddFile(geminifake.File{Name: "files/big", Size: size, Seed: 11, BytesPerSecond: 32 << 20, StallAfter: 3 << 20})
	dir := t.TempDir()
	db, res, log := initDB(t, filepath.Join(dir, "s.db")), filepath.Join(dir, "results"), filepath.Join(dir, "effects.log")
	effect := `echo "$GEMRECON_KEY $GEMRECON_ATTEMPT $GEMRECON_RESULTS_FILE" >> ` + shellQuote(log)
	args := func(cmd string) []string {
		return []string{"--db", db, cmd, "--base-url", api.URL(), "--qps", "0", "--results-dir", res,
			"--lease", "2s", "--effect-timeout", "1s", "--exec", effect}
	}
	first := child(t, args("poll")...)
	first.Env = append(first.Env, env...)
	var stderr testkit.Buffer
	first.Stderr = &stderr
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	tmp := ""
	waitFor(t, 30*time.Second, func() bool {
		if api.Stalled() != 1 {
			return false
		}
		entries, _ := os.ReadDir(res)
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".tmp") {
				tmp = filepath.Join(res, e.Name())
				return true
			}
		}
		return false
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if fi, err := os.Stat(tmp); err != nil || fi.Size() == 0 || fi.Size() >= size {
		t.Fatalf("the killed download left %v (%v); want a partial temporary file", fi, err)
	}
	if _, err := os.Stat(filepath.Join(res, "b0.jsonl")); !os.IsNotExist(err) {
		t.Fatalf("a results file exists after the kill: %v", err)
	}
	api.Unstall("files/big")

	// Restart: drain until the dead process's lease has expired and the
	// key is taken over.
	waitFor(t, 60*time.Second, func() bool {
		r := gemreconWith(t, env, args("drain")...)
		if r.code != exitOK {
			t.Fatalf("drain: %v", r)
		}
		b, _ := os.ReadFile(log)
		return len(b) > 0
	})
	lines := readLines(t, log)
	if len(lines) != 1 || lines[0] != "gemini:batches/b0 2 "+filepath.Join(res, "b0.jsonl") {
		t.Fatalf("effect log %q: want one run, attempt 2 (the takeover), with the results file", lines)
	}
	got, err := os.ReadFile(filepath.Join(res, "b0.jsonl"))
	want, _ := io.ReadAll(geminifake.Content(11, size))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("results file: %d bytes, %v; want the %d bytes served", len(got), err, size)
	}
	entries, _ := os.ReadDir(res)
	for _, e := range entries {
		if e.Name() != "b0.jsonl" {
			t.Fatalf("left in the results directory: %s", e.Name())
		}
	}
	// Once more: nothing runs again, nothing is fetched again.
	downloads := api.Count(http.MethodGet, "/v1beta/files/big:download")
	wantCode(t, gemreconWith(t, env, args("poll")...), exitOK)
	if n := api.Count(http.MethodGet, "/v1beta/files/big:download"); n != downloads || len(readLines(t, log)) != 1 {
		t.Fatalf("a later poll fetched %d more times, ran %d effects", n-downloads, len(readLines(t, log))-1)
	}
}

// serve --sync confirms inside the request within --sync-wait: a batch the
// API says is finished is answered 200 done; one it says is running 202
// (the key goes on as in inbox mode), in about --sync-wait, not longer.
func TestServeSyncConfirmsWithinSyncWait(t *testing.T) {
	parallel(t)
	api := fakeAPI(t, "SUCCEEDED", "RUNNING")
	dir := t.TempDir()
	addr := freeAddr(t)
	log := filepath.Join(dir, "effects.log")
	cmd := child(t, "--db", initDB(t, filepath.Join(dir, "s.db")), "serve", "--listen", addr, "--insecure-no-verify", "--sync",
		"--sync-wait", "1s", "--base-url", api.URL(), "--qps", "0", "--exec", `echo "$GEMRECON_KEY $GEMRECON_BATCH_STATE $GEMRECON_CONFIRMED" >> `+shellQuote(log))
	cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey, "GOOGLE_API_KEY=")
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")
	post := func(id string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := http.Post("http://"+addr+"/webhook", "application/json",
			strings.NewReader(`{"type":"batch.succeeded","data":{"id":"`+id+`"}}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), time.Since(start)
	}
	if code, body, _ := post("b0"); code != http.StatusOK || !strings.Contains(body, `"done"`) {
		t.Fatalf("finished batch: %d %s\n%s", code, body, stderr)
	}
	if lines := readLines(t, log); len(lines) != 1 || lines[0] != "gemini:batches/b0 SUCCEEDED true" {
		t.Fatalf("effect log %q", lines)
	}
	code, body, took := post("b1")
	if code != http.StatusAccepted || took > 10*time.Second {
		t.Fatalf("running batch: %d %s after %v; want 202 within about --sync-wait\n%s", code, body, took, stderr)
	}
	if lines := readLines(t, log); len(lines) != 1 {
		t.Fatalf("the effect ran for a batch the API says is running: %q", lines)
	}
}
