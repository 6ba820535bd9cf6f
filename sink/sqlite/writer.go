package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// maxYields bounds how often the writer yields to let more operations join
// a batch before it starts the transaction.
const maxYields = 4

// errClosed is returned by operations on a closed sink.
var errClosed = errors.New("sink is closed")

// op is one write waiting for the writer goroutine.
type op struct {
	ctx      context.Context
	fn       func(tx *sql.Conn) (any, error) // nil: only commit (Flush, Ping)
	onCommit func(v any)                     // after a successful commit, when fn returned no error
	res      chan opResult
	// alone, when set, is the op as one statement in SQLite's autocommit
	// mode, for when it is alone in its batch and no statistics wait: it
	// returns done=false when it wrote nothing, and fn then decides in an
	// ordinary transaction. It saves BEGIN, COMMIT and the statement
	// journal of a statement inside a transaction.
	alone func(tx *sql.Conn) (v any, done bool, err error)
}

type opResult struct {
	v   any
	err error
}

// submit queues fn for the writer and waits for its commit. The caller's ctx
// bounds the wait, not the transaction: a write the caller stopped waiting for
// may still commit (treat its outcome as unknown).
func (s *Sink) submit(ctx context.Context, fn func(tx *sql.Conn) (any, error), onCommit func(v any)) (any, error) {
	return s.submitOp(&op{ctx: ctx, fn: fn, onCommit: onCommit})
}

// submitOp is submit of a whole op (see op.alone).
func (s *Sink) submitOp(o *op) (any, error) {
	ctx := o.ctx
	if err := s.writable(); err != nil {
		return nil, err
	}
	o.res = make(chan opResult, 1)
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, fmt.Errorf("sqlite sink %s: %w", s.path, errClosed)
	}
	// A caller alone (the writer idle, nothing queued, and the last batch
	// had no company either) runs its own transaction here: handing it to
	// the writer goroutine and back costs two goroutine switches per
	// commit, which a sequential caller pays in full. Callers that come
	// together still meet in the writer's batches: while one runs alone,
	// the others queue, and the writer gathers them into one commit.
	// Running it here, the caller cannot stop waiting before its turn
	// ends: only a caller whose deadline lies beyond the longest wait for
	// another process's lock (see inlineOK) does so.
	if s.lastBatch.Load() <= 1 && len(s.ops) == 0 && s.inlineOK(ctx) && s.wmu.TryLock() {
		if len(s.ops) == 0 {
			s.runBatch([]*op{o})
			s.wmu.Unlock()
			s.mu.RUnlock()
			r := <-o.res
			return r.v, r.err
		}
		s.wmu.Unlock()
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.mu.RUnlock()
		return nil, ctx.Err()
	}
	s.mu.RUnlock()
	select {
	case r := <-o.res:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// inlineOK reports whether a caller with ctx may run its own transaction:
// when ctx has no deadline, or one farther away than twice the busy timeout
// (the longest BEGIN IMMEDIATE waits for another process's lock, retries
// included), so that waiting in its own transaction cannot make it miss the
// deadline. A caller cancelled meanwhile waits for that turn to end (nothing
// is written once its context is done). Others hand their operation to the
// writer goroutine and stop waiting when ctx ends, as before.
func (s *Sink) inlineOK(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return !ok || time.Until(d) > 2*s.opt.BusyTimeout
}

// writeLoop is the writer goroutine of this process: it takes every queued
// operation, runs them in one transaction, commits once and answers each.
func (s *Sink) writeLoop() {
	defer close(s.exited)
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		var batch []*op
		select {
		case o := <-s.ops:
			batch = append(batch, o)
		case <-t.C:
			if s.stats.len() == 0 {
				continue
			}
		case <-s.quit:
			// Close holds off new submissions; answer the queued ones and
			// write the last statistics.
			for {
				select {
				case o := <-s.ops:
					batch = append(batch, o)
					continue
				default:
				}
				break
			}
			s.wmu.Lock()
			if len(batch) > 0 || s.stats.len() > 0 {
				s.finalErr = s.runBatch(batch)
			}
			s.wmu.Unlock()
			return
		}
		s.wmu.Lock()
		batch = s.gather(batch)
		s.lastBatch.Store(int64(len(batch)))
		s.runBatch(batch)
		s.wmu.Unlock()
	}
}

