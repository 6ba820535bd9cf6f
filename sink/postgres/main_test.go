package postgres

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// TestMain makes the test binary a drain worker when started as pg-drain
// (see drainChild).
func TestMain(m *testing.M) {
	testkit.Main(m, map[string]func() int{"pg-drain": drainChild})
}

// drainChild opens the sink at the DSN of its one argument (the migration
// races the other children's), claims due keys until none is left,
// completes each and prints its key.
func drainChild() int {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: pg-drain DSN")
		return 2
	}
	dsn := os.Args[1]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, dsn, sink.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 1
	}
	defer s.Close()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	owner := fmt.Sprint("pid-", os.Getpid())
	for {
		cs, err := s.ClaimDue(ctx, owner, time.Minute, 5, sink.ClaimOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "claim due:", err)
			return 1
		}
		if len(cs) == 0 {
			return 0
		}
		for _, c := range cs {
			if err := s.Complete(ctx, c.Key, c.Token); err != nil {
				fmt.Fprintln(os.Stderr, "complete:", err)
				return 1
			}
			fmt.Fprintln(out, c.Key)
		}
	}
}

// TestProcessesDrainOnce: three processes open one schema at once and drain
// it; every key is completed by exactly one of them.
func TestProcessesDrainOnce(t *testing.T) {
	dsn, _ := testSchema(t)
	s := openDSN(t, dsn, sink.Options{})
	ctx := context.Background()
	const n = 150
	for i := range n {
		if _, err := s.Record(ctx, sink.Sighting{Key: fmt.Sprintf("gemini:batches/p-%03d", i), Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for _, out := range runChildren(t, dsn, 3) {
		for _, k := range strings.Fields(out) {
			count[k]++
		}
	}
	if len(count) != n {
		t.Errorf("children completed %d distinct keys, want %d", len(count), n)
	}
	for k, c := range count {
		if c != 1 {
			t.Errorf("key %s completed %d times, want 1", k, c)
		}
	}
	st, err := s.Stats(ctx)
	if err != nil || st.ByState[sink.StateDone] != n || st.Fenced != 0 {
		t.Fatalf("Stats = %+v, %v; want %d done, 0 fenced", st, err, n)
	}
}

// runChildren runs procs drain children on dsn at once and returns their
// outputs; any child's failure fails the test.
func runChildren(t *testing.T, dsn string, procs int) []string {
	t.Helper()
	outs := make([]bytes.Buffer, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := testkit.Command("pg-drain", dsn)
			cmd.Stdout = &outs[i]
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("%v: %s", err, stderr.String())
			}
		})
	}
	wg.Wait()
	res := make([]string, procs)
	for i := range procs {
		if errs[i] != nil {
			t.Fatalf("child %d: %v", i, errs[i])
		}
		res[i] = outs[i].String()
	}
	return res
}

// TestProcessesMigrateOnce: three processes open one empty schema at once;
// each succeeds and every migration is recorded once.
func TestProcessesMigrateOnce(t *testing.T) {
	dsn, schema := testSchema(t)
	runChildren(t, dsn, 3)
	admin := adminConn(t, baseDSN(t))
	var rows, max int
	err := admin.QueryRow(context.Background(),
		`SELECT count(*), coalesce(max(version), 0) FROM `+schema+`.gemrecon_schema_version`).Scan(&rows, &max)
	if err != nil {
		t.Fatal(err)
	}
	if want := SchemaVersion(); rows != want || max != want {
		t.Fatalf("schema_version: %d rows, max %d; want %d", rows, max, want)
	}
}
