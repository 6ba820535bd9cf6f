// Command cmd prints issue 17's table: what a new completion costs on the
// SQLite sink (WAL frames by table and index, WAL bytes and fdatasyncs per
// commit), the sequential new-completion and duplicate rates of gemrecon's
// sinks against the seed document's own sink (../shared/bench/seed000_sink.py,
// run in the same run on the same disk), and the raw disk probes: append
// 128 bytes, append and overwrite as many bytes as a commit appends, each
// followed by fdatasync. Rates are the median of -runs runs [min–max];
// ratios are the median of the per-run ratios. Each run also times every
// step (the RecordAndClaim commit, the Complete commit) and every probe
// sync one by one, and compares their medians: a typical completion against
// two typical syncs, which the device's occasional slow syncs do not move.
//
//	go run ./internal/commitcost/cmd            # from the module root
//	GEMRECON_TEST_POSTGRES=postgres://… go run ./internal/commitcost/cmd   # PostgreSQL too
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/internal/commitcost"
	"github.com/gemrecon/gemrecon/internal/disksync"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "commitcost:", err)
		os.Exit(1)
	}
}

type config struct {
	dir, seed, pg string
	n, dupN, runs int
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("commitcost", flag.ContinueOnError)
	var c config
	fs.StringVar(&c.dir, "dir", "", "directory for the databases and the probes (default: a temporary directory under the current one, on the same disk as the repository)")
	fs.StringVar(&c.seed, "seed", "../shared/bench/seed000_sink.py", "the seed's sink script")
	fs.StringVar(&c.pg, "postgres", os.Getenv("GEMRECON_TEST_POSTGRES"), "PostgreSQL DSN (default $GEMRECON_TEST_POSTGRES; empty: SQLite only)")
	fs.IntVar(&c.n, "n", 2000, "new completions per run (the seed script's N too)")
	fs.IntVar(&c.dupN, "dup-n", 20000, "duplicate Records per run")
	fs.IntVar(&c.runs, "runs", 3, "runs (medians are taken over them)")
	mode := fs.String("mode", "", "internal: 'syncs' runs -n new completions on a fresh SQLite file in -dir and exits (counted under strace)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.dir == "" {
		d, err := os.MkdirTemp(".", ".commitcost-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		c.dir = d
	}
	ctx := context.Background()
	if *mode == "syncs" {
		s, err := openSQLite(ctx, c.dir, "syncs")
		if err != nil {
			return err
		}
		if _, err := commitcost.NewCompletions(ctx, s, c.n, "s", nil); err != nil {
			return err
		}
		return s.Close()
	}
	if _, err := os.Stat(c.seed); err != nil {
		return fmt.Errorf("the seed's sink script: %w (-seed)", err)
	}
	return report(ctx, c, stdout)
}

func openSQLite(ctx context.Context, dir, name string) (*sqlite.Sink, error) {
	d, err := os.MkdirTemp(dir, name+"-")
	if err != nil {
		return nil, err
	}
	return sqlite.Open(ctx, filepath.Join(d, "sink.db"), sink.Options{}, sqlite.WithLogger(slog.New(slog.DiscardHandler)))
}

// pgSink opens a PostgreSQL sink in a fresh schema; drop removes it.
func pgSink(ctx context.Context, dsn string) (s *postgres.Sink, drop func(), err error) {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "gemrecon_cc_" + hex.EncodeToString(b)
	s, err = postgres.Open(ctx, dsn, sink.Options{}, postgres.WithSchema(schema), postgres.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, nil, err
	}
	return s, func() {
		s.Close()
		if c, err := pgx.Connect(ctx, dsn); err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			c.Close(ctx)
		}
	}, nil
}

// sample is one quantity over the runs.
type sample []float64

