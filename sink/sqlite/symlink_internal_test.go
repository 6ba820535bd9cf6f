package sqlite

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// fileID is the device and inode of the file at path.
func testFileID(t *testing.T, path string) [2]uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint64{uint64(st.Dev), uint64(st.Ino)}
}

// retarget points the symbolic link at link to target, in one rename.
func retarget(t *testing.T, link, target string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// linkedSink opens a sink through a symbolic link in one directory to a
// database in another, and returns it with the link and the real file.
func linkedSink(t *testing.T) (s *Sink, link, real string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"real", "links"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	real = filepath.Join(dir, "real", "a.db")
	link = filepath.Join(dir, "links", "gemrecon.db")
	if err := os.WriteFile(real, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), link, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, link, real
}

// A link retargeted after SQLite opened the file does not move the sink to
// the new target: a connection its pools open now, which SQLite opens on the
// new target, is refused, and the sink is broken.
func TestLinkRetargetedWhileOpen(t *testing.T) {
	ctx := context.Background()
	s, link, real := linkedSink(t)
	defer s.Close()
	other := filepath.Join(filepath.Dir(real), "b.db")
	o := mustOpen(t, other)
	defer o.Close()
	retarget(t, link, other)

	// The readers' pool has fewer than its 4 connections: some of these
	// are new, and SQLite opens them on the new target.
	refused := 0
	for range 4 {
		c, err := s.db.rdb.Conn(ctx)
		if err != nil {
			if !errors.Is(err, ErrFileReplaced) {
				t.Fatalf("a new reader: %v, want ErrFileReplaced", err)
			}
			refused++
			continue
		}
		defer c.Close()
	}
	if refused == 0 {
		t.Fatal("no new reader connection was refused on the retargeted link")
	}
	// The refusal breaks the sink (ErrFileReplaced's rule), as the next
	// commit's identity check would: nothing more is acknowledged.
	if err := s.Broken(); !errors.Is(err, ErrFileReplaced) {
		t.Errorf("Broken after a refused reader = %v, want ErrFileReplaced", err)
	}
}

func mustOpen(t *testing.T, path string) *Sink {
	t.Helper()
	s, err := Open(context.Background(), path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sqliteName resolves a path as SQLite's unix VFS does: the name SQLite
// gives the file it opened (PRAGMA database_list), after which it names the
// -wal and -shm files. Absolute and relative links, a chain of links, a
// directory link followed by ".." (which goes up from the link's target, not
// back to the link's directory), and a relative path.
func TestSQLiteNameIsSQLites(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"real", "links"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	real := filepath.Join(dir, "real", "a.db")
	s := mustOpen(t, real)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	links := filepath.Join(dir, "links")
	for name, target := range map[string]string{
		"abs.db":   real,
		"rel.db":   "../real/a.db",
		"chain.db": "rel.db",
		"dir":      "../real",
	} {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	// links/dir/.. is dir, not links: links/real does not exist.
	paths := []string{real, filepath.Join(links, "abs.db"), filepath.Join(links, "chain.db"),
		filepath.Join(links, "dir", "a.db"), links + "/dir/../real/a.db", "chain.db", "dir/../real/a.db"}
	t.Chdir(links)
	for _, p := range paths {
		db, err := openDB(p, sink.DefaultBusyTimeout, true)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		err = db.QueryRow(qMainFile).Scan(&want)
		db.Close()
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		got, err := sqliteName(p)
		if err != nil || got != want {
			t.Fatalf("sqliteName(%s) = %q, %v; SQLite names it %q", p, got, err, want)
		}
	}
}

// A database that a live writing sink uses through its real path has a -wal
// file beside it: read through a symbolic link from another directory, it
// must not be read as immutable (a -wal beside the link is looked for in
// vain), since its main file does not hold everything.
func TestNoImmutableReadThroughLinkBesideALiveWriter(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"real", "links"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	real := filepath.Join(dir, "real", "a.db")
	link := filepath.Join(dir, "links", "gemrecon.db")
	s := mustOpen(t, real)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 100)
	f, err := os.Open(real)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadFull(f, head)
	f.Close()
	if err != nil || head[18] != 2 {
		t.Fatalf("header: %v, write version %d; want WAL mode (2)", err, head[18])
	}
	// Nobody uses it: the immutable read of the linked file is the choice.
	if file, ok := immutableFile(link, head); !ok || file != real {
		t.Fatalf("no writer: immutableFile(link) = %q, %v; want %q, true", file, ok, real)
	}

	w := mustOpen(t, real)
	defer w.Close()
	if _, err := w.Record(context.Background(), sink.Sighting{Key: "gemini:batches/live", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	if !exists(real + "-wal") {
		t.Fatal("no -wal beside the live writer's file")
	}
	if file, ok := immutableFile(link, head); ok {
		t.Fatalf("a live writer: immutableFile(link) = %q, true; want no immutable read", file)
	}
	if file, ok := immutableFile(real, head); ok {
		t.Fatalf("a live writer: immutableFile(real) = %q, true; want no immutable read", file)
	}
}
