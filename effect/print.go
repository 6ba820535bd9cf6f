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
//
// A writer that fails (stdout's reader went away: EPIPE) or that does not
// take the line before Run's context ends (a reader that stopped reading)
// breaks the effect for good: that Run and every later one return an error
// marked Broken, so the dispatcher stops claiming and the command exits. The
// write itself happens on a goroutine, so that a stalled writer cannot hold
// Run past its context (the effect timeout, shutdown's grace); a write
// abandoned that way may still complete if the reader resumes before the
// process exits. For a signal-free EPIPE on stdout, the process must handle
// SIGPIPE (os/signal.Notify; cmd/gemrecon does).
type Print struct {
	w    io.Writer
	turn chan struct{} // one token: whose line is being written

	mu     sync.Mutex
	broken error         // set once; every later Run returns it
	gone   chan struct{} // closed when broken is set

	// beforeWait, when set (tests only), is called after the write
	// started and before Run waits for it, with the channel the write's
	// result arrives on: a test can end the context after the write
	// finished and before Run looked.
	beforeWait func(done <-chan error)
}

// NewPrint returns a Print effect writing to w (usually os.Stdout).
func NewPrint(w io.Writer) *Print {
	return &Print{w: w, turn: make(chan struct{}, 1), gone: make(chan struct{})}
}

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
	select {
	case p.turn <- struct{}{}:
	case <-p.gone:
		return p.brokenErr()
	case <-ctx.Done():
		// Behind an earlier line that is taking this long: the output
		// stalled; that line's Run says so.
		return fmt.Errorf("print: not written: stdout is still busy with an earlier line: %w", ctx.Err())
	}
	if err := p.brokenErr(); err != nil {
		<-p.turn
		return err
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-p.turn }() // only once the write returned: lines never interleave
		done <- p.write(line)
	}()
	if p.beforeWait != nil {
		p.beforeWait(done)
	}
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		// The write's result decides when it is in: a line taken before
		// Run looked is written, whatever the context did meanwhile (select
		// picks at random among ready cases).
		select {
		case werr = <-done:
		default:
			return p.breakWith(fmt.Errorf("print: stdout stalled: the line was not taken in time (%v); is its reader still reading?: %w", context.Cause(ctx), ctx.Err()))
		}
	}
	if werr != nil {
		return p.breakWith(fmt.Errorf("print: stdout is broken (no reader any more?): %w", werr))
	}
	return nil
}

// write writes one line and flushes or syncs it.
func (p *Print) write(line []byte) error {
	if _, err := p.w.Write(line); err != nil {
		return err
	}
	switch w := p.w.(type) {
	case interface{ Flush() error }:
		if err := w.Flush(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	case interface{ Sync() error }:
		// A terminal or a pipe cannot be synced; the line has reached the
		// kernel, which is all "written" can mean there.
		if err := w.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOTSUP) {
			return fmt.Errorf("sync: %w", err)
		}
	}
	return nil
}

// breakWith marks the effect broken with err (the first cause stays) and
// returns the Broken error.
func (p *Print) breakWith(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == nil {
		p.broken = Broken(err)
		close(p.gone)
		return p.broken
	}
	return Broken(err)
}

// brokenErr returns the error that broke the effect, or nil.
func (p *Print) brokenErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.broken
}
