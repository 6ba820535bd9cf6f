package sqlite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

const (
	raceKeys      = 500
	raceProcesses = 8
	// raceBusyTimeout is generous: SQLite's busy handler polls unfairly, and
	// this machine is shared; what the test asserts is that no busy error
	// surfaces, not how long one lock wait takes.
	raceBusyTimeout = 30 * time.Second
)

// raceChild records, claims and completes every key (in one of two orders,
// so that four processes race on the same key at a time) and prints
// "done KEY TOKEN" for each Complete that succeeded. Any error other than
// ErrNotClaimable is printed and fails the child. Its index among the
// processes is its second argument.
func raceChild(path string) int {
	if len(os.Args) != 3 {
		fmt.Println("error: usage: sqlite-race PATH INDEX")
		return 2
	}
	idx, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Println("error: index:", err)
		return 2
	}
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path, sink.Options{BusyTimeout: raceBusyTimeout}, quiet)
	if err != nil {
		fmt.Println("error: open:", err)
		return 1
	}
	defer s.Close()
	order := rand.New(rand.NewPCG(uint64(idx%2), 7)).Perm(raceKeys)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	owner := fmt.Sprintf("proc-%d", idx)
	sources := []string{sink.SourcePoll, sink.SourceWebhook}
	for _, k := range order {
		key := fmt.Sprintf("gemini:batches/race-%03d", k)
		sg := sink.Sighting{Key: key, Source: sources[idx%2], Payload: []byte(`{"name":"` + key + `"}`)}
		var c sink.Claim
		if idx%4 == 3 {
			var cp *sink.Claim
			if _, cp, err = s.RecordAndClaim(ctx, sg, sink.ClaimRequest{Owner: owner, Lease: time.Hour}); err == nil && cp == nil {
				continue // not claimed at record time: a process that claims takes it
			} else if cp != nil {
				c = *cp
			}
		} else {
			if _, err = s.Record(ctx, sg); err != nil {
				fmt.Fprintln(out, "error: record:", err)
				return 1
			}
			c, err = s.Claim(ctx, key, owner, time.Hour, sink.ClaimOptions{})
		}
		if errors.Is(err, sink.ErrNotClaimable) {
			continue
		}
		if err != nil {
			fmt.Fprintln(out, "error: claim:", err)
			return 1
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			fmt.Fprintln(out, "error: complete:", err)
			return 1
		}
		fmt.Fprintf(out, "done %s %d\n", key, c.Token)
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(out, "error: close:", err)
		return 1
	}
	return 0
}

// Eight processes race over 500 keys on one file, which none of them created
// before the race: every key ends done, completed exactly once, no busy error
// surfaces, and the file passes integrity_check.
func TestMultiProcess(t *testing.T) {
	testkit.ParallelUnlessRace(t)
	if testing.Short() {
		t.Skip("short")
	}
	path := filepath.Join(t.TempDir(), "race.db")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		outputs = make([]string, raceProcesses)
		fails   []string
	)
	start := time.Now()
	for i := range raceProcesses {
		cmd := child(t, "race", path, strconv.Itoa(i))
		wg.Go(func() {
			out, err := cmd.Output()
			mu.Lock()
			defer mu.Unlock()
			outputs[i] = string(out)
			if err != nil {
				fails = append(fails, fmt.Sprintf("process %d: %v: %s", i, err, lastLines(string(out), 3)))
			}
		})
	}
	wg.Wait()
	t.Logf("%d processes × %d keys in %v", raceProcesses, raceKeys, time.Since(start).Round(time.Millisecond))
	if len(fails) > 0 {
		t.Fatalf("children failed:\n%s", strings.Join(fails, "\n"))
	}
	completions := map[string]int{}
	perProcess := make([]int, raceProcesses)
	for i, out := range outputs {
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && f[0] == "done" {
				completions[f[1]]++
				perProcess[i]++
			} else if line != "" {
				t.Fatalf("process %d printed %q", i, line)
			}
		}
	}
	t.Logf("completions per process: %v", perProcess)
	if len(completions) != raceKeys {
		t.Fatalf("%d keys completed, want %d", len(completions), raceKeys)
	}
	for k, n := range completions {
		if n != 1 {
			t.Fatalf("key %s completed %d times, want exactly once", k, n)
		}
	}

	s, err := sqlite.Open(context.Background(), path, sink.Options{ReadOnly: true}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.ByState[sink.StateDone] != raceKeys || st.Fenced != 0 {
		t.Fatalf("Stats = %+v, want %d done and nothing fenced", st, raceKeys)
	}
	if want := int64(raceKeys * (raceProcesses - 1)); st.DuplicatesSuppressed != want {
		t.Fatalf("DuplicatesSuppressed = %d, want %d (every process saw every key)", st.DuplicatesSuppressed, want)
	}
	sqlitetest.IntegrityCheck(t, path)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
