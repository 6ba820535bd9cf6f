package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/gemrecon/gemrecon/sink"
)

// The pass records and pass lease of spec §5.5 (sink.Passes), one row of
// gemrecon_passes per scope. Like the key claims, every operation is one
// autocommit statement at READ COMMITTED whose decisions use the database
// clock (or the injected Options.Now), and a write whose reply was lost is
// settled and read back (by op_nonce).

var _ sink.Passes = (*Sink)(nil)

// checkPassName is sink.CheckPassName, naming the operation.
func checkPassName(what, kind, v string) error {
	if err := sink.CheckPassName(kind, v); err != nil {
		return fmt.Errorf("postgres: %s: %w", what, err)
	}
	return nil
}

// passMicros is a lease in microseconds, PostgreSQL's precision, rounded up
// so that a positive lease never ends at the instant it is granted.
func passMicros(what string, lease time.Duration) (int64, error) {
	if lease <= 0 {
		return 0, fmt.Errorf("postgres: %s: lease %v must be positive", what, lease)
	}
	if lease > math.MaxInt64-time.Microsecond {
		return lease.Microseconds(), nil
	}
	return (lease + time.Microsecond - 1).Microseconds(), nil
}

const passColumns = `scope, last_start, last_end, coalesce(last_holder, ''), last_success, last_full_scan,
	coalesce(holder, ''), held_until, token, ended_at`

// passRow is a stored record and the database-clock time its last pass was
// recorded (the minimum interval is measured from it).
type passRow struct {
	rec     sink.PassRecord
	endedAt time.Time
}

// scanPass reads passColumns, then extra destinations.
func scanPass(row pgx.Row, extra ...any) (passRow, error) {
	var (
		r                                      passRow
		start, end, success, full, held, ended *time.Time
	)
	dst := append([]any{&r.rec.Scope, &start, &end, &r.rec.LastHolder, &success, &full, &r.rec.Holder, &held, &r.rec.Token, &ended}, extra...)
	if err := row.Scan(dst...); err != nil {
		return r, err
	}
	t := func(p *time.Time) time.Time {
		if p == nil {
			return time.Time{}
		}
		return p.UTC()
	}
	r.rec.LastStart, r.rec.LastEnd, r.rec.LastSuccess, r.rec.LastFullScan = t(start), t(end), t(success), t(full)
	r.rec.HeldUntil, r.endedAt = t(held), t(ended)
	return r, nil
}

// acquirePassSQL takes the lease when no other owner holds it live and (with
// $5 > 0) no pass was recorded less than $5 µs ago; otherwise it leaves the
// row as it is. It always returns the row (locked and re-read by ON
// CONFLICT, so the decision and the row agree), whether this statement took
// the lease (op_nonce is ours), and the now it decided with. Parameters: $1
// scope, $2 now, $3 owner, $4 lease µs, $5 minimum interval µs, $6 nonce.
const acquirePassSQL = `
INSERT INTO gemrecon_passes AS p (scope, holder, held_until, token, op_nonce)
VALUES ($1, $3, ` + now2 + ` + $4::bigint * interval '1 microsecond', 1, $6::bigint)
ON CONFLICT (scope) DO UPDATE SET
	holder     = CASE WHEN ` + passFree + ` THEN $3 ELSE p.holder END,
	held_until = CASE WHEN ` + passFree + ` THEN ` + now2 + ` + $4 * interval '1 microsecond' ELSE p.held_until END,
	token      = CASE WHEN ` + passFree + ` THEN p.token + 1 ELSE p.token END,
	op_nonce   = CASE WHEN ` + passFree + ` THEN $6::bigint ELSE p.op_nonce END
RETURNING ` + passColumns + `, op_nonce IS NOT DISTINCT FROM $6::bigint, ` + now2

// passFree: the existing row p may be taken by $3 now.
const passFree = `(NOT (p.holder IS NOT NULL AND p.holder <> $3 AND ` + now2 + ` < p.held_until)
	AND NOT ($5::bigint > 0 AND p.ended_at IS NOT NULL AND ` + now2 + ` >= p.ended_at
		AND ` + now2 + ` < p.ended_at + $5::bigint * interval '1 microsecond'))`

