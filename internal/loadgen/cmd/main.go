// Command cmd is the serve benchmark: it measures the raw append+fdatasync
// rate of a directory, then runs a real webhook receiver (signature
// verification, canon, SQLite sink with group commit) on a file in that
// directory and drives it over loopback with signed duplicate deliveries and
// with new keys, and prints a Markdown table of requests/s and latency.
//
//	go run ./internal/loadgen/cmd -duration 5s -out testdata/webhook/BENCH-serve.md
package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/gemrecon/gemrecon/internal/disksync"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/webhook"
)

// benchSecret signs the benchmark's requests (it guards nothing).
const benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "serve-bench:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve-bench", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory for the database and the fsync probe (default: a temporary directory under the current one, so it is on the same disk as a real deployment, not tmpfs)")
	dur := fs.Duration("duration", 5*time.Second, "length of each load phase")
	syncDur := fs.Duration("sync-duration", 3*time.Second, "length of the raw fdatasync probe")
	dupWorkers := fs.Int("dup-workers", 4, "concurrent senders of duplicate deliveries")
	newWorkers := fs.Int("new-workers", 64, "concurrent senders of new keys (group commit needs concurrency)")
	out := fs.String("out", "", "also write the Markdown report to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		d, err := os.MkdirTemp(".", ".serve-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*dir = d
	}
	ctx := context.Background()
	loadBefore := loadAverage()

	raw, err := disksync.Rate(*dir, *syncDur, 0)
	if err != nil {
		return fmt.Errorf("fdatasync probe: %w", err)
	}

	s, err := sqlite.Open(ctx, *dir+"/bench.db", sink.Options{}, sqlite.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return err
	}
	defer s.Close()
	h, err := serve.Receiver(webhook.Config{Secrets: []string{benchSecret}}, s)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- webhook.Serve(sctx, ln, h, webhook.ServerOptions{}) }()
	url := "http://" + ln.Addr().String() + "/webhook"

	// Seed the duplicate's key, then warm up connections and caches.
	if _, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: benchSecret, Workers: 1, Count: 1, Body: loadgen.SameKey("dup")}); err != nil {
		return err
	}
	if _, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: benchSecret, Workers: *dupWorkers, Duration: 500 * time.Millisecond, Body: loadgen.SameKey("dup")}); err != nil {
		return err
	}
	dup, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: benchSecret, Workers: *dupWorkers, Duration: *dur, Body: loadgen.SameKey("dup")})
	if err != nil {
		return err
	}
	// A duplicate of a done key: the common case (redeliveries after the
	// effect ran; every poll pass re-seeing finished batches).
	if err := markDone(ctx, s, "gemini:batches/dup-done"); err != nil {
		return err
	}
	dupDone, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: benchSecret, Workers: *dupWorkers, Duration: *dur, Body: loadgen.SameKey("dup-done")})
	if err != nil {
		return err
	}
	fresh, err := loadgen.Run(ctx, loadgen.Config{URL: url, Secret: benchSecret, Workers: *newWorkers, Duration: *dur, Body: loadgen.NewKeys(fmt.Sprintf("new-%d", time.Now().UnixNano()))})
	if err != nil {
		return err
	}
	stop()
	if err := <-served; err != nil {
		return err
	}

	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s/%s, %d CPUs (GOMAXPROCS %d), %s; load average before the run %s (other work on the machine); directory %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), loadBefore, *dir)
	fmt.Fprintf(&b, "| workload | senders | requests | req/s | p50 | p99 | non-202 | goal | met |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---|---|\n")
	fmt.Fprintf(&b, "| raw append+fdatasync (same directory) | 1 | %d syncs | %.0f | | | | (reference) | |\n", raw.Syncs, raw.Rate())
	row := func(name string, workers int, r loadgen.Result, goal string, met bool) {
		non := r.TransportErrors
		for c, n := range r.ByStatus {
			if c != 202 {
				non += n
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s | %d | %s | %s |\n", name, workers, len(r.Latencies), r.Rate(),
			ms(r.Quantile(0.5)), ms(r.Quantile(0.99)), non, goal, yes(met))
	}
	row("duplicate deliveries of a pending key", *dupWorkers, dup, "≥ 5,000 req/s and p99 ≤ 10 ms",
		dup.Rate() >= 5000 && dup.Quantile(0.99) <= 10*time.Millisecond)
	row("duplicate deliveries of a done key", *dupWorkers, dupDone, "≥ 5,000 req/s and p99 ≤ 10 ms",
		dupDone.Rate() >= 5000 && dupDone.Quantile(0.99) <= 10*time.Millisecond)
	ratio := fresh.Rate() / raw.Rate()
	row(fmt.Sprintf("new keys (durable Record; %.2f × raw)", ratio), *newWorkers, fresh,
		fmt.Sprintf("≥ 0.8 × raw = %.0f req/s", 0.8*raw.Rate()), ratio >= 0.8)
	fmt.Fprint(stdout, b.String())
	if *out != "" {
		cmd := "go run ./internal/loadgen/cmd " + strings.Join(args, " ")
		doc := "# `gemrecon serve` throughput\n\nCommand (from the module root):\n\n    " + cmd + "\n\n" + b.String() +
			"\nThe load generator and the receiver share the machine's cores (loopback, one process). Every\n" +
			"request carries a Standard Webhooks signature that the receiver verifies. A new key is durable\n" +
			"(SQLite WAL, synchronous=FULL) before its 202; concurrent new keys share commits (group commit).\n" +
			"A duplicate is answered from the sink's cache and buffered statistics, without a disk sync.\n"
		if err := os.WriteFile(*out, []byte(doc), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// markDone records key and completes it through the sink, as a finished
// dispatch would.
func markDone(ctx context.Context, s sink.Sink, key string) error {
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
		return err
	}
	c, err := s.Claim(ctx, key, "serve-bench", time.Minute)
	if err != nil {
		return err
	}
	return s.Complete(ctx, key, c.Token)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
