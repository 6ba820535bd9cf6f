package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"

	"github.com/gemrecon/gemrecon/sink"
)

// keyReaders is how many connections are kept for the key lookup of
// Record and RecordAndClaim (a duplicate sighting's only database work).
const keyReaders = 2

// keyReader is a reader connection held for qKeyRow, with the driver's own
// statement: a duplicate of a pending key costs one SQLite read
// transaction, and database/sql's pool, statement cache, Rows and Scan
// around it cost a large share of the rest.
type keyReader struct {
	conn *sql.Conn
	stmt driver.Stmt
	args []driver.NamedValue
	dest []driver.Value
}

// openKeyReaders opens the key readers on their own pool (kdb).
func (s *Sink) openKeyReaders(ctx context.Context) error {
	db, err := s.openWritable()
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(keyReaders)
	db.SetMaxIdleConns(keyReaders)
	s.kdb = db
	s.keyReaders = make(chan *keyReader, keyReaders)
	for range keyReaders {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		kr := &keyReader{conn: c, args: make([]driver.NamedValue, 1), dest: make([]driver.Value, 7)}
		err = c.Raw(func(dc any) error {
			p, ok := dc.(driver.ConnPrepareContext)
			if !ok {
				return fmt.Errorf("driver connection %T cannot prepare", dc)
			}
			kr.stmt, err = p.PrepareContext(ctx, qKeyRow)
			if err != nil {
				return err
			}
			if _, ok := kr.stmt.(driver.StmtQueryContext); !ok {
				return fmt.Errorf("driver statement %T cannot query with a context", kr.stmt)
			}
			return nil
		})
		if err != nil {
			c.Close()
			return err
		}
		s.keyReaders <- kr
		s.nKeyReaders++
	}
	return nil
}

// closeKeyReaders closes what openKeyReaders opened.
func (s *Sink) closeKeyReaders() error {
	if s.kdb == nil {
		return nil
	}
	// Every reader opened, including one a Record is using now (a single
	// read: it comes back at once).
	var errs []error
	for range s.nKeyReaders {
		kr := <-s.keyReaders
		errs = append(errs, kr.conn.Raw(func(any) error { return kr.stmt.Close() }), kr.conn.Close())
	}
	s.nKeyReaders = 0
	errs = append(errs, s.kdb.Close())
	s.kdb = nil
	return errors.Join(errs...)
}

// readKeyRow reads qKeyRow for key: on a key reader when one is free,
// otherwise through the reader pool.
func (s *Sink) readKeyRow(ctx context.Context, key string) (keyRow, bool, error) {
	var kr *keyReader
	select {
	case kr = <-s.keyReaders:
	default:
		return scanKeyRow(s.readQueryRow(ctx, qKeyRow, key))
	}
	defer func() { s.keyReaders <- kr }()
	var r keyRow
	found := false
	err := kr.conn.Raw(func(any) error {
		kr.args[0] = driver.NamedValue{Ordinal: 1, Value: key}
		rows, err := kr.stmt.(driver.StmtQueryContext).QueryContext(ctx, kr.args)
		if err != nil {
			return err
		}
		err = rows.Next(kr.dest)
		if errors.Is(err, io.EOF) {
			return rows.Close()
		}
		if err == nil {
			found = true
			err = scanKeyValues(kr.dest, &r)
		}
		return errors.Join(err, rows.Close())
	})
	clear(kr.dest)
	return r, found && err == nil, err
}

// scanKeyValues converts a qKeyRow row as the driver returns it.
func scanKeyValues(v []driver.Value, r *keyRow) error {
	str := func(i int) (string, error) {
		switch x := v[i].(type) {
		case string:
			return x, nil
		case []byte:
			return string(x), nil
		}
		return "", fmt.Errorf("key row column %d: %T, want text", i, v[i])
	}
	num := func(i int) (int64, error) {
		if x, ok := v[i].(int64); ok {
			return x, nil
		}
		return 0, fmt.Errorf("key row column %d: %T, want an integer", i, v[i])
	}
	st, err := str(0)
	if err != nil {
		return err
	}
	r.state = sink.State(st)
	if r.firstSource, err = str(1); err != nil {
		return err
	}
	if r.nextAttempt, err = num(2); err != nil {
		return err
	}
	if r.leaseUntil, err = num(3); err != nil {
		return err
	}
	c, err := num(4)
	if err != nil {
		return err
	}
	r.confirmed = c != 0
	if r.batchState, err = str(5); err != nil {
		return err
	}
	n, err := num(6)
	r.needsConfirm = n != 0
	return err
}

// walNow returns the WAL-index header's version when rows may be cached by
// it (see rowCache).
func (s *Sink) walNow() (walVersion, bool) {
	if s.wal == nil || !s.walArmed.Load() {
		return walVersion{}, false
	}
	return s.wal.version()
}

// lookupKeyRow is readKeyRow answered from rowCache while no commit has
// happened since the row was read. A row is kept by the version the header
// had before the read began: while the header still has that version, no
// commit has happened since, so the read saw the database as it is now. A
// commit between the header's read and the row's leaves a row newer than
// its version, which is never answered: the header has moved on, and a
// version never comes back.
func (s *Sink) lookupKeyRow(ctx context.Context, key string) (keyRow, bool, error) {
	r, hit, v, ok := s.cachedRow(key)
	if hit {
		return r, true, nil
	}
	r, found, err := s.readKeyRow(ctx, key)
	if err == nil && found && ok {
		s.rows.put(key, r, v)
	}
	return r, found, err
}

// cachedRow is key's row from rowCache when one is valid now (hit), and the
// header's version it looked at (ok is false when there is none to cache
// by).
func (s *Sink) cachedRow(key string) (r keyRow, hit bool, v walVersion, ok bool) {
	if v, ok = s.walNow(); !ok {
		return keyRow{}, false, v, false
	}
	if r, hit = s.rows.get(key, v); hit {
		s.rowHits.Add(1)
	}
	return r, hit, v, true
}
