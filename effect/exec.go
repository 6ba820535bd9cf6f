package effect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultStderrTail bounds how much of an exec effect's stderr is kept as the
// error of a failed attempt (its end says the most).
const DefaultStderrTail = 2 << 10

// DefaultWaitDelay bounds how long an exec effect waits for its pipes to close
// after the command exited or was killed (a grandchild that escaped the kill,
// or a background child of a successful command, may hold them open).
const DefaultWaitDelay = 2 * time.Second

// Exec runs a shell command per event (spec §4 --exec): `/bin/sh -c CMD`
// with the event document on stdin and GEMRECON_* variables in the
// environment. Exit status 0 is success; anything else is a retryable error
// whose text ends with the tail of the command's stderr. The command runs in
// its own process group, and when the context is done (the effect timeout or
// shutdown) the whole group is killed with SIGKILL.
//
// The exit status decides: a command that exited 0 succeeded even when the
// context ended after its exit and before it was reaped (the kill then hits
// a finished group). Only a command that died of that kill reports an error
// wrapping the context's (errors.Is context.DeadlineExceeded or Canceled);
// one that failed on its own reports its own status, whatever the context
// did afterwards.
type Exec struct {
	command   string
	lines     func(OutputLine) // where the command's output goes; nil: nowhere
	waitDelay time.Duration    // DefaultWaitDelay; tests shorten it

	// beforeWait, when set (tests only), is called after the command
	// started and before it is waited for, with its pid and a channel that
	// is closed once the context's kill was sent: a test can hold the
	// command exited but not yet reaped while the timer fires.
	beforeWait func(pid int, killed <-chan struct{})
}

// ExecOutput returns a line handler for NewExec that writes each line to w
// (cmd/gemrecon gives its stderr: gemrecon's stdout carries data, so the
// user's command is heard where the logs are), a whole line per Write (see
// OutputLine for long and last lines). nil discards them.
func ExecOutput(w io.Writer) func(OutputLine) {
	if w == nil {
		return nil
	}
	// Errors are dropped: where the copy goes (gemrecon's stderr) breaking
	// is not the command's failure (see Run).
	var mu sync.Mutex
	return func(l OutputLine) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = w.Write(append([]byte(l.Text), '\n'))
	}
}

// OutputLine is one line an exec command wrote: the event's key, the
// stream ("stdout" or "stderr") and the text without its newline. A line
// longer than MaxOutputLine comes in pieces of that size; a last line
// without a newline comes when the command has finished.
type OutputLine struct {
	Key, Stream, Text string
}

// MaxOutputLine bounds the bytes of one OutputLine (a command that writes
// without newlines must not grow a buffer without end).
const MaxOutputLine = 64 << 10

// NewExec returns an effect that runs command with /bin/sh -c. lines gets
// each line of the command's stdout and stderr, whole: ExecOutput's writes
// them to a writer; a handler of its own can make them records of a log in
// JSON lines. It is called from the goroutines that copy the command's
// output, one per stream, and must not block for long; nil discards the
// output.
func NewExec(command string, lines func(OutputLine)) *Exec {
	return &Exec{command: command, lines: lines, waitDelay: DefaultWaitDelay}
}

