package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestMain lets tests run this binary as the real gemrecon (for signals and
// process-level behaviour): GEMRECON_CLI_CHILD=1 makes it main().
func TestMain(m *testing.M) {
	if os.Getenv("GEMRECON_CLI_CHILD") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// result is one in-process command line's outcome.
type result struct {
	code           int
	stdout, stderr string
}

// gemrecon runs one command line in-process with buffers for streams.
func gemrecon(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(context.Background(), args, strings.NewReader(""), &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func (r result) String() string {
	return "exit " + itoa(r.code) + "\nstdout:\n" + r.stdout + "\nstderr:\n" + r.stderr
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got %v", code, r)
	}
}

// newDB creates an empty, migrated SQLite sink file and returns its path.
func newDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sink.db")
	s, err := sqlite.Open(context.Background(), path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// withSink opens the database at path for a test to arrange rows.
func withSink(t *testing.T, path string, opt sink.Options, fn func(s sink.Sink)) {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fn(s)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStatusUnknownKeyOnEmptyDatabase(t *testing.T) {
	db := newDB(t)
	for _, arg := range []string{"projects/p/locations/us/operations/abc-123/", "gemini:operations/abc-123"} {
		r := gemrecon(t, "--db", db, "status", arg)
		wantCode(t, r, exitUnknownKey)
		if !strings.Contains(r.stdout, "gemini:operations/abc-123") {
			t.Errorf("status %q: stdout %q does not show the canonical key", arg, r.stdout)
		}
		r = gemrecon(t, "--db", db, "status", "--json", arg)
		wantCode(t, r, exitUnknownKey)
		var got map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got["key"] != "gemini:operations/abc-123" || got["state"] != "unknown" {
			t.Errorf("status --json %q = %s (err %v), want key and state unknown", arg, r.stdout, err)
		}
	}
}

func TestReadOnlyCommandsNeverCreateTheDatabase(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope", "sink.db")
	for _, args := range [][]string{{"status", "batches/x"}, {"list"}, {"stats"}} {
		r := gemrecon(t, append([]string{"--db", missing}, args...)...)
		wantCode(t, r, exitFatal)
		if !strings.Contains(r.stderr, missing) {
			t.Errorf("%v: stderr %q does not name the path %s", args, r.stderr, missing)
		}
		if strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%v: want a one-line error, got %q", args, r.stderr)
		}
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("a read-only command created %s (stat err %v)", missing, err)
	}
	// GEMRECON_DB works like --db.
	t.Setenv("GEMRECON_DB", missing)
	r := gemrecon(t, "status", "batches/x")
	wantCode(t, r, exitFatal)
	if !strings.Contains(r.stderr, missing) {
		t.Errorf("GEMRECON_DB: stderr %q does not name %s", r.stderr, missing)
	}
}

func TestStatusExitCodesFollowState(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	withSink(t, db, sink.Options{MaxAttempts: 1}, func(s sink.Sink) {
		for _, k := range []string{"gemini:batches/done", "gemini:batches/pending", "gemini:batches/claimed", "gemini:batches/dead"} {
			if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{"name":"` + k[7:] + `"}`)}); err != nil {
				t.Fatal(err)
			}
		}
		c, err := s.Claim(ctx, "gemini:batches/done", "test", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, c.Key, c.Token); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(ctx, "gemini:batches/claimed", "test", time.Hour); err != nil {
			t.Fatal(err)
		}
		c, err = s.Claim(ctx, "gemini:batches/dead", "test", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Fail(ctx, c.Key, c.Token, sink.Failure{Cause: "boom: the downstream said no"}); err != nil {
			t.Fatal(err)
		}
	})
	for _, tc := range []struct {
		name string
		code int
		want string
	}{
		{"batches/done", exitOK, "done"},
		{"batches/pending", exitNotDone, "pending"},
		{"batches/claimed", exitNotDone, "claimed"},
		{"batches/dead", exitDead, "boom: the downstream said no"},
	} {
		r := gemrecon(t, "--db", db, "status", tc.name)
		if r.code != tc.code || !strings.Contains(r.stdout, tc.want) {
			t.Errorf("status %s: want exit %d and %q in stdout, got %v", tc.name, tc.code, tc.want, r)
		}
		r = gemrecon(t, "--db", db, "status", "--json", tc.name)
		var got map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
			t.Fatalf("status --json %s: %v\n%s", tc.name, err, r.stdout)
		}
		for _, field := range []string{"key", "state", "attempts", "token", "first_source", "sources", "seen_count", "first_seen_at", "last_seen_at", "conflicts", "operation"} {
			if _, ok := got[field]; !ok {
				t.Errorf("status --json %s: field %q missing in %s", tc.name, field, r.stdout)
			}
		}
	}

	r := gemrecon(t, "--db", db, "list", "--state", "dead", "--json")
	wantCode(t, r, exitOK)
	var entries []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &entries); err != nil || len(entries) != 1 || entries[0]["key"] != "gemini:batches/dead" {
		t.Fatalf("list --state dead --json = %s (err %v), want the one dead key", r.stdout, err)
	}
	r = gemrecon(t, "--db", db, "stats", "--json")
	wantCode(t, r, exitOK)
	var st sink.Stats
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	want := map[sink.State]int64{sink.StateDone: 1, sink.StatePending: 1, sink.StateClaimed: 1, sink.StateDead: 1}
	for s, n := range want {
		if st.ByState[s] != n {
			t.Errorf("stats by_state[%s] = %d, want %d (%s)", s, st.ByState[s], n, r.stdout)
		}
	}
	if st.FirstSource[sink.SourceWebhook] != 4 {
		t.Errorf("stats first_source[webhook] = %d, want 4", st.FirstSource[sink.SourceWebhook])
	}

	// retry brings the dead key back; a key that is not dead is refused.
	r = gemrecon(t, "--db", db, "retry", "batches/dead")
	wantCode(t, r, exitOK)
	r = gemrecon(t, "--db", db, "status", "batches/dead")
	wantCode(t, r, exitNotDone)
	r = gemrecon(t, "--db", db, "retry", "batches/done")
	wantCode(t, r, exitFatal)
	r = gemrecon(t, "--db", db, "retry", "--all-dead")
	wantCode(t, r, exitOK)
}

func TestPurgeRefusesShorterThanLookback(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if err := s.NoteLookback(ctx, 72*time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	r := gemrecon(t, "--db", db, "purge", "--older-than", "24h")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "72h") {
		t.Errorf("purge refusal should name the lookback: %v", r)
	}
	wantCode(t, gemrecon(t, "--db", db, "purge", "--older-than", "24h", "--force"), exitOK)
	wantCode(t, gemrecon(t, "--db", db, "purge", "--older-than", "100h"), exitOK)

	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if err := s.NoteLookback(ctx, 0); err != nil {
			t.Fatal(err)
		}
	})
	r = gemrecon(t, "--db", db, "purge", "--older-than", "10000h")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "lookback 0") {
		t.Errorf("purge after a lookback-0 poll should say why: %v", r)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	db := newDB(t)
	for _, args := range [][]string{
		{"status"},
		{"status", "a", "b"},
		{"nosuchcommand"},
		{"list", "--nosuchflag"},
		{"list", "--state", "sleeping"},
		{"--log-format", "xml", "stats"},
		{"--log-level", "loud", "stats"},
		{"drain", "--effect-timeout", "10m", "--lease", "5m"},
		{"drain", "--exec", "true", "--forward", "http://127.0.0.1:1/"},
		{"purge"},
		{"retry"},
	} {
		r := gemrecon(t, append([]string{"--db", db}, args...)...)
		if r.code != exitUsage || r.stderr == "" {
			t.Errorf("%v: want exit 2 with a message, got %v", args, r)
		}
	}
}

func TestBadDatabaseFiles(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notDB, []byte("this is not a database, just some text that is long enough to fill a header block................................................"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(notDB)
	for _, tc := range []struct{ name, path string }{
		{"directory", dir},
		{"not sqlite", notDB},
	} {
		for _, args := range [][]string{{"stats"}, {"drain"}} {
			r := gemrecon(t, append([]string{"--db", tc.path}, args...)...)
			wantCode(t, r, exitFatal)
			if !strings.Contains(r.stderr, tc.path) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
				t.Errorf("%s %v: want a one-line error naming %s, got %v", tc.name, args, tc.path, r)
			}
		}
	}
	after, _ := os.ReadFile(notDB)
	if !bytes.Equal(before, after) {
		t.Fatal("a failed open changed the non-database file")
	}
}

func TestVersion(t *testing.T) {
	r := gemrecon(t, "version")
	wantCode(t, r, exitOK)
	if !strings.HasPrefix(r.stdout, "gemrecon ") {
		t.Fatalf("version = %q", r.stdout)
	}
}

func TestEveryCommandHasAnExample(t *testing.T) {
	a := &app{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
	root := a.rootCommand()
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("gemrecon %s has no --help example", c.Name())
		}
	}
}

func TestShellCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		r := gemrecon(t, "completion", shell)
		wantCode(t, r, exitOK)
		if !strings.Contains(r.stdout, "gemrecon") {
			t.Errorf("completion %s printed no script", shell)
		}
	}
}

// child returns a command that runs this test binary as gemrecon.
func child(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "GEMRECON_CLI_CHILD=1")
	return cmd
}
