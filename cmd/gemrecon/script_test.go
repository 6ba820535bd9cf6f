package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/poller"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestMain makes this test binary the real gemrecon when it is started as
// "gemrecon" (a script's `exec gemrecon`, child), as "gemrecon-as-nobody"
// (the same, dropped to the nobody user first when it runs as root, for
// scripts that need file modes to count) or as "gemrecon-fsize-limited"
// (the same under a file-size limit, withFileSizeLimit).
func TestMain(m *testing.M) {
	testkit.Main(m, map[string]func() int{
		"gemrecon": func() int { return run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr) },
		"gemrecon-fsize-limited": func() int {
			if len(os.Args) < 2 {
				os.Stderr.WriteString("usage: gemrecon-fsize-limited BYTES [gemrecon arguments]\n")
				return 125
			}
			if err := withFileSizeLimit(os.Args[1]); err != nil {
				os.Stderr.WriteString("gemrecon-fsize-limited: " + err.Error() + "\n")
				return 125
			}
			return run(os.Args[2:], os.Stdin, os.Stdout, os.Stderr)
		},
		"gemrecon-as-nobody": func() int {
			if err := testkit.DropToNobody(); err != nil {
				os.Stderr.WriteString("gemrecon-as-nobody: " + err.Error() + "\n")
				return 125
			}
			return run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		},
	})
}

// TestScripts runs the CLI scripts in testdata/script: what a user types,
// with each command a real gemrecon process (this test binary, started as
// gemrecon: no separate build) in a fresh directory and environment. A
// script that needs the Gemini API starts the local stand-in (fakeapi), so
// no script reaches the network. The commands beyond testscript's own are
// in scriptCmds.
func TestScripts(t *testing.T) {
	// Not parallel(t): its scripts join the group (Setup), not the test.
	t.Parallel()
	testscript.Run(t, testscript.Params{
		Dir:                 "../../testdata/script",
		RequireExplicitExec: true,
		RequireUniqueNames:  true,
		Setup: func(env *testscript.Env) error {
			env.Defer(testGroups.join(anyTests)) // see parallel
			// No script may reach the network: the SDK's default endpoint
			// is replaced by a closed port on loopback (fakeapi sets the
			// stand-in's URL), so a command given an API key and no
			// --base-url fails here instead of calling Google.
			// (testscript passes GORACE on, which testkit.Main set.)
			env.Vars = append(env.Vars, "GOOGLE_GEMINI_BASE_URL="+noNetwork, "GOOGLE_VERTEX_BASE_URL="+noNetwork)
			env.Values[apiKey{}] = &scriptAPI{}
			if tb, ok := env.T().(testing.TB); ok { // a *testing.T underneath
				env.Values[tbKey{}] = tb
			}
			return nil
		},
		Condition: func(cond string) (bool, error) {
			if cond == "pg" { // a PostgreSQL server to test against (pgschema)
				return os.Getenv(pgtest.EnvDSN) != "", nil
			}
			return false, errors.New("unknown condition " + cond)
		},
		Cmds: scriptCmds,
	})
}

var scriptCmds = map[string]func(ts *testscript.TestScript, neg bool, args []string){
	"exits":      cmdExits,
	"arrange":    cmdArrange,
	"fakeapi":    cmdFakeAPI,
	"jsonlines":  cmdJSONLines,
	"jsonfields": cmdJSONFields,
	"jsonis":     cmdJSONIs,
	"pgschema":   cmdPGSchema,
}

// exits CODE COMMAND [ARGS...]: runs COMMAND like exec and fails unless it
// exits with status CODE; stdout and stderr are then its output, as after
// exec. (exec only tells success from failure; gemrecon's exit statuses
// mean more, spec §8.)
func cmdExits(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! exits (give the status it must exit with)")
	}
	if len(args) < 2 {
		ts.Fatalf("usage: exits CODE COMMAND [ARGS...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exits: %q is not an exit status", args[0])
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exits: %v", err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("%s exited with status %d, want %d", args[1], got, want)
	}
}

