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

// Round is one run of every measure. Raw rates are each measured just
// before the measure they divide.
type Round struct {
	Load                     string // /proc/loadavg's 1-minute figure at its start
	SeqRaw, ConcRaw, PollRaw float64
	Sequential, Concurrent   Completions // through serve's receiver
	SinkSeq, SinkConc        Completions // the sink's calls of that path
	SeedNew, SeedDup         float64
	Dups, SinkDups           Duplicates // through ingest; through Sink.Record
	Serve                    []time.Duration
	Poll                     Pass
}

// Report is a run's rounds.
type Report struct {
	Config     Config
	Start, End time.Time
	Rounds     []Round
}

// Run runs every measure cfg.Rounds times.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	rep := &Report{Config: cfg, Start: time.Now()}
	for i := range cfg.Rounds {
		r, err := cfg.round(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", i+1, err)
		}
		rep.Rounds = append(rep.Rounds, r)
	}
	rep.End = time.Now()
	return rep, nil
}

func (c Config) progress(format string, a ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "floors: "+format+"\n", a...)
	}
}

func (c Config) round(ctx context.Context, i int) (Round, error) {
	dir, err := os.MkdirTemp(c.Dir, fmt.Sprintf("round%d-", i+1))
	if err != nil {
		return Round{}, err
	}
	defer os.RemoveAll(dir)
	r := Round{Load: loadAverage()}
	raw := func(into *float64) error {
		res, err := disksync.Probe{Bytes: 128}.Run(dir, c.Probe, 0)
		*into = res.Rate()
		return err
	}
	c.progress("round %d: sequential completions (load %s)", i+1, r.Load)
	if err := raw(&r.SeqRaw); err != nil {
		return r, err
	}
	if r.SinkSeq, err = SinkPath(ctx, dir, c.Sequential, 1); err != nil {
		return r, err
	}
	if r.Sequential, err = ProductPath(ctx, dir, c.Sequential, 1); err != nil {
		return r, err
	}
	c.progress("round %d: %d concurrent completions", i+1, c.Senders)
	if err := raw(&r.ConcRaw); err != nil {
		return r, err
	}
	if r.SinkConc, err = SinkPath(ctx, dir, c.Concurrent, c.Senders); err != nil {
		return r, err
	}
	if r.Concurrent, err = ProductPath(ctx, dir, c.Concurrent, c.Senders); err != nil {
		return r, err
	}
	c.progress("round %d: duplicates and the seed's sink", i+1)
	if c.Seed != "" {
		if r.SeedNew, r.SeedDup, err = RunSeed(ctx, c.Seed, dir, c.SeedN); err != nil {
			return r, err
		}
	}
	if r.SinkDups, err = DuplicateSightings(ctx, dir, c.Duplicates, false); err != nil {
		return r, err
	}
	if r.Dups, err = DuplicateSightings(ctx, dir, c.Duplicates, true); err != nil {
		return r, err
	}
	c.progress("round %d: serve, %d deliveries %v apart", i+1, c.Deliveries, c.Gap)
	if r.Serve, err = ServeLatency(ctx, c.Gemrecon, dir, c.Deliveries, c.Gap); err != nil {
		return r, err
	}
	slices.Sort(r.Serve)
	c.progress("round %d: a poll pass over %d completions", i+1, c.Batches)
	if err := raw(&r.PollRaw); err != nil {
		return r, err
	}
	r.Poll, err = PollPass(ctx, c.Gemrecon, dir, c.Batches)
	return r, err
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

// series is one quantity over the rounds.
type series []float64

func (s series) sorted() []float64 { c := slices.Clone(s); slices.Sort(c); return c }

func (s series) median() float64 {
	c := s.sorted()
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// cell is "median [min–max]" (the median alone for one round).
func (s series) cell(format string) string {
	c := s.sorted()
	if len(c) == 1 {
		return fmt.Sprintf(format, c[0])
	}
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", s.median(), c[0], c[len(c)-1])
}

func (rep *Report) of(f func(Round) float64) series {
	s := make(series, len(rep.Rounds))
	for i, r := range rep.Rounds {
		s[i] = f(r)
	}
	return s
}

// Markdown writes the table.
func (rep *Report) Markdown(w io.Writer) {
	c := rep.Config
	loads := make([]string, len(rep.Rounds))
	for i, r := range rep.Rounds {
		loads[i] = r.Load
	}
	fmt.Fprintf(w, "Measured %s–%s UTC, %s/%s, %d CPUs, %s; %d rounds; load average (1 min) at each round's start: %s, at the end: %s. Cells: median [min–max] over the rounds.\n\n",
		rep.Start.UTC().Format("2006-01-02 15:04"), rep.End.UTC().Format("15:04"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(),
		len(rep.Rounds), strings.Join(loads, ", "), loadAverage())
	fmt.Fprintf(w, "| measure | value | floor | met (rounds) |\n|---|---:|---|---|\n")
	row := func(name string, s series, format, floor string, ok func(float64) bool) {
		met := ""
		if ok != nil {
			n := 0
			for _, v := range s {
				if ok(v) {
					n++
				}
			}
			met = fmt.Sprintf("%s (%d/%d)", yes(ok(s.median())), n, len(s))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", name, s.cell(format), floor, met)
	}
	ge := func(f float64) func(float64) bool { return func(v float64) bool { return v >= f } }
	for _, p := range []struct {
		name        string
		sink, whole func(Round) Completions
		raw         func(Round) float64
		floor       float64
	}{
		{fmt.Sprintf("1. sequential new completions (%d, one at a time)", c.Sequential),
			func(r Round) Completions { return r.SinkSeq }, func(r Round) Completions { return r.Sequential },
			func(r Round) float64 { return r.SeqRaw }, 0.35},
		{fmt.Sprintf("2. new completions, %d at once (%d)", c.Senders, c.Concurrent),
			func(r Round) Completions { return r.SinkConc }, func(r Round) Completions { return r.Concurrent },
			func(r Round) float64 { return r.ConcRaw }, 1.2},
	} {
		row(p.name+": raw 128 B write + fdatasync just before, per second", rep.of(p.raw), "%.0f", "", nil)
		row("  the sink's calls of serve's path (RecordAndClaim, Complete), per second", rep.of(func(r Round) float64 { return p.sink(r).Rate() }), "%.0f", "", nil)
		row("  **completions per raw sync**", rep.of(func(r Round) float64 { return p.sink(r).Rate() / p.raw(r) }), "%.3f", fmt.Sprintf("≥ %.2f", p.floor), ge(p.floor))
		row("  commits per completion (`(*sqlite.Sink).Commits`)", rep.of(func(r Round) float64 { return p.sink(r).PerCompletion() }), "%.2f", "", nil)
		row("  through serve's receiver (HTTP from a client in the same process, ingest, dispatch, NDJSON effect), per second", rep.of(func(r Round) float64 { return p.whole(r).Rate() }), "%.0f", "", nil)
		row("  … per raw sync", rep.of(func(r Round) float64 { return p.whole(r).Rate() / p.raw(r) }), "%.3f", "", nil)
		row("  … commits per completion", rep.of(func(r Round) float64 { return p.whole(r).PerCompletion() }), "%.2f", "", nil)
	}
	if c.Seed != "" {
		row(fmt.Sprintf("seed's sink `new_per_s` (N = %d)", c.SeedN), rep.of(func(r Round) float64 { return r.SeedNew }), "%.0f", "", nil)
		row(fmt.Sprintf("seed's sink `dup_per_s` (N = %d)", c.SeedN), rep.of(func(r Round) float64 { return r.SeedDup }), "%.0f", "", nil)
	}
	for _, d := range []struct {
		name         string
		sink, ingest func(Round) float64
	}{{"done", func(r Round) float64 { return r.SinkDups.Done }, func(r Round) float64 { return r.Dups.Done }},
		{"pending", func(r Round) float64 { return r.SinkDups.Pending }, func(r Round) float64 { return r.Dups.Pending }}} {
		row(fmt.Sprintf("3. duplicates of a %s key through Sink.Record, per second (%d, one at a time)", d.name, c.Duplicates), rep.of(d.sink), "%.0f", "", nil)
		if c.Seed != "" {
			row("  **× the seed's `dup_per_s`**", rep.of(func(r Round) float64 { return d.sink(r) / r.SeedDup }), "%.1f", "≥ 5", ge(5))
		}
		row("  through ingest (the webhook body parsed, then Record), per second", rep.of(d.ingest), "%.0f", "", nil)
		if c.Seed != "" {
			row("  … × the seed's `dup_per_s`", rep.of(func(r Round) float64 { return d.ingest(r) / r.SeedDup }), "%.1f", "", nil)
		}
	}
	ms := func(q float64) series {
		return rep.of(func(r Round) float64 { return float64(quantile(r.Serve, q)) / float64(time.Millisecond) })
	}
	name := fmt.Sprintf("4. serve --forward --confirm never: 2xx → effect start, ms (%d deliveries %v apart)", c.Deliveries, c.Gap)
	row(name+", p50", ms(0.5), "%.2f", "", nil)
	row("  **p99**", ms(0.99), "%.2f", "≤ 5 ms", func(v float64) bool { return v <= 5 })
	row("  max", ms(1), "%.2f", "", nil)
	row(fmt.Sprintf("5. poll pass over %d new completions (NDJSON effect, --qps 0), wall s", c.Batches), rep.of(func(r Round) float64 { return r.Poll.Elapsed.Seconds() }), "%.1f", "", nil)
	row("  completions per second", rep.of(func(r Round) float64 { return r.Poll.Rate() }), "%.0f", "", nil)
	row("  raw 128 B write + fdatasync just before, per second", rep.of(func(r Round) float64 { return r.PollRaw }), "%.0f", "", nil)
	row("  **completions per raw sync**", rep.of(func(r Round) float64 { return r.Poll.Rate() / r.PollRaw }), "%.3f", "≥ 0.2", ge(0.2))
	row("  **peak RSS, MiB** (the child's ru_maxrss)", rep.of(func(r Round) float64 { return float64(r.Poll.MaxRSSKiB) / 1024 }), "%.1f", "< 64", func(v float64) bool { return v < 64 })
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// loadAverage is /proc/loadavg's 1-minute figure ("?" where unknown).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
