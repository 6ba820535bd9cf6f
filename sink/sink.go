// Package sink owns the durable state machine that turns many sightings of
// one completion into one run of its effect: states, transitions, fencing
// tokens, leases and backoff (spec §3). Backends live in sub-packages
// (sink/sqlite, sink/postgres) and all pass the suite in sink/sinktest.
package sink

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/canon"
)

// State is where a key stands in its lifecycle.
type State string

// The four states of spec §3.
const (
	// StatePending: known, waiting for its next attempt at NextAttemptAt.
	StatePending State = "pending"
	// StateClaimed: an attempt holds a lease until LeaseUntil.
	StateClaimed State = "claimed"
	// StateDone: the effect succeeded; nothing starts it again.
	StateDone State = "done"
	// StateDead: attempts exhausted or a permanent failure; waits for an operator.
	StateDead State = "dead"
)

// Valid reports whether s is one of the four states.
func (s State) Valid() bool {
	return slices.Contains([]State{StatePending, StateClaimed, StateDone, StateDead}, s)
}

// Sources of a sighting. Other strings are allowed (they are stored as given).
const (
	SourcePoll    = "poll"
	SourceWebhook = "webhook"
)

// Errors at the package boundary. Backends wrap them with %w; callers match
// with errors.Is.
var (
	// ErrNotFound: no row for the key.
	ErrNotFound = errors.New("key not found")
	// ErrFenced: the token is no longer current (another attempt took the
	// key over, or it was completed or failed already). The caller's outcome
	// is discarded; backends count every fenced Complete/Fail/Renew.
	ErrFenced = errors.New("fenced: the claim's token is no longer current")
	// ErrNotClaimable: the key exists but cannot be claimed now (done, dead,
	// pending but not yet due, or claimed under a live lease).
	ErrNotClaimable = errors.New("key is not claimable now")
	// ErrSchemaTooNew: the database was migrated by a newer gemrecon.
	ErrSchemaTooNew = errors.New("database schema is newer than this gemrecon understands")
	// ErrNotDead: Retry was asked for a key that is not dead.
	ErrNotDead = errors.New("key is not dead")
	// ErrNoDatabase: a read-only or MustExist open found no gemrecon
	// database where it looked.
	ErrNoDatabase = errors.New("no database")
	// ErrUnusable: this process can no longer use the database (its file is
	// damaged, or was deleted or replaced under it). Retrying cannot help:
	// every later write and Ping of the sink fails too, and commands exit 1.
	ErrUnusable = errors.New("the database is unusable")
)

// Sighting is one report of a completion, from the poller or the webhook,
// carrying what canon computed from it (spec §9.1): nothing downstream
// parses the payload again.
type Sighting struct {
	Key     string // canonical key, "gemini:…"
	Source  string // SourcePoll, SourceWebhook, …
	Payload []byte // the operation (JSON) as the API or webhook gave it
	// State is the batch's state as this sighting says it, normalised by
	// canon.NormalizeState ("SUCCEEDED", "FAILED", …); "" when it says
	// nothing of it (a bare name, a batch.completed event).
	State string
	// FromAPI: Payload is the API's own operation (a listed or fetched
	// batch), not a webhook's event. A sighting from the API confirms the
	// key (spec §9.2).
	FromAPI bool
	// Dynamic: the sighting was verified only by a dynamic (JWKS) signature
	// (spec §6), which proves that Google sent it, not that the batch is
	// this project's. A key whose every sighting so far was dynamic needs
	// confirmation: no process runs it unconfirmed.
	Dynamic bool
	// EndTime is when the batch ended, as the API says (FromAPI only; zero
	// when unknown): its results are kept for sink.ResultsKept from then.
	EndTime time.Time
}

// RecordResult says what Record found.
type RecordResult struct {
	New   bool  // the key was unknown and is now pending, due now
	State State // the key's state after the Record
	// Confirmed: this sighting from the API confirmed a key that was not
	// (its operation is now the stored payload; a pending key is due now, a
	// key dead as unknown to the API is pending again).
	Confirmed bool
	// Conflict: the sighting's terminal state differs from the stored
	// batch state (spec §9.4; counted and logged by the sink).
	Conflict bool
}

