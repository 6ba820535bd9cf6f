package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// withDSNParams appends params to the DSN of a writing sink's pools.
func withDSNParams(params string) Option { return func(c *config) { c.dsnParams = params } }

// A writing Open whose connections SQLite leaves out of WAL mode is refused
// with one line naming the file and the mode. SQLite really does keep the
// old mode here: with nolock=1 (or a VFS without shared memory) it answers
// PRAGMA journal_mode=WAL with "delete" and no error. That is the one seam
// the test needs: no DSN the sink builds by itself reaches it.
func TestOpenRefusesAJournalModeOtherThanWAL(t *testing.T) {
	ctx := context.Background()
	for _, params := range []string{"&nolock=1", "&vfs=unix-dotfile"} {
		path := filepath.Join(t.TempDir(), "notwal.db")
		s, err := Open(ctx, path, sink.Options{}, withDSNParams(params))
		if err == nil {
			s.Close()
			t.Fatalf("%s: Open succeeded on a database SQLite kept out of WAL mode", params)
		}
		if testing.Verbose() {
			t.Log(err)
		}
		msg := err.Error()
		if !errors.Is(err, ErrNotWAL) || !strings.Contains(msg, path) || !strings.Contains(msg, `journal mode "delete"`) ||
			strings.Contains(msg, "\n") || strings.Count(msg, "sqlite sink") != 1 {
			t.Fatalf("%s: error %q: want one line naming the file and the mode, wrapping ErrNotWAL", params, msg)
		}
		// SQLite itself says the file is not in WAL mode.
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		var mode string
		err = db.QueryRow("PRAGMA journal_mode").Scan(&mode)
		db.Close()
		if err != nil || mode != "delete" {
			t.Fatalf("%s: the file's journal mode: %q, %v", params, mode, err)
		}
	}
}

// A read-only sink is not held to WAL mode: a file in rollback mode (a copy
// made by VACUUM INTO, say) is read as it is, and
// a writing Open puts it back in WAL mode.
func TestReadOnlyReadsARollbackModeFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "rollback.db")
	s := mustOpen(t, path)
	key := "gemini:batches/rollback"
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	err = db.QueryRow("PRAGMA journal_mode=DELETE").Scan(&mode)
	db.Close()
	if err != nil || mode != "delete" {
		t.Fatalf("switch to DELETE: %q, %v", mode, err)
	}
	ro, err := Open(ctx, path, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := ro.Get(ctx, key); err != nil || e.State != sink.StatePending {
		t.Errorf("read-only Get: %+v, %v", e, err)
	}
	ro.Close()
	w := mustOpen(t, path)
	defer w.Close()
	if err := w.db.rdb.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("after a writing Open: %q, %v", mode, err)
	}
}

// TestShellWordIsOneWord: the command lines that messages suggest name the
// database as one shell word, whatever its path holds: a real sh gets the
// path back unchanged. Before, a path with a space was two words.
func TestShellWordIsOneWord(t *testing.T) {
	for _, p := range []string{"/var/lib/gemrecon/gemrecon.db", "my db.db", "it's.db", `a"b$c\d`, "tab\there.db"} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellWord(p)).Output()
		if err != nil {
			t.Fatalf("sh with %q: %v", shellWord(p), err)
		}
		if string(out) != p {
			t.Errorf("shellWord(%q) = %s, which sh reads as %q", p, shellWord(p), out)
		}
	}
}
