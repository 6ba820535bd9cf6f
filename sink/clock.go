package sink

import (
	"context"
	"time"
)

// Clock is an optional Sink capability: the time now by the clock the sink
// writes and compares its times with (PostgreSQL: the server's, unless a
// clock was injected; SQLite: the sink's own). A caller that shows a stored
// time against now (a lease that has expired, a key that is due) asks the
// sink, not its own clock, which may differ from the server's.
type Clock interface {
	Now(ctx context.Context) (time.Time, error)
}

// NowOf is now by s's clock when s is a Clock that answers, else this
// machine's: what a caller compares a stored time with (a lease's end, a
// next attempt).
func NowOf(ctx context.Context, s any) time.Time {
	if c, ok := s.(Clock); ok {
		if t, err := c.Now(ctx); err == nil {
			return t
		}
	}
	return time.Now()
}
