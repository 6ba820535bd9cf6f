package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestRetryOfAKeyChangedWhileItWaits: Retry waits for another transaction
// that holds the dead key's row and then sends it back to pending (another
// operator's retry) or deletes it. Retry must say what the key is now —
// ErrNotDead naming pending, or ErrNotFound — not "is dead: key is not
// dead" from an older snapshot.
func TestRetryOfAKeyChangedWhileItWaits(t *testing.T) {
	for _, tc := range []struct {
		name, change string
		want         error
		wantText     string
	}{
		{"retried elsewhere", `UPDATE gemrecon_keys SET state = 'pending', next_attempt_at = now(), attempts = 0,
			retries = retries + 1, lease_owner = NULL, lease_until = NULL, dead_reason = '' WHERE key = $1`,
			sink.ErrNotDead, "is pending"},
		{"deleted", `DELETE FROM gemrecon_keys WHERE key = $1`, sink.ErrNotFound, "key not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, dsn := openTest(t, sink.Options{MaxAttempts: 1})
			const key = "gemini:batches/d"
			if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll}); err != nil {
				t.Fatal(err)
			}
			c, err := s.Claim(ctx, key, "w", time.Minute, sink.ClaimOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if st, err := s.Fail(ctx, key, c.Token, sink.Failure{Cause: "boom"}); err != nil || st != sink.StateDead {
				t.Fatalf("Fail = %s, %v; want dead", st, err)
			}
			tx, watcher := lockRow(ctx, t, dsn, key)
			done := make(chan error, 1)
			go func() { done <- s.Retry(ctx, key, sink.RetryOptions{}) }()
			waitForLockWait(ctx, t, watcher, loadMarker, done)
			if _, err := tx.Exec(ctx, tc.change, key); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err = <-done:
			case <-ctx.Done():
				t.Fatal("Retry did not return after the lock was released")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Retry = %v; want %v saying %q", err, tc.want, tc.wantText)
			}
		})
	}
}
