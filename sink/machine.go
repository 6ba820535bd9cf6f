package sink

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"
)

// Store is what a backend gives the state machine: transactions that load
// and store rows, and the reads. It decides nothing (rules.go does).
type Store interface {
	// Write runs fn in one write transaction and commits it when fn returns
	// nil; an error from fn undoes what fn wrote and is returned. Every row
	// fn loads is held against other writers until the transaction ends
	// (SQLite: its write lock; PostgreSQL: FOR UPDATE), so what the core
	// decided from a row is stored only while the row is as it was read. A
	// commit whose outcome the backend cannot learn is an error.
	Write(ctx context.Context, fn func(Tx) error) error
	// Peek reads a key's row without holding it: what Record needs to tell
	// a duplicate, which writes nothing, from a sighting that must commit.
	// It needs only Key, State, Confirmed, BatchState, NeedsConfirm and
	// FirstSource (the fields sighting and duplicate read); a Store may
	// leave the others zero.
	Peek(ctx context.Context, key string) (Row, bool, error)
	// Entry, Entries, Stats, DueKeys, PassRecords and MaxLookback are the
	// reads behind Get, List, Stats, Due, PassRecords and MaxLookback.
	Entry(ctx context.Context, key string) (Entry, error)
	Entries(ctx context.Context, o ListOptions) ([]Entry, error)
	Stats(ctx context.Context) (Stats, error)
	DueKeys(ctx context.Context, limit int, skipNeedsConfirm bool) ([]string, error)
	PassRecords(ctx context.Context) ([]PassRecord, error)
	MaxLookback(ctx context.Context) (d time.Duration, forever, ok bool, err error)
	// Now is the time by the store's clock (Clock).
	Now(ctx context.Context) (time.Time, error)
	Ping(ctx context.Context) error
	Close() error
}

// Tx is one write transaction of a Store.
type Tx interface {
	// Now is the time by which this transaction decides and stores times:
	// Options.Now, or PostgreSQL's now() when no clock was injected.
	Now() time.Time
	// Load reads a key's row and holds it until the transaction ends.
	Load(key string) (Row, bool, error)
	// Due loads up to limit claimable rows (limit <= 0: all), oldest first
	// ("Order, time and errors"), each held as Load holds it; PostgreSQL
	// skips rows other transactions hold.
	Due(limit int, skipNeedsConfirm bool) ([]Row, error)
	// Insert adds a new key with its first payload; false when the key
	// exists (another transaction inserted it since Load).
	Insert(r Row, payload []byte) (bool, error)
	// Update stores r over the row Load or Due read.
	Update(r Row) error
	// Bodies reads what a claim hands over besides the row: the payload,
	// the first webhook body and the results file.
	Bodies(key string) (payload, webhook []byte, resultsFile string, err error)
	// SetOperation makes op the key's payload; moveWebhook keeps the
	// payload it replaces as the first webhook body (a webhook-first key
	// being confirmed: each byte is stored once).
	SetOperation(key string, op []byte, moveWebhook bool) error
	// SetResults stores where the key's results were written.
	SetResults(key, file string) error
	// CountFenced adds one to the durable count of fenced outcomes.
	CountFenced() error
	// ApplyStats adds buffered sighting statistics to their keys (keys no
	// longer stored are skipped), each row held as Load holds it.
	ApplyStats(d map[string]*Delta) error
	// Purge deletes the keys done before the given time and returns them.
	Purge(before time.Time) ([]string, error)
	// NoteLookback records a poll's lookback (0: forever).
	NoteLookback(d time.Duration) error
	// LoadPass and StorePass read (held) and write a scope's pass record.
	LoadPass(scope string) (PassRow, bool, error)
	StorePass(r PassRow) error
	// Exec runs an --sql script with its named parameters (spec §4).
	Exec(script string, params map[string]any) error
	// AddHistory appends a to the key's history; with keep > 0 the entries
	// before the last keep are then deleted and counted as dropped.
	AddHistory(key string, a Attempt, keep int) error
	// EndAttempt ends the running attempt entry of token with its outcome.
	EndAttempt(key string, token int64, end time.Time, outcome, errText string) error
}