// Claim is a granted attempt: the holder may run the effect until LeaseUntil
// and must present Token to Renew, Complete or Fail.
type Claim struct {
	Key         string
	Token       int64 // fencing token; strictly increases with every claim of the key
	Attempt     int   // 1 for the first attempt
	Owner       string
	LeaseUntil  time.Time
	Payload     []byte // the stored payload: the API's operation once confirmed, else the first one
	FirstSource string
	Takeover    bool // the previous attempt's lease had expired
	// FirstSeenAt is the key's first sighting.
	FirstSeenAt time.Time
	// Confirmed: Payload is the API's operation (first seen by poll, or
	// confirmed since, spec §9.2).
	Confirmed bool
	// BatchState is the batch's own state as stored ("" when unknown).
	BatchState string
	// NeedsConfirm: every sighting so far was verified only by a dynamic
	// signature; the key must not run unconfirmed.
	NeedsConfirm bool
	// Webhook is the first webhook body, when a webhook saw the key.
	Webhook []byte
	// ResultsFile is where the batch's results were written (NoteResults).
	ResultsFile string
	// Rerun: the key was done and an operator sent it back (spec §7); its
	// effect is told so.
	Rerun bool
	// NoResults: the operator asked for the attempt to run without the
	// batch's results (retry --without-results, spec §9.5).
	NoResults bool
}

// Confirmation is the API's answer about a claimed key (Sink.Confirm).
type Confirmation struct {
	// Operation is the API's operation, stored as the key's payload.
	Operation []byte
	// State is its state, normalised by canon.NormalizeState.
	State string
	// EndTime is when the batch ended (zero when the API gave none).
	EndTime time.Time
}

// Dead reasons: the class of a permanent failure, kept while the key is dead
// so that stats and metrics count them apart (spec §6, §9.2).
const (
	// DeadUnknownToAPI: the API answered 404 (or 403 for a batch of another
	// project) when the key was confirmed, or the name is one the API
	// cannot fetch and the key may not run unconfirmed. A later sighting
	// from the API revives it.
	DeadUnknownToAPI = "unknown_to_api"
	// DeadResultsExpired: the batch's results file is gone from the API
	// (404, or 403 while the credential works) and the batch ended more
	// than 48 h ago, longer than the API keeps files (spec §9.5).
	DeadResultsExpired = "results_expired"
	// DeadEffect is how Stats names every other dead key: the effect failed
	// permanently or ran out of attempts (stored as "").
	DeadEffect = "effect"
)

// ClaimOptions narrow which keys a claim may take.
type ClaimOptions struct {
	// SkipNeedsConfirm leaves keys that need confirmation (every sighting
	// dynamically verified) to another claimer: a process that cannot
	// confirm sets it, so it never claims such a key only to hand it back.
	SkipNeedsConfirm bool
	// Command names what claims (poll, serve, drain), for the key's
	// history.
	Command string
}

// Failure describes why an attempt failed.
type Failure struct {
	Cause     string    // error text; backends keep at most MaxErrorLen bytes
	Permanent bool      // go dead now instead of retrying
	NotBefore time.Time // earliest next attempt (e.g. Retry-After); zero = backoff alone
	// NoAttempt: the attempt does not count toward MaxAttempts (it was not
	// the effect's fault: gemrecon's stdout went away, the API could not be
	// asked). The key goes back to pending, never to dead, at NotBefore or
	// after the backoff of its current attempt count; Permanent is ignored.
	NoAttempt bool
	// DeadReason is stored when the failure makes the key dead (e.g.
	// DeadUnknownToAPI); "" for an ordinary failure of the effect.
	DeadReason string
	// Interrupted: a shutdown stopped the effect (the key's history says
	// so; otherwise a failure like any other).
	Interrupted bool
}

// StateConflict reports whether a sighting's state conflicts with the
// stored batch state by meaning (spec §9.4): both terminal and different.
// A re-rendered payload with the same state, or a sighting that says
// nothing of its state, is no conflict.
func StateConflict(stored, seen string) bool {
	return stored != seen && canon.IsTerminal(stored) && canon.IsTerminal(seen)
}

// MaxErrorLen bounds the stored error text (its tail is kept).
const MaxErrorLen = 4096

