package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// syncServer runs a --sync receiver whose effect appends to a file and fails
// for keys that fail() rejects.
func syncServer(t *testing.T, fail func(context.Context, string) error, wait time.Duration) (base string, s sink.Sink, effects string) {
	t.Helper()
	s = sqlitetest.Open(t, sqlitetest.Path(t), sink.Options{RetryBase: time.Hour})
	effects = filepath.Join(t.TempDir(), "effects")
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects, fail: fail}, Logger: slog.New(slog.DiscardHandler), Grace: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Sync: true, SyncWait: wait, Dispatcher: d})
	if err != nil {
		t.Fatal(err)
	}
	base, _ = serve(t, h, webhook.ServerOptions{})
	return base, s, effects
}

func post(t *testing.T, base string, body []byte) reply {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	return do(t, c, http.MethodPost, base+"/webhook", body, signed(t, testSecret, "msg_sync", time.Now(), body))
}

func TestSyncDone(t *testing.T) {
	base, s, effects := syncServer(t, nil, time.Second)
	if r := post(t, base, event("s1")); r.Code != 200 || r.Status != "done" || r.Key != "gemini:batches/s1" {
		t.Fatalf("sync delivery = %d %q %q, want 200 done gemini:batches/s1", r.Code, r.Status, r.Key)
	}
	// Done before the answer: the row says so.
	if e, err := s.Get(context.Background(), "gemini:batches/s1"); err != nil || e.State != sink.StateDone {
		t.Errorf("after 200: %s, %v; want done", e.State, err)
	}
	// A redelivery answers done and runs nothing.
	if r := post(t, base, event("s1")); r.Code != 200 || r.Status != "done" {
		t.Errorf("sync redelivery = %d %q, want 200 done", r.Code, r.Status)
	}
	if got := effectLines(t, effects); !slices.Equal(got, []string{"gemini:batches/s1"}) {
		t.Errorf("effect runs = %q, want one", got)
	}
	// Non-terminal events are still 200 ignored and run nothing.
	if r := post(t, base, []byte(`{"name":"batches/s2","metadata":{"state":"BATCH_STATE_RUNNING"}}`)); r.Code != 200 || r.Status != "ignored" {
		t.Errorf("sync non-terminal = %d %q, want 200 ignored", r.Code, r.Status)
	}
}

func TestSyncEffectFailure(t *testing.T) {
	base, s, _ := syncServer(t, func(context.Context, string) error { return errors.New("downstream said no") }, time.Second)
	r := post(t, base, event("f1"))
	if r.Code != 500 || r.Status != "retry" || r.Error == "" {
		t.Fatalf("sync delivery with a failing effect = %d %q %q, want 500 retry with an error", r.Code, r.Status, r.Error)
	}
	e, err := s.Get(context.Background(), "gemini:batches/f1")
	if err != nil || e.State != sink.StatePending || e.Attempts != 1 {
		t.Fatalf("after 500: %+v, %v; want pending after 1 attempt", e, err)
	}
	// The sender's retry finds the key backing off: durable, the background
	// workers own it now, so 202 at once rather than another 500.
	start := time.Now()
	if r := post(t, base, event("f1")); r.Code != 202 || r.Status != "duplicate" {
		t.Errorf("sync redelivery while backing off = %d %q, want 202 duplicate", r.Code, r.Status)
	}
	if el := time.Since(start); el > 900*time.Millisecond {
		t.Errorf("redelivery while backing off took %v, want no SyncWait", el)
	}
}

func TestSyncBusy(t *testing.T) {
	base, s, effects := syncServer(t, nil, 300*time.Millisecond)
	ctx := context.Background()
	key := "gemini:batches/busy1"
	if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: event("busy1")}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "another-process", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Held past SyncWait: 202.
	start := time.Now()
	r := post(t, base, event("busy1"))
	if r.Code != 202 || r.Status != "duplicate" {
		t.Errorf("sync delivery of a claimed key = %d %q, want 202 duplicate", r.Code, r.Status)
	}
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Errorf("202 after %v, want it after waiting SyncWait (300ms)", el)
	}

	// Held, then completed by its holder within SyncWait: 200.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = s.Complete(ctx, key, c.Token)
	}()
	base2, _, _ := syncServerOn(t, s, effects, 5*time.Second)
	if r := post(t, base2, event("busy1")); r.Code != 200 || r.Status != "done" {
		t.Errorf("sync delivery while the holder finishes = %d %q, want 200 done", r.Code, r.Status)
	}
	if got := effectLines(t, effects); len(got) != 0 {
		t.Errorf("effect runs = %q, want none here (the other holder ran it)", got)
	}
}

