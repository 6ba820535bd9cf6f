package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/internal/floors"
)

// TestTinyRun runs every measure once at a tiny size, against a gemrecon
// built from this module, and checks that the table has every row with a
// figure (never the figures' size: they depend on the machine).
func TestTinyRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gemrecon and runs it as serve, poll and emulator")
	}
	ctx := context.Background()
	bin, err := floors.Build(ctx, "../../..", binDir(t))
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := filepath.Abs("../../../../shared/bench/seed000_sink.py")
	if _, err := os.Stat(seed); err != nil {
		t.Logf("no seed script (%v): its rows are left out", err)
		seed = ""
	}
	args := []string{"-dir", t.TempDir(), "-gemrecon", bin, "-seed", seed, "-seed-n", "20", "-rounds", "2",
		"-n", "3", "-concurrent", "20", "-senders", "4", "-dups", "30", "-deliveries", "3", "-gap", "1ms",
		"-batches", "120", "-probe", "20ms"}
	var out, progress bytes.Buffer
	if err := run(ctx, args, &out, &progress); err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	table := out.String()
	rows := []string{
		"1. sequential new completions (3, one at a time): raw 128 B write + fdatasync just before, per second",
		"2. new completions, 4 at once (20): raw 128 B write + fdatasync just before, per second",
		"the sink's calls of serve's path (RecordAndClaim, Complete), per second",
		"through serve's receiver (HTTP from a client in the same process, ingest, dispatch, NDJSON effect), per second",
		"3. duplicates of a done key through Sink.Record, per second (30, one at a time)",
		"3. duplicates of a pending key through Sink.Record, per second (30, one at a time)",
		"through ingest (the webhook body parsed, then Record), per second",
		"4. serve --forward --confirm never: 2xx → effect start, ms (3 deliveries 1ms apart), p50",
		"**p99**", "max",
		"5. poll pass over 120 new completions (NDJSON effect, --qps 0), wall s",
		"**completions per raw sync**", "**peak RSS, MiB**", "commits per completion",
	}
	if seed != "" {
		rows = append(rows, "seed's sink `new_per_s` (N = 20)", "seed's sink `dup_per_s` (N = 20)", "**× the seed's `dup_per_s`**")
	}
	for _, r := range rows {
		if !strings.Contains(table, "| "+r) && !strings.Contains(table, "|   "+r) {
			t.Errorf("no row %q in:\n%s", r, table)
		}
	}
	// Every row has a figure: median [min–max] over the two rounds.
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| measure") {
			continue
		}
		if cells := strings.Split(line, "|"); len(cells) != 6 || !strings.Contains(cells[2], "[") || strings.Contains(cells[2], "NaN") {
			t.Errorf("row without a median and range: %s", line)
		}
		// The pass's peak RSS was read.
		if strings.Contains(line, "**peak RSS, MiB**") && strings.HasPrefix(strings.TrimSpace(strings.Split(line, "|")[2]), "0.0 ") {
			t.Errorf("no peak RSS: %s", line)
		}
	}
}

// binDir is where TestTinyRun builds gemrecon: a directory of the user's
// cache kept from run to run (one per checkout), so that go build finds the
// binary up to date and skips the link when nothing changed, as it skips
// compiling the packages; a temporary directory when there is no cache.
func binDir(t *testing.T) string {
	module, err := filepath.Abs("../../..")
	cache, cerr := os.UserCacheDir()
	if err != nil || cerr != nil {
		return t.TempDir()
	}
	dir := filepath.Join(cache, "gemrecon-test", fmt.Sprintf("floors-%x", sha256.Sum256([]byte(module))))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return t.TempDir()
	}
	return dir
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-format", "csv"}, {"-rounds", "0"}, {"extra"}} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) = nil, want a usage error", args)
		}
	}
}
