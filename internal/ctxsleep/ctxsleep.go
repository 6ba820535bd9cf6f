// Package ctxsleep holds the one context-aware sleep that the libraries
// with an injectable Sleep (dispatch, poller, the stand-in's delivery
// engine) take as their default, and that reconcile's Watch waits with.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done, and returns ctx.Err() in that case
// (also when d <= 0 and ctx is already done).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-time.After(d): // unreferenced, its timer is collected (Go 1.23)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
