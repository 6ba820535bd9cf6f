package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
)

// The field names of spec §5.4, in order (plus invalid after duplicates).
var summaryFields = []string{"listed", "terminal", "skipped_old", "new", "duplicates", "invalid",
	"effects_ok", "effects_failed", "fenced", "api_requests", "full_scan", "duration"}

func sampleResult() Result {
	return Result{
		Start: t0, End: t0.Add(1421 * time.Millisecond),
		List: poller.PassStats{Listed: 120, Terminal: 37, SkippedOld: 3, Requests: 2, FullScan: true},
		New:  2, Duplicates: 31, Invalid: 1,
		Effects: dispatch.Summary{OK: 2, Failed: 1, Dead: 1, Fenced: 1},
	}
}

// The text line: "poll:" and every field as name=value, in the spec's order.
func TestSummaryText(t *testing.T) {
	got := sampleResult().Summary().String()
	want := "poll: listed=120 terminal=37 skipped_old=3 new=2 duplicates=31 invalid=1 effects_ok=2 effects_failed=2 fenced=1 api_requests=2 full_scan=true duration=1.421s"
	if got != want {
		t.Errorf("summary\n got %s\nwant %s", got, want)
	}
	var names []string
	for _, f := range strings.Fields(strings.TrimPrefix(got, "poll: ")) {
		name, _, _ := strings.Cut(f, "=")
		names = append(names, name)
	}
	if !reflect.DeepEqual(names, summaryFields) {
		t.Errorf("fields %v, want %v", names, summaryFields)
	}
	// A listing error is no full scan, whatever the poller got to.
	r := sampleResult()
	r.ListErr = errors.New("boom")
	if r.Summary().FullScan {
		t.Error("a failed listing reported as a full scan")
	}
}

// Under --log-format json: one JSON object on one line, the same names in
// the same order, the same values.
func TestSummaryJSON(t *testing.T) {
	var b strings.Builder
	if err := sampleResult().Summary().Write(&b, true); err != nil {
		t.Fatal(err)
	}
	line := b.String()
	if strings.Count(line, "\n") != 1 || !strings.HasSuffix(line, "\n") {
		t.Fatalf("not one line: %q", line)
	}
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, _ := dec.Token(); tok != json.Delim('{') {
		t.Fatalf("not an object: %s", line)
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tok.(string))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	if !reflect.DeepEqual(names, summaryFields) {
		t.Errorf("JSON fields %v, want %v", names, summaryFields)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	if m["listed"] != 120.0 || m["skipped_old"] != 3.0 || m["full_scan"] != true || m["duration"] != "1.421s" || m["effects_failed"] != 2.0 {
		t.Errorf("JSON values %v", m)
	}
	b.Reset()
	if err := sampleResult().Summary().Write(&b, false); err != nil || b.String() != sampleResult().Summary().String()+"\n" {
		t.Errorf("text Write = %q, %v", b.String(), err)
	}
}

// A real pass: terminal = skipped_old + new + duplicates + invalid.
func TestSummaryAddsUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{pageSize: 5})
	bs, _ := issueBatches(t0)
	e.api.Add(bs...)
	e.api.Add(geminifake.Batch{Name: geminifake.GeminiName("bad\x7f"), State: "FAILED", CreateTime: t0.Add(-time.Hour)})
	e.api.Add(geminifake.Batch{Name: geminifake.GeminiName("run"), State: "RUNNING", CreateTime: t0.Add(-time.Hour)})
	for range 2 {
		r := e.pass(t)
		s := r.Summary()
		if r.Err() != nil || s.Terminal != s.SkippedOld+s.New+s.Duplicates+s.Invalid || s.Listed != 44 || s.Terminal != 43 || s.Invalid != 1 {
			t.Errorf("summary %s (err %v) does not add up", s, r.Err())
		}
	}
}

// gauge reads one gauge's value from a textfile ("" when absent); a gauge
// with labels is read whatever its labels.
func gauge(text, name string) string {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
		if rest, ok := strings.CutPrefix(l, name+"{"); ok {
			if _, v, ok := strings.Cut(rest, "} "); ok {
				return v
			}
		}
	}
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The textfile: last_run_success is 1 only for a pass that exits 0; the
// last success and last full scan come from the database, so a pass that
// exits 4 (an effect failed) or 1 (the listing failed) does not overwrite
// the time of the last good one; the other gauges stay.
func TestTextfile(t *testing.T) { backends(t, testTextfile) }

