package sqlite

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// maxBatch bounds how many queued writes share one transaction.
const maxBatch = 512

// maxYields bounds how often the writer yields to let more writes join a
// batch before it starts the transaction.
const maxYields = 4

// errClosed is returned by writes on a closed sink.
var errClosed = errors.New("sink is closed")

// op is one write waiting for the writer goroutine.
type op struct {
	ctx context.Context
	fn  func(sink.Tx) error
	err chan error
}

// Write queues fn for the writer goroutine and waits for its commit
// (sink.Store). The caller's ctx bounds the wait, not the transaction: a
// write the caller stopped waiting for may still commit. A write whose ctx
// ended before its turn does nothing.
func (s *db) Write(ctx context.Context, fn func(sink.Tx) error) error {
	if s.wdb == nil {
		return fmt.Errorf("sqlite sink %s: %w", s.path, ErrReadOnly)
	}
	if err := s.Broken(); err != nil {
		return err
	}
	o := &op{ctx: ctx, fn: fn, err: make(chan error, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return fmt.Errorf("sqlite sink %s: %w", s.path, errClosed)
	}
	select {
	case s.ops <- o:
	case <-ctx.Done():
		s.mu.RUnlock()
		return ctx.Err()
	}
	s.mu.RUnlock()
	select {
	case err := <-o.err:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writeLoop is the writer goroutine: it takes every queued write, runs them
// in one transaction and answers each after the one commit.
func (s *db) writeLoop() {
	defer close(s.exited)
	// An idle writer still looks at the files every second: a -wal deleted
	// under it is rescued (checkIdentity) before a kill loses it.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if s.Broken() == nil {
				if err := s.checkIdentity(); err != nil {
					s.markBroken(err)
				}
			}
		case o := <-s.ops:
			s.runBatch(s.gather([]*op{o}))
		case <-s.quit:
			// Close holds off new writes; answer the queued ones.
			for len(s.ops) > 0 {
				s.runBatch(s.gather([]*op{<-s.ops}))
			}
			return
		}
	}
}

// gather adds the queued writes to batch. Callers answered by the previous
// commit are often about to submit their next write (a dispatcher's workers
// complete at the same moment): before starting a transaction, the writer
// yields its processor so that they can join this commit instead of waiting
// a whole disk sync for the next one, and stops yielding as soon as a yield
// brings nothing new.
func (s *db) gather(batch []*op) []*op {
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

// runBatch runs batch in one BEGIN IMMEDIATE transaction, each write inside
// its own savepoint, commits once, checks that the path still names the
// opened file, and answers every write. Statements run under no caller's
// context: an interrupted statement may roll back the whole transaction,
// and with it the other callers' writes.
func (s *db) runBatch(batch []*op) {
	bg := context.Background()
	answer := func(err error) {
		for _, o := range batch {
			o.err <- err
		}
	}
	exec := func(q string) error {
		st, err := prepared(&s.wstmts, s.wconn, q)
		if err == nil {
			_, err = st.Exec()
		}
		return s.fail(err)
	}
	// A write alone needs no savepoint: when it fails, the transaction
	// is rolled back whole.
	alone := len(batch) == 1
	if err := s.Broken(); err != nil {
		answer(err)
		return
	}
	// BEGIN IMMEDIATE waits in SQLite's busy handler; a conflict SQLite
	// answers at once is tried again, within the same busy timeout.
	if err := retryBusy(bg, s.opt.BusyTimeout, func() error { return exec(`BEGIN IMMEDIATE`) }); err != nil {
		answer(err)
		return
	}
	errs := make([]error, len(batch))
	for i, o := range batch {
		if errs[i] = o.ctx.Err(); errs[i] != nil {
			continue // the caller left before its turn: do nothing
		}
		if alone {
			if err := o.fn(&tx{db: s, now: s.opt.Now()}); err != nil {
				s.rollback(answer, s.fail(err))
				return
			}
			continue
		}
		if err := exec(`SAVEPOINT op`); err != nil {
			s.rollback(answer, err)
			return
		}
		if err := o.fn(&tx{db: s, now: s.opt.Now()}); err != nil {
			errs[i] = s.fail(err)
			// A failed statement may have rolled back the whole
			// transaction (SQLITE_FULL, a script's RAISE(ROLLBACK)): then
			// there is no savepoint to return to, and nothing commits.
			if rerr := exec(`ROLLBACK TO op`); rerr != nil {
				s.rollback(answer, fmt.Errorf("%w (and the transaction could not be kept: %w)", errs[i], rerr))
				return
			}
		}
		if err := exec(`RELEASE op`); err != nil {
			s.rollback(answer, err)
			return
		}
	}
	if err := exec(`COMMIT`); err != nil {
		s.rollback(answer, err)
		return
	}
	s.commits.Add(1)
	// The commit counts only if it went to the file the path names: after
	// the file was deleted or replaced it went to a file nobody can find.
	if err := s.checkIdentity(); err != nil {
		s.markBroken(err)
		answer(err)
		return
	}
	for i, o := range batch {
		o.err <- errs[i]
	}
}

// rollback ends the writer's open transaction, if any (a failed COMMIT may
// leave it open), and answers the batch with err.
func (s *db) rollback(answer func(error), err error) {
	_, _ = s.wconn.ExecContext(context.Background(), `ROLLBACK`)
	answer(err)
}