// Entry is everything known about one key (spec §7 status).
type Entry struct {
	Key           string    `json:"key"`
	State         State     `json:"state"`
	Attempts      int       `json:"attempts"`
	Token         int64     `json:"token"`
	FirstSource   string    `json:"first_source"`
	Sources       []string  `json:"sources"`
	SeenCount     int64     `json:"seen_count"`
	FirstSeenAt   time.Time `json:"first_seen_at"`
	LastSeenAt    time.Time `json:"last_seen_at"`
	LeaseOwner    string    `json:"lease_owner,omitempty"`
	LeaseUntil    time.Time `json:"lease_until,omitzero"`
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	DoneAt        time.Time `json:"done_at,omitzero"`
	LastError     string    `json:"last_error,omitempty"`
	Conflicts     int64     `json:"conflicts"`
	// Confirmed: the stored payload is the API's operation (spec §9.2).
	Confirmed bool `json:"confirmed"`
	// BatchState is the batch's own state ("" when unknown, spec §9.6).
	BatchState string `json:"batch_state"`
	// NeedsConfirm: every sighting so far was dynamically verified.
	NeedsConfirm bool `json:"needs_confirmation"`
	// DeadReason is the class of a dead key's failure ("" for DeadEffect).
	DeadReason string `json:"dead_reason,omitempty"`
	// ResultsFile is where the batch's results were written, if anywhere.
	ResultsFile string `json:"results_file"`
	// Reruns counts the operator's reruns of the key once done.
	Reruns int `json:"reruns"`
	// BatchEnd is when the batch ended by the API's word (zero: unknown).
	BatchEnd time.Time `json:"batch_end,omitzero"`
	// History is the key's last HistoryKept attempts and operator actions,
	// oldest first (Get only); Dropped counts older entries no longer kept.
	History []Attempt `json:"history,omitempty"`
	Dropped int       `json:"history_dropped,omitempty"`
	Payload []byte    `json:"-"`
	// Webhook is the first webhook body, when a webhook saw the key.
	Webhook []byte `json:"-"`
}

// ResultsKept is how long the Gemini API keeps a batch's results file after
// the batch ended (gemini-api.md: files are kept 48 h), and ResultsWarning
// how long before that stats counts a key whose effect has not run yet.
const (
	ResultsKept    = 48 * time.Hour
	ResultsWarning = 6 * time.Hour
)

// HistoryKept bounds a key's history: the last entries are kept, and the
// older ones only counted.
const HistoryKept = 20

// Attempt is one entry of a key's history (spec §3 "History"): an attempt
// from its claim to its outcome, a fenced outcome, or an operator's retry
// or rerun.
type Attempt struct {
	Kind    string    `json:"kind"` // KindAttempt, KindFenced, KindRetry, KindRerun
	Token   int64     `json:"token"`
	Command string    `json:"command,omitempty"` // the claiming command: poll, serve, drain
	Holder  string    `json:"holder,omitempty"`  // the lease owner, or who asked (user@host)
	Start   time.Time `json:"start"`
	End     time.Time `json:"end,omitzero"`
	Outcome string    `json:"outcome,omitempty"` // Outcome* (attempts and fenced outcomes)
	Error   string    `json:"error,omitempty"`
}

// Kinds of history entries.
const (
	KindAttempt = "attempt"
	KindFenced  = "fenced"
	KindRetry   = "retry"
	KindRerun   = "rerun"
)

// Outcomes of attempts in the history.
const (
	OutcomeRunning      = "running" // not ended yet (or its holder died: the takeover ends it)
	OutcomeOK           = "ok"
	OutcomeFailed       = "failed"
	OutcomeFenced       = "fenced"
	OutcomeLeaseExpired = "lease expired"
	OutcomeHandedBack   = "handed back"
	OutcomeInterrupted  = "interrupted"
)

// ListOptions filters List.
type ListOptions struct {
	State State // "" = all
	Limit int   // <= 0 = no limit
}

// Stats summarises the sink (spec §7 stats).
type Stats struct {
	ByState              map[State]int64  `json:"by_state"`
	OldestPendingAge     time.Duration    `json:"oldest_pending_age_ns"`
	DuplicatesSuppressed int64            `json:"duplicates_suppressed"`
	FirstSource          map[string]int64 `json:"first_source"`
	Conflicts            int64            `json:"conflicts"`
	Fenced               int64            `json:"fenced"`
	// DeadByReason splits the dead keys: DeadUnknownToAPI, DeadEffect.
	DeadByReason map[string]int64 `json:"dead_by_reason"`
	// ResultsExpiring counts the keys of succeeded batches not done yet
	// whose results expire within ResultsWarning (spec §9.5).
	ResultsExpiring int64 `json:"results_expiring"`
	// Completion-to-done latency (first sighting → done) over done keys.
	LatencyP50 time.Duration `json:"latency_p50_ns"`
	LatencyP99 time.Duration `json:"latency_p99_ns"`
	LatencyMax time.Duration `json:"latency_max_ns"`
	// Passes are the reconciliation pass records, one per scope (spec §5.5),
	// ordered by scope.
	Passes []PassRecord `json:"passes"`
}