// syncServerOn is syncServer on an existing sink.
func syncServerOn(t *testing.T, s sink.Sink, effects string, wait time.Duration) (string, sink.Sink, string) {
	t.Helper()
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Sync: true, SyncWait: wait, Dispatcher: d})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	return base, s, effects
}

func TestSyncSenderHangsUp(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	// The effect honours its context, and dispatch gives no grace: only a
	// context that survives the sender's hang-up lets it finish.
	base, s, effects := syncServer(t, func(ctx context.Context, _ string) error {
		started <- struct{}{}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}, time.Second)
	body := event("hangup1")
	c := &http.Client{Timeout: 200 * time.Millisecond} // the sender gives up first
	req, _ := http.NewRequest(http.MethodPost, base+"/webhook", bytes.NewReader(body))
	req.Header = signed(t, testSecret, "msg_h", time.Now(), body)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("slow sync delivery answered %d before the client timeout", resp.StatusCode)
	}
	<-started
	close(release) // the effect finishes after the sender has gone
	waitDone(t, s, "gemini:batches/hangup1")
	if r := post(t, base, body); r.Code != 200 || r.Status != "done" {
		t.Errorf("retry after hang-up = %d %q, want 200 done", r.Code, r.Status)
	}
	if got := effectLines(t, effects); !slices.Equal(got, []string{"gemini:batches/hangup1"}) {
		t.Errorf("effect runs = %q, want one", got)
	}
}

// A key whose effect failed for good answers 500 in the request where it
// failed; a redelivery of the dead key runs nothing and answers 202 "dead"
// (durable, nothing a retry of the sender could change), not 500 again:
// every non-2xx makes the Gemini API retry for 24 h and can disable the
// webhook (spec §6).
func TestSyncDeadKey(t *testing.T) {
	var runs int
	base, s, _ := syncServer(t, func(context.Context, string) error {
		runs++
		return effect.Permanent(errors.New("downstream refuses this batch"))
	}, time.Second)
	r := post(t, base, event("d1"))
	if r.Code != 500 || r.Status != "dead" || r.Error == "" {
		t.Fatalf("sync delivery whose effect fails for good = %d %q %q, want 500 dead with an error", r.Code, r.Status, r.Error)
	}
	e, err := s.Get(context.Background(), "gemini:batches/d1")
	if err != nil || e.State != sink.StateDead {
		t.Fatalf("after 500: %+v, %v; want dead", e, err)
	}
	for i := range 2 {
		r := post(t, base, event("d1"))
		if r.Code != 202 || r.Status != "dead" || !strings.Contains(r.Error, "downstream refuses this batch") {
			t.Errorf("redelivery %d of a dead key = %d %q %q, want 202 dead naming the last error", i+1, r.Code, r.Status, r.Error)
		}
	}
	if runs != 1 {
		t.Errorf("effect ran %d times, want once", runs)
	}
	if e, err := s.Get(context.Background(), "gemini:batches/d1"); err != nil || e.State != sink.StateDead || e.Attempts != 1 {
		t.Errorf("after the redeliveries: %+v, %v; want dead after 1 attempt", e, err)
	}
}

// TestSyncBackingOffByTheServersClock: on PostgreSQL a key's next attempt is
// written by the server's clock, so --sync must judge "backing off" by it
// too. With the server's clock 2h behind this machine's, a key backing off
// for an hour looked due by this machine's clock: the redelivery waited out
// --sync-wait for a claim the server would not grant, instead of answering
// 202 at once.
func TestSyncBackingOffByTheServersClock(t *testing.T) {
	dsn, _, skew := pgtest.SkewedSchema(t)
	skew(-2 * time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := postgres.Open(ctx, dsn, sink.Options{RetryBase: time.Hour, RetryMax: time.Hour, Rand: func() float64 { return 0.999 }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	effects := filepath.Join(t.TempDir(), "effects")
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects, fail: func(context.Context, string) error { return errors.New("downstream said no") }},
		Logger: slog.New(slog.DiscardHandler), Grace: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Sync: true, SyncWait: 3 * time.Second, Dispatcher: d})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	if r := post(t, base, event("skew1")); r.Code != 500 || r.Status != "retry" {
		t.Fatalf("first delivery = %d %q, want 500 retry", r.Code, r.Status)
	}
	start := time.Now()
	if r := post(t, base, event("skew1")); r.Code != 202 || r.Status != "duplicate" {
		t.Errorf("redelivery while backing off = %d %q, want 202 duplicate", r.Code, r.Status)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("redelivery while backing off (by the server's clock) took %v, want an answer without waiting --sync-wait (3s)", el)
	}
}
