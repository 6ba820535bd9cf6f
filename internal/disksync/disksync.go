// Package disksync measures the disk's own rate of durable appends (write
// + fdatasync), the bound every durable commit shares. Benchmarks report
// their throughput against it, measured in the same run and the same
// directory, because absolute rates on a shared machine drift.
package disksync

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Result is the raw disk's durable-append rate.
type Result struct {
	Syncs   int
	Elapsed time.Duration
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

// Probe is one kind of durable append: Bytes written, then fdatasync.
type Probe struct {
	// Bytes written before each fdatasync (at least 1).
	Bytes int
}

// Run appends and fdatasyncs, repeatedly, in a temporary file in dir, for
// d (or until limit syncs).
func (p Probe) Run(dir string, d time.Duration, limit int) (Result, error) {
	if d <= 0 && limit <= 0 {
		return Result{}, errors.New("disksync: a probe needs a duration or a count")
	}
	if p.Bytes < 1 {
		return Result{}, fmt.Errorf("disksync: probe of %d bytes", p.Bytes)
	}
	f, err := os.CreateTemp(dir, ".disksync-*")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rec := make([]byte, p.Bytes)
	for i := range rec {
		rec[i] = 'x'
	}
	rec[len(rec)-1] = '\n'
	start := time.Now()
	n := 0
	for (d <= 0 || time.Since(start) < d) && (limit <= 0 || n < limit) {
		if _, err := f.Write(rec); err != nil {
			return Result{}, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return Result{}, fmt.Errorf("fdatasync %s: %w", filepath.Base(f.Name()), err)
		}
		n++
	}
	return Result{Syncs: n, Elapsed: time.Since(start)}, nil
}