// PassRecord is what the database keeps about the reconciliation passes of
// one scope (spec §5.5): one API project as seen by one backend and base URL.
// Times are zero when no such pass happened yet.
type PassRecord struct {
	Scope string `json:"scope"`
	// LastStart and LastEnd bound the last pass that listed (a skipped pass
	// is not recorded); LastHolder is the owner that ran it.
	LastStart  time.Time `json:"last_start,omitzero"`
	LastEnd    time.Time `json:"last_end,omitzero"`
	LastHolder string    `json:"last_holder,omitempty"`
	// LastSuccess is the end of the last pass that listed fully and whose
	// every effect succeeded (exit status 0).
	LastSuccess time.Time `json:"last_success,omitzero"`
	// LastFullScan is the start of the last pass that read every page to the
	// end without an error.
	LastFullScan time.Time `json:"last_full_scan,omitzero"`
	// Holder holds the pass lease until HeldUntil ("" when free); Token is the
	// lease's fencing token, incremented by every acquisition.
	Holder    string    `json:"holder,omitempty"`
	HeldUntil time.Time `json:"held_until,omitzero"`
	Token     int64     `json:"token"`
	// Unfinished and OldestUnfinished are the last listing's unfinished
	// batches (PassOutcome).
	Unfinished       map[string]int64 `json:"unfinished,omitempty"`
	OldestUnfinished time.Time        `json:"oldest_unfinished,omitzero"`
}

// PassLease is a held pass lease of one scope (spec §5.5).
type PassLease struct {
	Scope string
	Owner string
	Token int64 // 0: a pass that holds no lease (poll --force)
	Until time.Time
}

// PassOutcome is what one pass that listed reports when it ends.
type PassOutcome struct {
	Start, End time.Time
	Success    bool // listed fully and every effect succeeded (exit 0)
	FullScan   bool // read every page to the end without an error
	// Unfinished counts the batches the pass listed that had not finished,
	// by state, and OldestUnfinished is the creation of the oldest (spec
	// §5.5); nil when the listing failed, which keeps the last figures.
	Unfinished       map[string]int64
	OldestUnfinished time.Time
}

// ErrPassHeld is wrapped by AcquirePass when another live holder has the
// scope's pass lease; ErrPassRecent when a pass of the scope ended less than
// the asked interval ago. Either way the caller skips its listing.
var (
	ErrPassHeld   = errors.New("the scope's pass lease is held by another process")
	ErrPassRecent = errors.New("a pass of the scope ended less than one interval ago")
)

// Passes keeps the per-scope pass records and the pass lease of spec §5.5,
// so that replicas sharing one database list about once per interval in all.
// Every backend implements it.
type Passes interface {
	// AcquirePass takes the scope's pass lease for owner until now + lease,
	// creating the record if needed. It fails with ErrPassHeld while another
	// owner's lease is live, and with ErrPassRecent when minInterval > 0 and
	// the scope's last pass ended less than minInterval ago. The returned
	// record is the one that decided (holder and until on ErrPassHeld).
	AcquirePass(ctx context.Context, scope, owner string, lease, minInterval time.Duration) (PassLease, PassRecord, error)
	// RenewPass extends a held pass lease to now + lease; ErrFenced when the
	// lease was taken over (its token is no longer current).
	RenewPass(ctx context.Context, l PassLease, lease time.Duration) (PassLease, error)
	// EndPass records a pass's outcome and releases its lease. With a zero
	// token (a pass that held no lease) it only records. ErrFenced, and
	// nothing recorded, when the lease was taken over meanwhile.
	EndPass(ctx context.Context, l PassLease, o PassOutcome) error
	// PassRecords returns every scope's record, ordered by scope.
	PassRecords(ctx context.Context) ([]PassRecord, error)
}

