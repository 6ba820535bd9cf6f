package sqlite_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

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
