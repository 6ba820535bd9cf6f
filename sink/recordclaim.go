package sink

import (
	"context"
	"time"
)

// RecordClaimer is an optional Sink capability: record a sighting and, when
// the key can be claimed now (new, pending and due, or claimed under an
// expired lease), claim it in the same durable commit. A new completion then
// costs two disk syncs (record+claim, complete) instead of three. Callers
// check for it with a type assertion and fall back to Record then Claim.
type RecordClaimer interface {
	// RecordAndClaim is Record followed by Claim, in one commit when a claim
	// is granted. The RecordResult is always filled when err is nil or wraps
	// ErrNotClaimable; RecordResult.New is true when this sighting created
	// the key. A sighting of a key that cannot be claimed now returns
	// ErrNotClaimable (the sighting is still recorded).
	RecordAndClaim(ctx context.Context, s Sighting, owner string, lease time.Duration) (RecordResult, Claim, error)
}

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
