package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// arrangePasses gives db three poll scopes (spec §5.5): "a" with a full,
// successful pass by host-a and its lease now held by host-b for an hour;
// "b" whose only pass failed, its lease free; "c" whose holder died in
// 2020 (the lease expired, not yet taken over).
func arrangePasses(t *testing.T, db string) (t0 time.Time) {
	t.Helper()
	ctx := context.Background()
	t0 = time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		l, _, err := s.AcquirePass(ctx, "gemini|https://a|k1", "host-a", time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.EndPass(ctx, l, sink.PassOutcome{Start: t0, End: t0.Add(2 * time.Second), Success: true, FullScan: true}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.AcquirePass(ctx, "gemini|https://a|k1", "host-b", time.Hour, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.EndPass(ctx, sink.PassLease{Scope: "gemini|https://b|k2", Owner: "host-a"},
			sink.PassOutcome{Start: t0, End: t0.Add(3 * time.Second)}); err != nil {
			t.Fatal(err)
		}
	})
	withSink(t, db, sink.Options{Now: func() time.Time { return time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) }}, func(s sink.Sink) {
		if _, _, err := s.AcquirePass(ctx, "gemini|https://c|k3", "host-c", time.Minute, 0); err != nil {
			t.Fatal(err)
		}
	})
	return t0
}

// TestStatsShowsPassRecords: `gemrecon stats` shows each scope's last pass
// (start, end, holder), last success, last full scan and lease; --json has
// them under "passes" with the struct's field names.
func TestStatsShowsPassRecords(t *testing.T) {
	parallel(t)
	db := newDB(t)
	r := gemrecon(t, "--db", db, "stats")
	wantCode(t, r, exitOK)
	if !regexp.MustCompile(`(?m)^poll passes: +none recorded$`).MatchString(r.stdout) {
		t.Errorf("stats of a database without passes should say so:\n%s", r.stdout)
	}
	r = gemrecon(t, "--db", db, "stats", "--json")
	if !strings.Contains(r.stdout, `"passes": []`) {
		t.Errorf("stats --json without passes should have \"passes\": []:\n%s", r.stdout)
	}

	t0 := arrangePasses(t, db)
	ts := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	r = gemrecon(t, "--db", db, "stats")
	wantCode(t, r, exitOK)
	for _, want := range []string{
		`(?m)^poll passes: +3 scopes$`,
		`(?m)^  gemini\|https://a\|k1$`,
		`(?m)^    last pass: +` + regexp.QuoteMeta(ts(0)+" → "+ts(2*time.Second)+" by host-a") + `$`,
		`(?m)^    last success: +` + regexp.QuoteMeta(ts(2*time.Second)) + `$`,
		`(?m)^    last full scan: +` + regexp.QuoteMeta(ts(0)) + `$`,
		`(?m)^    lease: +held by host-b until \S+ \(token 2\)$`,
		`(?m)^  gemini\|https://b\|k2$`,
		`(?m)^    last pass: +` + regexp.QuoteMeta(ts(0)+" → "+ts(3*time.Second)+" by host-a") + `$`,
		`(?m)^    last success: +-$`,
		`(?m)^    lease: +free \(token 0\)$`,
		`(?m)^  gemini\|https://c\|k3$`,
		`(?m)^    last pass: +-$`,
		`(?m)^    lease: +expired: held by host-c until 2020-01-01T00:01:00Z \(token 1\); the next pass takes it over$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("stats output lacks %s:\n%s", want, r.stdout)
		}
	}
	if a, b, c := strings.Index(r.stdout, "https://a"), strings.Index(r.stdout, "https://b"), strings.Index(r.stdout, "https://c"); !(a < b && b < c) {
		t.Errorf("scopes not in order:\n%s", r.stdout)
	}

	r = gemrecon(t, "--db", db, "stats", "--json")
	wantCode(t, r, exitOK)
	var got struct {
		Passes []map[string]any `json:"passes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || len(got.Passes) != 3 {
		t.Fatalf("stats --json passes: %v\n%s", err, r.stdout)
	}
	a := got.Passes[0]
	for field, want := range map[string]any{
		"scope": "gemini|https://a|k1", "last_start": ts(0), "last_end": ts(2 * time.Second), "last_holder": "host-a",
		"last_success": ts(2 * time.Second), "last_full_scan": ts(0), "holder": "host-b", "token": 2.0,
	} {
		if a[field] != want {
			t.Errorf("stats --json passes[0].%s = %v, want %v", field, a[field], want)
		}
	}
	if _, ok := a["held_until"]; !ok {
		t.Errorf("stats --json passes[0] lacks held_until: %v", a)
	}
	if b := got.Passes[1]; b["last_success"] != nil || b["holder"] != nil || b["held_until"] != nil || b["token"] != 0.0 {
		t.Errorf("stats --json passes[1] = %v, want no success, no holder, token 0", b)
	}
}