// Sink is the durable claim/lease store of spec §3, with the pass records
// of §5.5. Every method is safe for concurrent use by many goroutines, and
// (through the database) by many processes.
type Sink interface {
	Passes

	// Record notes a sighting. A new key becomes pending and due now, durably,
	// before Record returns; it is confirmed when the sighting is FromAPI, and
	// needs confirmation when it is Dynamic. A known key only updates
	// sighting statistics, which are buffered in memory and written lazily
	// (a duplicate must not cost a disk sync) — except a sighting from the
	// API of an unconfirmed key, which confirms it durably (spec §9.2: the
	// operation becomes the payload, a pending key is due now, a key dead as
	// DeadUnknownToAPI is pending again). A terminal state that differs from
	// the stored batch state is a conflict (spec §9.4).
	Record(ctx context.Context, s Sighting) (RecordResult, error)
	// RecordAll records sightings as Record does, those that must commit
	// in one commit.
	RecordAll(ctx context.Context, s []Sighting) ([]RecordResult, error)
	// RecordAndClaim is Record, and when the key can then be claimed as the
	// dispatcher would claim it (req's options) and no other key is due
	// before it, a claim in the same commit; otherwise the claim is nil.
	RecordAndClaim(ctx context.Context, s Sighting, req ClaimRequest) (RecordResult, *Claim, error)
	// Claim takes the key for one attempt: allowed when pending and due, or
	// claimed with an expired lease (takeover). Increments token and attempt
	// in one durable commit. ErrNotClaimable / ErrNotFound otherwise (also
	// ErrNotClaimable for a key that needs confirmation, with
	// SkipNeedsConfirm).
	Claim(ctx context.Context, key, owner string, lease time.Duration, o ClaimOptions) (Claim, error)
	// ClaimDue claims up to limit due keys, oldest first (like Due then Claim,
	// but without racing other claimers for the same rows).
	ClaimDue(ctx context.Context, owner string, lease time.Duration, limit int, o ClaimOptions) ([]Claim, error)
	// Renew extends a live lease. ErrFenced when the token is not current.
	Renew(ctx context.Context, key string, token int64, lease time.Duration) error
	// Confirm stores the API's answer for a claimed key (spec §9.2), fenced
	// on token: the operation becomes the payload (the first webhook body is
	// kept apart), the batch state is set, and the key is confirmed and
	// needs confirmation no more. A terminal state that differs from the
	// stored one is a conflict (counted, logged; the API's wins). A key
	// confirmed meanwhile (by a poll sighting) keeps what it holds.
	Confirm(ctx context.Context, key string, token int64, c Confirmation) error
	// NoteResults records where the claimed key's results were written
	// (spec §9.5), fenced on token.
	NoteResults(ctx context.Context, key string, token int64, file string) error
	// Complete marks a claimed key done if token is still current; else ErrFenced.
	Complete(ctx context.Context, key string, token int64) error
	// Fail returns the key to pending with backoff, or to dead when permanent
	// or attempts reached the maximum. Fenced like Complete. Returns the new state.
	Fail(ctx context.Context, key string, token int64, f Failure) (State, error)
	// Retry moves a dead key to pending, due now, with a fresh attempt
	// budget (operator action; ErrNotDead otherwise), or with o.Rerun a
	// done key (ErrNotDone otherwise).
	Retry(ctx context.Context, key string, o RetryOptions) error
	// Due lists keys that can be claimed now, oldest first.
	Due(ctx context.Context, limit int, o ClaimOptions) ([]string, error)
	// Get returns one key's entry, or ErrNotFound.
	Get(ctx context.Context, key string) (Entry, error)
	// List returns entries, oldest first.
	List(ctx context.Context, opt ListOptions) ([]Entry, error)
	// Stats summarises the sink.
	Stats(ctx context.Context) (Stats, error)
	// Purge deletes the keys done for longer than olderThan and returns
	// them. The age is measured with the clock that wrote the done times
	// (the sink's: Options.Now, or on PostgreSQL without it the database's
	// now()), never the caller's: a caller whose clock runs ahead would
	// otherwise purge keys done less than olderThan ago, inside a poll's
	// lookback. A negative olderThan is an error. The lookback guard is
	// PurgeRequest.Check (spec §7).
	Purge(ctx context.Context, olderThan time.Duration) ([]string, error)
	// NoteLookback records that a poll used this lookback (0 = forever), so
	// that MaxLookback can guard purge.
	NoteLookback(ctx context.Context, lookback time.Duration) error
	// MaxLookback returns the longest lookback ever noted; forever is true if
	// any poll used 0; ok is false if no poll was ever recorded.
	MaxLookback(ctx context.Context) (d time.Duration, forever bool, ok bool, err error)
	// Ping checks that the database is reachable and writable (readiness).
	Ping(ctx context.Context) error
	// Flush writes buffered sighting statistics now.
	Flush(ctx context.Context) error
	// Close flushes and releases the database.
	Close() error
}

