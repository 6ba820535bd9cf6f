package main

import (
	"bytes"
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
)

// backendDB is one backend for the tests of issue 24: a database gemrecon
// init has not created yet, a mistyped name of it, and how messages name
// each.
type backendDB struct {
	name         string
	db, typo     string
	where, typoW string // what a message must say of db and of typo
	typoExists   func() bool
}

// backends returns a fresh SQLite path in dir, and a fresh PostgreSQL schema
// when GEMRECON_TEST_POSTGRES is set, each with a mistyped variant: a file
// name with a letter missing, a search_path whose first schema is misspelt
// (public after it, as the docs advise).
func backends(t *testing.T) []backendDB {
	dir := t.TempDir()
	db := filepath.Join(dir, "cron.db")
	typo := filepath.Join(dir, "crn.db")
	bs := []backendDB{{name: "sqlite", db: db, typo: typo, where: db, typoW: "sqlite sink " + typo,
		typoExists: func() bool { _, err := os.Stat(typo); return err == nil }}}
	if os.Getenv(pgtest.EnvDSN) == "" {
		t.Log("PostgreSQL part skipped: set " + pgtest.EnvDSN)
		return bs
	}
	dsn, schema := pgtest.NewSchema(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema+","+"public")
	u.RawQuery = q.Encode()
	good := u.String()
	q.Set("search_path", schema+"x,public")
	u.RawQuery = q.Encode()
	bad := u.String()
	bs = append(bs, backendDB{name: "postgres", db: good, typo: bad,
		where: "search_path " + schema + ",public", typoW: `schema "` + schema + `x": no database: the schema does not exist`,
		typoExists: func() bool {
			c, err := pgx.Connect(context.Background(), good)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			var n int
			if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema+"x").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		}})
	return bs
}

// runChild runs this test binary as gemrecon with args and env added, and
// returns what it did.
func runChild(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := child(t, args...)
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// Issue 24's cases, each as a user would meet it with the built binary,
// on SQLite and PostgreSQL: a mistyped --db (a file name, a search_path
// schema) is refused, creating nothing and running nothing again; so is a
// poll with no effect flag, an empty effect, and an --exec program that
// does not exist; init creates once and then does nothing.
func TestIssue24SafeDefaults(t *testing.T) {
	parallel(t)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			api := fakeAPI(t, "SUCCEEDED", "FAILED")
			env := []string{"GEMINI_API_KEY=" + testAPIKey, "GOOGLE_API_KEY=", "GEMRECON_DB="}
			log := filepath.Join(t.TempDir(), "effects.log")
			effect := `--exec=echo "$GEMRECON_KEY" >> ` + shellQuote(log)

			// A writing command before init: refused, nothing created.
			r := runChild(t, env, pollArgs(b.db, api, effect)...)
			if r.code != exitFatal || !strings.Contains(r.stderr, "run 'gemrecon init' once to create it") {
				t.Fatalf("poll before init: want exit 1 saying to run init, got %v", r)
			}

			r = runChild(t, env, "--db", b.db, "init")
			if r.code != exitOK || !strings.Contains(r.stdout, b.where) || !strings.Contains(r.stdout, "created it") {
				t.Fatalf("init: want exit 0 naming %q and what it created, got %v", b.where, r)
			}
			r = runChild(t, env, "--db", b.db, "init")
			if r.code != exitOK || !strings.Contains(r.stdout, "this gemrecon's; nothing to do") {
				t.Fatalf("second init: want exit 0, nothing to do, got %v", r)
			}
			r = runChild(t, env, pollArgs(b.db, api, effect)...)
			if r.code != exitOK || len(readLines(t, log)) != 2 {
				t.Fatalf("poll after init: want exit 0 and 2 effects, got %v", r)
			}

			// A mistyped database: exit 1 naming what it resolved, the
			// effects not run again, nothing created.
			r = runChild(t, env, pollArgs(b.typo, api, effect)...)
			if r.code != exitFatal || !strings.Contains(r.stderr, b.typoW) || !strings.Contains(r.stderr, "gemrecon init") {
				t.Errorf("poll on a mistyped --db: want exit 1 naming %q and init, got %v", b.typoW, r)
			}
			// So does every other command that writes.
			for _, args := range [][]string{{"drain", "--print"}, {"retry", "--all-dead"}, {"rerun", "batches/b0"},
				{"purge", "--older-than", "1000h", "--force"}} {
				r = runChild(t, env, append([]string{"--db", b.typo}, args...)...)
				if r.code != exitFatal || !strings.Contains(r.stderr, b.typoW) {
					t.Errorf("%s on a mistyped --db: want exit 1 naming %q, got %v", args[0], b.typoW, r)
				}
			}
			if b.typoExists() {
				t.Errorf("a command on a mistyped --db created it")
			}
			if n := len(readLines(t, log)); n != 2 {
				t.Errorf("the effects ran again on a mistyped --db: %d lines, want 2", n)
			}

			// No effect flag: exit 2 saying how to keep the old behaviour;
			// nothing listed, nothing marked done.
			api.Add(geminifake.Batch{Name: "batches/b9", State: "SUCCEEDED", CreateTime: time.Now().Add(-time.Hour)})
			r = runChild(t, env, pollArgs(b.db, api)...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "add --print to print each completion as an NDJSON line, as before") {
				t.Errorf("bare poll: want exit 2 pointing at --print, got %v", r)
			}
			// Empty and blank effects, and a program that is not there.
			for _, args := range [][]string{{"--exec", ""}, {"--exec", "  "}, {"--forward", ""}, {"--sql", " "}} {
				r = runChild(t, env, pollArgs(b.db, api, args...)...)
				if r.code != exitUsage || !strings.Contains(r.stderr, args[0]+" is empty") {
					t.Errorf("poll %s %q: want exit 2 naming the flag, got %v", args[0], args[1], r)
				}
			}
			r = runChild(t, env, pollArgs(b.db, api, "--exec", "no-such-program")...)
			if r.code != exitUsage || !strings.Contains(r.stderr, "--exec no-such-program: no executable no-such-program on PATH") {
				t.Errorf("poll --exec no-such-program: want exit 2 with the reason, got %v", r)
			}
			r = runChild(t, env, "--db", b.db, "status", "batches/b9")
			if r.code != exitUnknownKey {
				t.Errorf("a refused poll recorded batches/b9: %v", r)
			}
			// --print is today's NDJSON effect, chosen on purpose.
			r = runChild(t, env, pollArgs(b.db, api, "--print")...)
			if r.code != exitOK || !strings.Contains(r.stdout, `"key":"gemini:batches/b9"`) {
				t.Errorf("poll --print: want exit 0 and b9's line on stdout, got %v", r)
			}
		})
	}
}