// gather adds the queued operations to batch. Callers answered by the
// previous commit are often just about to submit their next operation (a
// dispatcher's workers complete at the same moment): before starting a
// transaction, the writer yields its processor (a few microseconds) so that
// they can join this commit instead of waiting a whole disk sync for the
// next one; it stops yielding as soon as a yield brings nothing new.
func (s *Sink) gather(batch []*op) []*op {
	for yields := 0; ; yields++ {
		n := len(batch)
	drain:
		for len(batch) < maxBatch {
			select {
			case o := <-s.ops:
				batch = append(batch, o)
			default:
				break drain
			}
		}
		if len(batch) >= maxBatch || yields >= maxYields || (yields > 0 && len(batch) == n) {
			return batch
		}
		runtime.Gosched()
	}
}

// domainError reports whether err is an expected outcome whose writes (a
// fenced counter, a dead transition) must be kept.
func domainError(err error) bool {
	return errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrNotClaimable) ||
		errors.Is(err, sink.ErrNotFound) || errors.Is(err, sink.ErrNotDead)
}

// runBatch runs batch in one BEGIN IMMEDIATE transaction, each op inside its
// own savepoint (none when it is alone), adds the buffered sighting
// statistics, commits once and answers every op.
func (s *Sink) runBatch(batch []*op) error {
	ctx := context.Background()
	answerAll := func(err error) error {
		for _, o := range batch {
			o.res <- opResult{err: err}
		}
		return err
	}
	if err := s.Broken(); err != nil {
		return answerAll(err)
	}
	// BEGIN IMMEDIATE waits in SQLite's busy handler; a conflict SQLite
	// answers at once is tried again, within the same busy timeout. The
	// transaction is the connection's own (BEGIN … COMMIT on the one
	// writer connection): database/sql's Tx would start a goroutine per
	// transaction to watch a context the batch does not have.
	tx := s.wconn
	// Until one of this writer's commits is seen to change the WAL-index
	// header, no row is cached by its version (see rowCache).
	var v0 walVersion
	arming := false
	if s.wal != nil && !s.walArmed.Load() {
		v0, arming = s.wal.version()
	}
	// An op alone, with no statistics waiting, may run as one autocommit
	// statement (op.alone).
	if len(batch) == 1 && batch[0].alone != nil && batch[0].ctx.Err() == nil && s.stats.len() == 0 {
		o := batch[0]
		var v any
		done := false
		if err := retryBusy(ctx, s.opt.BusyTimeout, func() error {
			var err error
			v, done, err = o.alone(tx)
			return s.fail(err)
		}); err != nil {
			return answerAll(err) // SQLite rolled the statement back
		}
		if done {
			return s.committed(batch, []opResult{{v: v}}, arming, v0)
		}
		// It wrote nothing: the ordinary transaction decides.
	}
	if err := retryBusy(ctx, s.opt.BusyTimeout, func() error {
		_, err := s.txExec(tx, qBegin)
		return s.fail(err)
	}); err != nil {
		return answerAll(err)
	}
	results := make([]opResult, len(batch))
	for i, o := range batch {
		if o.fn == nil {
			continue
		}
		if err := o.ctx.Err(); err != nil {
			results[i].err = err // the caller left before its turn: do nothing
			continue
		}
		if len(batch) == 1 {
			// Alone in the transaction: no savepoint; an error undoes the
			// whole transaction (buffered statistics stay buffered).
			v, err := o.fn(tx)
			if err != nil && !domainError(err) {
				s.rollback()
				return answerAll(s.fail(err))
			}
			results[i] = opResult{v: v, err: err}
			continue
		}
		if _, err := s.txExec(tx, qSavepoint); err != nil {
			s.rollback()
			return answerAll(s.fail(err))
		}
		v, err := o.fn(tx)
		if err != nil && !domainError(err) {
			if _, rerr := s.txExec(tx, qRollbackTo); rerr != nil {
				s.rollback()
				return answerAll(s.fail(rerr))
			}
			err = s.fail(err)
		}
		if _, err := s.txExec(tx, qRelease); err != nil {
			s.rollback()
			return answerAll(s.fail(err))
		}
		results[i] = opResult{v: v, err: err}
	}
	deltas := s.stats.take()
	if len(deltas) > 0 {
		if err := s.applyDeltas(tx, deltas); err != nil {
			s.log.Warn("sqlite sink: writing sighting statistics failed; kept in memory", "db", s.path, "err", err)
			s.stats.putBack(deltas)
			deltas = nil
		}
	}
	if _, err := s.txExec(tx, qCommit); err != nil {
		s.rollback() // a failed COMMIT may leave the transaction open
		if deltas != nil {
			s.stats.putBack(deltas)
		}
		return answerAll(s.fail(err))
	}
	return s.committed(batch, results, arming, v0)
}