// Options are shared by all backends.
type Options struct {
	// Now is the clock; nil means time.Now. (PostgreSQL uses the database
	// clock for time decisions unless Now is set, which tests do.)
	Now func() time.Time
	// RetryBase is the first backoff ceiling (default 10s); it doubles per
	// attempt up to RetryMax (default 1h). Full jitter: uniform in [0, ceiling].
	RetryBase time.Duration
	RetryMax  time.Duration
	// MaxAttempts: a failure of attempt MaxAttempts goes dead (default 10).
	MaxAttempts int
	// Rand returns a uniform float64 in [0,1); nil means math/rand/v2.
	Rand func() float64
	// BusyTimeout bounds how long SQLite waits for another process's lock
	// (default 5s); on PostgreSQL it is the lock_timeout.
	BusyTimeout time.Duration
	// ReadOnly opens without creating or migrating (status, list, stats).
	ReadOnly bool
	// MustExist opens only a database that already holds gemrecon's schema
	// (an older one is still migrated): a missing SQLite file, an empty
	// one, or a PostgreSQL schema without gemrecon's tables is
	// ErrNoDatabase, and nothing is created. The CLI sets it for every
	// command but init, so that a mistyped --db is refused rather than
	// started afresh (which would run every completion's effect again).
	MustExist bool
}

// Defaults of spec §4.
const (
	DefaultRetryBase   = 10 * time.Second
	DefaultRetryMax    = time.Hour
	DefaultMaxAttempts = 10
	DefaultBusyTimeout = 5 * time.Second
)

// WithDefaults fills zero fields.
func (o Options) WithDefaults() Options {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RetryBase <= 0 {
		o.RetryBase = DefaultRetryBase
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.RetryMax < o.RetryBase {
		o.RetryMax = o.RetryBase
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = DefaultBusyTimeout
	}
	return o
}

// Backoff is the delay before the next attempt after attempt number attempt
// (1-based) failed: full jitter, uniform in [0, min(max, base·2^(attempt-1))].
func Backoff(attempt int, base, max time.Duration, rnd func() float64) time.Duration {
	ceiling := base // also for an attempt below 1
	for i := 1; i < attempt && ceiling < max; i++ {
		ceiling *= 2
	}
	if ceiling > max || ceiling <= 0 {
		ceiling = max
	}
	return time.Duration(rnd() * float64(ceiling))
}

// TruncateError is the text stored for a failure's cause: the tail of s
// within MaxErrorLen bytes (the end of an error or of stderr says the
// most), as valid UTF-8 without NUL. A cause is whatever the effect said —
// an --exec effect's stderr may hold any bytes — and PostgreSQL's text
// holds neither NUL nor bytes that are not UTF-8 (the whole Fail was
// refused, and the key stayed claimed), while a cut by bytes alone could
// halve a character. Invalid bytes and NUL become U+FFFD; the cut moves
// forward to a character's start. Both backends store it (conformance
// ErrorNotText).
func TruncateError(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) <= MaxErrorLen {
		return s
	}
	i := len(s) - MaxErrorLen + len("…")
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "…" + s[i:]
}

// NewStats returns empty Stats with every state and dead reason at 0.
func NewStats() Stats {
	return Stats{
		ByState:      map[State]int64{StatePending: 0, StateClaimed: 0, StateDone: 0, StateDead: 0},
		FirstSource:  map[string]int64{},
		DeadByReason: map[string]int64{DeadEffect: 0, DeadUnknownToAPI: 0, DeadResultsExpired: 0},
	}
}

// AddKeys counts n keys of one state, first source and dead reason (one
// group of a backend's GROUP BY of the three) into st.
func (st *Stats) AddKeys(state State, firstSource, deadReason string, n int64) {
	st.ByState[state] += n
	st.FirstSource[firstSource] += n
	if state == StateDead {
		st.DeadByReason[cmp.Or(deadReason, DeadEffect)] += n
	}
}

// PayloadHash is the SHA-256 both backends keep beside a stored payload.
func PayloadHash(p []byte) []byte {
	h := sha256.Sum256(p)
	return h[:]
}
