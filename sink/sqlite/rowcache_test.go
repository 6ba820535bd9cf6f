package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// completeChild claims and completes the key given after path, in a process
// of its own, and prints "ok" or the error.
func completeChild(path string) int {
	if len(os.Args) != 3 {
		fmt.Println("error: usage: sqlite-complete PATH KEY")
		return 2
	}
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path, sink.Options{BusyTimeout: 5 * time.Second}, quiet)
	if err != nil {
		fmt.Println("error: open:", err)
		return 1
	}
	defer s.Close()
	c, err := s.Claim(ctx, os.Args[2], "child", time.Minute)
	if err == nil {
		err = s.Complete(ctx, os.Args[2], c.Token)
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// webhookSighting is a duplicate-able sighting of key as a webhook sends it.
func webhookSighting(key string) sink.Sighting {
	return sink.Sighting{Key: key, Source: sink.SourceWebhook, State: "SUCCEEDED", Payload: []byte(`{"name":"` + key + `"}`)}
}

// recordState records sg and returns the state Record reports.
func recordState(t *testing.T, s *sqlite.Sink, sg sink.Sighting) sink.State {
	t.Helper()
	res, err := s.Record(context.Background(), sg)
	if err != nil {
		t.Fatal(err)
	}
	return res.State
}

// warmRowCache records key until its duplicate is answered from the row
// cache, and fails the test when it never is.
func warmRowCache(t *testing.T, s *sqlite.Sink, sg sink.Sighting, want sink.State) {
	t.Helper()
	before := s.RowCacheHits()
	for range 3 {
		if st := recordState(t, s, sg); st != want {
			t.Fatalf("Record(%s) = %s, want %s", sg.Key, st, want)
		}
	}
	if !s.RowCacheArmed() {
		t.Fatal("the row cache is not armed after this sink's own commits")
	}
	if s.RowCacheHits() == before {
		t.Fatalf("three duplicates of %s with no commit between: none was answered from the row cache", sg.Key)
	}
}

// A duplicate answered from the row cache must say what a read would say
// now: every commit of another process, of another connection of this
// process, and of this sink itself ends what the cache knew.
func TestRowCacheEndsAtEveryCommit(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{})
	key := "gemini:batches/rowcache-1"
	sg := webhookSighting(key)
	if res, err := s.Record(ctx, sg); err != nil || !res.New {
		t.Fatalf("first Record = %+v, %v", res, err)
	}

	t.Run("another process", func(t *testing.T) {
		warmRowCache(t, s, sg, sink.StatePending)
		out, err := child(t, "complete", path, key).Output()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("child: %q, %v", out, err)
		}
		if st := recordState(t, s, sg); st != sink.StateDone {
			t.Fatalf("after another process completed %s, Record says %s", key, st)
		}
	})

	t.Run("another connection", func(t *testing.T) {
		key := "gemini:batches/rowcache-2"
		sg := webhookSighting(key)
		if _, err := s.Record(ctx, sg); err != nil {
			t.Fatal(err)
		}
		warmRowCache(t, s, sg, sink.StatePending)
		// A write no sink made: a lease taken by hand.
		sqlitetest.Exec(t, path, `UPDATE gemrecon_keys SET state = 'claimed', lease_owner = 'x', lease_until = ?, token = token + 1 WHERE key = ?`,
			time.Now().Add(time.Hour).UnixNano(), key)
		if st := recordState(t, s, sg); st != sink.StateClaimed {
			t.Fatalf("after another connection claimed %s, Record says %s", key, st)
		}
	})

	t.Run("this sink", func(t *testing.T) {
		key := "gemini:batches/rowcache-3"
		sg := webhookSighting(key)
		if _, err := s.Record(ctx, sg); err != nil {
			t.Fatal(err)
		}
		warmRowCache(t, s, sg, sink.StatePending)
		c, err := s.Claim(ctx, key, "me", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if st := recordState(t, s, sg); st != sink.StateClaimed {
			t.Fatalf("after this sink claimed %s, Record says %s", key, st)
		}
		warmRowCache(t, s, sg, sink.StateClaimed)
		if _, err := s.Fail(ctx, key, c.Token, sink.Failure{Cause: "x", Permanent: true}); err != nil {
			t.Fatal(err)
		}
		if st := recordState(t, s, sg); st != sink.StateDead {
			t.Fatalf("after this sink failed %s permanently, Record says %s", key, st)
		}
	})
}