// arrange DB STATE NAME [CAUSE] puts the key of NAME into STATE in the
// SQLite database DB (created when missing) through the sink, as serve and
// a worker would have: pending (one webhook sighting), claimed (a lease of
// an hour), done, or dead (its one attempt failed with CAUSE). For pending
// it prints what the sink answered: "KEY: new, pending", or for a key it
// knew "KEY: known, STATE" (a redelivery).
// arrange DB lookback D records a poll's --lookback D (0: forever).
func cmdArrange(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 3 {
		ts.Fatalf("usage: arrange DB pending|claimed|done|dead NAME [CAUSE] | arrange DB lookback D")
	}
	ctx := context.Background()
	s, err := sqlite.Open(ctx, ts.MkAbs(args[0]), sink.Options{MaxAttempts: 1})
	ts.Check(err)
	defer func() { ts.Check(s.Close()) }()
	if args[1] == "lookback" {
		d, err := time.ParseDuration(args[2])
		ts.Check(err)
		ts.Check(s.NoteLookback(ctx, d))
		return
	}
	name := args[2]
	key, err := canon.Key(name)
	ts.Check(err)
	res, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"name":` + strconv.Quote(name) + `}`)})
	ts.Check(err)
	switch args[1] {
	case "pending":
		seen := "known"
		if res.New {
			seen = "new"
		}
		fmt.Fprintf(ts.Stdout(), "%s: %s, %s\n", key, seen, res.State)
		return
	case "claimed":
		_, err = s.Claim(ctx, key, "script", time.Hour, sink.ClaimOptions{})
		ts.Check(err)
		return
	}
	c, err := s.Claim(ctx, key, "script", time.Minute, sink.ClaimOptions{})
	ts.Check(err)
	switch args[1] {
	case "done":
		ts.Check(s.Complete(ctx, c.Key, c.Token))
	case "dead":
		cause := "the effect failed"
		if len(args) > 3 {
			cause = args[3]
		}
		_, err = s.Fail(ctx, c.Key, c.Token, sink.Failure{Cause: cause})
		ts.Check(err)
	default:
		ts.Fatalf("arrange: unknown state %q", args[1])
	}
}

// noNetwork is where a script's API requests go when it started no
// stand-in: the discard port on loopback, where nothing listens.
const noNetwork = "http://127.0.0.1:9/"

type apiKey struct{}

// scriptAPI is a script's Gemini API stand-in.
type scriptAPI struct{ srv *geminifake.Server }

// fakeapi [STATE...] starts the Gemini API stand-in on 127.0.0.1 with
// batches b0, b1, … in those states, created an hour ago (a FAILED one
// with the API's quota error), and sets $GEMINI_API_KEY, $API (the
// --base-url) and GOOGLE_GEMINI_BASE_URL (the SDK's default endpoint) for
// the commands after it. It stops when the script ends, or when a later
// fakeapi STATE... starts a fresh one.
// fakeapi add ID STATE adds a batch created a minute ago;
// fakeapi fault repeat-token makes the second and third pages repeat their
// page token; fakeapi fault oversize-page answers the next list request
// with a page one byte larger than poller.MaxResponseBody (an empty list,
// padded).
func cmdFakeAPI(ts *testscript.TestScript, neg bool, args []string) {
	if neg {
		ts.Fatalf("unsupported: ! fakeapi")
	}
	h := ts.Value(apiKey{}).(*scriptAPI)
	if len(args) > 0 && (args[0] == "add" || args[0] == "fault") {
		if h.srv == nil {
			ts.Fatalf("fakeapi %s: start it first (fakeapi STATE...)", args[0])
		}
		switch {
		case args[0] == "add" && len(args) == 3:
			h.srv.Add(geminifake.Batch{Name: geminifake.GeminiName(args[1]), State: args[2], CreateTime: time.Now().Add(-time.Minute)})
		case args[0] == "fault" && len(args) == 2 && args[1] == "repeat-token":
			h.srv.InjectFault(geminifake.Fault{}, geminifake.Fault{RepeatToken: true}, geminifake.Fault{RepeatToken: true})
		case args[0] == "fault" && len(args) == 2 && args[1] == "oversize-page":
			const head, tail = `{"operations":[]`, `}`
			h.srv.InjectFault(geminifake.Fault{Body: head + strings.Repeat(" ", poller.MaxResponseBody+1-len(head)-len(tail)) + tail})
		default:
			ts.Fatalf("usage: fakeapi add ID STATE | fakeapi fault repeat-token|oversize-page")
		}
		return
	}
	if h.srv != nil {
		h.srv.Close() // a fresh stand-in
	}
	h.srv = geminifake.New(geminifake.Options{APIKey: testAPIKey})
	_, err := h.srv.Start("127.0.0.1:0")
	ts.Check(err)
	srv := h.srv
	ts.Defer(func() { srv.Close() })
	created := time.Now().Add(-time.Hour)
	for i, st := range args {
		b := geminifake.Batch{Name: geminifake.GeminiName("b" + strconv.Itoa(i)), State: st, CreateTime: created}
		if st == "FAILED" {
			b.Error = &geminifake.Status{Code: 8, Message: "Enqueued token quota exceeded for this model."}
		}
		h.srv.Add(b)
	}
	ts.Setenv("GEMINI_API_KEY", testAPIKey)
	ts.Setenv("API", h.srv.URL())
	ts.Setenv("GOOGLE_GEMINI_BASE_URL", h.srv.URL())
}

// jsonlines stdout|stderr|FILE fails unless every non-empty line of it is
// one JSON object (what --log-format json promises of stderr).
func cmdJSONLines(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: jsonlines stdout|stderr|FILE")
	}
	for _, line := range strings.Split(ts.ReadFile(args[0]), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			ts.Fatalf("%s: line %q is not a JSON object: %v", args[0], line, err)
		}
	}
}

// jsonfields stdout|stderr|FILE FIELD... fails unless it is one JSON
// object that has every FIELD at its top level.
func cmdJSONFields(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: jsonfields stdout|stderr|FILE FIELD...")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &m); err != nil {
		ts.Fatalf("%s is not one JSON object: %v", args[0], err)
	}
	for _, f := range args[1:] {
		if _, ok := m[f]; !ok {
			ts.Fatalf("%s has no field %q", args[0], f)
		}
	}
}

// jsonis stdout|stderr|FILE PATH WANT fails unless the JSON value at PATH
// (dot-separated object fields and array indexes: history.0.outcome) is
// WANT, written as fmt prints it (a number without quotes).
func cmdJSONIs(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: jsonis stdout|stderr|FILE PATH WANT")
	}
	var v any
	if err := json.Unmarshal([]byte(ts.ReadFile(args[0])), &v); err != nil {
		ts.Fatalf("%s is not JSON: %v", args[0], err)
	}
	for _, step := range strings.Split(args[1], ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[step]
		case []any:
			i, err := strconv.Atoi(step)
			if err != nil || i < 0 || i >= len(x) {
				ts.Fatalf("%s: no element %q of an array of %d", args[1], step, len(x))
			}
			v = x[i]
		default:
			ts.Fatalf("%s: %q is not inside an object or array", args[1], step)
		}
	}
	if got := fmt.Sprint(v); got != args[2] {
		ts.Fatalf("%s at %s = %s, want %s", args[0], args[1], got, args[2])
	}
}

// pgschema creates a private schema on the GEMRECON_TEST_POSTGRES server,
// dropped when the script ends, and sets $PG_URL (a postgres:// URL) and
// $PG_KV (the same as a libpq keyword/value string) to it. Guard its use
// with [!pg] skip.
func cmdPGSchema(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: pgschema")
	}
	tb, ok := ts.Value(tbKey{}).(testing.TB)
	if !ok {
		ts.Fatalf("pgschema: no testing.TB for this script")
	}
	dsn, schema := pgtest.NewSchema(tb)
	kv, err := keywordValue(dsn)
	ts.Check(err)
	ts.Setenv("PG_URL", dsn)
	ts.Setenv("PG_KV", kv)
	ts.Setenv("PG_SCHEMA", schema)
}

type tbKey struct{}

// keywordValue writes a postgres:// URL as a libpq keyword/value string:
// host=… port=… user=… password=… dbname=…, then the query parameters,
// each value single-quoted (a quote or backslash in it escaped).
func keywordValue(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	quote := func(v string) string {
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
	}
	var kv []string
	add := func(k, v string) {
		if v != "" {
			kv = append(kv, k+"="+quote(v))
		}
	}
	add("host", u.Hostname())
	add("port", u.Port())
	add("user", u.User.Username())
	if p, ok := u.User.Password(); ok {
		add("password", p)
	}
	add("dbname", strings.TrimPrefix(u.Path, "/"))
	q := u.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		add(k, q.Get(k))
	}
	return strings.Join(kv, " "), nil
}
