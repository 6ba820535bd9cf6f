package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestDeadlineWhileLocked: while another connection holds the write lock, a
// write whose deadline is nearer than the lock wait returns at its deadline
// (it is handed to the writer goroutine, not run in the caller's), and a
// write without a deadline runs once the lock is released.
func TestDeadlineWhileLocked(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locked.db")
	s, err := Open(ctx, path, sink.Options{BusyTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.inlineOK(ctx) {
		t.Fatal("inlineOK(no deadline) = false")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if s.inlineOK(short) {
		t.Fatal("inlineOK(300ms) = true with a busy timeout of 3s")
	}

	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(100)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = s.Record(short, sink.Sighting{Key: "gemini:batches/short", Source: sink.SourcePoll})
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Errorf("Record under another's lock with a 300ms deadline = %v after %v; want the deadline, at once", err, took)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/patient", Source: sink.SourcePoll})
		done <- err
	}()
	// Whether it begins before or after the release, it commits.
	if _, err := c.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Record without a deadline after the lock was released: %v", err)
	}
	if _, err := s.Get(ctx, "gemini:batches/patient"); err != nil {
		t.Error(err)
	}
}

// TestReadKeyRow: the key readers answer a key lookup as the reader pool
// does, found or not, and Close closes every one of them.
func TestReadKeyRow(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "keys.db"), sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sg := sink.Sighting{Key: "gemini:batches/k", Source: sink.SourceWebhook, State: "SUCCEEDED", Dynamic: true}
	if _, err := s.Record(ctx, sg); err != nil {
		t.Fatal(err)
	}
	if n := len(s.keyReaders); n != keyReaders {
		t.Fatalf("%d free key readers, want %d", n, keyReaders)
	}
	for _, key := range []string{sg.Key, "gemini:batches/none"} {
		got, gotFound, err := s.readKeyRow(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		want, wantFound, err := scanKeyRow(s.readQueryRow(ctx, qKeyRow, key))
		if err != nil {
			t.Fatal(err)
		}
		if got != want || gotFound != wantFound {
			t.Errorf("readKeyRow(%s) = %+v, %v; the reader pool says %+v, %v", key, got, gotFound, want, wantFound)
		}
		if key == sg.Key && (!gotFound || got.state != sink.StatePending || got.batchState != "SUCCEEDED" || !got.needsConfirm || got.firstSource != sink.SourceWebhook) {
			t.Errorf("readKeyRow(%s) = %+v, %v", key, got, gotFound)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s.nKeyReaders != 0 || s.kdb != nil {
		t.Errorf("after Close: %d key readers open, pool %v", s.nKeyReaders, s.kdb)
	}
}
