package sqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

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