func (s sample) median() float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	c := append(sample(nil), s...)
	sort.Float64s(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

func (s sample) cell(format string) string {
	if len(s) == 0 {
		return "—"
	}
	c := append(sample(nil), s...)
	sort.Float64s(c)
	if len(c) == 1 {
		return fmt.Sprintf(format, c[0])
	}
	return fmt.Sprintf(format+" ["+format+"–"+format+"]", s.median(), c[0], c[len(c)-1])
}

func perSecond(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func report(ctx context.Context, c config, out io.Writer) error {
	start := time.Now().UTC()
	load := loadAverage()

	// 1. What one completion's commits write (once: it does not depend on the disk's speed).
	acct, err := account(ctx, c)
	if err != nil {
		return fmt.Errorf("accounting: %w", err)
	}
	equal := int(math.Round(acct.bytesPerCommit))

	// 2. fdatasyncs per completion, counted by strace (when it exists).
	syncs, syncErr := countSyncs(ctx, c)

	// 3. The timed runs, interleaved so that each run's numbers share the disk's conditions.
	q := map[string]sample{}
	add := func(k string, v float64) { q[k] = append(q[k], v) }
	for r := range c.runs {
		dir, err := os.MkdirTemp(c.dir, fmt.Sprintf("run%d-", r))
		if err != nil {
			return err
		}
		seed, err := commitcost.RunSeed(ctx, c.seed, dir, c.n)
		if err != nil {
			return err
		}
		add("seed new", seed.NewPerS)
		add("seed dup", seed.DupPerS)

		s, err := openSQLite(ctx, dir, "new")
		if err != nil {
			return err
		}
		// Each step's time, from the end of the step before (one clock
		// read per step, inside the timed run).
		steps := map[string][]time.Duration{}
		last := time.Now()
		d, err := commitcost.NewCompletions(ctx, s, c.n, "r", func(step string) error {
			now := time.Now()
			steps[step] = append(steps[step], now.Sub(last))
			last = now
			return nil
		})
		s.Close()
		if err != nil {
			return err
		}
		add("sqlite new", perSecond(c.n, d))
		for _, step := range []string{commitcost.StepRecordClaim, commitcost.StepComplete} {
			add("p50 "+step, micros(disksync.Median(steps[step])))
		}
		for _, done := range []bool{false, true} {
			s, err := openSQLite(ctx, dir, "dup")
			if err != nil {
				return err
			}
			d, err := commitcost.Duplicates(ctx, s, 1000, c.dupN, done)
			s.Close()
			if err != nil {
				return err
			}
			add(fmt.Sprintf("sqlite dup done=%v", done), perSecond(c.dupN, d))
		}
		for _, p := range probes(equal) {
			res, err := p.Run(dir, 0, 1000)
			if err != nil {
				return err
			}
			add(p.String(), res.Rate())
			add("p50 "+p.String(), micros(res.Median()))
		}
		if c.pg != "" {
			s, drop, err := pgSink(ctx, c.pg)
			if err != nil {
				return err
			}
			d, err := commitcost.NewCompletions(ctx, s, c.n, "r", nil)
			if err == nil {
				add("pg new", perSecond(c.n, d))
				d, err = commitcost.Duplicates(ctx, s, 1000, c.dupN/10, false)
				add("pg dup done=false", perSecond(c.dupN/10, d))
			}
			drop()
			if err != nil {
				return err
			}
		}
		raw := q[probes(equal)[0].String()]
		add("new/seed", q["sqlite new"][r]/q["seed new"][r])
		add("dup/seed", q["sqlite dup done=false"][r]/q["seed dup"][r])
		add("new/raw128", q["sqlite new"][r]/raw[r])
		add("new/rawEqual", q["sqlite new"][r]/q[probes(equal)[1].String()][r])
		add("new/overwriteEqual", q["sqlite new"][r]/q[probes(equal)[2].String()][r])
		// Two commits a completion: at most half the overwrite syncs.
		add("new/ceiling", q["sqlite new"][r]/(q[probes(equal)[2].String()][r]/2))
		// The same at the median, where the device's slow syncs weigh
		// nothing: a typical completion's two commits against two typical
		// overwrite syncs, and the time between (CPU, locks, writes).
		ow := q["p50 "+probes(equal)[2].String()][r]
		rc, cp := q["p50 "+commitcost.StepRecordClaim][r], q["p50 "+commitcost.StepComplete][r]
		add("p50 over", rc+cp-2*ow)
		add("p50 ratio", (rc+cp)/(2*ow))
		if c.pg != "" {
			add("pg new/seed", q["pg new"][len(q["pg new"])-1]/q["seed new"][r])
			add("pg dup/seed", q["pg dup done=false"][len(q["pg dup done=false"])-1]/q["seed dup"][r])
		}
		os.RemoveAll(dir)
	}
	var pgAcct *pgAccounting
	if c.pg != "" {
		if pgAcct, err = accountPG(ctx, c); err != nil {
			return fmt.Errorf("PostgreSQL accounting: %w", err)
		}
	}
	end := time.Now().UTC()

	w := func(format string, a ...any) { fmt.Fprintf(out, format, a...) }
	w("Run %s–%s UTC (%s), load average %s → %s, N = %d new completions per run (seed script and gemrecon), %d duplicate Records, %d runs; cells: median [min–max].\n\n",
		start.Format("2006-01-02 15:04:05"), end.Format("15:04:05"), end.Sub(start).Round(time.Second), load, loadAverage(), c.n, c.dupN, c.runs)
	w("| quantity | value |\n| --- | ---: |\n")
	w("| seed sink `new_per_s` | %s |\n", q["seed new"].cell("%.0f"))
	w("| SQLite sink, sequential new completions/s (RecordAndClaim → Complete) | %s |\n", q["sqlite new"].cell("%.0f"))
	w("| **new completions: SQLite ÷ seed** (target ≥ 5) | **%s** |\n", q["new/seed"].cell("%.2f"))
	w("| seed sink `dup_per_s` | %s |\n", q["seed dup"].cell("%.0f"))
	w("| SQLite sink, pending-key duplicates/s (Record, 1 goroutine) | %s |\n", q["sqlite dup done=false"].cell("%.0f"))
	w("| **pending-key duplicates: SQLite ÷ seed** (target ≥ 20) | **%s** |\n", q["dup/seed"].cell("%.1f"))
	w("| SQLite sink, done-key duplicates/s | %s |\n", q["sqlite dup done=true"].cell("%.0f"))
	for i, p := range probes(equal) {
		w("| raw: %s, syncs/s | %s |\n", p, q[p.String()].cell("%.0f"))
		key := []string{"new/raw128", "new/rawEqual", "new/overwriteEqual"}[i]
		w("| completions per raw sync (%s)%s | %s |\n", p, map[int]string{0: " (≥ 0.4 wanted)"}[i], q[key].cell("%.3f"))
	}
	w("| **new completions ÷ the two-sync ceiling** (overwrite syncs/s ÷ 2: what two commits of a completion allow on this disk; a disk-relative measure) | **%s** |\n", q["new/ceiling"].cell("%.2f"))
	ow := "p50 " + probes(equal)[2].String()
	w("| median time of one step (µs): `RecordAndClaim` commit · `Complete` commit · one raw overwrite of %d B + fdatasync | %s · %s · %s |\n",
		equal, q["p50 "+commitcost.StepRecordClaim].cell("%.0f"), q["p50 "+commitcost.StepComplete].cell("%.0f"), q[ow].cell("%.0f"))
	w("| median completion (the two steps' medians) ÷ two median overwrite syncs · what is left above the two syncs, µs (CPU, locks, writes between the syncs) | %s · %s |\n",
		q["p50 ratio"].cell("%.2f"), q["p50 over"].cell("%.0f"))
	if c.pg != "" {
		w("| PostgreSQL sink, sequential new completions/s | %s |\n", q["pg new"].cell("%.0f"))
		w("| new completions: PostgreSQL ÷ seed | %s |\n", q["pg new/seed"].cell("%.2f"))
		w("| PostgreSQL sink, pending-key duplicates/s (%d per run) | %s |\n", c.dupN/10, q["pg dup done=false"].cell("%.0f"))
		w("| pending-key duplicates: PostgreSQL ÷ seed | %s |\n", q["pg dup/seed"].cell("%.1f"))
	}
	w("\nWhat one SQLite completion's commits write (%d completions, page size %d B, one WAL frame = %d B):\n\n", c.n, acct.pageSize, acct.frameBytes)
	w("| commit | commits | WAL frames (pages) per commit | WAL bytes per commit | pages per commit by table / index |\n| --- | ---: | ---: | ---: | --- |\n")
	for _, step := range []string{commitcost.StepRecordClaim, commitcost.StepComplete} {
		t := acct.tallies[step]
		w("| %s | %d | %.2f | %.0f | %s |\n", step, t.Commits, t.PerCommit(), t.PerCommit()*float64(acct.frameBytes), commitcost.FormatShares(t.ByBtree(acct.btrees)))
	}
	w("\nWAL restarts after a checkpoint: %d in %d completions (%.2f per 1,000). ", acct.restarts, c.n, 1000*float64(acct.restarts)/float64(c.n))
	if syncErr != nil {
		w("fdatasyncs per completion: not counted (%v).\n", syncErr)
	} else {
		w("fdatasyncs per completion, counted by `strace -f -c -e trace=fdatasync,fsync` over %d completions (open and close subtracted): %.3f fdatasync, %.3f fsync.\n",
			c.n, syncs["fdatasync"], syncs["fsync"])
	}
	if pgAcct != nil {
		w("\nPostgreSQL, the same %d sequential completions (server-wide counters, so other sessions' work on the server is included; a lower bound is the minimum of repeated runs):\n\n", c.n)
		w("| quantity | per completion | per commit |\n| --- | ---: | ---: |\n")
		w("| commits (`pg_stat_database.xact_commit`) | %.2f | 1 |\n", pgAcct.commits/float64(c.n))
		w("| WAL bytes (`pg_current_wal_lsn()` difference) | %.0f | %.0f |\n", pgAcct.walBytes/float64(c.n), pgAcct.walBytes/math.Max(pgAcct.commits, 1))
		w("| WAL records (`pg_stat_wal.wal_records`) | %.1f | %.1f |\n", pgAcct.walRecords/float64(c.n), pgAcct.walRecords/math.Max(pgAcct.commits, 1))
		w("| WAL syncs (`pg_stat_wal.wal_sync`) | %.2f | %.2f |\n", pgAcct.walSyncs/float64(c.n), pgAcct.walSyncs/math.Max(pgAcct.commits, 1))
	}
	return nil
}

// probes are the raw disk probes: append 128 B, append and overwrite as
// many bytes as a commit appends.
func probes(equal int) []disksync.Probe {
	return []disksync.Probe{{Bytes: 128}, {Bytes: equal}, {Bytes: equal, Overwrite: true}}
}

type accounting struct {
	tallies        map[string]*commitcost.Tally
	btrees         map[uint32]string
	restarts       int
	pageSize       int64
	frameBytes     int64
	bytesPerCommit float64
}

// account runs c.n completions on a fresh SQLite file, reading the WAL
// frames after each step.
func account(ctx context.Context, c config) (*accounting, error) {
	s, err := openSQLite(ctx, c.dir, "acct")
	if err != nil {
		return nil, err
	}
	defer s.Close()
	w, err := commitcost.OpenWAL(s.Path())
	if err != nil {
		return nil, err
	}
	a := &accounting{tallies: map[string]*commitcost.Tally{commitcost.StepRecordClaim: {}, commitcost.StepComplete: {}}}
	if _, err := commitcost.NewCompletions(ctx, s, c.n, "a", func(step string) error {
		fs, err := w.Read()
		a.tallies[step].Add(fs)
		return err
	}); err != nil {
		return nil, err
	}
	if a.btrees, err = commitcost.Btrees(s.Path()); err != nil {
		return nil, err
	}
	a.restarts, a.pageSize, a.frameBytes = w.Restarts(), w.PageSize(), w.FrameBytes()
	var frames, commits int
	for _, t := range a.tallies {
		frames += t.Frames
		commits += t.Commits
	}
	a.bytesPerCommit = float64(frames) * float64(a.frameBytes) / float64(max(commits, 1))
	return a, nil
}

// countSyncs counts fdatasync and fsync calls per completion under strace.
func countSyncs(ctx context.Context, c config) (map[string]float64, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	count := func(n int) (map[string]int, error) {
		return commitcost.CountSyncs(ctx, []string{self, "-mode", "syncs", "-dir", c.dir, "-n", fmt.Sprint(n)})
	}
	base, err := count(0)
	if err != nil {
		return nil, err
	}
	full, err := count(c.n)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for k := range full {
		out[k] = float64(full[k]-base[k]) / float64(c.n)
	}
	return out, nil
}

type pgAccounting struct {
	commits, walBytes, walRecords, walSyncs float64
}

// accountPG runs c.n completions on a fresh schema and reads the server's
// counters before and after.
func accountPG(ctx context.Context, c config) (*pgAccounting, error) {
	conn, err := pgx.Connect(ctx, c.pg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	read := func() (commits, lsn, records, syncs float64, err error) {
		time.Sleep(1500 * time.Millisecond) // backends report their statistics when idle (at most every second)
		if _, err = conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			return
		}
		err = conn.QueryRow(ctx, `SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())::float8,
			(pg_current_wal_lsn() - '0/0')::float8, wal_records::float8, wal_sync::float8 FROM pg_stat_wal`).Scan(&commits, &lsn, &records, &syncs)
		return
	}
	s, drop, err := pgSink(ctx, c.pg)
	if err != nil {
		return nil, err
	}
	c0, l0, r0, s0, err := read()
	if err != nil {
		drop()
		return nil, err
	}
	_, err = commitcost.NewCompletions(ctx, s, c.n, "a", nil)
	drop() // closing ends the sink's sessions, which report their statistics
	if err != nil {
		return nil, err
	}
	c1, l1, r1, s1, err := read()
	if err != nil {
		return nil, err
	}
	// The drop itself commits once and writes WAL; not subtracted (small against N).
	return &pgAccounting{commits: c1 - c0, walBytes: l1 - l0, walRecords: r1 - r0, walSyncs: s1 - s0}, nil
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
