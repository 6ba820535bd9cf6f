package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// The pass records and pass lease of spec §5.5 (sink.Passes), one row of
// gemrecon_passes per scope. Every write goes through the writer goroutine
// like the key operations; the decisions use the sink's clock (Options.Now).

var _ sink.Passes = (*Sink)(nil)

// checkPassName is sink.CheckPassName, naming the operation.
func checkPassName(what, kind, v string) error {
	if err := sink.CheckPassName(kind, v); err != nil {
		return fmt.Errorf("sqlite sink: %s: %w", what, err)
	}
	return nil
}

// passUntil is now + lease, refusing a lease that is not positive or that
// would overflow the stored time.
func passUntil(what string, now int64, lease time.Duration) (int64, error) {
	if lease <= 0 {
		return 0, fmt.Errorf("sqlite sink: %s: lease %v must be positive", what, lease)
	}
	if int64(lease) > math.MaxInt64-now {
		return 0, fmt.Errorf("sqlite sink: %s: lease %v is too long", what, lease)
	}
	return now + int64(lease), nil
}

const passColumns = `scope, last_start, last_end, last_holder, last_success, last_full_scan, holder, held_until, token, ended_at`

// passRow is a stored record and the sink-clock time its last pass was
// recorded (the minimum interval is measured from it).
type passRow struct {
	rec     sink.PassRecord
	endedAt int64
}

func scanPass(sc interface{ Scan(...any) error }) (passRow, error) {
	var (
		r                                    passRow
		start, end, success, full, held, ean int64
	)
	err := sc.Scan(&r.rec.Scope, &start, &end, &r.rec.LastHolder, &success, &full, &r.rec.Holder, &held, &r.rec.Token, &ean)
	if err != nil {
		return r, err
	}
	r.rec.LastStart, r.rec.LastEnd = fromNS(start), fromNS(end)
	r.rec.LastSuccess, r.rec.LastFullScan = fromNS(success), fromNS(full)
	r.rec.HeldUntil = fromNS(held)
	r.endedAt = ean
	return r, nil
}

// passRowTx reads one scope's row inside the writer's transaction.
func passRowTx(tx *sql.Conn, scope string) (passRow, bool, error) {
	r, err := scanPass(tx.QueryRowContext(context.Background(), `SELECT `+passColumns+` FROM gemrecon_passes WHERE scope = ?`, scope))
	if errors.Is(err, sql.ErrNoRows) {
		return passRow{rec: sink.PassRecord{Scope: scope}}, false, nil
	}
	return r, err == nil, err
}

// passResult carries a domain outcome (held, recent, fenced, not found) out
// of the writer without rolling anything back or re-wrapping it.
type passResult struct {
	lease sink.PassLease
	rec   sink.PassRecord
	err   error
}

// AcquirePass takes the scope's pass lease for owner until now + lease (see
// sink.Passes). Another owner's live lease (now < held_until) is
// ErrPassHeld; with minInterval > 0, a pass recorded less than minInterval
// ago by the sink's clock is ErrPassRecent (a recorded time ahead of the
// clock, which went back, does not count as recent). Otherwise the lease is
// taken — over an expired holder, or over this owner's own live lease — and
// the token incremented.
func (s *Sink) AcquirePass(ctx context.Context, scope, owner string, lease, minInterval time.Duration) (sink.PassLease, sink.PassRecord, error) {
	what := "acquire pass " + scope
	if err := checkPassName(what, "scope", scope); err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	if err := checkPassName(what, "owner", owner); err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	if _, err := passUntil(what, 0, lease); err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		now := s.nowNS()
		r, _, err := passRowTx(tx, scope)
		if err != nil {
			return nil, err
		}
		rec := r.rec
		if rec.Holder != "" && rec.Holder != owner && now < toNS(rec.HeldUntil) {
			return passResult{rec: rec, err: fmt.Errorf("sqlite sink: %s: held by %s until %s (token %d): %w",
				what, rec.Holder, rec.HeldUntil.Format(time.RFC3339Nano), rec.Token, sink.ErrPassHeld)}, nil
		}
		if minInterval > 0 && r.endedAt != 0 && now >= r.endedAt && now-r.endedAt < int64(minInterval) {
			return passResult{rec: rec, err: fmt.Errorf("sqlite sink: %s: the last pass ended %v ago, less than %v: %w",
				what, time.Duration(now-r.endedAt), minInterval, sink.ErrPassRecent)}, nil
		}
		until, err := passUntil(what, now, lease)
		if err != nil {
			return passResult{err: err}, nil
		}
		if _, err := tx.ExecContext(context.Background(), `INSERT INTO gemrecon_passes (scope, holder, held_until, token)
			VALUES (?1, ?2, ?3, 1)
			ON CONFLICT (scope) DO UPDATE SET holder = ?2, held_until = ?3, token = token + 1`, scope, owner, until); err != nil {
			return nil, err
		}
		rec.Holder, rec.HeldUntil, rec.Token = owner, fromNS(until), rec.Token+1
		return passResult{lease: sink.PassLease{Scope: scope, Owner: owner, Token: rec.Token, Until: rec.HeldUntil}, rec: rec}, nil
	}, nil)
	if err != nil {
		return sink.PassLease{}, sink.PassRecord{}, err
	}
	r := v.(passResult)
	return r.lease, r.rec, r.err
}