func testTextfile(t *testing.T, pg bool) {
	e := newEnv(t, envOptions{pageSize: 5, postgres: pg})
	prom := filepath.Join(t.TempDir(), "gemrecon.prom")
	bs, _ := issueBatches(t0)
	e.api.Add(bs...)

	// 1: success.
	r := e.pass(t)
	if !r.Success() || !r.RecordKnown {
		t.Fatalf("pass 1: %s, %v", r.Summary(), r.Err())
	}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text := readFile(t, prom)
	good := unixString(t0)
	for name, want := range map[string]string{
		"gemrecon_poll_last_run_success":                 "1",
		"gemrecon_poll_last_success_timestamp_seconds":   good,
		"gemrecon_poll_last_full_scan_timestamp_seconds": good,
		"gemrecon_poll_last_run_timestamp_seconds":       good,
		"gemrecon_poll_new":                              "12",
		"gemrecon_poll_skipped_old":                      "30",
		"gemrecon_poll_full_scan":                        "1",
		"gemrecon_poll_api_requests":                     "9",
		"gemrecon_poll_invalid":                          "0",
		"gemrecon_poll_listed":                           "42",
		"gemrecon_poll_terminal":                         "42",
		"gemrecon_poll_duplicates":                       "0",
		"gemrecon_poll_effects_ok":                       "12",
		"gemrecon_poll_effects_failed":                   "0",
		"gemrecon_poll_fenced":                           "0",
		"gemrecon_poll_last_run_duration_seconds":        "0",
		"gemrecon_poll_skipped":                          "0",
	} {
		if got := gauge(text, name); got != want {
			t.Errorf("pass 1: %s = %q, want %s", name, got, want)
		}
	}
	if !strings.Contains(text, "# TYPE gemrecon_poll_last_success_timestamp_seconds gauge\n") ||
		!strings.Contains(text, `gemrecon_poll_last_success_timestamp_seconds{scope="`+e.poll.scope+`"} `) {
		t.Errorf("no TYPE line or no scope label:\n%s", text)
	}

	// 2: an hour later a new completion whose effect fails: exit 4.
	e.clock.Set(t0.Add(time.Hour))
	e.api.Add(geminifake.Batch{Name: geminifake.GeminiName("failing"), State: "SUCCEEDED", CreateTime: t0})
	e.eff.fail[key("batches/failing")] = true
	r = e.pass(t)
	if r.Success() || r.Err() != nil || r.Summary().EffectsFailed != 1 {
		t.Fatalf("pass 2: %s, %v; want one failed effect", r.Summary(), r.Err())
	}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if gauge(text, "gemrecon_poll_last_run_success") != "0" || gauge(text, "gemrecon_poll_last_success_timestamp_seconds") != good ||
		gauge(text, "gemrecon_poll_last_run_timestamp_seconds") != unixString(t0.Add(time.Hour)) || gauge(text, "gemrecon_poll_effects_failed") != "1" {
		t.Errorf("pass 2 (exit 4):\n%s", text)
	}
	lastFull := gauge(text, "gemrecon_poll_last_full_scan_timestamp_seconds") // pass 2 read every page: shuffled
	if lastFull != unixString(t0.Add(time.Hour)) || !r.FullScan() {
		t.Errorf("pass 2: full scan %v, last full scan %s", r.FullScan(), lastFull)
	}

	// 3: the listing fails (credentials refused): exit 1.
	e.clock.Set(t0.Add(2 * time.Hour))
	e.api.InjectFault(geminifake.Fault{Status: 401})
	r = e.pass(t)
	if r.ListErr == nil || r.Success() {
		t.Fatalf("pass 3: %s, %v; want a listing error", r.Summary(), r.Err())
	}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if gauge(text, "gemrecon_poll_last_run_success") != "0" || gauge(text, "gemrecon_poll_last_success_timestamp_seconds") != good ||
		gauge(text, "gemrecon_poll_last_full_scan_timestamp_seconds") != lastFull {
		t.Errorf("pass 3 (exit 1):\n%s", text)
	}

	// 4: the failing effect now succeeds: the last success moves.
	e.clock.Set(t0.Add(3 * time.Hour))
	e.eff.fail[key("batches/failing")] = false
	r = e.pass(t)
	if !r.Success() {
		t.Fatalf("pass 4: %s, %v", r.Summary(), r.Err())
	}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if gauge(text, "gemrecon_poll_last_run_success") != "1" || gauge(text, "gemrecon_poll_last_success_timestamp_seconds") != unixString(t0.Add(3*time.Hour)) {
		t.Errorf("pass 4 (exit 0):\n%s", text)
	}

	// 5: another process holds the lease: the pass skips its listing,
	// succeeds, and the scope's last success stays the database's.
	e.clock.Set(t0.Add(4 * time.Hour))
	if _, _, err := e.sink.AcquirePass(context.Background(), e.poll.scope, "other-host:1:a", time.Minute, 0); err != nil {
		t.Fatal(err)
	}
	r = e.pass(t)
	if !r.Success() || !r.Skipped() {
		t.Fatalf("pass 5: %s, %v; want a skipped, successful pass", r.Summary(), r.Err())
	}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if gauge(text, "gemrecon_poll_skipped") != "1" || gauge(text, "gemrecon_poll_last_run_success") != "1" || gauge(text, "gemrecon_poll_api_requests") != "0" ||
		gauge(text, "gemrecon_poll_last_success_timestamp_seconds") != unixString(t0.Add(3*time.Hour)) {
		t.Errorf("pass 5 (skipped):\n%s", text)
	}

	// A fenced outcome is not success either (exit 4), and without a
	// readable record the database gauges are left out, not made up.
	r = Result{Start: t0, End: t0, Effects: dispatch.Summary{OK: 1, Fenced: 1}, Record: sink.PassRecord{LastSuccess: t0}}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if gauge(text, "gemrecon_poll_last_run_success") != "0" || gauge(text, "gemrecon_poll_fenced") != "1" ||
		strings.Contains(text, "last_success_timestamp") || strings.Contains(text, "last_full_scan_timestamp") {
		t.Errorf("fenced, record unknown:\n%s", text)
	}
	// A scope that never succeeded has no last success, as on /metrics.
	r = Result{Start: t0, End: t0, ListErr: errors.New("refused"), RecordKnown: true, Scope: "gemini x",
		Record: sink.PassRecord{LastFullScan: t0}}
	if err := WriteTextfile(prom, r); err != nil {
		t.Fatal(err)
	}
	text = readFile(t, prom)
	if strings.Contains(text, "last_success_timestamp") || gauge(text, "gemrecon_poll_last_full_scan_timestamp_seconds") != good {
		t.Errorf("never succeeded:\n%s", text)
	}
}

// unixString renders t's Unix time as the text exposition format writes a
// gauge (expfmt: strconv 'g', shortest).
func unixString(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'g', -1, 64)
}
