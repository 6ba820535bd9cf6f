package effect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testLine is what Print writes for testEvent().
func testLine(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(testEvent())
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// fragment is what a line cut off part-way leaves behind.
const fragment = `{"key":"gemini:batches/cut-off","name":"batc`

// appendTo creates a file holding before and opens it the way the shell's
// >> opens stdout: write-only, appending.
func appendTo(t *testing.T, before string) (*os.File, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.ndjson")
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

// printTwice runs two lines through a Print on w and returns how often it
// said it ended a partial line.
func printTwice(t *testing.T, w io.Writer) int {
	t.Helper()
	var ended int
	p := NewPrint(w, func() { ended++ })
	for range 2 {
		if err := p.Run(context.Background(), testEvent()); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	return ended
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPrintEndsAPartialLineFirst: stdout appended to a file whose last line
// was cut off (`gemrecon poll >> events.ndjson` after a full disk): the
// first line starts on a line of its own, once, and Print says so once.
func TestPrintEndsAPartialLineFirst(t *testing.T) {
	earlier := testLine(t)
	f, path := appendTo(t, earlier+fragment)
	if n := printTwice(t, f); n != 1 {
		t.Errorf("NewPrint's onPartial ran %d times, want once", n)
	}
	line := testLine(t)
	if got, want := readFile(t, path), earlier+fragment+"\n"+line+line; got != want {
		t.Errorf("file holds\n%q\nwant\n%q", got, want)
	}
}

// TestPrintLeavesWholeLinesAlone: a file that ends in '\n', an empty file,
// a pipe (whatever went into it before) and a writer that is no file get
// the lines and nothing else.
func TestPrintLeavesWholeLinesAlone(t *testing.T) {
	line := testLine(t)
	for _, before := range []string{line, ""} {
		f, path := appendTo(t, before)
		if n := printTwice(t, f); n != 0 {
			t.Errorf("file holding %q: NewPrint's onPartial ran %d times, want never", before, n)
		}
		if got, want := readFile(t, path), before+line+line; got != want {
			t.Errorf("file holding %q now holds\n%q\nwant\n%q", before, got, want)
		}
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := make(chan string, 1)
	go func() { b, _ := io.ReadAll(r); got <- string(b) }()
	if _, err := w.WriteString(fragment); err != nil {
		t.Fatal(err)
	}
	n := printTwice(t, w)
	w.Close()
	if n != 0 {
		t.Errorf("pipe: NewPrint's onPartial ran %d times, want never", n)
	}
	if s, want := <-got, fragment+line+line; s != want {
		t.Errorf("pipe's reader got\n%q\nwant\n%q", s, want)
	}

	buf := bytes.NewBufferString(fragment)
	if n := printTwice(t, buf); n != 0 || buf.String() != fragment+line+line {
		t.Errorf("buffer: NewPrint's onPartial ran %d times, buffer holds %q; want never and the lines", n, buf.String())
	}
}

// TestPrintWithoutAppendLooksBeforeItsOffset: stdout opened without
// O_APPEND (the shell's >, or <>) is written at its offset, so the byte
// before the offset decides: at the end of a fragment, a '\n' first; at the
// start of a file, nothing (a '\n' there would overwrite its first byte).
func TestPrintWithoutAppendLooksBeforeItsOffset(t *testing.T) {
	line := testLine(t)
	for _, tc := range []struct {
		name  string
		seek  int64
		want  string
		ended int
	}{
		{"offset at the fragment's end", int64(len(fragment)), fragment + "\n" + line + line, 1},
		{"offset at the start", 0, line + line, 0}, // the lines are longer than the fragment
	} {
		path := filepath.Join(t.TempDir(), "out")
		if err := os.WriteFile(path, []byte(fragment), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(tc.seek, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		n := printTwice(t, f)
		f.Close()
		if n != tc.ended {
			t.Errorf("%s: NewPrint's onPartial ran %d times, want %d", tc.name, n, tc.ended)
		}
		if got := readFile(t, path); got != tc.want {
			t.Errorf("%s: file holds\n%q\nwant\n%q", tc.name, got, tc.want)
		}
	}
}

// TestPrintChecksWithTheFirstLineWritten: a first Run whose context had
// already ended writes nothing at all, not even the '\n'; the next Run
// ends the fragment and writes its line.
func TestPrintChecksWithTheFirstLineWritten(t *testing.T) {
	f, path := appendTo(t, fragment)
	var ended int
	p := NewPrint(f, func() { ended++ })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Run(ctx, testEvent()); err == nil || IsBroken(err) {
		t.Fatalf("Run with an ended context = %v, want a plain error", err)
	}
	if got := readFile(t, path); got != fragment || ended != 0 {
		t.Fatalf("after a Run with an ended context the file holds %q (ended %d); want it untouched", got, ended)
	}
	if err := p.Run(context.Background(), testEvent()); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, path), fragment+"\n"+testLine(t); got != want || ended != 1 {
		t.Errorf("file holds\n%q (ended %d)\nwant\n%q (ended once)", got, ended, want)
	}
}

// TestPrintFailingToEndThePartialLineBreaks: the '\n' is a write like any
// other: when it fails, the effect is broken and its line is not written.
// (A file opened read-only, at its end: the check can read the fragment,
// the write fails with EBADF.)
func TestPrintFailingToEndThePartialLineBreaks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.ndjson")
	if err := os.WriteFile(path, []byte(fragment), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	var ended int
	p := NewPrint(f, func() { ended++ })
	err = p.Run(context.Background(), testEvent())
	if !IsBroken(err) || !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), "partial line") {
		t.Fatalf("Run() = %v, want a Broken error about the partial line wrapping EBADF", err)
	}
	if ended != 0 {
		t.Errorf("NewPrint's onPartial ran %d times, want never: no '\\n' was written", ended)
	}
	if err := p.Run(context.Background(), testEvent()); !IsBroken(err) {
		t.Errorf("second Run() = %v, want Broken at once", err)
	}
	if got := readFile(t, path); got != fragment {
		t.Errorf("file holds %q, want the fragment alone", got)
	}
}

// cutOffWriter writes to a real file and cuts its first write off after
// room bytes with ENOSPC, as a disk that filled up mid-line does; later
// writes succeed (space was freed meanwhile).
type cutOffWriter struct {
	f    *os.File
	room int
	cut  bool
}

func (c *cutOffWriter) Write(p []byte) (int, error) {
	if c.cut {
		return c.f.Write(p)
	}
	c.cut = true
	n, err := c.f.Write(p[:min(c.room, len(p))])
	if err == nil && n < len(p) {
		err = syscall.ENOSPC
	}
	return n, err
}

// TestPrintCutOffLineBreaksBeforeTheNextLine: within one process, a line
// cut off part-way (a short write with an error) breaks the effect before
// the next line may be written: a Run waiting for its turn behind it fails
// as Broken and writes nothing, so no line continues the fragment, even
// when the writer would take it. (The fragment is ended by the next
// process's Print: TestPrintEndsAPartialLineFirst.)
func TestPrintCutOffLineBreaksBeforeTheNextLine(t *testing.T) {
	f, path := appendTo(t, "")
	p := NewPrint(&cutOffWriter{f: f, room: len(fragment)}, nil)
	next := make(chan error, 1)
	p.beforeWait = func(done <-chan error) {
		for deadline := time.Now().Add(10 * time.Second); len(done) == 0; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatal("the first write did not finish within 10s")
			}
		}
		// The cut-off write returned and its Run has not looked yet: the
		// next line's Run gets its turn now.
		p.beforeWait = nil
		go func() { next <- p.Run(context.Background(), testEvent()) }()
		select {
		case err := <-next:
			if !IsBroken(err) {
				t.Errorf("the next Run() = %v, want Broken", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the next Run did not return within 10s")
		}
	}
	err := p.Run(context.Background(), testEvent())
	if !IsBroken(err) || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Run() = %v, want a Broken error wrapping ENOSPC", err)
	}
	if got, want := readFile(t, path), testLine(t)[:len(fragment)]; got != want {
		t.Errorf("file holds\n%q\nwant the cut-off line's first %d bytes alone\n%q", got, len(fragment), want)
	}
}
