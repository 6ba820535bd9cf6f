package effect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// Print writes the event document as one NDJSON line (spec §4, the effect
// when no other is configured). Run returns only after the line was written
// and, when the writer can, flushed (Flush) or synced (Sync). It is safe for
// concurrent use: lines never interleave.
//
// A writer that fails (stdout's reader went away: EPIPE; a line cut off
// part-way: ENOSPC, EFBIG) or that does not take the line before Run's
// context ends (a reader that stopped reading) breaks the effect for good:
// that Run and every later one return an error marked Broken, so the
// dispatcher stops claiming and the command exits. A failed write breaks it
// before the next line gets its turn, so that no line of the same process
// continues a fragment. The write itself happens on a goroutine, so that a
// stalled writer cannot hold Run past its context (the effect timeout,
// shutdown's grace); a write abandoned that way may still complete if the
// reader resumes before the process exits. For a signal-free EPIPE on stdout, the process must handle
// SIGPIPE (os/signal.Notify; cmd/gemrecon does).
//
// A write cut off part-way (disk full, a file-size limit) leaves the file
// ending in a partial line, and the key is retried by a later process.
// So that its line does not continue the fragment, the first line a Print
// writes is preceded by a '\n' when the writer is an *os.File that is a
// regular file whose byte before the next write's position (its end when it
// was opened O_APPEND, as the shell's >> does; its offset otherwise) is not
// '\n': the fragment ends as a malformed line of its own and every new line
// is whole. Print logs nothing; NewPrint's onPartial says when it happened. To
// read that byte from a file opened write-only, Print reopens it read-only
// through /proc/self/fd (Linux); where it can read the byte neither way
// (another system, a file it may not read), it skips the check. Pipes,
// terminals, devices and other writers are left alone. The check assumes
// that no other process appends to the file at the same moment.
type Print struct {
	w         io.Writer
	turn      chan struct{} // one token: whose line is being written
	onPartial func()        // NewPrint's, or nil
	started   bool          // the first line's check was made; guarded by turn

	// broken is cancelled, with the error that broke the effect as its
	// cause (the first one stays), when the effect breaks; every later Run
	// returns that cause.
	broken    context.Context
	breakWith context.CancelCauseFunc

	// beforeWait, when set (tests only), is called after the write
	// started and before Run waits for it, with the channel the write's
	// result arrives on: a test can end the context after the write
	// finished and before Run looked.
	beforeWait func(done <-chan error)
}

// NewPrint returns a Print effect writing to w (usually os.Stdout).
// onPartial, unless nil, is called when the file w writes to ended in a
// partial line and Print has just ended it with a '\n' (see Print), at most
// once per Print, before its first line is written. It runs on the
// goroutine that writes; the caller logs it (cmd/gemrecon: a warning).
func NewPrint(w io.Writer, onPartial func()) *Print {
	broken, breakWith := context.WithCancelCause(context.Background())
	return &Print{w: w, turn: make(chan struct{}, 1), broken: broken, breakWith: breakWith, onPartial: onPartial}
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
	case <-p.broken.Done():
		return context.Cause(p.broken)
	case <-ctx.Done():
		// Behind an earlier line that is taking this long: the output
		// stalled; that line's Run says so.
		return fmt.Errorf("print: not written: stdout is still busy with an earlier line: %w", ctx.Err())
	}
	if err := context.Cause(p.broken); err != nil {
		<-p.turn
		return err
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-p.turn }() // only once the write returned: lines never interleave
		err := p.write(line)
		if err != nil {
			// Broken before the next line gets its turn: after a line
			// cut off part-way, a line written in this process would
			// continue the fragment.
			err = p.breakOn(fmt.Errorf("print: stdout is broken%s: %w", writeHint(err), err))
		}
		done <- err
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
			return p.breakOn(fmt.Errorf("print: stdout stalled: the line was not taken in time (%v); is its reader still reading?: %w", context.Cause(ctx), ctx.Err()))
		}
	}
	return werr // nil, or Broken already
}

// write writes one line and flushes or syncs it; before the first line, it
// ends a partial line the file ended in (Print).
func (p *Print) write(line []byte) error {
	if !p.started {
		p.started = true
		if f, ok := p.w.(*os.File); ok && endsInPartialLine(f) {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				return fmt.Errorf("end the partial line it ended in: %w", err)
			}
			if p.onPartial != nil {
				p.onPartial()
			}
		}
	}
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

// breakOn marks the effect broken with err (the first cause stays) and
// returns the Broken error.
func (p *Print) breakOn(err error) error {
	err = Broken(err)
	p.breakWith(err)
	return err
}

// writeHint names the likely cause of a failed write of stdout, or nothing.
func writeHint(err error) string {
	switch {
	case errors.Is(err, syscall.EPIPE):
		return " (no reader any more?)"
	case errors.Is(err, syscall.ENOSPC):
		return " (disk full?)"
	case errors.Is(err, syscall.EDQUOT):
		return " (disk quota exceeded?)"
	case errors.Is(err, syscall.EFBIG):
		return " (a file-size limit?)"
	}
	return ""
}

// endsInPartialLine reports whether f is a regular file whose byte before
// the position its next write lands at is not '\n'. It is false when that
// cannot be told (Print: the check is skipped).
func endsInPartialLine(f *os.File) bool {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	fd := f.Fd() // a regular file: no poller to take it out of
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
	if errno != 0 {
		return false
	}
	at := fi.Size() // O_APPEND: every write lands at the end
	if flags&syscall.O_APPEND == 0 {
		if at, err = f.Seek(0, io.SeekCurrent); err != nil {
			return false
		}
	}
	if at <= 0 {
		return false // nothing before: an empty file, or the start of one
	}
	var b [1]byte
	_, err = f.ReadAt(b[:], at-1)
	if errors.Is(err, syscall.EBADF) {
		// Opened write-only (the shell's > and >>): read it through a
		// second, read-only descriptor of the same file (Linux).
		var r *os.File
		if r, err = os.Open("/proc/self/fd/" + strconv.Itoa(int(fd))); err == nil {
			_, err = r.ReadAt(b[:], at-1)
			r.Close()
		}
	}
	return err == nil && b[0] != '\n'
}