// ErrNotDone: a rerun was asked for a key that is not done.
var ErrNotDone = errors.New("key is not done")

// Machine is the state machine of spec §3 over a Store: it implements
// Sink (and Clock, SQLCompleter and RecordAndClaim). Backends return one.
type Machine struct {
	st   Store
	opt  Options
	log  *slog.Logger
	name string // "sqlite sink", "postgres sink": where a log line comes from

	mu      sync.Mutex
	buf     map[string]*Delta // buffered statistics of duplicate sightings
	full    chan struct{}     // kicks the flusher when flushAt keys wait
	stop    chan struct{}
	stopped sync.WaitGroup
	closed  sync.Once
	err     error
}

// Delta is what buffered sightings of one key add to its statistics (spec
// §3 "Sightings, payloads and conflicts"): they never cost a commit, and a
// crash may lose the last second of them, never a key or a state.
type Delta struct {
	N         int64
	Sources   []string // in first-seen order
	Conflicts int64
	Webhook   []byte // a poll-first key's first webhook body (kept where none is yet)
	Verified  bool   // a sighting not only dynamically verified: the need for confirmation ends
}

func (d *Delta) merge(o *Delta) {
	d.N += o.N
	d.Conflicts += o.Conflicts
	for _, s := range o.Sources {
		if !slices.Contains(d.Sources, s) {
			d.Sources = append(d.Sources, s)
		}
	}
	if d.Webhook == nil && o.Webhook != nil {
		d.Webhook = slices.Clone(o.Webhook) // the caller's buffer may be reused
	}
	d.Verified = d.Verified || o.Verified
}

// Buffered statistics are written at the latest after flushEvery, or by
// the flusher once flushAt keys are waiting (by the sighting itself once
// four times as many are), and before every read that shows them.
const (
	flushEvery = time.Second
	flushAt    = 1024
)

// NewMachine returns the state machine over st. opt is filled with its
// defaults; a read-only machine buffers nothing.
func NewMachine(st Store, opt Options, log *slog.Logger, name string) *Machine {
	m := &Machine{st: st, opt: opt.WithDefaults(), log: cmp.Or(log, slog.Default()), name: name, buf: map[string]*Delta{},
		full: make(chan struct{}, 1), stop: make(chan struct{})}
	if !opt.ReadOnly {
		m.stopped.Add(1)
		go m.flusher()
	}
	return m
}

var (
	_ Sink         = (*Machine)(nil)
	_ Clock        = (*Machine)(nil)
	_ SQLCompleter = (*Machine)(nil)
)

// errorf says which operation on which key met err. (The Store's errors
// are returned as they are: they say what and where already.)
func (m *Machine) errorf(op, key string, err error) error {
	if key != "" {
		return fmt.Errorf("%s: %s %s: %w", m.name, op, KeyText(key), err)
	}
	return fmt.Errorf("%s: %s: %w", m.name, op, err)
}

