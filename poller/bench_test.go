package poller

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
)

// benchEnv enables TestLoadPass (slow: ~100k batches over HTTP).
const benchEnv = "GEMRECON_POLL_BENCH"

// TestMain makes the test binary run one measured pass (benchChild) when
// started as poll-bench: the fake, whose memory grows with the number of
// batches, lives in the parent; the child's peak RSS is the poller's alone.
func TestMain(m *testing.M) {
	testkit.Main(m, map[string]func() int{"poll-bench": testkit.WithJSON(benchChild)})
}

// scenario is one measured pass: the fake's URL, the poller's lookback and
// whether the pass is a periodic full scan.
type scenario struct {
	URL      string
	Lookback time.Duration
	FullScan bool
}

type childResult struct {
	Listed, Passed, SkippedOld, Pages, Requests int
	FullScan                                    bool
	Seconds                                     float64
	PeakHeapInuse, PeakSys                      uint64
	BaseHeapInuse                               uint64
	VmHWMKiB                                    int64 // the child's own peak RSS
	Err                                         string
}

func benchChild(sc scenario) int {
	cfg := DefaultConfig()
	cfg.APIKey = testKey
	cfg.BaseURL = sc.URL
	cfg.PageSize = 100
	cfg.Lookback = sc.Lookback
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res := childResult{BaseHeapInuse: ms.HeapInuse}
	var (
		mu   sync.Mutex
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		mu.Lock()
		res.PeakHeapInuse = max(res.PeakHeapInuse, ms.HeapInuse)
		res.PeakSys = max(res.PeakSys, ms.Sys)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	p, err := New(context.Background(), cfg)
	if err == nil {
		var st PassStats
		st, err = p.PassWith(context.Background(), PassOptions{FullScan: sc.FullScan}, func([]Operation) error { return nil })
		res.Listed, res.Passed, res.SkippedOld, res.Pages, res.Requests = st.Listed, st.Passed, st.SkippedOld, st.Pages, st.Requests
		res.FullScan = st.FullScan
		res.Seconds = st.Duration.Seconds()
	}
	close(done)
	wg.Wait()
	sample()
	if err != nil {
		res.Err = err.Error()
	}
	res.VmHWMKiB = testkit.PeakRSS()
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// benchBatches makes n Gemini batches, one in ten terminal.
func benchBatches(n int) []geminifake.Batch {
	bs := make([]geminifake.Batch, n)
	at := time.Date(2025, 12, 11, 0, 0, 0, 0, time.UTC)
	for i := range bs {
		b := geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("bench-%06d", i)), State: "RUNNING",
			DisplayName: "bench", Model: "models/gemini-2.5-flash", CreateTime: at, UpdateTime: at}
		if i%10 == 0 {
			b.State, b.EndTime, b.RequestCount, b.SuccessfulCount = "SUCCEEDED", at.Add(time.Hour), 3, 3
			b.ResponsesFile = "files/out-" + b.Name[len("batches/"):]
		}
		bs[i] = b
	}
	return bs
}

// windowBatches makes n Gemini batches of which recent were created in the
// last hour and the rest 100 h ago or more, one in ten terminal: a listing
// in which a lookback of 72 h holds the recent ones only.
func windowBatches(n, recent int) []geminifake.Batch {
	bs := benchBatches(n)
	now := time.Now()
	for i := range bs {
		if i < recent {
			bs[i].CreateTime = now.Add(-time.Duration(i) * time.Second)
		} else {
			bs[i].CreateTime = now.Add(-100*time.Hour - time.Duration(i)*time.Second)
		}
		bs[i].UpdateTime = bs[i].CreateTime
		if !bs[i].EndTime.IsZero() {
			bs[i].EndTime = bs[i].CreateTime.Add(time.Minute)
		}
	}
	return bs
}

// runChild runs one measured pass in a child process against a fake
// holding bs, listed in order.
func runChild(t *testing.T, bs []geminifake.Batch, order geminifake.Order, sc scenario) childResult {
	t.Helper()
	s := geminifake.New(geminifake.Options{APIKey: testKey, MaxPageSize: 100, Order: order})
	s.Add(bs...)
	u, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc.URL = u
	cmd := testkit.CommandJSON(t, "poll-bench", sc)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var res childResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	if res.Err != "" {
		t.Fatalf("child: %s", res.Err)
	}
	if res.VmHWMKiB <= 0 {
		t.Fatal("no VmHWM from the child")
	}
	return res
}

