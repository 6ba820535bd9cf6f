// Package disksync measures the disk's own rate of durable appends
// (append + fdatasync), the bound every durable commit shares. Benchmarks
// report their throughput against it, measured in the same run and the
// same directory, because absolute rates on a shared machine drift.
package disksync

import (
	"bytes"
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

// Rate appends a small record and fdatasyncs it, repeatedly, in a
// temporary file in dir, for d (or until max syncs): the most durable
// commits per second one writer can make on that disk.
func Rate(dir string, d time.Duration, max int) (Result, error) {
	if d <= 0 && max <= 0 {
		return Result{}, errors.New("disksync: Rate needs a duration or a count")
	}
	f, err := os.CreateTemp(dir, ".loadgen-sync-*")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	rec := bytes.Repeat([]byte("x"), 63)
	rec = append(rec, '\n')
	start := time.Now()
	n := 0
	for (d <= 0 || time.Since(start) < d) && (max <= 0 || n < max) {
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