// passFenced explains why a token-checked pass write matched no row:
// ErrNotFound when the scope has no record, else ErrFenced.
func passFenced(tx *sql.Conn, what string, l sink.PassLease) error {
	r, found, err := passRowTx(tx, l.Scope)
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("sqlite sink: %s: no pass record: %w", what, sink.ErrNotFound)
	}
	holder := r.rec.Holder
	if holder == "" {
		holder = "nobody"
	}
	return fmt.Errorf("sqlite sink: %s by %s with token %d: the lease is now held by %s (token %d): %w",
		what, l.Owner, l.Token, holder, r.rec.Token, sink.ErrFenced)
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
		return fmt.Errorf("sqlite sink: %s: negative token %d", what, l.Token)
	}
	return nil
}

// RenewPass extends a held pass lease to now + lease. It succeeds while
// the lease's token is current and the lease has not been ended, even after
// it expired if nobody took it over (as Renew of a key); else ErrFenced.
func (s *Sink) RenewPass(ctx context.Context, l sink.PassLease, lease time.Duration) (sink.PassLease, error) {
	what := "renew pass " + l.Scope
	if err := checkLeaseArg(what, l); err != nil {
		return sink.PassLease{}, err
	}
	if l.Token == 0 {
		return sink.PassLease{}, fmt.Errorf("sqlite sink: %s: token 0 holds no lease to renew", what)
	}
	if _, err := passUntil(what, 0, lease); err != nil {
		return sink.PassLease{}, err
	}
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		until, err := passUntil(what, s.nowNS(), lease)
		if err != nil {
			return passResult{err: err}, nil
		}
		res, err := tx.ExecContext(context.Background(), `UPDATE gemrecon_passes SET held_until = ?1
			WHERE scope = ?2 AND token = ?3 AND holder = ?4`, until, l.Scope, l.Token, l.Owner)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			err := passFenced(tx, what, l)
			if errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrNotFound) {
				return passResult{err: err}, nil
			}
			return nil, err
		}
		nl := l
		nl.Until = fromNS(until)
		return passResult{lease: nl}, nil
	}, nil)
	if err != nil {
		return sink.PassLease{}, err
	}
	r := v.(passResult)
	return r.lease, r.err
}

// checkOutcome refuses an outcome without its times (a pass that listed has
// both); an end before the start (the wall clock went back) is kept as given.
func checkOutcome(what string, o sink.PassOutcome) error {
	if o.Start.IsZero() || o.End.IsZero() {
		return fmt.Errorf("sqlite sink: %s: the outcome needs both a start and an end time", what)
	}
	return nil
}

// EndPass records a pass's outcome and releases its lease; with token 0 it
// only records (the lease, held or not, is left alone). A lease that was
// taken over or already ended is ErrFenced, and nothing is recorded.
func (s *Sink) EndPass(ctx context.Context, l sink.PassLease, o sink.PassOutcome) error {
	what := "end pass " + l.Scope
	if err := checkLeaseArg(what, l); err != nil {
		return err
	}
	if err := checkOutcome(what, o); err != nil {
		return err
	}
	v, err := s.submit(ctx, func(tx *sql.Conn) (any, error) {
		args := []any{l.Scope, l.Owner, toNS(o.Start), toNS(o.End), o.Success, o.FullScan, s.nowNS()}
		const set = `last_start = ?3, last_end = ?4, last_holder = ?2,
			last_success = CASE WHEN ?5 THEN ?4 ELSE last_success END,
			last_full_scan = CASE WHEN ?6 THEN ?3 ELSE last_full_scan END,
			ended_at = ?7`
		if l.Token == 0 {
			_, err := tx.ExecContext(context.Background(), `INSERT INTO gemrecon_passes
				(scope, last_start, last_end, last_holder, last_success, last_full_scan, ended_at)
				VALUES (?1, ?3, ?4, ?2, CASE WHEN ?5 THEN ?4 ELSE 0 END, CASE WHEN ?6 THEN ?3 ELSE 0 END, ?7)
				ON CONFLICT (scope) DO UPDATE SET `+set, args...)
			return passResult{}, err
		}
		res, err := tx.ExecContext(context.Background(), `UPDATE gemrecon_passes SET `+set+`, holder = '', held_until = 0
			WHERE scope = ?1 AND holder = ?2 AND token = ?8`, append(args, l.Token)...)
		if err != nil {
			return nil, err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			err := passFenced(tx, what, l)
			if errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrNotFound) {
				return passResult{err: err}, nil
			}
			return nil, err
		}
		return passResult{}, nil
	}, nil)
	if err != nil {
		return err
	}
	return v.(passResult).err
}

// PassRecords returns every scope's record, ordered by scope (byte order).
// HeldUntil may be in the past: an expired lease not yet taken over.
func (s *Sink) PassRecords(ctx context.Context) ([]sink.PassRecord, error) {
	recs, err := passRecords(ctx, s.rdb)
	return recs, s.fail(err)
}

// passRecords reads every record through q (the reader pool, or Stats's
// read transaction); never nil.
func passRecords(ctx context.Context, q rowsQuerier) ([]sink.PassRecord, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+passColumns+` FROM gemrecon_passes ORDER BY scope`)
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
