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
