package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/tcpproxy"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

const unusableSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// deliverOnce POSTs one signed batch event and returns the status and body.
func deliverOnce(t *testing.T, url, id string) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"type":"batch.succeeded","version":"v1","data":{"id":%q}}`, id)
	h, err := testkit.SignWebhook(unusableSecret, "msg-"+id, time.Now(), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return postJSON(t, url, body, h)
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A real serve process whose database file is deleted, or replaced by
// another file renamed over it, stops acknowledging: every webhook after
// that gets 503 (its record went to a file no one can see), /readyz 503,
// one loud error in the log, and exit status 1 at shutdown naming the file.
func TestServeDatabaseDeletedOrReplaced(t *testing.T) {
	parallel(t)
	for _, tt := range []struct {
		name string
		do   func(t *testing.T, db string)
	}{
		{"deleted", func(t *testing.T, db string) {
			if err := os.Remove(db); err != nil {
				t.Fatal(err)
			}
		}},
		{"replaced", func(t *testing.T, db string) {
			other := newDB(t)
			if err := os.Rename(other, db); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db := initDB(t, filepath.Join(t.TempDir(), "s.db"))
			addr := freeAddr(t)
			cmd := child(t, "--db", db, "serve", "--listen", addr, "--print")
			cmd.Env = append(cmd.Env, "GEMRECON_WEBHOOK_SECRET="+unusableSecret)
			var stderr testkit.Buffer
			cmd.Stderr = &stderr
			cmd.Stdout = io.Discard
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			base := "http://" + addr
			waitHealthy(t, base+"/readyz", &stderr)
			if code, body := deliverOnce(t, base+"/webhook", "before"); code/100 != 2 {
				t.Fatalf("delivery before = %d %s", code, body)
			}

			tt.do(t, db)

			for i := range 3 {
				code, body := deliverOnce(t, base+"/webhook", fmt.Sprintf("after-%d", i))
				if code != http.StatusServiceUnavailable || !strings.Contains(body, "deleted or replaced") {
					t.Fatalf("delivery %d after the file went = %d %s; want 503 saying why\n%s", i, code, body, &stderr)
				}
			}
			if code := getStatus(t, base+"/readyz"); code != http.StatusServiceUnavailable {
				t.Fatalf("/readyz after the file went = %d, want 503", code)
			}
			if n := strings.Count(stderr.String(), "THE DATABASE IS UNUSABLE"); n != 1 {
				t.Fatalf("the loud error was logged %d times, want once\n%s", n, &stderr)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, 30*time.Second, &stderr); code != exitFatal {
				t.Fatalf("serve exited with status %d, want 1\n%s", code, &stderr)
			}
			last := lastLine(stderr.String())
			if !strings.Contains(last, "gemrecon: ") || !strings.Contains(last, db) || !strings.Contains(last, "restart gemrecon") {
				t.Fatalf("serve's last line %q should name the file and what to do", last)
			}
		})
	}
}

func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// damagedDB writes a database with n pending keys k-00000… (first seen in
// that order) and fills the given page of it with 0xff bytes; page is
// chosen by pick from the database's b-tree pages.
func damagedDB(t *testing.T, n int, pick string) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sink.db")
	s, err := sqlite.Open(ctx, path, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				name := fmt.Sprintf("batches/k-%05d", i)
				if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:" + name, Source: sink.SourceWebhook,
					Payload: []byte(`{"name":"` + name + `","done":true}`)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	pgno, size := sqlitetest.Page(t, path, pick)
	sqlitetest.TrashPage(t, path, pgno, size)
	return path
}

const (
	dueIndexRoot = `SELECT rootpage FROM sqlite_schema WHERE name = 'gemrecon_keys_due'`
	// The keys table's last leaf holds the greatest keys.
	lastKeysLeaf = `SELECT pageno FROM dbstat WHERE name = 'gemrecon_keys' AND pagetype = 'leaf' AND path <> '/' ORDER BY path DESC LIMIT 1`
	// Its second leaf holds some of the smallest, claimed first; the open
	// check reads only the first.
	secondKeysLeaf = `SELECT pageno FROM dbstat WHERE name = 'gemrecon_keys' AND pagetype = 'leaf' AND path <> '/' ORDER BY path LIMIT 1 OFFSET 1`
)

// wantDamaged fails unless the command exited 1 with an error line that
// names the file and what to do.
func wantDamaged(t *testing.T, r result, db string) {
	t.Helper()
	if r.code != exitFatal {
		t.Fatalf("want exit 1, got %v", r)
	}
	for _, line := range strings.Split(r.stderr, "\n") {
		ok := strings.HasPrefix(line, "gemrecon: ")
		for _, w := range []string{db, "damaged", "restore it from a backup", "PRAGMA integrity_check"} {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return
		}
	}
	t.Fatalf("no error line names %s as damaged and says what to do:\n%s", db, r.stderr)
}

// drain on a damaged file: a damaged root page is found at open, before any
// effect runs; a damaged data page found by a later write fails the run.
// Both exit 1 with a message naming the file and what to do.
func TestDrainDamagedDatabase(t *testing.T) {
	parallel(t)
	t.Run("index root", func(t *testing.T) {
		db := damagedDB(t, 2000, dueIndexRoot)
		log := filepath.Join(t.TempDir(), "effects.log")
		r := gemrecon(t, "--db", db, "drain", "--exec", "echo $GEMRECON_KEY >> "+shellQuote(log))
		wantDamaged(t, r, db)
		if b, err := os.ReadFile(log); err == nil && len(b) > 0 {
			t.Fatalf("effects ran on a damaged database: %q", b)
		}
	})
	t.Run("data page found later", func(t *testing.T) {
		db := damagedDB(t, 2000, secondKeysLeaf)
		r := gemrecon(t, "--db", db, "drain", "--exec", "true", "--concurrency", "4")
		wantDamaged(t, r, db)
	})
}

// poll on a file whose damage only a Record meets (the page of the listed
// key): exit 1 with the message.
func TestPollDamagedDatabase(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	db := damagedDB(t, 2000, lastKeysLeaf)
	api := fakeAPI(t)
	api.Add(geminifake.Batch{Name: geminifake.GeminiName("k-01999"), State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Hour)})
	r := gemrecon(t, pollArgs(db, api, "--print")...)
	wantDamaged(t, r, db)
}

// runBounded runs cmd and returns its exit status and stderr, failing the
// test if it is still running after max.
func runBounded(t *testing.T, cmd *exec.Cmd, max time.Duration) (int, string, time.Duration) {
	t.Helper()
	var stderr testkit.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return exitStatus(err), stderr.String(), time.Since(start)
	case <-time.After(max):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("still running after %v (killed)\n%s", max, &stderr)
		return 0, "", 0
	}
}

// drain against a PostgreSQL server that accepts TCP and never answers
// (connecting is bounded by the default connect timeout, 10 s), or that stops
// answering mid-run (here connect_timeout=1 and statement_timeout=100ms, so
// one round trip may take 100ms + 5s; then settling the unknown outcome
// costs two connect timeouts), exits 1 within those deadlines, saying what
// timed out. Before, connecting waited for as long as the peer kept the
// connection, and a claim for 30 s of dispatch's own timeout.
func TestDrainStalledPostgres(t *testing.T) {
	base := pgtest.Schema(t)
	ctx := context.Background()
	s, err := postgres.Open(ctx, base, sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/stalled", Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	t.Run("connect", func(t *testing.T) {
		t.Parallel()
		p, pdsn := tcpproxy.ForDSN(t, base)
		p.Stall()
		// No connect_timeout in the DSN: the default bounds it.
		code, stderr, took := runBounded(t, child(t, "--db", pdsn, "drain", "--exec", "true"), 60*time.Second)
		if code != exitFatal || !strings.Contains(stderr, "could not connect within the connect timeout of 10s") || took > 20*time.Second {
			t.Fatalf("drain against a stalled connect: exit %d after %v\n%s", code, took, stderr)
		}
		t.Logf("exit 1 after %v", took.Round(time.Millisecond))
	})
	t.Run("mid-run", func(t *testing.T) {
		t.Parallel()
		p, pdsn := tcpproxy.ForDSN(t, base)
		p.StallWhenClientSends([]byte("SKIP LOCKED")) // ClaimDue's statement
		code, stderr, took := runBounded(t, child(t, "--db", pdsn+"&connect_timeout=1&statement_timeout=100", "drain", "--exec", "true"), 60*time.Second)
		if code != exitFatal || !strings.Contains(stderr, "no reply from the PostgreSQL server within 5.1s") || took > 20*time.Second {
			t.Fatalf("drain against a server that stops answering: exit %d after %v\n%s", code, took, stderr)
		}
		t.Logf("exit 1 after %v", took.Round(time.Millisecond))
	})
}
