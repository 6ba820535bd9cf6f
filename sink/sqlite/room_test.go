package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// lowerFileSizeLimit sets this process's soft file-size limit
// (RLIMIT_FSIZE) to limit bytes, as a full disk would stop the database's
// files from growing (the tests of this package do not run in parallel),
// and returns the function that restores it (also called when the test
// ends). A write past the limit fails with EFBIG: Go ignores SIGXFSZ.
func lowerFileSizeLimit(t *testing.T, limit uint64) (restore func()) {
	t.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &orig); err != nil {
		t.Fatal(err)
	}
	lowered := orig
	lowered.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lowered); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore = func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &orig); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(restore)
	return restore
}

// roomKey is the key of the i-th record of fillUntilNoRoom.
func roomKey(i int) string { return fmt.Sprintf("gemini:batches/room-%04d", i) }

func recordRoom(s *sqlite.Sink, i int) error {
	name := strings.TrimPrefix(roomKey(i), "gemini:")
	_, err := s.Record(context.Background(), sink.Sighting{Key: roomKey(i), Source: sink.SourceWebhook, Payload: []byte(`{"name":"` + name + `"}`)})
	return err
}

// fillUntilNoRoom opens a sink on path, records one key, lowers the
// file-size limit to 32 KiB above the WAL's size and records more until
// three have failed with ErrNoRoom. It returns the sink, the records that
// succeeded and those that failed, the first failure, the limit, and the
// function that restores the limit.
func fillUntilNoRoom(t *testing.T, path string) (s *sqlite.Sink, acked, refused []int, firstErr error, limit uint64, restore func()) {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := recordRoom(s, 0); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	limit = uint64(fi.Size()) + 32<<10
	restore = lowerFileSizeLimit(t, limit)
	acked = []int{0}
	for i := 1; len(refused) < 3; i++ {
		if i == 1000 {
			t.Fatalf("1000 records under a file-size limit of %d bytes; the WAL should have reached it", limit)
		}
		switch err := recordRoom(s, i); {
		case err == nil:
			acked = append(acked, i)
		case errors.Is(err, sqlite.ErrNoRoom):
			refused = append(refused, i)
			if firstErr == nil {
				firstErr = err
			}
		default:
			t.Fatalf("record %d under the limit: %v, want ErrNoRoom", i, err)
		}
	}
	return s, acked, refused, firstErr, limit, restore
}

// wantRecorded opens path afresh and checks that every acked record is there.
func wantRecorded(t *testing.T, path string, acked []int) {
	t.Helper()
	sqlitetest.IntegrityCheck(t, path)
	r, err := sqlite.Open(context.Background(), path, sink.Options{ReadOnly: true}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, i := range acked {
		if _, err := r.Get(context.Background(), roomKey(i)); err != nil {
			t.Errorf("acknowledged record %d: %v", i, err)
		}
	}
}

// TestNoRoomIsNotBroken: a sink whose files cannot grow fails its writes
// with ErrNoRoom and a one-line message that names the file at the limit and
// what to do, commits nothing of them, and is not broken: once there is room
// again, the same sink writes again. Every Record that succeeded is in the
// file afterwards.
func TestNoRoomIsNotBroken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, acked, refused, firstErr, limit, restore := fillUntilNoRoom(t, path)
	msg := firstErr.Error()
	for _, want := range []string{path + "-wal", fmt.Sprintf("file-size limit of %d bytes", limit), "raise the limit", "nothing of this write was committed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	if !strings.HasPrefix(msg, "sqlite sink "+path+": ") || strings.Contains(msg, "\n") {
		t.Errorf("the error is not one line naming the database first:\n%s", msg)
	}
	if err := s.Broken(); err != nil {
		t.Fatalf("no room marked the sink broken: %v", err)
	}
	for _, i := range refused {
		if _, err := s.Get(context.Background(), roomKey(i)); !errors.Is(err, sink.ErrNotFound) {
			t.Errorf("refused record %d: Get = %v, want ErrNotFound (nothing committed)", i, err)
		}
	}

	restore()
	for _, i := range refused {
		if err := recordRoom(s, i); err != nil {
			t.Fatalf("record %d once the limit was back: %v", i, err)
		}
		acked = append(acked, i)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wantRecorded(t, path, acked)
}

// TestNoRoomAtClose: a sink closed while its files cannot grow (the
// checkpoint of the last close cannot extend the database file) loses
// nothing it acknowledged: the WAL keeps it, and the next open, with room,
// finds every record.
func TestNoRoomAtClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	s, acked, _, _, limit, restore := fillUntilNoRoom(t, path)
	// Nor may the database file grow: the WAL's pages cannot be copied
	// into it.
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	restore()
	restore = lowerFileSizeLimit(t, min(limit, uint64(fi.Size())))
	s.Close() // its error, if any, is not the point
	restore()
	if _, err := os.Stat(path + "-wal"); err != nil {
		t.Fatalf("the close removed the WAL (%v): its checkpoint could write the file after all", err)
	}
	wantRecorded(t, path, acked)
}
