package commitcost

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestWALCountsCommits: the frames of a real SQLite sink's completions are
// read back from its WAL, one commit per step, on the key table.
func TestWALCountsCommits(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "cc.db")
	s := sqlitetest.Open(t, path, sink.Options{})
	w, err := OpenWAL(path)
	if err != nil {
		t.Fatal(err)
	}
	tallies := map[string]*Tally{StepRecordClaim: {}, StepComplete: {}}
	if _, err := NewCompletions(ctx, s, 20, "t", func(step string) error {
		fs, err := w.Read()
		tallies[step].Add(fs)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	bt, err := Btrees(path)
	if err != nil {
		t.Fatal(err)
	}
	for step, ta := range tallies {
		if ta.Commits != 20 {
			t.Errorf("%s: %d commits in the WAL, want 20", step, ta.Commits)
		}
		if ta.PerCommit() < 1 {
			t.Errorf("%s: %.2f frames per commit", step, ta.PerCommit())
		}
		shares := ta.ByBtree(bt)
		found := false
		for _, sh := range shares {
			found = found || sh.Name == "gemrecon_keys"
		}
		if !found {
			t.Errorf("%s: no frame of gemrecon_keys: %s", step, FormatShares(shares))
		}
	}
	if w.PageSize() < 512 {
		t.Errorf("page size %d", w.PageSize())
	}
}

func TestParseStraceSummary(t *testing.T) {
	out := `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
100.00    1.234567         617      2001           fdatasync
  0.00    0.000010          10         1         1 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    1.234577         617      2002         1 total
`
	got := parseStraceSummary(out)
	if got["fdatasync"] != 2001 || got["fsync"] != 1 {
		t.Errorf("parse = %v", got)
	}
}