// TestStatsEscapesStoredStrings: stats prints pass scopes, pass holders and
// first sources — strings other processes stored — with control characters
// escaped, as list and status print keys and errors (spec §12); --json
// escapes them as JSON does.
func TestStatsEscapesStoredStrings(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	scope, owner, source := "gemini|https://e\x1b[2J|k", "host\x1b]0;owned\x07", "hook\x1b[31m"
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		l, _, err := s.AcquirePass(ctx, scope, owner, time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if err := s.EndPass(ctx, l, sink.PassOutcome{Start: now, End: now, Success: true, FullScan: true}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.AcquirePass(ctx, scope, owner, time.Hour, 0); err != nil { // held, so "lease:" names it too
			t.Fatal(err)
		}
		if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/esc", Source: source, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	})
	r := gemrecon(t, "--db", db, "stats")
	wantCode(t, r, exitOK)
	if strings.ContainsAny(r.stdout, "\x1b\x07") {
		t.Errorf("stats printed raw control characters:\n%q", r.stdout)
	}
	for _, want := range []string{
		"\n  " + strconv.Quote(scope) + "\n",
		"by " + strconv.Quote(owner) + "\n",
		"held by " + strconv.Quote(owner) + " until ",
		" " + strconv.Quote(source) + " 1\n", // first source
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats lacks %q:\n%s", want, r.stdout)
		}
	}
	r = gemrecon(t, "--db", db, "stats", "--json")
	wantCode(t, r, exitOK)
	if strings.ContainsAny(r.stdout, "\x1b\x07") || !strings.Contains(r.stdout, `\u001b[2J`) {
		t.Errorf("stats --json printed %q, want JSON escapes", r.stdout)
	}
}

// TestServeMetricsShowPassRecords: serve's /metrics carries the pass
// records of the database per scope, absent where a time never happened.
func TestServeMetricsShowPassRecords(t *testing.T) {
	parallel(t)
	db := newDB(t)
	t0 := arrangePasses(t, db)
	addr := freeAddr(t)
	cmd := child(t, "--db", db, "serve", "--listen", addr, "--exec", "true")
	cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	waitHealthy(t, "http://"+addr+"/healthz", &stderr)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body := new(bytes.Buffer)
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	got := grepLines(body.String(), "gemrecon_poll_last_")
	series := map[string]float64{}
	for _, l := range strings.Split(got, "\n") {
		name, v, ok := strings.Cut(l, " ")
		if f, err := strconv.ParseFloat(v, 64); ok && !strings.HasPrefix(l, "#") && err == nil {
			series[name] = f
		}
	}
	sec := func(d time.Duration) float64 { return float64(t0.Add(d).Unix()) }
	for name, want := range map[string]float64{
		`gemrecon_poll_last_success_timestamp_seconds{scope="gemini|https://a|k1"}`:   sec(2 * time.Second),
		`gemrecon_poll_last_pass_end_timestamp_seconds{scope="gemini|https://a|k1"}`:  sec(2 * time.Second),
		`gemrecon_poll_last_full_scan_timestamp_seconds{scope="gemini|https://a|k1"}`: sec(0),
		`gemrecon_poll_last_pass_end_timestamp_seconds{scope="gemini|https://b|k2"}`:  sec(3 * time.Second),
	} {
		if v, ok := series[name]; !ok || v != want {
			t.Errorf("/metrics %s = %v (present %v), want %v:\n%s", name, v, ok, want, got)
		}
	}
	for _, absent := range []string{
		`gemrecon_poll_last_success_timestamp_seconds{scope="gemini|https://b|k2"}`,
		`gemrecon_poll_last_full_scan_timestamp_seconds{scope="gemini|https://b|k2"}`,
		`{scope="gemini|https://c|k3"}`,
	} {
		if strings.Contains(got, absent) {
			t.Errorf("/metrics has %s, which never happened:\n%s", absent, got)
		}
	}
}
