package sqlite_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// oneLine fails unless err is a one-line message containing every want.
func oneLine(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: error = nil, want one containing %q", what, want)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Fatalf("%s: error spans lines: %q", what, msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Fatalf("%s: error = %q, want it to contain %q", what, msg, w)
		}
	}
}

func rawExec(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

func openRW(path string, opt sink.Options) (*sqlite.Sink, error) {
	return sqlite.Open(context.Background(), path, opt, quiet)
}

func TestOpenCreatesFileMode0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	s, err := openRW(path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600", fi.Mode().Perm())
	}
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

func TestOpenBadInput(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string) // prepares path
		opt   sink.Options
		is    error
		want  []string
	}{
		{
			name:  "directory",
			setup: func(t *testing.T, path string) { os.Mkdir(path, 0o755) },
			want:  []string{"is a directory"},
		},
		{
			name: "not sqlite",
			setup: func(t *testing.T, path string) {
				os.WriteFile(path, []byte("name,state\nbatches/x,done\n"), 0o600)
			},
			want: []string{"file is not a database"},
		},
		{
			name: "not sqlite read-only",
			setup: func(t *testing.T, path string) {
				os.WriteFile(path, []byte("name,state\nbatches/x,done\n"), 0o600)
			},
			opt:  sink.Options{ReadOnly: true},
			want: []string{"file is not a database"},
		},
		{
			name:  "another application",
			setup: func(t *testing.T, path string) { rawExec(t, path, "CREATE TABLE invoices (id INTEGER)") },
			want:  []string{"another application"},
		},
		{
			name:  "missing read-only",
			setup: func(t *testing.T, path string) {},
			opt:   sink.Options{ReadOnly: true},
			is:    sink.ErrNoDatabase,
			want:  []string{"no database"},
		},
		{
			name:  "link to nothing",
			setup: func(t *testing.T, path string) { os.Symlink("missing.db", path) },
			want:  []string{"is a symbolic link to missing.db, which does not exist"},
		},
		{
			name:  "link to nothing read-only",
			setup: func(t *testing.T, path string) { os.Symlink("missing.db", path) },
			opt:   sink.Options{ReadOnly: true},
			is:    sink.ErrNoDatabase,
			want:  []string{"is a symbolic link to missing.db, which does not exist"},
		},
		{
			name: "schema too new",
			setup: func(t *testing.T, path string) {
				s, err := openRW(path, sink.Options{})
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				rawExec(t, path, "PRAGMA user_version = 99", "UPDATE gemrecon_meta SET value = 98 WHERE name = 'min_reader'")
			},
			is:   sink.ErrSchemaTooNew,
			want: []string{"schema version 99", "knows schema version 98 or later", fmt.Sprintf("up to %d", sqlite.SchemaVersion())},
		},
		{
			name: "schema too new read-only",
			setup: func(t *testing.T, path string) {
				s, err := openRW(path, sink.Options{})
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				v := sqlite.SchemaVersion() + 1
				rawExec(t, path, fmt.Sprintf("PRAGMA user_version = %d", v), fmt.Sprintf("UPDATE gemrecon_meta SET value = %d WHERE name = 'min_reader'", v))
			},
			opt:  sink.Options{ReadOnly: true},
			is:   sink.ErrSchemaTooNew,
			want: []string{fmt.Sprintf("schema version %d", sqlite.SchemaVersion()+1), fmt.Sprintf("up to %d", sqlite.SchemaVersion())},
		},
		{
			name: "schema too new without a minimum reader",
			setup: func(t *testing.T, path string) {
				s, err := openRW(path, sink.Options{})
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				rawExec(t, path, "PRAGMA user_version = 99", "DELETE FROM gemrecon_meta WHERE name = 'min_reader'")
			},
			is:   sink.ErrSchemaTooNew,
			want: []string{"schema version 99 records no minimum reader"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.db")
			tt.setup(t, path)
			before := snapshot(t, path)
			s, err := openRW(path, tt.opt)
			if err == nil {
				s.Close()
			}
			oneLine(t, "Open", err, append(tt.want, path)...)
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("Open error = %v, want errors.Is %v", err, tt.is)
			}
			if after := snapshot(t, path); after != before {
				t.Fatalf("Open changed %s: before %q, after %q", path, before, after)
			}
		})
	}
}

// snapshot describes what exists at path and beside it (-wal, -shm), so a
// refused Open can be shown to change nothing.
func snapshot(t *testing.T, path string) string {
	t.Helper()
	var b strings.Builder
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			b.WriteString("absent;")
			continue
		}
		if fi.IsDir() {
			b.WriteString("dir;")
			continue
		}
		data, _ := os.ReadFile(p)
		fmt.Fprintf(&b, "%s %d bytes sha256 %x;", fi.Mode(), len(data), sha256.Sum256(data))
	}
	return b.String()
}

