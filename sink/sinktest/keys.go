package sinktest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/canon"
	"github.com/gemrecon/gemrecon/sink"
)

// legacyKey is a key that spec §12 refuses for a new sighting but that a
// gemrecon from before it could have stored.
type legacyKey struct {
	desc string
	key  string
	// everywhere: every backend's database can hold it (PostgreSQL's text
	// cannot hold NUL or invalid UTF-8, and its index refuses ~2.7 KB).
	everywhere bool
}

func legacyKeys() []legacyKey {
	return []legacyKey{
		{"600 bytes", canon.Prefix + "batches/" + strings.Repeat("l", 600-len("gemini:batches/")), true},
		{"a collection word", canon.Prefix + "batches", true},
		{"tab, newline and ESC", canon.Prefix + "batches/t\tn\ne\x1b[31m", true},
		{"a C1 control", canon.Prefix + "batches/c1\u0085", true},
		{"NUL", canon.Prefix + "batches/nul\x00x", false},
		{"invalid UTF-8", canon.Prefix + "batches/bad\xff", false},
		{"100 KB", canon.Prefix + "batches/" + strings.Repeat("h", 100_000), false},
	}
}

// testRecordRefusesInvalidKeys: Record and RecordAndClaim refuse every key
// spec §12 refuses, on every backend alike, with an error that wraps
// canon.ErrInvalidKey (never a database error: a receiver would answer that
// with a 503 forever) and quotes little of the key; nothing is stored. A key
// of exactly canon.MaxKeyLen bytes is stored and read back exactly.
func testRecordRefusesInvalidKeys(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	invalid := []string{
		canon.Prefix + "batches/" + strings.Repeat("x", canon.MaxKeyLen), // over the limit
		canon.Prefix + "batches/" + strings.Repeat("x", 3000),            // PostgreSQL's index limit
		canon.Prefix + "batches/" + strings.Repeat("x", 500_000),         // an argument list's limit
		canon.Prefix + "batches/nul\x00",
		canon.Prefix + "batches/nl\n",
		canon.Prefix + "batches/del\x7f",
		canon.Prefix + "batches/c1\u009b",
		canon.Prefix + "batches/bad\xff",
		canon.Prefix + "batches/surrogate\xed\xa0\x80",
		canon.Prefix + "batches",
		canon.Prefix + "batches/",
		canon.Prefix + "batchPredictionJobs",
	}
	for i, key := range invalid {
		_, err := e.s.Record(e.ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{}`)})
		checkInvalid(t, fmt.Sprintf("Record(invalid key #%d, %d bytes)", i, len(key)), err)
		_, _, err = e.s.RecordAndClaim(e.ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook}, sink.ClaimRequest{Owner: "o", Lease: time.Minute})
		checkInvalid(t, fmt.Sprintf("RecordAndClaim(invalid key #%d, %d bytes)", i, len(key)), err)
	}
	if got := e.due(0); len(got) != 0 {
		t.Fatalf("Due after refused Records = %q, want nothing", got)
	}
	if es, err := e.s.List(e.ctx, sink.ListOptions{}); err != nil || len(es) != 0 {
		t.Fatalf("List after refused Records = %d entries, %v; want none", len(es), err)
	}

	max := canon.Prefix + "batches/" + strings.Repeat("m", canon.MaxKeyLen-len("gemini:batches/"))
	if r := e.record(max, sink.SourceWebhook, `{}`); !r.New {
		t.Fatalf("Record(key of %d bytes) = %+v, want new", len(max), r)
	}
	if en := e.get(max); en.Key != max {
		t.Fatalf("Get(key of %d bytes).Key is %d bytes, want the key exactly", len(max), len(en.Key))
	}
	// max is due: a new key waits behind it.
	c := e.claim(max, time.Minute)
	other := max[:len(max)-1] + "n"
	if r, c, err := e.s.RecordAndClaim(e.ctx, sink.Sighting{Key: other, Source: sink.SourcePoll}, sink.ClaimRequest{Owner: "o", Lease: time.Minute}); err != nil || !r.New || c == nil || c.Key != other {
		t.Fatalf("RecordAndClaim(key of %d bytes) = %+v, %+v, %v; want new and claimed", len(other), r, c, err)
	}
	_ = c
}

// testErrorsQuoteLongKeysShort: spec §12 — error texts quote at most
// canon.MaxQuoted bytes of a name. Operations on a key that is not stored
// (an operator's typo, a name from elsewhere), 100 KB long, fail with an
// error of their own kind whose text stays short.
func testErrorsQuoteLongKeysShort(t *testing.T, open Opener) {
	e := newEnv(t, open, nil)
	key := canon.Prefix + "batches/" + strings.Repeat("L", 100_000)
	short := func(what string, err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s of a 100 KB unknown key: %v, want %v", what, truncated(err), want)
			return
		}
		if n := len(err.Error()); n > 4*canon.MaxQuoted+200 {
			t.Errorf("%s error is %d bytes long, want it to quote at most %d bytes of the key: %s", what, n, canon.MaxQuoted, truncated(err))
		}
	}
	_, err := e.s.Get(e.ctx, key)
	short("Get", err, sink.ErrNotFound)
	_, err = e.s.Claim(e.ctx, key, "o", time.Minute, sink.ClaimOptions{})
	short("Claim", err, sink.ErrNotFound)
	short("Retry", e.s.Retry(e.ctx, key, sink.RetryOptions{}), sink.ErrNotFound)
	err = e.s.Complete(e.ctx, key, 1)
	if !errors.Is(err, sink.ErrFenced) && !errors.Is(err, sink.ErrNotFound) {
		t.Errorf("Complete of a 100 KB unknown key: %v, want fenced or not found", truncated(err))
	} else if n := len(err.Error()); n > 4*canon.MaxQuoted+200 {
		t.Errorf("Complete error is %d bytes long, want it to quote at most %d bytes of the key: %s", n, canon.MaxQuoted, truncated(err))
	}
}

// truncated is err's text, cut for a test failure message.
func truncated(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return s
}

func checkInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, canon.ErrInvalidKey) {
		t.Fatalf("%s error = %v, want one wrapping canon.ErrInvalidKey", what, err)
	}
	if n := len(err.Error()); n > 4*canon.MaxQuoted+200 {
		t.Fatalf("%s error is %d bytes long, want it to quote at most %d bytes of the key", what, n, canon.MaxQuoted)
	}
}

// StoredKeyInserter writes key into s's database as a new pending row, due
// and first seen at at, source poll, with no payload — straight into the
// backend's tables, bypassing Record, as a gemrecon from before spec §12 could
// have stored it. It returns false, writing nothing, for a key the backend's
// database could never have held (PostgreSQL: NUL, invalid UTF-8, or past its
// index size limit).
type StoredKeyInserter func(t *testing.T, s sink.Sink, key string, at time.Time) bool

// RunStoredKeys checks that keys stored before spec §12, which Record now
// refuses, stay readable and usable: Get and List return them exactly, and
// Claim, Fail, Retry, Complete and Purge take them exactly, so that an
// operator can inspect, retry and clean them up.
func RunStoredKeys(t *testing.T, open Opener, insert StoredKeyInserter) {
	e := newEnv(t, open, func(o *sink.Options) { o.MaxAttempts = 3 })
	var stored []string
	for _, lk := range legacyKeys() {
		if insert(t, e.s, lk.key, e.clk.Now()) {
			stored = append(stored, lk.key)
		} else if lk.everywhere {
			t.Fatalf("the inserter could not store the key with %s, which every backend can hold", lk.desc)
		}
	}
	for _, key := range stored {
		en := e.get(key)
		if en.Key != key || en.State != sink.StatePending {
			t.Fatalf("Get(stored key %s) = key %s, state %s; want the key exactly, pending", canon.Quote(key), canon.Quote(en.Key), en.State)
		}
		_, err := e.s.Record(e.ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook})
		checkInvalid(t, "Record(stored key "+canon.Quote(key)+")", err)
	}
	es, err := e.s.List(e.ctx, sink.ListOptions{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var listed []string
	for _, en := range es {
		listed = append(listed, en.Key)
	}
	slices.Sort(listed)
	want := slices.Clone(stored)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Fatalf("List keys = %q, want the stored keys exactly %q", listed, want)
	}
	if due := e.due(0); len(due) != len(stored) {
		t.Fatalf("Due = %d keys, want the %d stored keys", len(due), len(stored))
	}

	for _, key := range stored {
		q := canon.Quote(key)
		c := e.claim(key, time.Minute)
		if c.Key != key {
			t.Fatalf("Claim(%s).Key = %s, want the key exactly", q, canon.Quote(c.Key))
		}
		if st, err := e.s.Fail(e.ctx, key, c.Token, sink.Failure{Cause: "no effect can take this key", Permanent: true}); err != nil || st != sink.StateDead {
			t.Fatalf("Fail(%s, permanent) = %s, %v; want dead", q, st, err)
		}
		if err := e.s.Retry(e.ctx, key, sink.RetryOptions{}); err != nil {
			t.Fatalf("Retry(%s) = %v, want nil", q, err)
		}
		if en := e.get(key); en.State != sink.StatePending {
			t.Fatalf("Get(%s) after Retry = %s, want pending", q, en.State)
		}
		c = e.claim(key, time.Minute)
		if err := e.s.Complete(e.ctx, key, c.Token); err != nil {
			t.Fatalf("Complete(%s) = %v", q, err)
		}
	}
	e.clk.Advance(time.Hour)
	n, err := e.s.Purge(e.ctx, 30*time.Minute)
	if err != nil || len(n) != len(stored) {
		t.Fatalf("Purge = %q, %v; want the %d stored keys", n, err, len(stored))
	}
	for _, key := range stored {
		_, err := e.s.Get(e.ctx, key)
		e.wantErr("Get(purged "+canon.Quote(key)+")", err, sink.ErrNotFound)
	}
}
