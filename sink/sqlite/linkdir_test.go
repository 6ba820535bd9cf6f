package sqlite_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// linkedDirs makes, in a new directory, the database real/a.db (a closed
// gemrecon database, mode 0666, in WAL mode with no -wal or -shm) and the
// symbolic link links/gemrecon.db to it, with real/ and links/ given the
// modes realMode and linksMode (0555: this user may not write it; 0777: any
// user may). It returns the new directory, the link and real/.
func linkedDirs(t *testing.T, realMode, linksMode os.FileMode) (base, link, realDir string) {
	t.Helper()
	base, err := os.MkdirTemp("", "gemrecon-linkdir-")
	if err != nil {
		t.Fatal(err)
	}
	realDir = filepath.Join(base, "real")
	linksDir := filepath.Join(base, "links")
	t.Cleanup(func() {
		os.Chmod(realDir, 0o755)
		os.Chmod(linksDir, 0o755)
		os.RemoveAll(base)
	})
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{realDir, linksDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	real := filepath.Join(realDir, "a.db")
	s, err := openRW(real, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(real, 0o666); err != nil {
		t.Fatal(err)
	}
	link = filepath.Join(linksDir, "gemrecon.db")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if got := names(t, realDir); got != "a.db" {
		t.Fatalf("real/ holds %s, want a.db alone", got)
	}
	for d, m := range map[string]os.FileMode{realDir: realMode, linksDir: linksMode} {
		if err := os.Chmod(d, m); err != nil {
			t.Fatal(err)
		}
	}
	return base, link, realDir
}

// names lists the names in dir, sorted, space-separated.
func names(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ns []string
	for _, e := range es {
		ns = append(ns, e.Name())
	}
	sort.Strings(ns)
	return strings.Join(ns, " ")
}

// openAsUser opens path as an ordinary user would, and returns "ok" or
// "error: " and the error, one line. Root may write any directory, so as root
// it opens in a child process that drops to the nobody user
// (testkit.DropToNobody), started in base.
func openAsUser(t *testing.T, base, path string, readOnly bool) string {
	t.Helper()
	if os.Geteuid() != 0 {
		s, err := openRW(path, sink.Options{ReadOnly: readOnly})
		if err != nil {
			return "error: " + err.Error()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		return "ok"
	}
	role := "open-as-nobody"
	if readOnly {
		role = "open-read-only-as-nobody"
	}
	cmd := child(t, role, path)
	cmd.Dir = base // all DropToNobody makes searchable is base and its parents
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child as nobody: %v (%s)", err, out)
	}
	return strings.TrimSpace(string(out))
}

// A --db that is a symbolic link into another directory: SQLite keeps the
// -wal and -shm files beside the file the link points to, so that is the
// directory that must be writable. A read-only target directory is refused
// before SQLite opens anything, naming it (a writable directory of the link
// does not help), and nothing is created there.
func TestOpenThroughLinkIntoReadOnlyDirectory(t *testing.T) {
	base, link, realDir := linkedDirs(t, 0o555, 0o777)
	msg := openAsUser(t, base, link, false)
	want := "sqlite sink " + link + ": directory " + realDir + " (where the link gemrecon.db points) is read-only: SQLite needs to create its -wal and -shm files there"
	if msg != "error: "+want {
		t.Fatalf("Open through the link = %q, want %q", msg, "error: "+want)
	}
	if got := names(t, realDir); got != "a.db" {
		t.Fatalf("after the refused Open, real/ holds %s, want a.db alone", got)
	}
}

// A read-only directory of the link over a writable directory of the file is
// no reason to refuse: nothing is created beside the link.
func TestOpenThroughLinkFromReadOnlyDirectory(t *testing.T) {
	base, link, _ := linkedDirs(t, 0o777, 0o555)
	if msg := openAsUser(t, base, link, false); msg != "ok" {
		t.Fatalf("Open through a link in a read-only directory to a file in a writable one = %q, want ok", msg)
	}
	if got := names(t, filepath.Dir(link)); got != "gemrecon.db" {
		t.Fatalf("the link's directory holds %s, want the link alone", got)
	}
}

// A read-only open that SQLite refuses because it would have to create the
// -wal and -shm files in the target's directory names that directory.
func TestReadOnlyOpenThroughLinkIntoReadOnlyDirectory(t *testing.T) {
	base, link, realDir := linkedDirs(t, 0o555, 0o777)
	msg := openAsUser(t, base, link, true)
	want := "error: sqlite sink " + link + ": cannot read it: its directory " + realDir + " (where the link gemrecon.db points) is not writable by this user"
	if !strings.HasPrefix(msg, want) || strings.Contains(msg, "\n") {
		t.Fatalf("read-only Open through the link = %q, want one line starting %q", msg, want)
	}
}
