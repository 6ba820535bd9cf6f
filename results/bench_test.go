package results

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/testkit"
)

// benchEnv enables TestBenchResults (slow: it writes about 3 GiB).
const benchEnv = "GEMRECON_RESULTS_BENCH"

// benchResult is what one benchmark child prints.
type benchResult struct {
	Bytes    int64
	Seconds  float64
	VmHWMKiB int64
	Err      string
}

// benchChild runs one measured write in its own process, so that its peak
// RSS is that write's alone: Mode download fetches files/bench (Size bytes)
// from URL with Poller.Download into a results Dir; Mode raw writes the
// same bytes (geminifake.Content, Seed and Size) to a plain file in Dir
// through one 256 KiB buffer and fsyncs it: the disk's own rate for the
// same work, with the same fsync.
func benchChild(a childArgs) int {
	size, seed, dir := a.Size, a.Seed, a.Dir
	var res benchResult
	start := time.Now()
	switch a.Mode {
	case "raw":
		path := filepath.Join(dir, "raw.jsonl")
		f, err := os.Create(path)
		if err == nil {
			res.Bytes, err = io.CopyBuffer(f, geminifake.Content(seed, size), make([]byte, 256<<10))
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		res.Seconds = time.Since(start).Seconds()
		os.Remove(path)
		if err != nil {
			res.Err = err.Error()
		}
	case "download":
		d, err := Open(dir)
		var w Written
		if err == nil {
			p, perr := newPoller(a.URL)
			if err = perr; err == nil {
				w, err = d.Write(context.Background(), "bench", 1, download(p, "files/bench"))
			}
		}
		res.Seconds = time.Since(start).Seconds()
		res.Bytes = w.Size
		if err != nil {
			res.Err = err.Error()
		}
		os.Remove(w.Path)
	default:
		res.Err = "unknown MODE"
	}
	res.VmHWMKiB = testkit.PeakRSS()
	_ = json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// TestBenchResults measures a results download of a 1 MiB and a 512 MiB
// responses file — Poller.Download into Dir.Write against the stand-in
// over loopback — against the raw write rate of the same disk (the same
// bytes, one buffer, one fsync) in the same run, and the download
// process's peak RSS. Each measurement runs in its own child process (the
// stand-in serves from the parent), raw and download alternating. Run with
//
//	GEMRECON_RESULTS_BENCH=1 go test -count=1 -run TestBenchResults -v -timeout 30m ./results/
//
// (GEMRECON_RESULTS_BENCH_DIR picks the disk; default: the test's temporary
// directory. GEMRECON_RESULTS_BENCH_RUNS: runs per size, default 3.)
func TestBenchResults(t *testing.T) {
	if os.Getenv(benchEnv) == "" {
		t.Skip("a benchmark: set " + benchEnv + "=1")
	}
	s := geminifake.New(geminifake.Options{APIKey: testKey})
	if _, err := s.Start(""); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := t.TempDir()
	if d := os.Getenv("GEMRECON_RESULTS_BENCH_DIR"); d != "" {
		var err error
		if base, err = os.MkdirTemp(d, "results-bench-"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(base)
	}
	runs := 3
	if n, err := strconv.Atoi(os.Getenv("GEMRECON_RESULTS_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	child := func(mode string, size int64, dir string) benchResult {
		cmd := testkit.CommandJSON(t, "results-bench", childArgs{Mode: mode, Dir: dir, URL: s.URL(), Size: size, Seed: 3})
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		var r benchResult
		if err != nil || json.Unmarshal(out, &r) != nil || r.Err != "" || r.Bytes != size {
			t.Fatalf("%s %d: %v %s %+v", mode, size, err, out, r)
		}
		return r
	}
	type row struct {
		size                 int64
		raw, dl              []float64 // seconds
		rssDownload, rssRaw  []int64
		dlMedian, rawMedian  float64
		rssMaxDL, rssMaxRaw  int64
		throughput, rawMiBps float64
		genMiBps             float64 // the stand-in's content generator alone
	}
	var rows []row
	for _, size := range []int64{1 << 20, 512 << 20} {
		s.AddFile(geminifake.File{Name: "files/bench", Size: size, Seed: 3})
		r := row{size: size}
		genStart := time.Now()
		if _, err := io.CopyBuffer(io.Discard, geminifake.Content(3, size), make([]byte, 256<<10)); err != nil {
			t.Fatal(err)
		}
		r.genMiBps = float64(size) / (1 << 20) / time.Since(genStart).Seconds()
		for i := range runs {
			dir := filepath.Join(base, fmt.Sprintf("%d-%d", size, i))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			raw := child("raw", size, dir)
			dl := child("download", size, dir)
			r.raw, r.dl = append(r.raw, raw.Seconds), append(r.dl, dl.Seconds)
			r.rssRaw, r.rssDownload = append(r.rssRaw, raw.VmHWMKiB), append(r.rssDownload, dl.VmHWMKiB)
			t.Logf("size %d run %d: raw %.3fs, download %.3fs, RSS raw %d KiB, download %d KiB",
				size, i, raw.Seconds, dl.Seconds, raw.VmHWMKiB, dl.VmHWMKiB)
		}
		r.dlMedian, r.rawMedian = median(r.dl), median(r.raw)
		r.rssMaxDL, r.rssMaxRaw = slices.Max(r.rssDownload), slices.Max(r.rssRaw)
		r.throughput = float64(size) / (1 << 20) / r.dlMedian
		r.rawMiBps = float64(size) / (1 << 20) / r.rawMedian
		rows = append(rows, r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| file | download + write (median of %d) | raw write + fsync (median) | download / raw | peak RSS, download | peak RSS, raw | stand-in's generator alone |\n", runs)
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %.3f s (%.0f MiB/s) | %.3f s (%.0f MiB/s) | %.2f | %.1f MiB | %.1f MiB | %.0f MiB/s |\n",
			sizeName(r.size), r.dlMedian, r.throughput, r.rawMedian, r.rawMiBps, r.throughput/r.rawMiBps,
			float64(r.rssMaxDL)/1024, float64(r.rssMaxRaw)/1024, r.genMiBps)
	}
	growth := float64(rows[1].rssMaxDL) / float64(rows[0].rssMaxDL)
	fmt.Fprintf(&b, "\nPeak RSS of the download process, 1 MiB → 512 MiB: ×%.2f.\n", growth)
	fmt.Fprintf(&b, "Machine: %d CPUs, %s, measured %s.\n", runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	t.Log("\n" + b.String())
	fmt.Println(b.String())
	if growth > 2 {
		t.Errorf("peak RSS grew ×%.2f from 1 MiB to 512 MiB, want within 2×", growth)
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func sizeName(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