// AcquirePass takes the scope's pass lease for owner until now + lease (see
// sink.Passes and sink/sqlite's AcquirePass for the rules, which are the
// same here, by the database clock).
func (s *Sink) AcquirePass(ctx context.Context, scope, owner string, lease, minInterval time.Duration) (sink.PassLease, sink.PassRecord, error) {
	what := "acquire pass " + scope
	if err := checkPassName(what, "scope", scope); err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	if err := checkPassName(what, "owner", owner); err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	us, err := passMicros(what, lease)
	if err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	var minUS int64
	if minInterval > 0 {
		minUS = max(minInterval.Microseconds(), 1)
	}
	nc := nonce()
	var (
		r        passRow
		acquired bool
		now      time.Time
	)
	err = s.write(ctx, func(c *pgx.Conn) error {
		var err error
		r, err = scanPass(c.QueryRow(ctx, acquirePassSQL, scope, s.nowArg(), owner, us, minUS, nc), &acquired, &now)
		return err
	})
	if unknownOutcome(err) {
		rb, found, rerr := s.readBackPass(ctx, scope, nc)
		switch {
		case rerr != nil:
			return sink.PassLease{}, sink.PassRecord{}, fmt.Errorf("postgres: %s: outcome unknown (%w) and not read back: %w", what, err, rerr)
		case !found:
			return sink.PassLease{}, sink.PassRecord{}, fmt.Errorf("postgres: %s: not acquired (the statement was cut off: %w)", what, err)
		}
		r, acquired = rb, true
	} else if err != nil {
		return sink.PassLease{}, sink.PassRecord{}, fmt.Errorf("postgres: %s: %w", what, withCtxErr(ctx, err))
	}
	rec := r.rec
	if acquired {
		return sink.PassLease{Scope: scope, Owner: owner, Token: rec.Token, Until: rec.HeldUntil}, rec, nil
	}
	if rec.Holder != "" && rec.Holder != owner && now.Before(rec.HeldUntil) {
		return sink.PassLease{}, rec, fmt.Errorf("postgres: %s: held by %s until %s (token %d): %w",
			what, rec.Holder, rec.HeldUntil.Format(time.RFC3339Nano), rec.Token, sink.ErrPassHeld)
	}
	return sink.PassLease{}, rec, fmt.Errorf("postgres: %s: the last pass ended %v ago, less than %v: %w",
		what, now.Sub(r.endedAt), minInterval, sink.ErrPassRecent)
}

// readBackPass reads a scope's row after an unknown outcome; found is true
// when its last write was the statement with nonce nc.
func (s *Sink) readBackPass(ctx context.Context, scope string, nc int64) (passRow, bool, error) {
	ctx, cancel := readBackCtx(ctx)
	defer cancel()
	var (
		r    passRow
		ours bool
	)
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var err error
		r, err = scanPass(c.QueryRow(ctx, `SELECT `+passColumns+`, op_nonce IS NOT DISTINCT FROM $2
			FROM gemrecon_passes WHERE scope = $1`, scope, nc), &ours)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return passRow{}, false, nil
	}
	return r, ours, err
}

// passFencedErr explains a token-checked pass write that matched no row,
// from the row as the statement found it (exists false: no record).
func passFencedErr(what string, l sink.PassLease, exists bool, holder string, token int64) error {
	if !exists {
		return fmt.Errorf("postgres: %s: no pass record: %w", what, sink.ErrNotFound)
	}
	if holder == "" {
		holder = "nobody"
	}
	return fmt.Errorf("postgres: %s by %s with token %d: the lease is now held by %s (token %d): %w",
		what, l.Owner, l.Token, holder, token, sink.ErrFenced)
}

// checkLeaseArg validates the lease a caller presents to RenewPass/EndPass.
func checkLeaseArg(what string, l sink.PassLease) error {
	if err := checkPassName(what, "scope", l.Scope); err != nil {
		return err
	}
	if err := checkPassName(what, "owner", l.Owner); err != nil {
		return err
	}
	if l.Token < 0 {
		return fmt.Errorf("postgres: %s: negative token %d", what, l.Token)
	}
	return nil
}

// passCurrent ends a fenced pass statement: whether the update (CTE upd,
// returning one column) matched, the scope's row as the statement found it,
// and upd's column. $1 is the scope.
const passCurrent = `
SELECT EXISTS (SELECT 1 FROM upd), cur.scope IS NOT NULL, coalesce(cur.holder, ''), coalesce(cur.token, 0),
	(SELECT * FROM upd)
FROM (SELECT 1) AS one LEFT JOIN gemrecon_passes cur ON cur.scope = $1`

// renewPassSQL: $1 scope, $2 now, $3 token, $4 owner, $5 lease µs.
const renewPassSQL = `WITH upd AS (
	UPDATE gemrecon_passes SET held_until = ` + now2 + ` + $5::bigint * interval '1 microsecond'
	WHERE scope = $1 AND token = $3 AND holder = $4 RETURNING held_until)` + passCurrent

// RenewPass extends a held pass lease to now + lease: allowed while its
// token is current and the lease was not ended, even after it expired if
// nobody took it over; else ErrFenced. A renewal cut off is reported, not
// read back (repeating it is harmless).
func (s *Sink) RenewPass(ctx context.Context, l sink.PassLease, lease time.Duration) (sink.PassLease, error) {
	what := "renew pass " + l.Scope
	if err := checkLeaseArg(what, l); err != nil {
		return sink.PassLease{}, err
	}
	if l.Token == 0 {
		return sink.PassLease{}, fmt.Errorf("postgres: %s: token 0 holds no lease to renew", what)
	}
	us, err := passMicros(what, lease)
	if err != nil {
		return sink.PassLease{}, err
	}
	var (
		ok, exists bool
		holder     string
		token      int64
		until      *time.Time
	)
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, renewPassSQL, l.Scope, s.nowArg(), l.Token, l.Owner, us).Scan(&ok, &exists, &holder, &token, &until)
	})
	if err != nil {
		return sink.PassLease{}, fmt.Errorf("postgres: %s: %w", what, withCtxErr(ctx, err))
	}
	if !ok || until == nil {
		return sink.PassLease{}, passFencedErr(what, l, exists, holder, token)
	}
	nl := l
	nl.Until = until.UTC()
	return nl, nil
}