// RecordAndClaim takes a duplicate's row from the row cache too: a key
// claimed under a live lease is refused without meeting the writer, and a
// commit elsewhere that frees it is seen.
func TestRecordAndClaimUsesTheRowCache(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{})
	key := "gemini:batches/rowcache-rc"
	sg := webhookSighting(key)
	_, c, err := s.RecordAndClaim(ctx, sg, "me", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	warmRowCache(t, s, sg, sink.StateClaimed)
	commits, hits := s.Commits(), s.RowCacheHits()
	if _, _, err := s.RecordAndClaim(ctx, sg, "other", time.Hour); !errors.Is(err, sink.ErrNotClaimable) {
		t.Fatalf("RecordAndClaim of a key under a live lease: %v, want ErrNotClaimable", err)
	}
	if s.RowCacheHits() == hits || s.Commits() != commits {
		t.Fatalf("RecordAndClaim of a cached claimed key: %d row-cache hits, %d commits; want a hit and no commit",
			s.RowCacheHits()-hits, s.Commits()-commits)
	}
	// Another connection ends the lease: the next RecordAndClaim takes over.
	sqlitetest.Exec(t, path, `UPDATE gemrecon_keys SET lease_until = 1 WHERE key = ?`, key)
	_, c2, err := s.RecordAndClaim(ctx, sg, "other", time.Hour)
	if err != nil {
		t.Fatalf("RecordAndClaim after the lease was ended elsewhere: %v", err)
	}
	if c2.Token <= c.Token || !c2.Takeover {
		t.Fatalf("claim after the lease ended: %+v, want a takeover with a token above %d", c2, c.Token)
	}
}

// While another sink completes keys one after another, a duplicate recorded
// after a Complete returned must say done, whatever the row cache held:
// the header is read before and after every read, and concurrently with
// the other sink's commits.
func TestRowCacheUnderConcurrentCommits(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 10 * time.Second})
	other := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 10 * time.Second})
	const n = 200
	sgs := make([]sink.Sighting, n)
	for i := range sgs {
		sgs[i] = webhookSighting(fmt.Sprintf("gemini:batches/rowcache-c%03d", i))
		if _, err := s.Record(ctx, sgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	var completed atomic.Int64 // keys [0, completed) are done
	errc := make(chan error, 1)
	go func() {
		for i := range sgs {
			c, err := other.Claim(ctx, sgs[i].Key, "other", time.Minute)
			if err == nil {
				err = other.Complete(ctx, sgs[i].Key, c.Token)
			}
			if err != nil {
				errc <- err
				return
			}
			completed.Store(int64(i + 1))
		}
		errc <- nil
	}()
	hits := s.RowCacheHits()
	for completed.Load() < n {
		for i := range sgs {
			doneBefore := completed.Load()
			res, err := s.Record(ctx, sgs[i])
			if err != nil {
				t.Fatal(err)
			}
			if int64(i) < doneBefore && res.State != sink.StateDone {
				t.Fatalf("%s was completed before this Record began, which says %s", sgs[i].Key, res.State)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Without commits the duplicates come from the cache (done keys from
	// the done cache; the pending ones were all completed).
	t.Logf("row-cache hits while the other sink committed: %d", s.RowCacheHits()-hits)
}

// A duplicate of a key that cannot be claimed is answered ErrNotClaimable and
// recorded (sink.RecordClaimer) while another process holds the write lock,
// as it was when RecordAndClaim read the key first: a write transaction is
// not needed to refuse it.
func TestRecordAndClaimDuplicateUnderAnotherProcessLock(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{BusyTimeout: 200 * time.Millisecond})
	key := "gemini:batches/rac-locked"
	sg := webhookSighting(key)
	if res, _, err := s.RecordAndClaim(ctx, sg, "me", time.Hour); err != nil || !res.New {
		t.Fatalf("first RecordAndClaim = %+v, %v", res, err)
	}
	release := sqlitetest.HoldLock(t, path)
	res, _, err := s.RecordAndClaim(ctx, sg, "other", time.Hour)
	if !errors.Is(err, sink.ErrNotClaimable) || res.State != sink.StateClaimed {
		t.Fatalf("RecordAndClaim of a claimed key while another process holds the write lock = %+v, %v; want claimed, ErrNotClaimable", res, err)
	}
	release()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := storedSeen(t, path, key); n != 2 {
		t.Fatalf("seen_count = %d, want 2 (the refused sighting is recorded)", n)
	}
}

// A closed sink answers no duplicate from the row cache. Close's last flush
// is a commit that ends what the cache knew, but a flush that fails (another
// process holds the write lock past the busy timeout) commits nothing: the
// header keeps its version, and a Record after Close would be answered from
// memory — its sighting buffered where nothing will ever write it — where a
// read fails on the closed connections.
func TestRowCacheNotUsedAfterClose(t *testing.T) {
	ctx := context.Background()
	path := sqlitetest.Path(t)
	s, err := sqlite.Open(ctx, path, sink.Options{BusyTimeout: 200 * time.Millisecond}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	key := "gemini:batches/rowcache-closed"
	sg := webhookSighting(key)
	if _, err := s.Record(ctx, sg); err != nil {
		t.Fatal(err)
	}
	warmRowCache(t, s, sg, sink.StatePending)
	release := sqlitetest.HoldLock(t, path)
	if err := s.Close(); err == nil {
		t.Fatal("Close flushed while another process held the write lock")
	}
	release()
	if res, err := s.Record(ctx, sg); err == nil {
		t.Fatalf("Record of a duplicate after Close = %+v, nil error; want an error", res)
	}
	if _, _, err := s.RecordAndClaim(ctx, sg, "me", time.Minute); err == nil {
		t.Fatal("RecordAndClaim after Close: nil error")
	}
}
