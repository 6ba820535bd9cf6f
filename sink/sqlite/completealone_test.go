package sqlite_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// A Complete alone runs as one autocommit statement, unless statistics
// wait to be written: those go into the same commit, in a transaction, as
// with every other write ("written with the next commit"). Either way the
// done cache learns the key.
func TestCompleteAloneWritesWaitingStatistics(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{})
	key := "gemini:batches/alone-stats"
	sg := webhookSighting(key)
	_, c, err := s.RecordAndClaim(ctx, sg, "me", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sg); err != nil { // a duplicate: buffered
		t.Fatal(err)
	}
	commits := s.Commits()
	if err := s.Complete(ctx, key, c.Token); err != nil {
		t.Fatal(err)
	}
	if n := s.Commits() - commits; n != 1 {
		t.Fatalf("Complete took %d commits, want 1", n)
	}
	if n := storedSeen(t, path, key); n != 2 {
		t.Fatalf("after Complete, seen_count = %d, want 2: the buffered duplicate was not written with the commit", n)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateDone {
		t.Fatalf("Get after Complete = %+v, %v", e, err)
	}
	// The done cache knows it: a duplicate needs no read.
	if !s.InDoneCache(key) {
		t.Fatal("after Complete the done cache does not know the key")
	}
	if st := recordState(t, s, sg); st != sink.StateDone {
		t.Fatalf("a duplicate after Complete says %s", st)
	}

}

// A Complete alone under another process's write lock waits for it, as a
// transaction does, and commits once it is released; a stale token alone is
// fenced, through the ordinary transaction.
func TestCompleteAloneUnderAnotherProcessLock(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 10 * time.Second})
	key := "gemini:batches/alone-locked"
	_, c, err := s.RecordAndClaim(ctx, webhookSighting(key), "me", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	release := sqlitetest.HoldLock(t, path)
	done := make(chan error, 1)
	go func() { done <- s.Complete(ctx, key, c.Token) }()
	select {
	case err := <-done:
		t.Fatalf("Complete returned while another process held the write lock: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("Complete after the lock was released: %v", err)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State != sink.StateDone || e.Token != c.Token {
		t.Fatalf("Get after Complete = %+v, %v", e, err)
	}
	// The autocommit UPDATE … RETURNING tells the done cache too.
	if !s.InDoneCache(key) {
		t.Fatal("after Complete the done cache does not know the key")
	}
	if err := s.Complete(ctx, key, c.Token+1); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("Complete with a token that is not current: %v, want ErrFenced", err)
	}
}