// committed answers a batch whose commit succeeded: it counts the commit,
// arms the row cache when the commit was seen to move the WAL-index header
// from v0 (arming), checks that the path still names the file, and runs
// each op's onCommit.
func (s *Sink) committed(batch []*op, results []opResult, arming bool, v0 walVersion) error {
	s.commits.Add(1)
	if arming {
		if v1, ok := s.wal.version(); ok && v1 != v0 {
			s.walArmed.Store(true)
		}
	}
	// The commit counts only if it went to the file the path names: after
	// the file was deleted or replaced it went to a file nobody can find.
	if err := s.checkIdentity(); err != nil {
		s.markBroken(err)
		for _, o := range batch {
			o.res <- opResult{err: err}
		}
		return err
	}
	for i, o := range batch {
		r := results[i]
		if r.err == nil && o.onCommit != nil {
			o.onCommit(r.v)
		}
		o.res <- r
	}
	return nil
}

// rollback ends the writer's open transaction, if any, undoing it. Its
// error is not the caller's: the caller reports what made it roll back
// (and "no transaction is active" after SQLite rolled back by itself).
func (s *Sink) rollback() {
	s.txExec(s.wconn, qRollback)
}

// applyDeltas writes buffered sighting statistics inside tx, all or nothing.
func (s *Sink) applyDeltas(tx *sql.Conn, deltas map[string]*delta) error {
	if _, err := s.txExec(tx, qSavepointStats); err != nil {
		return err
	}
	err := func() error {
		for k, d := range deltas {
			if _, err := s.txExec(tx, qStatsSeen, d.seen, d.last, d.conflicts, d.sources[0], k); err != nil {
				return err
			}
			for _, extra := range d.sources[1:] {
				if _, err := s.txExec(tx, qStatsSource, extra, k); err != nil {
					return err
				}
			}
			if d.webhook != nil {
				if _, err := s.txExec(tx, qStatsWebhook, d.webhook, k); err != nil {
					return err
				}
			}
			if d.verified {
				if _, err := s.txExec(tx, qStatsVerified, k); err != nil {
					return err
				}
			}
		}
		return nil
	}()
	if err != nil {
		s.txExec(tx, qRollbackToStats)
		s.txExec(tx, qReleaseStats)
		return err
	}
	_, err = s.txExec(tx, qReleaseStats)
	return err
}

// Flush writes buffered sighting statistics now.
func (s *Sink) Flush(ctx context.Context) error {
	if s.wdb == nil {
		return nil
	}
	_, err := s.submit(ctx, nil, nil)
	return err
}

// flushErr is the error of the final flush made by Close.
func (s *Sink) flushErr() error { return s.finalErr }
