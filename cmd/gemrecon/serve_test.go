package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// serve refuses to start without a secret (spec §6), and never takes one in
// argv: there is no flag for it.
func TestServeRefusesToStartWithoutSecret(t *testing.T) {
	t.Setenv("GEMRECON_WEBHOOK_SECRET", "")
	db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
	r := gemrecon(t, "--db", db, "serve", "--listen", "127.0.0.1:0", "--print")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "GEMRECON_WEBHOOK_SECRET") || !strings.Contains(r.stderr, "--insecure-no-verify") {
		t.Errorf("the refusal should say how to configure a secret: %v", r)
	}
	t.Setenv("GEMRECON_WEBHOOK_SECRET", "whsec_bm90IGJhc2U2NA-not-base64!")
	r = gemrecon(t, "--db", db, "serve", "--listen", "127.0.0.1:0", "--print")
	wantCode(t, r, exitUsage)
	if strings.Contains(r.stderr, "not-base64") {
		t.Errorf("an invalid secret must not be echoed: %v", r)
	}
	if r := gemrecon(t, "serve", "--secret", "x"); r.code != exitUsage {
		t.Errorf("serve --secret must not exist (secrets never in argv): %v", r)
	}
}

// serve --poll-every runs reconciliation passes in the same process: a
// completion whose webhook never came is found and its effect run; SIGTERM
// then stops the process cleanly with nothing left claimed.
func TestServePollEvery(t *testing.T) {
	parallel(t)
	api := fakeAPI(t, "SUCCEEDED", "RUNNING", "FAILED")
	dir := t.TempDir()
	db := initDB(t, filepath.Join(dir, "s.db"))
	log := filepath.Join(dir, "effects.log")
	addr := freeAddr(t)
	cmd := child(t, "--db", db, "serve", "--listen", addr, "--poll-every", "200ms",
		"--base-url", api.URL(), "--qps", "0", "--exec", `echo "$GEMRECON_KEY $GEMRECON_SOURCE" >> `+shellQuote(log))
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "GEMINI_API_KEY="+testAPIKey)
	stderr := startServing(t, cmd, "http://"+addr+"/healthz")

	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Count(string(b), "\n") >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no poll-driven effects after 30s; log %q\n%s", b, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Several passes ran; the effects still ran once per completion.
	waitFor(t, 10*time.Second, func() bool { return strings.Count(stderr.String(), "poll: listed=") >= 2 })
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metricsBody := new(bytes.Buffer)
	metricsBody.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(metricsBody.String(), `gemrecon_keys{state="done"} 2`) {
		t.Errorf("/metrics should count 2 done keys:\n%s", grepLines(metricsBody.String(), "gemrecon_keys"))
	}
	// Poll sightings count in gemrecon_deliveries_total (issue 13, "Done
	// when" 3): two new keys, then the same two again on every later pass.
	if !strings.Contains(metricsBody.String(), `gemrecon_deliveries_total{outcome="accepted",source="poll"} 2`+"\n") ||
		!strings.Contains(metricsBody.String(), `gemrecon_deliveries_total{outcome="done",source="poll"}`) {
		t.Errorf("/metrics should count poll sightings:\n%s", grepLines(metricsBody.String(), "gemrecon_deliveries_total"))
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve exited with %v after SIGTERM\n%s", err, stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop after SIGTERM\n%s", stderr)
	}
	lines := readLines(t, log)
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " poll") {
		t.Fatalf("effect log %q: want the two terminal batches once each, first seen by poll", lines)
	}
	r := gemrecon(t, "--db", db, "stats", "--json")
	var st struct {
		ByState map[string]int `json:"by_state"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.ByState["done"] != 2 || st.ByState["claimed"] != 0 {
		t.Fatalf("stats after shutdown: %s (err %v)", r.stdout, err)
	}
}

// poll --metrics-textfile writes the pass's counters for node_exporter.
func TestPollMetricsTextfile(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t, "SUCCEEDED", "RUNNING", "EXPIRED")
	dir := t.TempDir()
	prom := filepath.Join(dir, "gemrecon.prom")
	r := gemrecon(t, pollArgs(initDB(t, filepath.Join(dir, "s.db")), api, "--metrics-textfile", prom, "--print")...)
	wantCode(t, r, exitOK)
	b, err := os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gemrecon_poll_listed 3", "gemrecon_poll_terminal 2", "gemrecon_poll_new 2",
		"gemrecon_poll_effects_ok 2", "gemrecon_poll_last_run_success 1", "# TYPE gemrecon_poll_api_requests gauge",
		"gemrecon_poll_skipped_old 0", "gemrecon_poll_full_scan 1", "gemrecon_poll_skipped 0", "# TYPE gemrecon_poll_last_success_timestamp_seconds gauge"} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("textfile lacks %q:\n%s", want, b)
		}
	}
	lastSuccess := textfileValue(t, string(b), "gemrecon_poll_last_success_timestamp_seconds")
	if lastSuccess <= 0 || textfileValue(t, string(b), "gemrecon_poll_last_full_scan_timestamp_seconds") <= 0 {
		t.Errorf("no last success or last full scan:\n%s", b)
	}
	// A second pass whose new key's effect fails exits 4: last_run_success
	// 0, and the last success is still the first pass's (from the database).
	api.Add(geminifake.Batch{Name: geminifake.GeminiName("late"), State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Minute)})
	r = gemrecon(t, pollArgs(initDB(t, filepath.Join(dir, "s.db")), api, "--metrics-textfile", prom, "--exec", "exit 3")...)
	wantCode(t, r, exitNotDone)
	b, err = os.ReadFile(prom)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "gemrecon_poll_last_run_success 0\n") || !strings.Contains(string(b), "gemrecon_poll_effects_failed 1\n") ||
		textfileValue(t, string(b), "gemrecon_poll_last_success_timestamp_seconds") != lastSuccess {
		t.Errorf("after a pass that exited 4 (last success was %v):\n%s", lastSuccess, b)
	}
}

// textfileValue reads one gauge's value from a textfile.
func textfileValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(l, name+"{"); ok { // labels (scope)
			_, l, _ = strings.Cut(rest, "} ")
			l = name + " " + l
		}
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("textfile has no %s:\n%s", name, text)
	return 0
}

func waitFor(t *testing.T, max time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(max)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", max)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