// A SQLite file that is empty, or holds no gemrecon schema, is no database
// for a writing command either (init creates the schema in it); an --exec
// path that is not executable is refused at start, one with shell syntax is
// not checked.
func TestIssue24EmptyFileAndExecPaths(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runChild(t, nil, "--db", db, "drain", "--print")
	if r.code != exitFatal || !strings.Contains(r.stderr, "sqlite sink "+db+": no database: the file is empty; check --db, or run 'gemrecon init'") {
		t.Fatalf("drain on an empty file: want exit 1 saying so, got %v", r)
	}
	if fi, err := os.Stat(db); err != nil || fi.Size() != 0 {
		t.Fatalf("the empty file was changed: %v %v", fi, err)
	}
	r = runChild(t, nil, "--db", db, "init")
	if r.code != exitOK || !strings.Contains(r.stdout, db+": found no gemrecon schema; created it") {
		t.Fatalf("init on an empty file: %v", r)
	}
	script := filepath.Join(dir, "publish.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ exec, want string }{
		{script, "--exec " + script + ": not executable: chmod +x " + script},
		{dir, "--exec " + dir + ": is a directory"},
		{"./nope.sh", "--exec ./nope.sh: no such file in the working directory"},
	} {
		r = runChild(t, nil, "--db", db, "drain", "--exec", c.exec)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("drain --exec %s: want exit 2 with %q, got %v", c.exec, c.want, r)
		}
	}
	if err := os.Chmod(script, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{script, "no-such-program || true", ":"} {
		if r = runChild(t, nil, "--db", db, "drain", "--exec", ok); r.code != exitOK {
			t.Errorf("drain --exec %q: want exit 0, got %v", ok, r)
		}
	}
}

// Several replicas may run init at the same moment on a new database (a
// Kubernetes Job with parallelism, hosts provisioned together): every one
// succeeds, and the database is usable.
func TestInitConcurrent(t *testing.T) {
	parallel(t)
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			const n = 4
			results := make([]result, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = runChild(t, nil, "--db", b.db, "init")
				}()
			}
			wg.Wait()
			created := 0
			for _, r := range results {
				if r.code != exitOK {
					t.Errorf("a concurrent init failed: %v", r)
				}
				if strings.Contains(r.stdout, "created it") {
					created++
				}
			}
			if created != 1 {
				t.Errorf("%d of %d concurrent inits say they created the schema, want 1", created, n)
			}
			if r := runChild(t, nil, "--db", b.db, "stats"); r.code != exitOK {
				t.Errorf("stats after concurrent inits: %v", r)
			}
		})
	}
}
