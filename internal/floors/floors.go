// Package floors measures the floors of issue 23 item 2 as a user meets
// them, each beside a raw 128-byte write + fdatasync loop on the same disk
// (internal/disksync) in the same run, and prints BENCHMARKS.md's table:
//
//  1. sequential new completions per raw sync: the sink's calls that serve
//     makes for a completion that comes alone (RecordAndClaim, Complete),
//     measured as the seed's script measures its own sink; beside them the
//     whole of serve's receiver in this process (HTTP, package ingest,
//     package dispatch and the effect around the same calls);
//  2. the same with 16 completions at once;
//  3. duplicate sightings of a done key and of a pending key through
//     Sink.Record (and, beside them, through ingest), against the seed
//     document's sink (../shared/bench) run on the same disk;
//  4. `gemrecon serve --forward URL --confirm never` as a child process:
//     a delivery's 2xx to its effect's start, deliveries one at a time;
//  5. one `gemrecon poll` pass, a child process, over 10,000 new
//     completions listed by the API stand-in (`gemrecon emulator`): its
//     peak RSS and completions per raw sync.
//
// Every measure runs Rounds times; the table gives the median and range.
// Its command is ./cmd (BENCHMARKS.md says how to run it).
package floors

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/internal/disksync"
)

// Config is one run's work.
type Config struct {
	// Dir holds the databases and the raw probe's file: the disk measured.
	Dir string
	// Gemrecon is measured as serve and poll, and serves the API stand-in
	// to poll (`gemrecon emulator`).
	Gemrecon string
	// Seed is ../shared/bench/seed000_sink.py, run with python3 on SeedN
	// keys ("": the seed's rows are not measured, nor floor 3's ratio).
	Seed  string
	SeedN int
	// Rounds is how often each measure runs.
	Rounds int
	// Sequential and Concurrent are the completions timed on the product
	// path, Senders the deliveries in flight for Concurrent; Duplicates the
	// duplicate sightings timed (and the seed's N), Deliveries serve's
	// deliveries, Batches the completions a poll pass finds.
	Sequential, Concurrent, Senders, Duplicates, Deliveries, Batches int
	// Gap is the time between deliveries to serve.
	Gap time.Duration
	// Probe is how long each raw sync probe runs.
	Probe time.Duration
	// Progress hears a line per measure (nil: none).
	Progress io.Writer
}

// figure is one row of the table in one round.
type figure struct {
	name, format string // the row's measure, and its value's format
	v            float64
	floor        string
	ok           func(float64) bool // whether a value meets floor (nil: no floor)
}

