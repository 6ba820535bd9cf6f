package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// TestNoteResultsFencedAfterATakeover: NoteResults is fenced on the claim's
// token by reading the key row inside its INSERT … SELECT. A plain read
// sees the statement's snapshot and is never checked again, so when the
// insert then waited (here for the extras row, held by another
// transaction) and a takeover committed meanwhile, the stale holder's write
// landed after the token had moved: a fenced write that was not fenced.
// Either NoteResults is refused, or the takeover waits until it is done.
func TestNoteResultsFencedAfterATakeover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, dsn := openTest(t, sink.Options{Now: clk.Now})
	k := "gemini:batches/fence"
	if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourcePoll}); err != nil {
		t.Fatal(err)
	}
	old, err := s.Claim(ctx, k, "old", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.NoteResults(ctx, k, old.Token, "first"); err != nil { // the extras row exists now
		t.Fatal(err)
	}
	tx, err := adminConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT key FROM gemrecon_key_extras WHERE key = $1 FOR UPDATE`, k); err != nil {
		t.Fatal(err)
	}
	noted := make(chan error, 1)
	go func() { noted <- s.NoteResults(ctx, k, old.Token, "stale") }()
	watcher := adminConn(t, dsn)
	waitForLockWait(ctx, t, watcher, "results_file = excluded.results_file", noted)

	clk.Advance(2 * time.Minute) // the old lease has expired
	type claimResult struct {
		c   sink.Claim
		err error
	}
	claimed := make(chan claimResult, 1)
	go func() {
		c, err := s.Claim(ctx, k, "new", time.Minute, sink.ClaimOptions{})
		claimed <- claimResult{c, err}
	}()
	// Either the takeover commits now, or it waits for the NoteResults in
	// flight (which holds the key row).
	var early *claimResult
	for waiting := false; early == nil && !waiting; {
		select {
		case r := <-claimed:
			early = &r
			continue
		case <-time.After(10 * time.Millisecond):
		}
		if err := watcher.QueryRow(ctx, `SELECT count(*) = 2 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, s.pg.appName).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	nerr := <-noted
	if early != nil {
		if early.err != nil || !early.c.Takeover || early.c.Token != old.Token+1 {
			t.Fatalf("takeover: %+v, %v; want token %d", early.c, early.err, old.Token+1)
		}
		if !errors.Is(nerr, sink.ErrFenced) {
			t.Fatalf("NoteResults with token %d, after the takeover to token %d committed: %v; want ErrFenced", old.Token, early.c.Token, nerr)
		}
		return
	}
	if nerr != nil {
		t.Fatalf("NoteResults before the takeover: %v", nerr)
	}
	if r := <-claimed; r.err != nil || !r.c.Takeover || r.c.Token != old.Token+1 {
		t.Fatalf("takeover after NoteResults: %+v, %v; want token %d", r.c, r.err, old.Token+1)
	}
	if e, err := s.Get(ctx, k); err != nil || e.ResultsFile != "stale" || e.Token != old.Token+1 {
		t.Fatalf("after both: results file %q, token %d, %v; want %q, %d", e.ResultsFile, e.Token, err, "stale", old.Token+1)
	}
}
