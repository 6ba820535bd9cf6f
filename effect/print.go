package effect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
)

// Print writes the event document as one NDJSON line (spec §4, the effect
// when no other is configured). Run returns only after the line was written
// and, when the writer can, flushed (Flush) or synced (Sync). It is safe for
// concurrent use: lines never interleave.
type Print struct {
	mu sync.Mutex
	w  io.Writer
}

// NewPrint returns a Print effect writing to w (usually os.Stdout).
func NewPrint(w io.Writer) *Print { return &Print{w: w} }

// Run writes ev as one line.
func (p *Print) Run(ctx context.Context, ev Event) error {
	line, err := json.Marshal(ev)
	if err != nil {
		return Permanent(fmt.Errorf("print: encode event document: %w", err))
	}
	line = append(line, '\n')
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("print: not written: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.w.Write(line); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	switch w := p.w.(type) {
	case interface{ Flush() error }:
		if err := w.Flush(); err != nil {
			return fmt.Errorf("print: flush: %w", err)
		}
	case interface{ Sync() error }:
		// A terminal or a pipe cannot be synced; the line has reached the
		// kernel, which is all "written" can mean there.
		if err := w.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
			return fmt.Errorf("print: sync: %w", err)
		}
	}
	return nil
}
