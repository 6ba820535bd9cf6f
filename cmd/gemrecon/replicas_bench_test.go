package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
)

// TestReplicaBench measures the list requests per minute that 1, 3 and 5
// `serve --poll-every 5s` replicas send to one project (the stand-in: 500
// terminal batches in a shuffled order, so every pass reads all 5 pages of
// 100) from one SQLite file, with the default --qps 5. BENCHMARKS.md,
// "Replicas", has the command; GEMRECON_BENCH_BIN runs another build (the
// commit before, say) in place of this one.
func TestReplicaBench(t *testing.T) {
	if os.Getenv("GEMRECON_REPLICA_BENCH") == "" {
		t.Skip("set GEMRECON_REPLICA_BENCH=1 (and optionally GEMRECON_BENCH_BIN, GEMRECON_BENCH_WINDOW) to measure")
	}
	window := time.Minute
	if w := os.Getenv("GEMRECON_BENCH_WINDOW"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatal(err)
		}
		window = d
	}
	bin := os.Getenv("GEMRECON_BENCH_BIN")
	counts := []int{1, 3, 5}
	if s := os.Getenv("GEMRECON_BENCH_REPLICAS"); s != "" {
		counts = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			counts = append(counts, n)
		}
	}
	var rows []string
	for _, n := range counts {
		api := fakeAPI(t)
		created := time.Now().Add(-time.Hour)
		for i := range 500 {
			api.Add(geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("bench-%03d", i)), State: "SUCCEEDED", CreateTime: created})
		}
		dir := t.TempDir()
		db := initDB(t, filepath.Join(dir, "sink.db"))
		var procs []*exec.Cmd
		for range n {
			addr := freeAddr(t)
			args := []string{"--db", db, "--log-level", "error", "serve", "--listen", addr, "--poll-every", "5s",
				"--base-url", api.URL(), "--exec", "true"}
			var cmd *exec.Cmd
			if bin == "" {
				cmd = child(t, args...)
			} else {
				cmd = exec.Command(bin, args...)
				cmd.Env = os.Environ()
			}
			cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+replicaSecret, "GEMINI_API_KEY="+testAPIKey)
			stderr := &testkit.Buffer{}
			cmd.Stderr = stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			waitHealthy(t, "http://"+addr+"/healthz", stderr)
			procs = append(procs, cmd)
		}
		from := time.Now()
		time.Sleep(window) // a measurement window, not a wait for a result
		to := time.Now()
		reqs, passes := listRequests(api, from, to)
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
		perMin := func(k int) float64 { return float64(k) / to.Sub(from).Minutes() }
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %.1f |", n, perMin(reqs), perMin(passes)))
	}
	t.Logf("binary %q, window %v:\n| replicas | list requests/min | passes/min |\n|---|---|---|\n%s", bin, window, strings.Join(rows, "\n"))
}