func TestReadOnly(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ro.db")
	s, err := openRW(path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "k", Source: "poll", Payload: []byte("p")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := openRW(path, sink.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("Open(read-only): %v", err)
	}
	defer ro.Close()
	if e, err := ro.Get(ctx, "k"); err != nil || e.State != sink.StatePending {
		t.Fatalf("Get = %+v, %v; want pending", e, err)
	}
	if err := ro.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	_, err = ro.Record(ctx, sink.Sighting{Key: "k2", Source: "poll"})
	if !errors.Is(err, sqlite.ErrReadOnly) {
		t.Fatalf("Record on a read-only sink = %v, want ErrReadOnly", err)
	}
	if _, err := ro.Claim(ctx, "k", "o", time.Minute, sink.ClaimOptions{}); !errors.Is(err, sqlite.ErrReadOnly) {
		t.Fatalf("Claim on a read-only sink = %v, want ErrReadOnly", err)
	}
}

// A file the process may not write must be refused at Open, naming the file.
// Root may write anything, so as root the check runs in a child process that
// drops to the nobody user (testkit.DropToNobody).
func TestOpenReadOnlyFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "gemrecon-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ro.db")
	s, err := openRW(path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, path)
	var msg string
	if os.Geteuid() != 0 {
		_, err := openRW(path, sink.Options{})
		if err == nil {
			t.Fatal("Open of a read-only file succeeded")
		}
		msg = "error: " + err.Error()
	} else {
		cmd := child(t, "open-as-nobody", path)
		cmd.Dir = dir // all DropToNobody makes searchable is dir and its parents
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("child as nobody: %v (%s)", err, out)
		}
		msg = strings.TrimSpace(string(out))
	}
	if !strings.HasPrefix(msg, "error: ") || !strings.Contains(msg, path) || !strings.Contains(msg, "read-only") || strings.Contains(msg, "\n") {
		t.Fatalf("Open(read-only file) = %q, want one error line naming %s as read-only", msg, path)
	}
	t.Logf("Open(read-only file) = %s", msg)
	if after := snapshot(t, path); after != before {
		t.Fatalf("Open changed the file: %q → %q", before, after)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// Another process holding the write lock beyond the busy timeout is reported
// as such, at Open and on a later write; once it lets go, writes work again.
func TestLockedByAnotherProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "locked.db")
	opt := sink.Options{BusyTimeout: 200 * time.Millisecond}
	early, err := openRW(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()

	release := sqlitetest.HoldLock(t, path)

	_, err = openRW(path, opt)
	oneLine(t, "Open while locked", err, path, "locked by another process")
	_, err = early.Record(ctx, sink.Sighting{Key: "k", Source: "poll"})
	oneLine(t, "Record while locked", err, path, "locked by another process")
	oneLine(t, "Ping while locked", early.Ping(ctx), path, "locked by another process")

	release()
	if t.Failed() {
		t.FailNow() // the holder failed
	}
	if r, err := early.Record(ctx, sink.Sighting{Key: "k", Source: "poll"}); err != nil || !r.New {
		t.Fatalf("Record after the lock went = %+v, %v; want new", r, err)
	}
}

