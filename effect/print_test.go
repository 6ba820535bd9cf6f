package effect

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

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
	p := NewPrint(&w)
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
	if err := NewPrint(&f).Run(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	want := `{"key":"gemini:batches/abc-123","name":"batches/abc-123","state":"SUCCEEDED","source":"webhook","attempt":3,"token":42,"operation":null}` + "\n"
	if f.String() != want {
		t.Errorf("Print wrote %q, want %q", f.String(), want)
	}
	if len(f.flushedAt) != 1 || f.flushedAt[0] != len(want) {
		t.Errorf("flushes at %v, want one after the whole line (%d)", f.flushedAt, len(want))
	}
}