// Run runs every measure cfg.Rounds times and writes the table to w.
func Run(ctx context.Context, cfg Config, w io.Writer) error {
	start := time.Now()
	var rounds [][]figure
	var loads []string
	for i := range cfg.Rounds {
		loads = append(loads, loadAverage())
		r, err := cfg.round(ctx, i, loads[i])
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		rounds = append(rounds, r)
	}
	fmt.Fprintf(w, "Measured %s–%s UTC, %s/%s, %d CPUs, %s; %d rounds; load average (1 min) at each round's start: %s, at the end: %s. Cells: median [min–max] over the rounds.\n\n",
		start.UTC().Format("2006-01-02 15:04"), time.Now().UTC().Format("15:04"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(),
		len(rounds), strings.Join(loads, ", "), loadAverage())
	fmt.Fprintf(w, "| measure | value | floor | met (rounds) |\n|---|---:|---|---|\n")
	for j, f := range rounds[0] {
		s := make([]float64, len(rounds))
		met := 0
		for i, r := range rounds {
			if s[i] = r[j].v; f.ok != nil && f.ok(s[i]) {
				met++
			}
		}
		slices.Sort(s)
		median := s[len(s)/2]
		if len(s)%2 == 0 {
			median = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		value := fmt.Sprintf(f.format, median) // "median [min–max]", the median alone for one round
		if len(s) > 1 {
			value = fmt.Sprintf(f.format+" ["+f.format+"–"+f.format+"]", median, s[0], s[len(s)-1])
		}
		verdict := "" // met by the median, and in how many rounds
		if f.ok != nil {
			verdict = fmt.Sprintf("**no** (%d/%d)", met, len(s))
			if f.ok(median) {
				verdict = fmt.Sprintf("yes (%d/%d)", met, len(s))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f.name, value, f.floor, verdict)
	}
	return nil
}

func (c Config) progress(format string, a ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "floors: "+format+"\n", a...)
	}
}

// round runs every measure once; each raw rate is measured just before
// the measure it divides.
func (c Config) round(ctx context.Context, i int, load string) ([]figure, error) {
	dir, err := os.MkdirTemp(c.Dir, fmt.Sprintf("round%d-", i+1))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var fs []figure
	row := func(name string, v float64, format, floor string, ok func(float64) bool) {
		fs = append(fs, figure{name, format, v, floor, ok})
	}
	ge := func(f float64) func(float64) bool { return func(v float64) bool { return v >= f } }
	raw := func() (float64, error) {
		res, err := disksync.Probe{Bytes: 128}.Run(dir, c.Probe, 0)
		return res.Rate(), err
	}
	for _, p := range []struct {
		name, progress string
		n, senders     int
		floor          float64
	}{
		{fmt.Sprintf("1. sequential new completions (%d, one at a time)", c.Sequential), fmt.Sprintf("sequential completions (load %s)", load), c.Sequential, 1, 0.35},
		{fmt.Sprintf("2. new completions, %d at once (%d)", c.Senders, c.Concurrent), fmt.Sprintf("%d concurrent completions", c.Senders), c.Concurrent, c.Senders, 1.2},
	} {
		c.progress("round %d: %s", i+1, p.progress)
		rawRate, err := raw()
		if err != nil {
			return nil, err
		}
		sink, err := SinkPath(ctx, dir, p.n, p.senders)
		if err != nil {
			return nil, err
		}
		whole, err := ProductPath(ctx, dir, p.n, p.senders)
		if err != nil {
			return nil, err
		}
		row(p.name+": raw 128 B write + fdatasync just before, per second", rawRate, "%.0f", "", nil)
		row("  the sink's calls of serve's path (RecordAndClaim, Complete), per second", sink.Rate(), "%.0f", "", nil)
		row("  **completions per raw sync**", sink.Rate()/rawRate, "%.3f", fmt.Sprintf("≥ %.2f", p.floor), ge(p.floor))
		row("  commits per completion (`(*sqlite.Sink).Commits`)", sink.PerCompletion(), "%.2f", "", nil)
		row("  through serve's receiver (HTTP from a client in the same process, ingest, dispatch, NDJSON effect), per second", whole.Rate(), "%.0f", "", nil)
		row("  … per raw sync", whole.Rate()/rawRate, "%.3f", "", nil)
		row("  … commits per completion", whole.PerCompletion(), "%.2f", "", nil)
	}
	c.progress("round %d: duplicates and the seed's sink", i+1)
	var seedNew, seedDup float64
	if c.Seed != "" {
		if seedNew, seedDup, err = RunSeed(ctx, c.Seed, dir, c.SeedN); err != nil {
			return nil, err
		}
		row(fmt.Sprintf("seed's sink `new_per_s` (N = %d)", c.SeedN), seedNew, "%.0f", "", nil)
		row(fmt.Sprintf("seed's sink `dup_per_s` (N = %d)", c.SeedN), seedDup, "%.0f", "", nil)
	}
	sinkDups, err := DuplicateSightings(ctx, dir, c.Duplicates, false)
	if err != nil {
		return nil, err
	}
	dups, err := DuplicateSightings(ctx, dir, c.Duplicates, true)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		name         string
		sink, ingest float64
	}{{"done", sinkDups.Done, dups.Done}, {"pending", sinkDups.Pending, dups.Pending}} {
		row(fmt.Sprintf("3. duplicates of a %s key through Sink.Record, per second (%d, one at a time)", d.name, c.Duplicates), d.sink, "%.0f", "", nil)
		if c.Seed != "" {
			row("  **× the seed's `dup_per_s`**", d.sink/seedDup, "%.1f", "≥ 5", ge(5))
		}
		row("  through ingest (the webhook body parsed, then Record), per second", d.ingest, "%.0f", "", nil)
		if c.Seed != "" {
			row("  … × the seed's `dup_per_s`", d.ingest/seedDup, "%.1f", "", nil)
		}
	}
	c.progress("round %d: serve, %d deliveries %v apart", i+1, c.Deliveries, c.Gap)
	lat, err := ServeLatency(ctx, c.Gemrecon, dir, c.Deliveries, c.Gap)
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(quantile(lat, q)) / float64(time.Millisecond) }
	row(fmt.Sprintf("4. serve --forward --confirm never: 2xx → effect start, ms (%d deliveries %v apart), p50", c.Deliveries, c.Gap), ms(0.5), "%.2f", "", nil)
	row("  **p99**", ms(0.99), "%.2f", "≤ 5 ms", func(v float64) bool { return v <= 5 })
	row("  max", ms(1), "%.2f", "", nil)
	c.progress("round %d: a poll pass over %d completions", i+1, c.Batches)
	rawRate, err := raw()
	if err != nil {
		return nil, err
	}
	pass, err := PollPass(ctx, c.Gemrecon, dir, c.Batches)
	if err != nil {
		return nil, err
	}
	row(fmt.Sprintf("5. poll pass over %d new completions (NDJSON effect, --qps 0), wall s", c.Batches), pass.Elapsed.Seconds(), "%.1f", "", nil)
	row("  completions per second", pass.Rate(), "%.0f", "", nil)
	row("  raw 128 B write + fdatasync just before, per second", rawRate, "%.0f", "", nil)
	row("  **completions per raw sync**", pass.Rate()/rawRate, "%.3f", "≥ 0.2", ge(0.2))
	row("  **peak RSS, MiB** (the child's ru_maxrss)", float64(pass.MaxRSSKiB)/1024, "%.1f", "< 64", func(v float64) bool { return v < 64 })
	return fs, nil
}

var seedLine = regexp.MustCompile(`new_per_s=([0-9.]+) dup_per_s=([0-9.]+)`)

// RunSeed runs the seed document's sink (python3 script dir n): n new
// completions, then the same n again, all skipped.
func RunSeed(ctx context.Context, script, dir string, n int) (newPerS, dupPerS float64, err error) {
	out, err := exec.CommandContext(ctx, "python3", script, dir, strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("floors: %s: %v: %s", script, err, out)
	}
	m := seedLine.FindSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("floors: %s printed no new_per_s=… dup_per_s=…: %s", script, out)
	}
	newPerS, _ = strconv.ParseFloat(string(m[1]), 64)
	dupPerS, _ = strconv.ParseFloat(string(m[2]), 64)
	return newPerS, dupPerS, nil
}

// quantile is the q-quantile of sorted ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds)-1)+0.5))]
}

// loadAverage is /proc/loadavg's 1-minute figure ("?" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
