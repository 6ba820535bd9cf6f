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
)

// TestNoRoomIsNotBroken: a sink whose files cannot grow (this process's
// soft file-size limit lowered to a little above them, as a full disk
// would; the tests of this package do not run in parallel) fails its writes
// with ErrNoRoom and a message that names the file at the limit, commits
// nothing of them, and is not broken: once the limit is back, the same sink
// writes again. Every Record that succeeded is in the file afterwards.
func TestNoRoomIsNotBroken(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	record := func(i int) error {
		name := fmt.Sprintf("batches/room-%04d", i)
		_, err := s.Record(ctx, sink.Sighting{Key: "gemini:" + name, Source: sink.SourceWebhook, Payload: []byte(`{"name":"` + name + `"}`)})
		return err
	}
	if err := record(0); err != nil {
		t.Fatal(err)
	}
	wal := path + "-wal"
	fi, err := os.Stat(wal)
	if err != nil {
		t.Fatal(err)
	}

	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &orig); err != nil {
		t.Fatal(err)
	}
	lowered := orig
	lowered.Cur = uint64(fi.Size()) + 32<<10
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lowered); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &orig); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()

	acked := []int{0}
	var refused []int
	var firstErr error
	for i := 1; len(refused) < 3; i++ {
		if i == 1000 {
			t.Fatalf("1000 records under a file-size limit of %d bytes; the WAL should have reached it", lowered.Cur)
		}
		switch err := record(i); {
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
	msg := firstErr.Error()
	for _, want := range []string{path, wal, fmt.Sprintf("file-size limit of %d bytes", lowered.Cur), "raise the limit", "nothing of this write was committed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the error is more than one line:\n%s", msg)
	}
	if err := s.Broken(); err != nil {
		t.Fatalf("no room marked the sink broken: %v", err)
	}
	for _, i := range refused {
		if _, err := s.Get(ctx, fmt.Sprintf("gemini:batches/room-%04d", i)); !errors.Is(err, sink.ErrNotFound) {
			t.Errorf("refused record %d: Get = %v, want ErrNotFound (nothing committed)", i, err)
		}
	}

	restore()
	for _, i := range refused {
		if err := record(i); err != nil {
			t.Fatalf("record %d once the limit was back: %v", i, err)
		}
		acked = append(acked, i)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := sqlite.Open(ctx, path, sink.Options{ReadOnly: true}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, i := range acked {
		if _, err := r.Get(ctx, fmt.Sprintf("gemini:batches/room-%04d", i)); err != nil {
			t.Errorf("acknowledged record %d: %v", i, err)
		}
	}
}
