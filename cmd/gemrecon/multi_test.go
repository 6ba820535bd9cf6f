package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
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

// Two poll processes and two serve processes share one PostgreSQL database;
// 1,000 completions, each delivered twice by webhook (once to each receiver)
// and seen by the pollers → exactly 1,000 effect lines, and stats agrees
// (issue 6). The two polls overlap, so the second usually finds the scope's
// pass lease held and skips its listing (issue 14): each poll that listed
// saw every completion once.
func TestMultiInstancePostgres(t *testing.T) {
	dsn := initDB(t, pgtest.Schema(t))
	const n = 1000
	dir := t.TempDir()
	log := filepath.Join(dir, "effects.log")
	effectFlag := "--exec=echo \"$GEMRECON_KEY $GEMRECON_TOKEN\" >> " + shellQuote(log)

	api := fakeAPI(t)
	created := time.Now().Add(-time.Hour)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("mi-%04d", i)
		api.Add(geminifake.Batch{Name: geminifake.GeminiName(ids[i]), State: "SUCCEEDED", CreateTime: created})
	}
	secret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

	// Create and migrate the schema once, so the four processes start on it.
	wantCode(t, gemrecon(t, "--db", dsn, "purge", "--older-than", "1h", "--force"), exitOK)

	var servers []*exec.Cmd
	var urls []string
	var serverErr []*testkit.Buffer
	for i := 0; i < 2; i++ {
		addr := freeAddr(t)
		cmd := child(t, "--db", dsn, "--log-level", "warn", "serve", "--listen", addr, "--concurrency", "8", effectFlag)
		cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+secret)
		stderr := &testkit.Buffer{}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		servers = append(servers, cmd)
		serverErr = append(serverErr, stderr)
		urls = append(urls, "http://"+addr)
		waitHealthy(t, "http://"+addr+"/healthz", stderr)
	}

	// Pollers and webhook deliveries run at the same time.
	var wg sync.WaitGroup
	pollOut := make([]result, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cmd := child(t, "--db", dsn, "poll", "--base-url", api.URL(), "--qps", "0", "--page-size", "100",
				"--lookback", "0", "--concurrency", "8", effectFlag)
			cmd.Env = append(cmd.Env, "GEMINI_API_KEY="+testAPIKey)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			pollOut[i] = result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
			if err != nil {
				pollOut[i].stderr += "\n" + err.Error()
			}
		}(i)
	}
	deliveries := make(chan [2]string)
	var failures sync.Map
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range deliveries {
				if err := deliverSigned(d[0], secret, d[1]); err != nil {
					failures.Store(d[1], err)
				}
			}
		}()
	}
	for _, id := range ids {
		body := fmt.Sprintf(`{"type":"batch.succeeded","version":"v1","data":{"id":%q}}`, id)
		deliveries <- [2]string{urls[0] + "/webhook", body}
		deliveries <- [2]string{urls[1] + "/webhook", body}
	}
	close(deliveries)
	wg.Wait()
	failures.Range(func(k, v any) bool { t.Errorf("delivery %v: %v", k, v); return true })
	for i, r := range pollOut {
		if r.code != exitOK {
			t.Errorf("poller %d: %v", i, r)
		}
	}

	// Wait until every key is done, then stop the receivers gracefully.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := gemrecon(t, "--db", dsn, "stats", "--json")
		var st sink.Stats
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatalf("stats: %v\n%v", err, r)
		}
		if st.ByState[sink.StateDone] == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3 minutes: %v", st.ByState)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i, s := range servers {
		_ = s.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- s.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve %d exited with %v\n%s", i, err, serverErr[i])
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("serve %d did not stop after SIGTERM", i)
		}
	}

	lines := readLines(t, log)
	perKey := map[string]int{}
	for _, l := range lines {
		perKey[strings.Fields(l)[0]]++
	}
	if len(lines) != n || len(perKey) != n {
		t.Fatalf("effect log: %d lines for %d distinct keys, want exactly %d each", len(lines), len(perKey), n)
	}
	r := gemrecon(t, "--db", dsn, "stats", "--json")
	var st sink.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	// 2 webhook deliveries + one poll sighting per poll that listed, per
	// completion: 1 + listed duplicates each.
	listed := 0
	for _, p := range pollOut {
		if !strings.Contains(p.stderr, " skipped=") {
			listed++
		}
	}
	if listed == 0 {
		t.Errorf("neither poll listed: %v", pollOut)
	}
	if want := int64((1 + listed) * n); st.ByState[sink.StateDone] != n || st.DuplicatesSuppressed != want {
		t.Errorf("stats = %s, want %d done and %d duplicates suppressed (%d polls listed)", r.stdout, n, want, listed)
	}
	if got := st.FirstSource[sink.SourceWebhook] + st.FirstSource[sink.SourcePoll]; got != n {
		t.Errorf("first-source split sums to %d, want %d", got, n)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func waitHealthy(t *testing.T, url string, stderr fmt.Stringer) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not healthy after 30s\n%s", url, stderr)
}

// deliverSigned POSTs a signed event, retrying 503 as a webhook sender would.
func deliverSigned(url, secret, body string) error {
	for attempt := 0; attempt < 20; attempt++ {
		h, err := testkit.SignWebhook(secret, fmt.Sprintf("msg-%d-%d", time.Now().UnixNano(), attempt), time.Now(), []byte(body))
		if err != nil {
			return err
		}
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
		req.Header = h
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil
		}
		if resp.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("still 503 after 20 attempts")
}
