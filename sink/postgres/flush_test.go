package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
)

// Statements that lock many key rows lock them in key order, so that two
// of them (flushes from different processes, a flush and a purge) wait for
// each other instead of deadlocking. Each test holds one key's row in
// another transaction and checks, while the statement waits for it, that
// it has locked every key before the held one and none after it.

const orderKeys, orderHeld = 100, 50

func orderKey(i int) string { return fmt.Sprintf("gemini:batches/order-%04d", i) }

func TestFlushLocksInKeyOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, dsn := openTest(t, sink.Options{})
	for range 2 { // the second sighting of each key is buffered
		for i := range orderKeys {
			if _, err := s.Record(ctx, sink.Sighting{Key: orderKey(i), Source: sink.SourcePoll}); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkLockOrder(ctx, t, dsn, "jsonb_to_recordset", func() error { return s.Flush(ctx) })
	for i := range orderKeys {
		if e, err := s.Get(ctx, orderKey(i)); err != nil || e.SeenCount != 2 {
			t.Fatalf("%s: seen_count %d, %v; want 2", orderKey(i), e.SeenCount, err)
		}
	}
}

func TestPurgeLocksInKeyOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clk := testkit.NewClock(time.Now())
	s, dsn := openTest(t, sink.Options{Now: clk.Now})
	for i := orderKeys - 1; i >= 0; i-- { // a table scan meets the keys in reverse order
		if _, err := s.Record(ctx, sink.Sighting{Key: orderKey(i), Source: sink.SourcePoll}); err != nil {
			t.Fatal(err)
		}
	}
	claims, err := s.ClaimDue(ctx, "w", time.Minute, 0, sink.ClaimOptions{})
	if err != nil || len(claims) != orderKeys {
		t.Fatalf("ClaimDue: %d claims, %v; want %d", len(claims), err, orderKeys)
	}
	for _, c := range claims {
		if err := s.Complete(ctx, c.Key, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Hour)
	var purged []string
	checkLockOrder(ctx, t, dsn, "DELETE FROM gemrecon_keys", func() (err error) {
		purged, err = s.Purge(ctx, time.Hour)
		return err
	})
	if len(purged) != orderKeys {
		t.Fatalf("purged %d keys, want %d", len(purged), orderKeys)
	}
}

// checkLockOrder runs op while another transaction holds orderKey(orderHeld)'s
// row, waits until op's statement (its text contains like) waits for that
// lock, and checks which rows op has locked by then.
func checkLockOrder(ctx context.Context, t *testing.T, dsn, like string, op func() error) {
	t.Helper()
	tx, err := adminConn(t, dsn).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT key FROM gemrecon_keys WHERE key = $1 FOR UPDATE`, orderKey(orderHeld)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- op() }()

	waitForLockWait(ctx, t, adminConn(t, dsn), like, done)
	free := func(cmp string) (n int) {
		t.Helper()
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT key FROM gemrecon_keys
			WHERE key `+cmp+` $1 FOR UPDATE SKIP LOCKED) x`, orderKey(orderHeld)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := free("<"); n != 0 {
		t.Errorf("%d of the %d keys before the held one are not locked by the waiting statement; want all locked", n, orderHeld)
	}
	if n := free(">"); n != orderKeys-orderHeld-1 {
		t.Errorf("%d of the %d keys after the held one are free; want all (none locked before the held one)", n, orderKeys-orderHeld-1)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("after the row was released: %v", err)
	}
}
