package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// corruptKeys is how many keys the corruption fixtures hold: enough for the
// keys table and its index to have several levels of pages.
const corruptKeys = 600

func corruptKey(i int) string { return fmt.Sprintf("gemini:batches/corrupt-%05d", i) }

var (
	fixtureOnce sync.Once
	fixturePath string
	fixtureErr  error
)

// corruptFixture returns a copy of a closed database (everything
// checkpointed into the main file) with corruptKeys keys, the first half
// done. The original is built once per test binary, by concurrent callers so
// that group commit makes it quick.
func corruptFixture(t *testing.T) string {
	t.Helper()
	fixtureOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gemrecon-corrupt-")
		if err != nil {
			fixtureErr = err
			return
		}
		cleanups = append(cleanups, func() { os.RemoveAll(dir) })
		fixturePath = filepath.Join(dir, "sink.db")
		fixtureErr = buildFixture(fixturePath)
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	path := filepath.Join(t.TempDir(), "sink.db")
	copyFile(t, fixturePath, path, 0o600)
	return path
}

func buildFixture(path string) error {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		return err
	}
	var g errgroup
	for w := range 16 {
		g.Go(func() error {
			for i := w; i < corruptKeys; i += 16 {
				k := corruptKey(i)
				if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(`{"name":"` + k + `"}`)}); err != nil {
					return err
				}
				if i < corruptKeys/2 {
					c, err := s.Claim(ctx, k, "fixture", time.Hour, sink.ClaimOptions{})
					if err != nil {
						return err
					}
					if err := s.Complete(ctx, k, c.Token); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	if err := errors.Join(g.Wait(), s.Close()); err != nil {
		return err
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		return errors.New("a -wal file is left after Close: the fixture is not all in the main file")
	}
	return nil
}

// errgroup runs functions and joins their errors.
type errgroup struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *errgroup) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	})
}

func (g *errgroup) Wait() error {
	g.wg.Wait()
	return errors.Join(g.errs...)
}

// wantCorrupt fails unless err is the one-line message of a damaged file:
// naming it, what was found, and what to do.
func wantCorrupt(t *testing.T, what, path string, err error, found ...string) {
	t.Helper()
	oneLine(t, what, err, append([]string{path, "damaged", "restore it from a backup", "move it away", "PRAGMA integrity_check"}, found...)...)
	if !errors.Is(err, sqlite.ErrCorrupt) || !errors.Is(err, sink.ErrUnusable) {
		t.Fatalf("%s: error %v does not wrap ErrCorrupt and ErrUnusable", what, err)
	}
}

// A damaged header is found at open, before SQLite touches the file, for a
// writing and a read-only open.
func TestCorruptHeader(t *testing.T) {
	for _, tt := range []struct {
		name  string
		off   int64
		b     []byte
		found string
	}{
		{"page size", 16, []byte{0x00, 0x03}, "page size 3"},
		{"payload fraction", 21, []byte{0x41}, "payload fractions"},
		{"free-page list", 32, []byte{0x7f, 0xff, 0xff, 0xff}, "free-page list"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := corruptFixture(t)
			sqlitetest.Overwrite(t, path, tt.off, tt.b)
			for _, ro := range []bool{false, true} {
				_, err := openRW(path, sink.Options{ReadOnly: ro})
				wantCorrupt(t, fmt.Sprintf("Open(read-only=%v)", ro), path, err, tt.found)
			}
		})
	}
}

// A damaged root page of an index or a table is found at open; before,
// Open and Ping succeeded and the first write failed.
func TestCorruptRootPage(t *testing.T) {
	for _, o := range []struct{ typ, name string }{
		{"index", "gemrecon_keys_due"}, {"table", "gemrecon_keys"}, {"table", "gemrecon_payloads"}, {"table", "gemrecon_meta"},
	} {
		t.Run(o.name, func(t *testing.T) {
			path := corruptFixture(t)
			pgno, size := sqlitetest.Page(t, path, sqlitetest.RootPage, o.name)
			sqlitetest.TrashPage(t, path, pgno, size)
			before := snapshot(t, path)
			for _, ro := range []bool{false, true} {
				_, err := openRW(path, sink.Options{ReadOnly: ro})
				wantCorrupt(t, fmt.Sprintf("Open(read-only=%v)", ro), path, err, fmt.Sprintf("%s %s (root page %d)", o.typ, o.name, pgno))
			}
			if after := snapshot(t, path); after != before {
				t.Fatalf("a refused Open changed the damaged file: %q → %q", before, after)
			}
		})
	}
}

// A damaged data page that only a later read meets breaks the sink from
// then on: Ping fails (readiness), and so do writes and Records, even those
// that need no disk (a duplicate of a done key).
func TestCorruptDataPageFoundLater(t *testing.T) {
	ctx := context.Background()
	path := corruptFixture(t)
	pgno, size := sqlitetest.Page(t, path, sqlitetest.LastLeaf, "gemrecon_keys") // holds the greatest keys
	sqlitetest.TrashPage(t, path, pgno, size)

	s, err := openRW(path, sink.Options{})
	if err != nil {
		t.Fatalf("Open = %v; the damage is in a page the open check does not read", err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping before the damage is met = %v", err)
	}
	if s.Broken() != nil {
		t.Fatalf("Broken before the damage is met = %v", s.Broken())
	}
	// A done key on an intact page is answered from the database (and then
	// from the done cache).
	if r, err := s.Record(ctx, sink.Sighting{Key: corruptKey(0), Source: sink.SourceWebhook}); err != nil || r.State != sink.StateDone {
		t.Fatalf("Record(done key) = %+v, %v", r, err)
	}
	_, err = s.Get(ctx, corruptKey(corruptKeys-1))
	wantCorrupt(t, "Get(key on the damaged page)", path, err)
	if !errors.Is(s.Broken(), sqlite.ErrCorrupt) {
		t.Fatalf("Broken after the damage was met = %v, want ErrCorrupt", s.Broken())
	}
	wantCorrupt(t, "Ping", path, s.Ping(ctx))
	_, err = s.Record(ctx, sink.Sighting{Key: "gemini:batches/new", Source: sink.SourceWebhook})
	wantCorrupt(t, "Record(new key)", path, err)
	_, err = s.Record(ctx, sink.Sighting{Key: corruptKey(0), Source: sink.SourceWebhook})
	wantCorrupt(t, "Record(cached done key)", path, err)
	_, err = s.ClaimDue(ctx, "w", time.Minute, 10, sink.ClaimOptions{})
	wantCorrupt(t, "ClaimDue", path, err)
}