// write runs fn in a write transaction. The domain outcome fn leaves in out
// (fenced, not claimable, …) commits what fn wrote and is returned as op's
// on key; the transaction's error, which does not commit, as it is.
func (m *Machine) write(ctx context.Context, op, key string, fn func(tx Tx) (out error, err error)) error {
	var out error
	err := m.st.Write(ctx, func(tx Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	if err == nil && out != nil {
		return m.errorf(op, key, out)
	}
	return err
}

// keyWrite is write for an operation on a stored key: fn gets its row, and
// a key that is not stored is the outcome ErrNotFound.
func (m *Machine) keyWrite(ctx context.Context, op, key string, fn func(tx Tx, r Row) (out error, err error)) error {
	return m.write(ctx, op, key, func(tx Tx) (error, error) {
		r, ok, err := tx.Load(key)
		if err != nil {
			return nil, err
		}
		if !ok {
			return ErrNotFound, nil
		}
		return fn(tx, r)
	})
}

// claimed stores a claim the rules decided (prev → out, at now): the row,
// and in the history the end of an attempt whose lease expired (a takeover)
// and the new attempt.
func (m *Machine) claimed(tx Tx, prev, out Row, o ClaimOptions, now time.Time, insert []byte) error {
	var err error
	if insert != nil {
		var ok bool
		if ok, err = tx.Insert(out, insert); err == nil && !ok {
			err = errInsertRace
		}
	} else {
		err = tx.Update(out)
	}
	if err == nil && prev.State == StateClaimed {
		err = tx.EndAttempt(out.Key, prev.Token, prev.LeaseUntil, OutcomeLeaseExpired, "")
	}
	if err != nil || out.State != StateClaimed {
		return err
	}
	return tx.AddHistory(out.Key, Attempt{Kind: KindAttempt, Token: out.Token, Command: o.Command, Holder: out.Owner,
		Start: now, Outcome: OutcomeRunning}, HistoryKept)
}

// Record notes a sighting (see Sink).
func (m *Machine) Record(ctx context.Context, sg Sighting) (RecordResult, error) {
	rr, _, err := m.record(ctx, sg, nil)
	return rr, err
}

// ClaimRequest asks RecordAndClaim for a claim made in the commit that
// records the sighting, as the dispatcher would make it.
type ClaimRequest struct {
	Owner string
	Lease time.Duration
	Opts  ClaimOptions
}

// RecordAndClaim is Record, and when the key can be claimed now and no
// other key is due before it, a claim of it in the same commit (spec §4: a
// completion that comes alone costs two commits, not three). A sighting
// that grants no claim returns a nil claim: it was recorded, and the key
// waits for the dispatcher like any other.
func (m *Machine) RecordAndClaim(ctx context.Context, sg Sighting, req ClaimRequest) (RecordResult, *Claim, error) {
	if err := checkLease(req.Lease); err != nil {
		return RecordResult{}, nil, m.errorf("record and claim", sg.Key, err)
	}
	return m.record(ctx, sg, &req)
}

func (m *Machine) record(ctx context.Context, sg Sighting, req *ClaimRequest) (RecordResult, *Claim, error) {
	rs, cs, err := m.recordAll(ctx, []Sighting{sg}, req)
	if err != nil {
		return RecordResult{}, nil, err
	}
	return rs[0], cs[0], nil
}

// RecordAll records sightings as Record does, those that must commit in
// one commit: a poll pass records each listed page so (spec §5.3).
func (m *Machine) RecordAll(ctx context.Context, sgs []Sighting) ([]RecordResult, error) {
	rs, _, err := m.recordAll(ctx, sgs, nil)
	return rs, err
}

// sightOut is what one sighting did inside a write.
type sightOut struct {
	rr        RecordResult
	c         *Claim
	dup, prev *Row // a duplicate after all (its row); a confirmation (the row before)
}

func (m *Machine) recordAll(ctx context.Context, sgs []Sighting, req *ClaimRequest) ([]RecordResult, []*Claim, error) {
	for _, sg := range sgs {
		if err := CheckKey(sg.Key); err != nil { // spec §12
			return nil, nil, err
		}
		if sg.Source == "" {
			return nil, nil, fmt.Errorf("record %s: empty source", KeyText(sg.Key))
		}
	}
	rs, cs := make([]RecordResult, len(sgs)), make([]*Claim, len(sgs))
	var write []int // the sightings that must commit
	for i, sg := range sgs {
		r, found, err := m.st.Peek(ctx, sg.Key)
		if err != nil {
			return nil, nil, err
		}
		if found {
			if kind, _, conflict := sighting(r, true, sg, time.Time{}); kind == sightDuplicate {
				m.noteDuplicate(r, sg, conflict)
				rs[i] = RecordResult{State: r.State, Conflict: conflict}
				continue
			}
		}
		write = append(write, i)
	}
	if len(write) == 0 {
		return rs, cs, nil
	}
	outs := make([]sightOut, len(write))
	err := m.st.Write(ctx, func(tx Tx) error {
		for j, i := range write {
			var err error
			if outs[j], err = m.sight(tx, sgs[i], req); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, errInsertRace) { // PostgreSQL: inserted by another meanwhile
		return m.recordAll(ctx, sgs, req)
	}
	if err != nil {
		return nil, nil, err
	}
	for j, i := range write {
		o, sg := outs[j], sgs[i]
		rs[i], cs[i] = o.rr, o.c
		switch {
		case o.dup != nil:
			m.noteDuplicate(*o.dup, sg, o.rr.Conflict)
		case o.prev != nil:
			if o.rr.Conflict {
				m.log.Warn(m.name+": state conflict: the API's batch state differs from the stored one; the API's wins",
					"key", sg.Key, "stored", o.prev.BatchState, "api", sg.State)
			}
			if o.prev.State == StateDead && o.rr.State != StateDead {
				m.log.Info(m.name+": a key dead as unknown to the API was listed by the API: pending again, due now", "key", sg.Key)
			}
			m.add(sg.Key, &Delta{N: 1, Sources: []string{sg.Source}})
		}
	}
	return rs, cs, nil
}

// sight decides and stores what sg does to its key inside tx (on the held
// row), and with req the claim of a key due now when no other key is.
func (m *Machine) sight(tx Tx, sg Sighting, req *ClaimRequest) (o sightOut, err error) {
	now := tx.Now()
	r, found, err := tx.Load(sg.Key)
	if err != nil {
		return o, err
	}
	kind, out, conflict := sighting(r, found, sg, now)
	switch kind {
	case sightDuplicate: // became known since the look
		o.dup, o.rr = &r, RecordResult{State: r.State, Conflict: conflict}
		return o, nil
	case sightConfirm:
		o.prev, o.rr = &r, RecordResult{State: out.State, Confirmed: true, Conflict: conflict}
		if err := tx.Update(out); err != nil {
			return o, err
		}
		if len(sg.Payload) > 0 {
			if err := tx.SetOperation(sg.Key, sg.Payload, r.FirstSource == SourceWebhook); err != nil {
				return o, err
			}
		}
	case sightNew:
		o.rr = RecordResult{New: true, State: StatePending}
	}
	// The claim the dispatcher would make now, if this key is due and no
	// other key is due before it: a new key is due at now, so any key
	// already due is older.
	var claimed Row
	var opts ClaimOptions
	if req != nil && out.claimable(now) {
		opts = req.Opts
		first, err := tx.Due(1, opts.SkipNeedsConfirm)
		if err != nil {
			return o, err
		}
		if len(first) == 0 || kind == sightConfirm && first[0].Key == sg.Key {
			claimed, _, _ = claim(out, req.Owner, req.Lease, now, m.opt.MaxAttempts, opts)
		}
	}
	var insert []byte
	if kind == sightNew {
		insert = append([]byte{}, sg.Payload...) // not nil: insert
	}
	if claimed.State != StateClaimed {
		if insert == nil {
			return o, nil
		}
		return o, m.claimed(tx, Row{}, out, opts, now, insert) // pending, unclaimed
	}
	o.rr.State = StateClaimed
	if insert != nil {
		out = Row{}
	}
	if err := m.claimed(tx, out, claimed, opts, now, insert); err != nil {
		return o, err
	}
	cl, err := claimOf(tx, claimed)
	o.c = &cl
	return o, err
}

// errInsertRace: the key was inserted by another transaction between this
// one's Load and Insert; the sighting is decided again.
var errInsertRace = errors.New("inserted concurrently")

// noteDuplicate buffers a duplicate sighting of the key whose row is r.
func (m *Machine) noteDuplicate(r Row, sg Sighting, conflict bool) {
	if conflict {
		m.log.Warn(m.name+": state conflict: a sighting's batch state differs from the stored one; the stored state stays",
			"key", sg.Key, "source", sg.Source, "stored", r.BatchState, "seen", sg.State, "confirmed", r.Confirmed)
	}
	d := duplicate(r, sg, conflict)
	m.add(sg.Key, &d)
}

func (m *Machine) add(key string, d *Delta) {
	m.mu.Lock()
	b := m.buf[key]
	if b == nil {
		b = &Delta{}
		m.buf[key] = b
	}
	b.merge(d)
	n := len(m.buf)
	m.mu.Unlock()
	switch {
	case n >= 4*flushAt: // the flusher does not keep up: the sightings wait
		_ = m.Flush(context.Background()) // statistics: a failure keeps them for the next flush
	case n >= flushAt:
		select {
		case m.full <- struct{}{}:
		default:
		}
	}
}

// Flush writes the buffered statistics now. On failure they stay buffered,
// unless the commit's outcome is unknown: they are additive, so they are
// dropped rather than maybe counted twice.
func (m *Machine) Flush(ctx context.Context) error {
	m.mu.Lock()
	taken := m.buf
	m.buf = map[string]*Delta{}
	m.mu.Unlock()
	if len(taken) == 0 {
		return nil
	}
	err := m.st.Write(ctx, func(tx Tx) error { return tx.ApplyStats(taken) })
	if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		m.mu.Lock()
		for k, d := range taken {
			if b := m.buf[k]; b != nil {
				d.merge(b)
			}
			m.buf[k] = d
		}
		m.mu.Unlock()
	}
	return err
}

// ErrOutcomeUnknown is wrapped by a Store's error for a commit that may or
// may not have happened (its answer was lost and could not be learnt).
var ErrOutcomeUnknown = errors.New("the commit's outcome is unknown")

func (m *Machine) flusher() {
	defer m.stopped.Done()
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-m.full:
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = m.Flush(ctx)
		cancel()
	}
}

// claimOf builds the Claim handed to the holder of the claimed row r.
func claimOf(tx Tx, r Row) (Claim, error) {
	payload, webhook, results, err := tx.Bodies(r.Key)
	return Claim{Key: r.Key, Token: r.Token, Attempt: r.Attempts, Owner: r.Owner, LeaseUntil: r.LeaseUntil,
		Payload: payload, FirstSource: r.FirstSource, Takeover: r.TookOver, FirstSeenAt: r.FirstSeenAt,
		Confirmed: r.Confirmed, BatchState: r.BatchState, NeedsConfirm: r.NeedsConfirm, Webhook: webhook,
		ResultsFile: results, Rerun: r.Reruns > 0, NoResults: r.NoResults}, err
}

func checkLease(lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("lease %v must be positive", lease)
	}
	return nil
}

// Claim takes the key for one attempt (see Sink).
func (m *Machine) Claim(ctx context.Context, key, owner string, lease time.Duration, o ClaimOptions) (Claim, error) {
	if err := checkLease(lease); err != nil {
		return Claim{}, m.errorf("claim", key, err)
	}
	var c Claim
	err := m.keyWrite(ctx, "claim", key, func(tx Tx, r Row) (out, err error) {
		c, out, err = m.take(tx, r, owner, lease, o)
		return out, err
	})
	if err != nil {
		return Claim{}, err
	}
	return c, nil
}

// take stores the claim of r that the rules decide, and returns it, or the
// refusal as the outcome out (a takeover of the last allowed attempt stores
// the key dead, and says so).
func (m *Machine) take(tx Tx, r Row, owner string, lease time.Duration, o ClaimOptions) (c Claim, out, err error) {
	got, store, out := claim(r, owner, lease, tx.Now(), m.opt.MaxAttempts, o)
	if store {
		if err := m.claimed(tx, r, got, o, tx.Now(), nil); err != nil {
			return c, nil, err
		}
	}
	if out != nil {
		if got.State == StateDead {
			m.log.Warn(m.name+": lease expired on the last attempt; key is dead", "key", got.Key, "attempts", got.Attempts)
		}
		return c, out, nil
	}
	c, err = claimOf(tx, got)
	return c, nil, err
}

// ClaimDue claims up to limit due keys (limit <= 0: all), oldest first.
func (m *Machine) ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int, o ClaimOptions) ([]Claim, error) {
	if err := checkLease(lease); err != nil {
		return nil, m.errorf("claim due", "", err)
	}
	var claims []Claim
	err := m.st.Write(ctx, func(tx Tx) error {
		claims = nil
		for limit <= 0 || len(claims) < limit {
			rows, err := tx.Due(limit-len(claims), o.SkipNeedsConfirm)
			if err != nil || len(rows) == 0 {
				return err
			}
			lost := 0
			for _, r := range rows {
				c, out, err := m.take(tx, r, owner, lease, o)
				switch {
				case err != nil:
					return err
				case out != nil: // a takeover that ended dead
					lost++
				default:
					claims = append(claims, c)
				}
			}
			if lost == 0 {
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return claims, nil
}

// Renew extends a claim's lease to now + lease (see Sink).
func (m *Machine) Renew(ctx context.Context, key string, token int64, lease time.Duration) error {
	if err := checkLease(lease); err != nil {
		return m.errorf("renew", key, err)
	}
	return m.fencedWrite(ctx, "renew", key, token, func(tx Tx, r Row) error {
		r.LeaseUntil = LeaseEnd(tx.Now(), lease)
		return tx.Update(r)
	})
}

// fencedWrite runs fn on the key's row when token is its current claim's,
// else counts and logs the write as fenced (spec §3): the refusal is the
// outcome, and the count commits.
func (m *Machine) fencedWrite(ctx context.Context, op, key string, token int64, fn func(tx Tx, r Row) error) error {
	return m.keyWrite(ctx, op, key, func(tx Tx, r Row) (error, error) {
		out := fence(r, token)
		if out == nil {
			return nil, fn(tx, r)
		}
		m.log.Error(m.name+": fenced outcome discarded: the claim's token is no longer current",
			"op", op, "key", r.Key, "token", token, "current_token", r.Token, "state", r.State)
		// On record without trimming: a stale holder rewrites none of the
		// current holder's entries.
		now := tx.Now()
		return out, errors.Join(tx.CountFenced(), tx.AddHistory(r.Key,
			Attempt{Kind: KindFenced, Token: token, Start: now, End: now, Outcome: OutcomeFenced, Error: op}, 0))
	})
}

// Complete marks a claimed key done when token is current.
func (m *Machine) Complete(ctx context.Context, key string, token int64) error {
	return m.fencedWrite(ctx, "complete", key, token, func(tx Tx, r Row) error {
		return m.ended(tx, complete(r, tx.Now()), OutcomeOK, "")
	})
}

// ended stores the row of an attempt's outcome, and ends its entry in the
// history.
func (m *Machine) ended(tx Tx, out Row, outcome, errText string) error {
	if err := tx.Update(out); err != nil {
		return err
	}
	return tx.EndAttempt(out.Key, out.Token, tx.Now(), outcome, errText)
}

// CompleteSQL runs an --sql script and marks the key done in one
// transaction (SQLCompleter).
func (m *Machine) CompleteSQL(ctx context.Context, key string, token int64, script string, params map[string]any) error {
	return m.fencedWrite(ctx, "complete", key, token, func(tx Tx, r Row) error {
		if err := tx.Exec(script, params); err != nil {
			return err
		}
		return m.ended(tx, complete(r, tx.Now()), OutcomeOK, "")
	})
}

// Fail ends a claimed attempt (see Sink).
func (m *Machine) Fail(ctx context.Context, key string, token int64, f Failure) (State, error) {
	// NotBefore is by the caller's clock: it travels as a wait from now,
	// which the transaction adds to its own now (on PostgreSQL the
	// server's), so that clocks that disagree do not move it.
	delay := f.NotBefore.Sub(m.opt.Now())
	var state State
	err := m.fencedWrite(ctx, "fail", key, token, func(tx Tx, r Row) error {
		out := fail(r, f, delay, !f.NotBefore.IsZero(), tx.Now(), m.opt)
		state = out.State
		outcome := OutcomeFailed
		switch {
		case f.Interrupted:
			outcome = OutcomeInterrupted
		case f.NoAttempt:
			outcome = OutcomeHandedBack
		}
		return m.ended(tx, out, outcome, out.LastError)
	})
	return state, err
}

// Confirm stores the API's answer for a claimed key (see Sink).
func (m *Machine) Confirm(ctx context.Context, key string, token int64, c Confirmation) error {
	return m.fencedWrite(ctx, "confirm", key, token, func(tx Tx, r Row) error {
		out, apply, conflict := confirm(r, c)
		if conflict {
			m.log.Warn(m.name+": state conflict: the API's batch state differs from the stored one",
				"key", key, "stored", r.BatchState, "api", c.State)
		}
		if err := tx.Update(out); err != nil || !apply || len(c.Operation) == 0 {
			return err
		}
		return tx.SetOperation(key, c.Operation, r.FirstSource == SourceWebhook)
	})
}

// NoteResults records where the claimed key's results were written.
func (m *Machine) NoteResults(ctx context.Context, key string, token int64, file string) error {
	return m.fencedWrite(ctx, "note results", key, token, func(tx Tx, _ Row) error {
		return tx.SetResults(key, file)
	})
}

// Retry moves a dead key to pending, or with o.Rerun a done key (see Sink).
func (m *Machine) Retry(ctx context.Context, key string, o RetryOptions) error {
	return m.keyWrite(ctx, "retry", key, func(tx Tx, r Row) (error, error) {
		out, rerr := retry(r, o, tx.Now())
		if rerr != nil {
			return rerr, nil
		}
		kind := KindRetry
		if o.Rerun {
			kind = KindRerun
		}
		if err := tx.Update(out); err != nil {
			return nil, err
		}
		return nil, tx.AddHistory(key, Attempt{Kind: kind, Token: r.Token, Holder: o.By, Start: tx.Now()}, HistoryKept)
	})
}

// Due lists keys that can be claimed now, oldest first.
func (m *Machine) Due(ctx context.Context, limit int, o ClaimOptions) ([]string, error) {
	return m.st.DueKeys(ctx, limit, o.SkipNeedsConfirm)
}

// Get returns one key's entry, its statistics flushed first.
func (m *Machine) Get(ctx context.Context, key string) (Entry, error) {
	if err := m.Flush(ctx); err != nil {
		return Entry{}, err
	}
	e, err := m.st.Entry(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return Entry{}, m.errorf("get", key, err)
	}
	return e, err
}

// List returns entries, oldest first.
func (m *Machine) List(ctx context.Context, o ListOptions) ([]Entry, error) {
	if o.State != "" && !o.State.Valid() {
		return nil, m.errorf("list", "", fmt.Errorf("unknown state %q (want pending, claimed, done or dead)", o.State))
	}
	if err := m.Flush(ctx); err != nil {
		return nil, err
	}
	return m.st.Entries(ctx, o)
}

// Stats summarises the sink.
func (m *Machine) Stats(ctx context.Context) (Stats, error) {
	if err := m.Flush(ctx); err != nil {
		return Stats{}, err
	}
	return m.st.Stats(ctx)
}

// Purge deletes the keys done for longer than olderThan, measured with the
// clock that wrote their done times (the transaction's), and returns them.
func (m *Machine) Purge(ctx context.Context, olderThan time.Duration) ([]string, error) {
	if olderThan < 0 {
		return nil, m.errorf("purge", "", fmt.Errorf("negative age %v (want the time keys have been done for, e.g. 720h)", olderThan))
	}
	var keys []string
	err := m.st.Write(ctx, func(tx Tx) error {
		before := time.Unix(0, math.MinInt64) // nothing is older than the range of times
		if now := tx.Now(); now.UnixNano() > math.MinInt64+int64(olderThan) {
			before = now.Add(-olderThan)
		}
		var err error
		keys, err = tx.Purge(before)
		return err
	})
	if err != nil {
		return nil, err
	}
	if keys == nil {
		keys = []string{} // never nil
	}
	return keys, nil
}

// NoteLookback records that a poll used this lookback (0 = forever).
func (m *Machine) NoteLookback(ctx context.Context, lookback time.Duration) error {
	if lookback < 0 {
		return m.errorf("note lookback", "", fmt.Errorf("negative lookback %v", lookback))
	}
	return m.st.Write(ctx, func(tx Tx) error { return tx.NoteLookback(lookback) })
}

// MaxLookback returns the longest lookback ever noted.
func (m *Machine) MaxLookback(ctx context.Context) (time.Duration, bool, bool, error) {
	return m.st.MaxLookback(ctx)
}

// Now is the time by the store's clock (Clock).
func (m *Machine) Now(ctx context.Context) (time.Time, error) { return m.st.Now(ctx) }

// Ping checks that the database is reachable and writable.
func (m *Machine) Ping(ctx context.Context) error { return m.st.Ping(ctx) }

// Close flushes the statistics and closes the store.
func (m *Machine) Close() error {
	m.closed.Do(func() {
		close(m.stop)
		m.stopped.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.err = errors.Join(m.Flush(ctx), m.st.Close())
	})
	return m.err
}

// AcquirePass takes the scope's pass lease (see Passes).
func (m *Machine) AcquirePass(ctx context.Context, scope, owner string, lease, minInterval time.Duration) (PassLease, PassRecord, error) {
	op := "acquire pass " + scope
	if err := errors.Join(CheckPassName("scope", scope), CheckPassName("owner", owner), checkLease(lease)); err != nil {
		return PassLease{}, PassRecord{}, m.errorf(op, "", err)
	}
	var rec PassRecord
	err := m.write(ctx, op, "", func(tx Tx) (error, error) {
		r, _, err := tx.LoadPass(scope)
		if err != nil {
			return nil, err
		}
		r.Scope = scope
		out, aerr := acquirePass(r, owner, lease, minInterval, tx.Now())
		rec = out.PassRecord
		if aerr != nil {
			return aerr, nil
		}
		return nil, tx.StorePass(out)
	})
	if err != nil {
		return PassLease{}, rec, err
	}
	return PassLease{Scope: scope, Owner: owner, Token: rec.Token, Until: rec.HeldUntil}, rec, nil
}

func checkPassLease(l PassLease) error {
	err := errors.Join(CheckPassName("scope", l.Scope), CheckPassName("owner", l.Owner))
	if l.Token < 0 {
		err = errors.Join(err, fmt.Errorf("negative token %d", l.Token))
	}
	return err
}

// RenewPass extends a held pass lease to now + lease (see Passes).
func (m *Machine) RenewPass(ctx context.Context, l PassLease, lease time.Duration) (PassLease, error) {
	op := "renew pass " + l.Scope
	err := errors.Join(checkPassLease(l), checkLease(lease))
	if err == nil && l.Token == 0 {
		err = errors.New("token 0 holds no lease to renew")
	}
	if err != nil {
		return PassLease{}, m.errorf(op, "", err)
	}
	err = m.passWrite(ctx, op, l, func(tx Tx, r PassRow) error {
		r.HeldUntil = LeaseEnd(tx.Now(), lease)
		l.Until = r.HeldUntil
		return tx.StorePass(r)
	})
	if err != nil {
		return PassLease{}, err
	}
	return l, nil
}

// EndPass records a pass's outcome and releases its lease (see Passes).
func (m *Machine) EndPass(ctx context.Context, l PassLease, o PassOutcome) error {
	op := "end pass " + l.Scope
	err := checkPassLease(l)
	if err == nil && (o.Start.IsZero() || o.End.IsZero()) {
		err = errors.New("the outcome needs both a start and an end time")
	}
	if err != nil {
		return m.errorf(op, "", err)
	}
	return m.passWrite(ctx, op, l, func(tx Tx, r PassRow) error {
		r.Scope = l.Scope
		return tx.StorePass(endPass(r, l, o, tx.Now()))
	})
}

// passWrite runs fn on the scope's pass record in a write transaction,
// unless l is not the current lease (passFence); a pass that held no lease
// (token 0) is not fenced.
func (m *Machine) passWrite(ctx context.Context, op string, l PassLease, fn func(tx Tx, r PassRow) error) error {
	return m.write(ctx, op, "", func(tx Tx) (error, error) {
		r, found, err := tx.LoadPass(l.Scope)
		if err != nil {
			return nil, err
		}
		if l.Token != 0 {
			if err := passFence(r, found, l); err != nil {
				return err, nil
			}
		}
		return nil, fn(tx, r)
	})
}

// PassRecords returns every scope's record, ordered by scope.
func (m *Machine) PassRecords(ctx context.Context) ([]PassRecord, error) {
	return m.st.PassRecords(ctx)
}