// TestLoadPass measures one pass over 1k, 10k and 100k listed batches
// (pages of 100, 10% terminal, no rate limit) in a child process each and
// writes the table to testdata/gemini/BENCH-poll.md. Run with
//
//	GEMRECON_POLL_BENCH=1 go test -run TestLoadPass -v ./poller/
func TestLoadPass(t *testing.T) {
	if os.Getenv(benchEnv) == "" {
		t.Skip("set " + benchEnv + "=1 to run the load measurement")
	}
	var rows []string
	var rss []int64
	for _, n := range []int{1_000, 10_000, 100_000} {
		res := runChild(t, benchBatches(n), geminifake.OrderShuffled, scenario{})
		if res.Listed != n || res.Passed != n/10 || res.Pages != n/100 || res.Requests != n/100 || !res.FullScan {
			t.Fatalf("n=%d: %+v", n, res)
		}
		maxRSS := res.VmHWMKiB
		rss = append(rss, maxRSS)
		rows = append(rows, fmt.Sprintf("| %d | %d | %.2f s | %.0f | %.1f MiB | %.1f MiB | %.1f MiB |",
			n, res.Requests, res.Seconds, float64(res.Listed)/res.Seconds,
			float64(maxRSS)/1024, float64(res.PeakHeapInuse)/(1<<20), float64(res.PeakSys)/(1<<20)))
		t.Log(rows[len(rows)-1])
	}
	// The stop rule's cost: 100k listed, the newest 1,000 (10 pages) inside
	// a 72 h window. Newest first ends after pages-in-window + 1; the
	// periodic full scan and an order that is not newest first read all.
	const n, recent = 100_000, 1_000
	window := windowBatches(n, recent)
	var costRows []string
	for _, c := range []struct {
		what  string
		order geminifake.Order
		sc    scenario
		want  int
	}{
		{"newest first, lookback 72h (ends early)", geminifake.OrderNewestFirst, scenario{Lookback: DefaultLookback}, recent/100 + 1},
		{"newest first, lookback 72h, full scan (one pass per --full-scan-every)", geminifake.OrderNewestFirst, scenario{Lookback: DefaultLookback, FullScan: true}, n / 100},
		{"oldest first, lookback 72h (order broken at page 2: reads all)", geminifake.OrderOldestFirst, scenario{Lookback: DefaultLookback}, n / 100},
		{"shuffled, lookback 72h (order broken: reads all)", geminifake.OrderShuffled, scenario{Lookback: DefaultLookback}, n / 100},
	} {
		res := runChild(t, window, c.order, c.sc)
		if res.Requests != c.want || res.Passed != recent/10 {
			t.Fatalf("%s: %+v, want %d requests and %d handed over", c.what, res, c.want, recent/10)
		}
		costRows = append(costRows, fmt.Sprintf("| %s | %d | %d | %d | %d | %.2f s | %.1f MiB |",
			c.what, res.Requests, res.Listed, res.Passed, res.SkippedOld, res.Seconds, float64(res.VmHWMKiB)/1024))
		t.Log(costRows[len(costRows)-1])
	}
	if ratio := float64(rss[2]) / float64(rss[0]); ratio > 2 {
		t.Errorf("peak RSS grew %.2f× from 1k to 100k batches, want ≤ 2×", ratio)
	}
	doc := fmt.Sprintf(`# Poller: one pass over many listed batches

Command (from the module root; each size runs in a child process, the fake API in the parent):

    %s=1 go test -run TestLoadPass -v ./poller/

One pass of poller.Pass (its own requests, read with encoding/json) over HTTP on loopback against
internal/geminifake; pages of 100; 10%% of the batches terminal (handed to a no-op callback);
no rate limit; Lookback 0 (every page). Peak RSS is the child's VmHWM (/proc/self/status; rusage
max RSS is not used: Go forks children with CLONE_VM, so it reports the parent's peak); peak heap and
Go Sys are runtime.MemStats sampled every 5 ms.

| listed batches | list requests | wall time | listed ops/s | peak RSS | peak HeapInuse | peak Go Sys |
|---:|---:|---:|---:|---:|---:|---:|
%s

Peak RSS from 1k to 100k: ×%.2f (flat: pages are streamed to the callback, never collected).

The stop rule's cost (spec §5.2), %d listed batches of which the newest %d (%d pages) were created in
the last hour and the rest 100 h ago or more; lookback 72h; 10%% terminal:

| listing order, pass | list requests | listed | handed over | skipped_old | wall time | peak RSS |
|---|---:|---:|---:|---:|---:|---:|
%s

Wall time and ops/s include the fake API serving on the same (shared, 2-core) machine; they are
noisy run to run. In-process allocation profile: `+"`go test -run '^$' -bench Pass ./poller/`"+`
(BenchmarkPass, 1k and 10k batches).
Machine: %d CPUs (shared), %s, measured %s.
`, benchEnv, strings.Join(rows, "\n"), float64(rss[2])/float64(rss[0]), n, recent, recent/100, strings.Join(costRows, "\n"), runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04 MST"))
	if err := os.WriteFile("../testdata/gemini/BENCH-poll.md", []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPass runs passes over 1,000 listed batches (pages of 100, 10%
// terminal, no rate limit) in process: go test -run ^$ -bench Pass ./poller/
func BenchmarkPass(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			s := geminifake.New(geminifake.Options{APIKey: testKey, MaxPageSize: 100})
			s.Add(benchBatches(n)...)
			u, err := s.Start("")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			cfg := DefaultConfig()
			cfg.APIKey, cfg.BaseURL, cfg.Lookback = testKey, u, 0
			p, err := New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			var st PassStats
			for b.Loop() {
				st, err = p.PassWith(context.Background(), PassOptions{}, func([]Operation) error { return nil })
				if err != nil || st.Listed != n {
					b.Fatalf("%+v %v", st, err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "listed/s")
			b.ReportMetric(float64(st.Requests), "requests/pass")
		})
	}
}
