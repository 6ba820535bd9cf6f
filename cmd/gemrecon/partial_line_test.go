package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// withFileSizeLimit lowers this process's file-size limit (RLIMIT_FSIZE,
// what `ulimit -f` and `prlimit --fsize` set) to the decimal number of bytes
// in limit. A write past it is cut off at the limit, and the next one
// fails with EFBIG: the SIGXFSZ the kernel sends as well is ignored by Go
// programs that do not ask for it, gemrecon among them.
func withFileSizeLimit(limit string) error {
	n, err := strconv.ParseUint(limit, 10, 64)
	if err != nil {
		return err
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &rl); err != nil {
		return err
	}
	rl.Cur = n
	return syscall.Setrlimit(syscall.RLIMIT_FSIZE, &rl)
}

// openAppend opens path the way the shell's >> opens stdout.
func openAppend(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDrainAppendedAfterACutOffLine: `gemrecon drain >> events.ndjson`, and
// the file reaches its size limit in the middle of a line. That process
// breaks (exit 1, no second line after the fragment, the keys pending with
// no attempt used); the next process, with room again, starts its lines on
// a line of their own and warns once: the fragment is one malformed line,
// and every event, the cut-off one included, is one whole JSON line.
func TestDrainAppendedAfterACutOffLine(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	db, out := initDB(t, filepath.Join(dir, "s.db")), filepath.Join(dir, "events.ndjson")
	keys := []string{"gemini:batches/cut1", "gemini:batches/cut2"}
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		for _, k := range keys {
			name := strings.TrimPrefix(k, "gemini:")
			if _, err := s.Record(context.Background(), sink.Sighting{Key: k, Source: sink.SourcePoll, Payload: []byte(`{"name":"` + name + `"}`)}); err != nil {
				t.Fatal(err)
			}
		}
	})
	// Earlier runs' lines: 1 MiB, far more than the database and its WAL
	// grow to, so that the limit cuts off stdout's line and nothing else.
	var earlier strings.Builder
	for i := 0; earlier.Len() < 1<<20; i++ {
		fmt.Fprintf(&earlier, `{"key":"gemini:batches/earlier%d","name":"batches/earlier%d","state":"SUCCEEDED"}`+"\n", i, i)
	}
	if err := os.WriteFile(out, []byte(earlier.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	const room = 40 // bytes of the first line that fit
	limit := earlier.Len() + room

	drain := func(name string, args ...string) (code int, stderr string) {
		t.Helper()
		f := openAppend(t, out)
		defer f.Close()
		// --retry-base 1ms: a key handed back is due again long before
		// the next process starts.
		cmd := testkit.Command(name, append(args, "--db", db, "drain", "--print", "--concurrency", "1", "--confirm", "never", "--retry-base", "1ms")...)
		cmd.Stdout = f
		var errb testkit.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return waitExit(t, cmd, 60*time.Second, &errb), errb.String()
	}

	code, stderr := drain("gemrecon-fsize-limited", strconv.Itoa(limit))
	if code != exitFatal || !strings.Contains(stderr, "file too large") {
		t.Fatalf("drain past the file-size limit exited %d, want 1 with EFBIG's message\nstderr:\n%s", code, stderr)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != limit {
		t.Fatalf("after the cut-off the file holds %d bytes, want %d (the earlier lines and %d bytes of one line)", len(b), limit, room)
	}
	fragment := string(b[earlier.Len():])
	wantPendingUncharged(t, db, keys...)

	code, stderr = drain("gemrecon")
	if code != exitOK {
		t.Fatalf("the next drain exited %d, want 0\nstderr:\n%s", code, stderr)
	}
	const warning = "stdout ended in a partial line (an earlier write was cut off); started a new line"
	if n := strings.Count(stderr, warning); n != 1 || !strings.Contains(grepLines(stderr, warning), "level=WARN") {
		t.Errorf("the next drain's stderr has the warning %d times, want once at level WARN:\n%s", n, stderr)
	}

	b, err = os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	rest, ok := strings.CutPrefix(string(b), earlier.String())
	if !ok || !strings.HasSuffix(rest, "\n") {
		t.Fatalf("the file no longer starts with the earlier lines, or does not end in a whole line:\n%q", rest)
	}
	lines := strings.Split(strings.TrimSuffix(rest, "\n"), "\n")
	if lines[0] != fragment {
		t.Errorf("the first line after the earlier ones is %q, want the fragment %q alone", lines[0], fragment)
	}
	seen := map[string]int{}
	for _, l := range lines[1:] {
		var ev struct {
			Key string `json:"key"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Errorf("line %q is not one JSON document: %v", l, err)
			continue
		}
		seen[ev.Key]++
	}
	for _, k := range keys {
		if seen[k] != 1 {
			t.Errorf("%s has %d whole lines, want 1; after the earlier lines the file holds:\n%s", k, seen[k], rest)
		}
	}
	if len(lines) != 1+len(keys) {
		t.Errorf("after the earlier lines the file holds %d lines, want the fragment and one per key:\n%s", len(lines), rest)
	}
}