// The committed v1 fixture upgrades to the current schema and keeps its rows.
func TestUpgradeFromV1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v1.db")
	copyFile(t, "../../testdata/sink/schema-v1.db", path, 0o600)

	// A read-only open neither reads nor upgrades an older schema.
	_, err := openRW(path, sink.Options{ReadOnly: true})
	oneLine(t, "read-only Open(v1)", err, path, "schema version 1 is older", "writing command")
	if v := sqlitetest.UserVersion(t, sqlitetest.ReadOnly(path)); v != 1 {
		t.Fatalf("user_version after a read-only open = %d, want 1", v)
	}

	clk := time.Date(2026, 1, 2, 5, 0, 0, 0, time.UTC)
	s, err := openRW(path, sink.Options{Now: func() time.Time { return clk }})
	if err != nil {
		t.Fatalf("Open(v1): %v", err)
	}
	defer s.Close()
	if v := sqlitetest.UserVersion(t, sqlitetest.ReadOnly(path)); v != sqlite.SchemaVersion() || v < 2 {
		t.Fatalf("user_version after Open = %d, want %d", v, sqlite.SchemaVersion())
	}
	want := map[string]sink.State{
		"gemini:batches/pending": sink.StatePending,
		"gemini:batches/done":    sink.StateDone,
		"gemini:batches/dead":    sink.StateDead,
		"gemini:batches/claimed": sink.StateClaimed,
	}
	for k, st := range want {
		e, err := s.Get(ctx, k)
		if err != nil || e.State != st {
			t.Fatalf("Get(%q) = %s, %v; want %s", k, e.State, err, st)
		}
	}
	if e, _ := s.Get(ctx, "gemini:batches/done"); e.SeenCount != 3 || len(e.Sources) != 2 || e.FirstSource != "webhook" ||
		string(e.Payload) != `{"name":"batches/done"}` {
		t.Fatalf("done entry = %+v", e)
	}
	// Version 4: rows stored before are confirmed when a poll saw them
	// first; their payloads say no state, so the batch state is unknown.
	for k, confirmed := range map[string]bool{"gemini:batches/pending": true, "gemini:batches/done": false} {
		if e, _ := s.Get(ctx, k); e.Confirmed != confirmed || e.BatchState != "" {
			t.Fatalf("Get(%q) after the upgrade: confirmed %v, batch state %q; want %v, unknown", k, e.Confirmed, e.BatchState, confirmed)
		}
	}
	// Conflicts are by meaning (spec §9.4): a re-rendered payload is none;
	// the API's operation confirms the old webhook-first row (its webhook
	// body kept apart), and a later webhook that says otherwise is one.
	for _, sg := range []sink.Sighting{
		{Key: "gemini:batches/done", Source: "webhook", Payload: []byte(`{"name":"batches/done"}`)},
		{Key: "gemini:batches/done", Source: "webhook", Payload: []byte(`{"name":"batches/done","x":1}`)},
		{Key: "gemini:batches/done", Source: "poll", Payload: []byte(`{"name":"batches/done","metadata":{"state":"BATCH_STATE_FAILED"}}`), State: "FAILED", FromAPI: true},
		{Key: "gemini:batches/done", Source: "webhook", Payload: []byte(`{"type":"batch.succeeded","data":{"id":"done"}}`), State: "SUCCEEDED"},
	} {
		if r, err := s.Record(ctx, sg); err != nil || r.State != sink.StateDone {
			t.Fatalf("Record(old done key, %s) = %+v, %v", sg.Payload, r, err)
		}
	}
	if e, _ := s.Get(ctx, "gemini:batches/done"); e.Conflicts != 1 || e.SeenCount != 7 || !e.Confirmed || e.BatchState != "FAILED" ||
		string(e.Webhook) != `{"name":"batches/done"}` || !strings.Contains(string(e.Payload), "BATCH_STATE_FAILED") {
		t.Fatalf("after four sightings: conflicts %d, seen %d, confirmed %v, batch %q, webhook %s, payload %s; want 1, 7, true, FAILED, the first body, the API's",
			e.Conflicts, e.SeenCount, e.Confirmed, e.BatchState, e.Webhook, e.Payload)
	}
	// Due order survives the move to due_at: the pending row is due, the
	// claimed row's lease (t0+1h) has expired at 05:00.
	if due, err := s.Due(ctx, 0, sink.ClaimOptions{}); err != nil || len(due) != 2 || due[0] != "gemini:batches/pending" {
		t.Fatalf("Due = %q, %v; want pending then claimed", due, err)
	}
	if d, _, ok, err := s.MaxLookback(ctx); err != nil || !ok || d != 72*time.Hour {
		t.Fatalf("MaxLookback = %v, %v, %v", d, ok, err)
	}
	// The new schema's features work on old rows.
	if err := s.Retry(ctx, "gemini:batches/dead", sink.RetryOptions{}); err != nil {
		t.Fatalf("Retry(old dead row): %v", err)
	}
	c, err := s.Claim(ctx, "gemini:batches/claimed", "o", time.Minute, sink.ClaimOptions{})
	if err != nil || !c.Takeover || c.Token != 3 {
		t.Fatalf("takeover of the old claim = %+v, %v", c, err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Fenced != 0 || st.ByState[sink.StatePending] != 2 {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
}

// The refusal of a --db that is a symbolic link to nothing says what to do,
// and only what works: a link to a missing file is refused wherever that
// file would be, in a directory gemrecon may write included (as here), so
// "point it at a path where gemrecon may create it" would only give the
// same refusal again. What works: point the link at the database, or give
// the path of the file to create instead of the link.
func TestOpenLinkToNothingSaysWhatWorks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "gemrecon.db")
	if err := os.Symlink(filepath.Join(dir, "elsewhere.db"), path); err != nil {
		t.Fatal(err)
	}
	_, err := openRW(path, sink.Options{})
	if err == nil {
		t.Fatal("Open of a link to nothing succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "where gemrecon may create it") {
		t.Errorf("error %q: advises pointing the link at a path gemrecon may create, which it already does (refused all the same)", msg)
	}
	if !strings.Contains(msg, "point it at the database") || !strings.Contains(msg, "path of the file to create") {
		t.Errorf("error %q: want it to say: point the link at the database, or give the path of the file to create", msg)
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link's target was created: %v", err)
	}
}
