// Package disksync measures the disk's own rate of durable appends
// (append + fdatasync), the bound every durable commit shares. Benchmarks
// report their throughput against it, measured in the same run and the
// same directory, because absolute rates on a shared machine drift.
//
// Probe measures the variants a database commit is compared with: an
// append of any size (128 bytes, or as many bytes as a commit appends to
// the WAL), and an overwrite of bytes already on disk (what a WAL does once
// it restarts from its beginning after a checkpoint: the file does not
// grow, so fdatasync has no file size to make durable).
package disksync

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// Result is the raw disk's durable-append rate.
type Result struct {
	Syncs   int
	Elapsed time.Duration
	// Each is the time of one write and its fdatasync, in order.
	Each []time.Duration
}

// Median is the median of Each (0 when empty): the time of a typical sync,
// which the device's occasional slow syncs do not move as they move Rate.
func (s Result) Median() time.Duration { return Median(s.Each) }

// Median is the median of ds (0 when empty); ds is not reordered.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	c := slices.Clone(ds)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}

// Rate is syncs per second.
func (s Result) Rate() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Syncs) / s.Elapsed.Seconds()
}

// Rate appends a small record (64 bytes) and fdatasyncs it, repeatedly, in a
// temporary file in dir, for d (or until max syncs): the most durable
// commits per second one writer can make on that disk.
func Rate(dir string, d time.Duration, max int) (Result, error) {
	return Probe{Bytes: 64}.Run(dir, d, max)
}

// Probe is one kind of durable write: Bytes written, then fdatasync.
type Probe struct {
	// Bytes written before each fdatasync (at least 1).
	Bytes int
	// Overwrite writes into a file already written and synced (a ring of
	// RingBytes, from its start again when full) instead of appending: the
	// file's size never changes.
	Overwrite bool
	// RingBytes is the overwritten file's size (default 4 MiB, about what
	// SQLite's WAL grows to between automatic checkpoints at 4 KiB pages).
	RingBytes int
}

// DefaultRing is Probe.RingBytes's default.
const DefaultRing = 4 << 20

// String names the probe as the benchmark tables do.
func (p Probe) String() string {
	if p.Overwrite {
		return fmt.Sprintf("overwrite %d B + fdatasync", p.Bytes)
	}
	return fmt.Sprintf("append %d B + fdatasync", p.Bytes)
}

// Run writes and fdatasyncs, repeatedly, in a temporary file in dir, for d
// (or until limit syncs).
func (p Probe) Run(dir string, d time.Duration, limit int) (Result, error) {
	if d <= 0 && limit <= 0 {
		return Result{}, errors.New("disksync: Rate needs a duration or a count")
	}
	if p.Bytes < 1 {
		return Result{}, fmt.Errorf("disksync: probe of %d bytes", p.Bytes)
	}
	f, err := os.CreateTemp(dir, ".loadgen-sync-*")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	sync := func() error {
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("fdatasync %s: %w", filepath.Base(f.Name()), err)
		}
		return nil
	}
	rec := make([]byte, p.Bytes)
	for i := range rec {
		rec[i] = 'x'
	}
	rec[len(rec)-1] = '\n'
	ring := 0
	if p.Overwrite {
		ring = p.RingBytes
		if ring <= 0 {
			ring = DefaultRing
		}
		ring = max(ring/p.Bytes, 1) * p.Bytes
		if _, err := f.Write(make([]byte, ring)); err != nil {
			return Result{}, err
		}
		if err := sync(); err != nil {
			return Result{}, err
		}
	}
	start := time.Now()
	n := 0
	off := int64(0)
	var each []time.Duration
	if limit > 0 {
		each = make([]time.Duration, 0, limit)
	}
	for (d <= 0 || time.Since(start) < d) && (limit <= 0 || n < limit) {
		t := time.Now()
		if p.Overwrite {
			if _, err := f.WriteAt(rec, off); err != nil {
				return Result{}, err
			}
			if off += int64(p.Bytes); off >= int64(ring) {
				off = 0
			}
		} else if _, err := f.Write(rec); err != nil {
			return Result{}, err
		}
		if err := sync(); err != nil {
			return Result{}, err
		}
		each = append(each, time.Since(t))
		n++
	}
	return Result{Syncs: n, Elapsed: time.Since(start), Each: each}, nil
}
