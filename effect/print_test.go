package effect

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// chunkWriter writes each line in small pieces, so that without Print's
// lock two concurrent lines would interleave.
type chunkWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	for i := 0; i < len(p); i += 3 {
		c.mu.Lock()
		c.b.Write(p[i:min(i+3, len(p))])
		c.mu.Unlock()
	}
	return len(p), nil
}

func TestPrintConcurrentLinesDoNotInterleave(t *testing.T) {
	var w chunkWriter
	p := NewPrint(&w, nil)
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ev := testEvent()
			ev.Key = fmt.Sprintf("gemini:batches/k%03d", i)
			ev.Operation = json.RawMessage("{\n  \"name\": \"batches/x\"\n}")
			if err := p.Run(context.Background(), ev); err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(w.b.String()))
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q is not one JSON document: %v", sc.Text(), err)
		}
		seen[ev.Key] = true
	}
	if len(seen) != n {
		t.Errorf("distinct lines = %d, want %d", len(seen), n)
	}
}

type flushRecorder struct {
	bytes.Buffer
	flushedAt []int
}

func (f *flushRecorder) Flush() error { f.flushedAt = append(f.flushedAt, f.Len()); return nil }

func TestPrintFlushesBeforeReturning(t *testing.T) {
	var f flushRecorder
	ev := testEvent()
	ev.Operation = nil
	if err := NewPrint(&f, nil).Run(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	want := `{"key":"gemini:batches/abc-123","name":"batches/abc-123","state":"SUCCEEDED","source":"webhook","attempt":3,"token":42,"operation":null,"confirmed":false,"batch_state":"","rerun":false}` + "\n"
	if f.String() != want {
		t.Errorf("Print wrote %q, want %q", f.String(), want)
	}
	if len(f.flushedAt) != 1 || f.flushedAt[0] != len(want) {
		t.Errorf("flushes at %v, want one after the whole line (%d)", f.flushedAt, len(want))
	}
}

// bigEvent is an event whose line is far larger than a pipe's buffer.
func bigEvent() Event {
	ev := testEvent()
	ev.Operation = json.RawMessage(`{"name":"batches/abc-123","pad":"` + strings.Repeat("x", 1<<20) + `"}`)
	return ev
}

// TestPrintBrokenPipeBreaksTheEffect: a write to a pipe whose reader went
// away fails the attempt as Broken, and every later Run fails at once.
func TestPrintBrokenPipeBreaksTheEffect(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r.Close()
	p := NewPrint(w, nil)
	err = p.Run(context.Background(), testEvent())
	if !IsBroken(err) || !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Run() = %v, want a Broken error wrapping EPIPE", err)
	}
	if !strings.Contains(err.Error(), "no reader any more?") {
		t.Errorf("Run() = %q, want the no-reader hint", err)
	}
	if err := p.Run(context.Background(), testEvent()); !IsBroken(err) {
		t.Errorf("second Run() = %v, want Broken at once", err)
	}
}

// TestPrintFullDiskSaysSo: a write refused with ENOSPC (the kernel's
// /dev/full) breaks the effect with a message that points at the disk, not
// at a reader that went away.
func TestPrintFullDiskSaysSo(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full here: %v", err)
	}
	defer f.Close()
	err = NewPrint(f, nil).Run(context.Background(), testEvent())
	if !IsBroken(err) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Run() = %v, want a Broken error wrapping ENOSPC", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "disk full?") || strings.Contains(msg, "no reader") {
		t.Errorf("Run() = %q, want the disk-full hint and not the no-reader one", msg)
	}
}

// TestPrintStalledReaderIsBoundedByTheContext: a reader that stops reading
// cannot hold Run past its context; the effect is broken, and a Run queued
// behind the stalled line fails too, without waiting for its own context.
func TestPrintStalledReaderIsBoundedByTheContext(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close() // lets the abandoned write end
	p := NewPrint(w, nil)
	ctx, cancel := context.WithCancelCause(context.Background())
	queued := make(chan error, 1)
	first := make(chan error, 1)
	go func() { first <- p.Run(ctx, bigEvent()) }()
	for deadline := time.Now().Add(10 * time.Second); len(p.turn) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first Run did not start writing within 10s")
		}
	}
	// The first is writing, and cannot finish: the pipe holds far less
	// than its line. A second line waits behind it, with no deadline of
	// its own.
	go func() { queued <- p.Run(context.Background(), testEvent()) }()
	cancel(errors.New("effect timeout 1s exceeded")) // the timer fires mid-write
	select {
	case err := <-first:
		if !IsBroken(err) || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "stalled") {
			t.Errorf("Run() = %v, want a Broken stall that wraps the context's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run() did not return within 10s of its context ending")
	}
	select {
	case err := <-queued:
		if !IsBroken(err) {
			t.Errorf("queued Run() = %v, want Broken", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued Run() did not return within 10s of the effect breaking")
	}
}

// TestPrintLineWrittenBeforeTheDeadlineIsSuccess: a line that the writer
// took is written, even when the context ended after the write returned
// and before Run looked (gemrecon paused or starved of CPU between the two,
// the NDJSON analogue of issue 12 item 3). Run must not pick the deadline
// over the finished write — Go's select chooses at random between ready
// cases — and call a working stdout stalled: that ended the command and
// printed the line again in the next one.
func TestPrintLineWrittenBeforeTheDeadlineIsSuccess(t *testing.T) {
	for i := 0; i < 64; i++ {
		var out bytes.Buffer
		p := NewPrint(&out, nil)
		ctx, cancel := context.WithCancelCause(context.Background())
		p.beforeWait = func(done <-chan error) {
			for deadline := time.Now().Add(10 * time.Second); len(done) == 0; time.Sleep(100 * time.Microsecond) {
				if time.Now().After(deadline) {
					t.Fatal("the write did not finish within 10s")
				}
			}
			cancel(errors.New("effect timeout 1s exceeded")) // the timer fires after the write
		}
		if err := p.Run(ctx, testEvent()); err != nil {
			t.Fatalf("run %d: Run() = %v, want nil: the line was written before the deadline", i, err)
		}
		if !strings.HasSuffix(out.String(), "\n") {
			t.Fatalf("run %d: output %q, want one line", i, out.String())
		}
	}
}
