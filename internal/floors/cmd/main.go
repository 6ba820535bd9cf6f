// Command cmd prints issue 23 item 2's floors as BENCHMARKS.md's table
// (package floors says what each measures). From the module root:
//
//	go run ./internal/floors/cmd                     # 3 rounds, the default sizes
//	go run ./internal/floors/cmd -rounds 5
//
// It builds ./cmd/gemrecon into a temporary directory unless -gemrecon
// names a binary.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gemrecon/gemrecon/internal/floors"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "floors:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("floors", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c floors.Config
	dir := fs.String("dir", ".", "make the run's temporary directory here: the disk measured (default: the current directory, on the repository's disk, not tmpfs)")
	fs.StringVar(&c.Gemrecon, "gemrecon", "", "the gemrecon binary to measure as serve and poll, and to run as the API stand-in (default: go build ./cmd/gemrecon of the module in the current directory)")
	fs.StringVar(&c.Seed, "seed", "../shared/bench/seed000_sink.py", "the seed document's sink, run with python3 (\"\": not run)")
	fs.IntVar(&c.SeedN, "seed-n", 2000, "the seed's N (new completions, then as many duplicates)")
	fs.IntVar(&c.Rounds, "rounds", 3, "how often each measure runs")
	fs.IntVar(&c.Sequential, "n", 500, "sequential completions timed")
	fs.IntVar(&c.Concurrent, "concurrent", 2000, "concurrent completions timed")
	fs.IntVar(&c.Senders, "senders", 16, "completions in flight at once for -concurrent")
	fs.IntVar(&c.Duplicates, "dups", 4000, "duplicate sightings timed of each kind")
	fs.IntVar(&c.Deliveries, "deliveries", 200, "deliveries sent to serve one at a time")
	fs.DurationVar(&c.Gap, "gap", 20*time.Millisecond, "time between deliveries to serve")
	fs.IntVar(&c.Batches, "batches", 10000, "completions the poll pass finds")
	fs.DurationVar(&c.Probe, "probe", time.Second, "length of each raw sync probe")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || c.Rounds < 1 {
		return fmt.Errorf("usage: floors [flags]; -rounds at least 1")
	}
	tmp, err := os.MkdirTemp(*dir, ".floors-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if c.Dir, err = filepath.Abs(tmp); err != nil {
		return err
	}
	if c.Gemrecon == "" {
		if c.Gemrecon, err = floors.Build(ctx, ".", c.Dir); err != nil {
			return err
		}
	}
	c.Progress = stderr
	return floors.Run(ctx, c, stdout)
}
