package sqlite

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The header read from a real database's -shm is valid, moves with every
// commit, and any copy of it that SQLite itself would not accept (copies that
// differ, as while a writer is between them; not initialised; a wrong
// checksum or version) is no version at all, so that nothing is answered
// from the row cache by it.
func TestWALHeader(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "walindex.db")
	s := mustOpen(t, path)
	defer s.Close()
	if s.wal == nil {
		t.Fatal("no WAL-index for a sink on a local file")
	}
	v0, ok := s.wal.version()
	if !ok {
		t.Fatal("the header of a new database is not valid")
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/w", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	v1, ok := s.wal.version()
	if !ok || v1 == v0 {
		t.Fatalf("after a commit: valid %v, changed %v", ok, v1 != v0)
	}
	if !s.walArmed.Load() {
		t.Fatal("a commit changed the header, but the row cache is not armed")
	}
	if v, _ := s.walNow(); v != v1 {
		t.Fatal("walNow differs from the header just read")
	}

	raw := make([]byte, 2*walHdrSize)
	if n, err := syscall.Pread(s.wal.fd, raw, 0); err != nil || n != len(raw) {
		t.Fatalf("pread: %d, %v", n, err)
	}
	if v, ok := parseWALHeader(raw); !ok || v != v1 {
		t.Fatalf("parseWALHeader of the header read again: %v, same %v", ok, v == v1)
	}
	bad := map[string]func(b []byte){
		"copies differ": func(b []byte) { b[walHdrSize+8]++ },
		"not initialised": func(b []byte) {
			b[walHdrInitAt], b[walHdrSize+walHdrInitAt] = 0, 0
		},
		"checksum": func(b []byte) {
			b[walHdrCksumAt]++
			b[walHdrSize+walHdrCksumAt]++
		},
		"content under the checksum": func(b []byte) {
			b[16]++ // mxFrame
			b[walHdrSize+16]++
		},
		"version": func(b []byte) {
			binary.NativeEndian.PutUint32(b[0:], 3007001)
			binary.NativeEndian.PutUint32(b[walHdrSize:], 3007001)
		},
		"short": nil,
	}
	for name, spoil := range bad {
		b := append([]byte(nil), raw...)
		if spoil == nil {
			b = b[:2*walHdrSize-1]
		} else {
			spoil(b)
		}
		if _, ok := parseWALHeader(b); ok {
			t.Errorf("%s: parseWALHeader accepted it", name)
		}
	}
}

// A second sink on the same file in this process shares the one descriptor
// of its -shm (closing it while SQLite may hold locks on the file would drop
// them, see walIndex).
func TestWALIndexOneDescriptorPerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shared.db")
	a := mustOpen(t, path)
	defer a.Close()
	b := mustOpen(t, path)
	defer b.Close()
	if a.wal == nil || a.wal != b.wal {
		t.Fatalf("two sinks on one file: walIndex %p and %p", a.wal, b.wal)
	}
}

// Opening and closing sinks does not keep descriptors: once the last
// connection is closed and SQLite has deleted the -shm file, nothing can hold
// a lock on it, and its descriptor is closed (each Open and Close used to
// keep one, with the deleted file, for the process's life). A -shm file
// still in use by another sink keeps its one descriptor.
func TestWALIndexReleasedWithTheFile(t *testing.T) {
	ctx := context.Background()
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	path := filepath.Join(t.TempDir(), "reopen.db")
	descriptors := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	cycle := func() {
		s := mustOpen(t, path)
		if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/reopen", Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	before := descriptors()
	for range 10 {
		cycle()
	}
	if n := descriptors(); n > before {
		t.Fatalf("10 Opens and Closes of one file: %d descriptors, %d before", n, before)
	}

	a := mustOpen(t, path)
	defer a.Close()
	b := mustOpen(t, path)
	w := a.wal
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.version(); !ok {
		t.Fatal("closing one of two sinks on a file released the other's WAL-index")
	}
}

// A FIFO in place of the -shm file is no WAL-index, and opening it does not
// wait for a writer (an Open that met one would never return).
func TestWALIndexNotAFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo.db")
	if err := syscall.Mkfifo(path+"-shm", 0o600); err != nil {
		t.Skip("mkfifo:", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := openWALIndex(path)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("openWALIndex accepted a FIFO")
		}
	case <-time.After(time.Second):
		t.Fatal("openWALIndex of a FIFO did not return within a second")
	}
}

// mustOpen opens the sink at path with default options; the caller closes it.
func mustOpen(t *testing.T, path string) *Sink {
	t.Helper()
	s, err := Open(context.Background(), path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