// Run runs the command once for ev.
func (e *Exec) Run(ctx context.Context, ev Event) error {
	doc, err := json.Marshal(ev)
	if err != nil {
		return Permanent(fmt.Errorf("exec: encode event document: %w", err))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("exec: not started: %w", err)
	}
	tail := &tailBuffer{}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", e.command)
	cmd.Stdin = bytes.NewReader(doc)
	cmd.Stderr = tail // stdout: /dev/null
	flush := func() {}
	if e.lines != nil {
		// Copied, never handed over as a file, and line by line: where
		// the copy goes (gemrecon's stderr) breaking is not the command's
		// failure — handed the file, or a copy that stops at the first
		// error and closes the pipe, the command would die of SIGPIPE at
		// its next write, and a successful effect would be recorded as
		// failed — and a line is written whole, in one write, so that the
		// lines of concurrent commands and gemrecon's log records never
		// cut into each other.
		stdout := &lineWriter{key: ev.Key, stream: "stdout", emit: e.lines}
		stderr := &lineWriter{key: ev.Key, stream: "stderr", emit: e.lines}
		cmd.Stdout = stdout
		cmd.Stderr = io.MultiWriter(tail, stderr)
		flush = func() { stdout.flush(); stderr.flush() }
	}
	cmd.Env = append(os.Environ(),
		"GEMRECON_KEY="+ev.Key,
		"GEMRECON_NAME="+ev.Name,
		"GEMRECON_STATE="+ev.State,
		"GEMRECON_TOKEN="+strconv.FormatInt(ev.Token, 10),
		"GEMRECON_ATTEMPT="+strconv.Itoa(ev.Attempt),
		"GEMRECON_SOURCE="+ev.Source,
		"GEMRECON_BATCH_STATE="+ev.BatchState,
		"GEMRECON_CONFIRMED="+strconv.FormatBool(ev.Confirmed),
		"GEMRECON_RESULTS_FILE="+ev.ResultsFile,
		"GEMRECON_RERUN="+map[bool]string{true: "1", false: "0"}[ev.Rerun],
	)
	// Its own process group, so that one signal reaches everything the
	// command started: a shell pipeline or a backgrounded grandchild would
	// otherwise survive the kill and run on after the attempt was given up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	killSent := make(chan struct{})
	var killed atomic.Bool // the kill reached a live group
	cmd.Cancel = func() error {
		defer close(killSent)
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		switch {
		case err == nil:
			killed.Store(true)
		case errors.Is(err, syscall.ESRCH):
			// Reaped already: the command finished on its own.
			return os.ErrProcessDone
		}
		return err
	}
	cmd.WaitDelay = e.waitDelay

	runErr := cmd.Start()
	if runErr == nil {
		if e.beforeWait != nil {
			e.beforeWait(cmd.Process.Pid, killSent)
		}
		runErr = cmd.Wait()
	}
	flush() // a last line without its newline
	st := cmd.ProcessState
	if st != nil && st.Success() {
		// The exit status decides, not the context's state after the
		// fact: a command that exited 0 did its work, even if the timer
		// fired (and a kill was sent to its group) before it was reaped,
		// or a background child kept its output open past the wait delay.
		return nil
	}
	var msg string
	var cause error = runErr
	switch {
	case st == nil: // it never started
		msg = "exec: " + runErr.Error()
	case killed.Load() && st.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
		// Our kill, sent because the context ended (timeout, shutdown,
		// a takeover): the error wraps the context's, so that dispatch
		// can say why.
		msg = fmt.Sprintf("exec: process group killed (%v): %s", context.Cause(ctx), st)
		cause = ctx.Err()
	default:
		// It ended on its own ("exit status 3", "signal: terminated"),
		// even if the context ended meanwhile.
		msg = "exec: " + st.String()
		if ee := (*exec.ExitError)(nil); !errors.As(runErr, &ee) {
			cause = &exec.ExitError{ProcessState: st}
		}
	}
	if t := tail.String(); t != "" {
		msg += "; stderr: " + t
	}
	return &execError{msg: msg, err: cause}
}

// lineWriter cuts one output stream of a command into lines (at most
// MaxOutputLine bytes each) and hands each to emit. Its lock covers the
// copying goroutine and flush (after the wait delay a copy may still be
// running when Run flushes).
type lineWriter struct {
	key, stream string
	emit        func(OutputLine)
	mu          sync.Mutex
	buf         []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			i = len(p)
		}
		take := min(i, MaxOutputLine-len(l.buf))
		l.buf = append(l.buf, p[:take]...)
		p = p[take:]
		switch {
		case len(p) > 0 && p[0] == '\n':
			p = p[1:]
			l.emitLocked()
		case len(l.buf) == MaxOutputLine:
			l.emitLocked()
		}
	}
	return n, nil
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emitLocked()
	}
}

func (l *lineWriter) emitLocked() {
	l.emit(OutputLine{Key: l.key, Stream: l.stream, Text: string(l.buf)})
	l.buf = l.buf[:0]
}

// execError keeps the readable message and the cause for errors.Is (a
// context error when the process group was killed).
type execError struct {
	msg string
	err error
}

func (e *execError) Error() string { return e.msg }
func (e *execError) Unwrap() error { return e.err }

// tailBuffer keeps the last DefaultStderrTail bytes written to it.
type tailBuffer struct {
	mu        sync.Mutex
	buf       []byte
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - DefaultStderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	return len(p), nil
}

// String returns the kept tail, trimmed, valid UTF-8, marked with "…" when
// the beginning was dropped.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(strings.ToValidUTF8(string(t.buf), ""))
	if t.truncated && s != "" {
		s = "…" + s
	}
	return s
}