// passOutcomeSet records an outcome: $4 owner, $5 start, $6 end, $7 success,
// $8 full scan, $9 nonce, and $2 now for ended_at.
const passOutcomeSet = `last_start = $5::timestamptz, last_end = $6::timestamptz, last_holder = $4,
	last_success = CASE WHEN $7 THEN $6::timestamptz ELSE p.last_success END,
	last_full_scan = CASE WHEN $8 THEN $5::timestamptz ELSE p.last_full_scan END,
	ended_at = ` + now2 + `, op_nonce = $9::bigint`

// endPassSQL records and releases a held lease: $1 scope, $3 token.
const endPassSQL = `WITH upd AS (
	UPDATE gemrecon_passes AS p SET ` + passOutcomeSet + `, holder = NULL, held_until = NULL
	WHERE scope = $1 AND token = $3 AND holder = $4 RETURNING 1)` + passCurrent

// recordPassSQL records a pass that held no lease ($3 is unused but typed,
// so that both statements take the same arguments).
const recordPassSQL = `INSERT INTO gemrecon_passes AS p
	(scope, last_start, last_end, last_holder, last_success, last_full_scan, ended_at, op_nonce)
VALUES ($1, $5::timestamptz, $6::timestamptz, $4, CASE WHEN $7 THEN $6::timestamptz END,
	CASE WHEN $8 THEN $5::timestamptz END, ` + now2 + `, $9::bigint)
ON CONFLICT (scope) DO UPDATE SET ` + passOutcomeSet + `
RETURNING $3::bigint`

// EndPass records a pass's outcome and releases its lease; with token 0 it
// only records (the lease, held or not, is left alone). A lease that was
// taken over or already ended is ErrFenced, and nothing is recorded. An
// outcome whose reply was lost is settled and read back.
func (s *Sink) EndPass(ctx context.Context, l sink.PassLease, o sink.PassOutcome) error {
	what := "end pass " + l.Scope
	if err := checkLeaseArg(what, l); err != nil {
		return err
	}
	if o.Start.IsZero() || o.End.IsZero() {
		return fmt.Errorf("postgres: %s: the outcome needs both a start and an end time", what)
	}
	nc := nonce()
	args := []any{l.Scope, s.nowArg(), l.Token, l.Owner, o.Start, o.End, o.Success, o.FullScan, nc}
	var (
		ok, exists bool
		holder     string
		token      int64
	)
	err := s.write(ctx, func(c *pgx.Conn) error {
		if l.Token == 0 {
			ok, exists = true, true
			_, err := c.Exec(ctx, recordPassSQL, args...)
			return err
		}
		var one *int32
		return c.QueryRow(ctx, endPassSQL, args...).Scan(&ok, &exists, &holder, &token, &one)
	})
	if unknownOutcome(err) {
		rb, ours, rerr := s.readBackPass(ctx, l.Scope, nc)
		switch {
		case rerr != nil:
			return fmt.Errorf("postgres: %s: outcome unknown (%w) and not read back: %w", what, err, rerr)
		case ours:
			return nil
		case l.Token == 0 || (rb.rec.Token == l.Token && rb.rec.Holder == l.Owner):
			return fmt.Errorf("postgres: %s: not recorded (the statement was cut off: %w)", what, err)
		default:
			return passFencedErr(what, l, rb.rec.Scope != "", rb.rec.Holder, rb.rec.Token)
		}
	}
	if err != nil {
		return fmt.Errorf("postgres: %s: %w", what, withCtxErr(ctx, err))
	}
	if !ok {
		return passFencedErr(what, l, exists, holder, token)
	}
	return nil
}

// PassRecords returns every scope's record, ordered by scope in byte order
// (COLLATE "C", whatever the database's collation). HeldUntil may be in the
// past: an expired lease not yet taken over.
func (s *Sink) PassRecords(ctx context.Context) ([]sink.PassRecord, error) {
	var recs []sink.PassRecord
	err := s.withConn(ctx, func(c *pgx.Conn) error {
		var err error
		recs, err = passRecords(ctx, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: pass records: %w", err)
	}
	return recs, nil
}

// passRecords reads every record through q (a connection, or Stats's
// snapshot transaction); never nil.
func passRecords(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]sink.PassRecord, error) {
	rows, err := q.Query(ctx, `SELECT `+passColumns+` FROM gemrecon_passes ORDER BY scope COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	recs := []sink.PassRecord{}
	for rows.Next() {
		r, err := scanPass(rows)
		if err != nil {
			return nil, err
		}
		recs = append(recs, r.rec)
	}
	return recs, rows.Err()
}
