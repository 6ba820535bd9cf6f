package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// Two orderings break the promises of spec §1: the mark-received-first and
// the work-before-recording orderings, which the design's seed documents
// warned of (docs/design.md §1 says what each is). These tests, named after
// those seeds, drive the real CLI and prove gemrecon has neither.

// The mark-received-first ordering: recording receipt in its own
// commit and treating every later delivery as a duplicate loses the
// completion when the work fails. In gemrecon a failed effect leaves the key
// pending; a redelivery is a duplicate *sighting*, yet the effect still runs
// until it succeeds.
func TestSeedMarkReceivedFirstDoesNotLoseTheCompletion(t *testing.T) {
	db := filepath.Join(t.TempDir(), "s.db")
	ctx := context.Background()
	key := "gemini:batches/seed-1"
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"name":"batches/seed-1"}`)}); err != nil {
			t.Fatal(err)
		}
	})
	r := gemrecon(t, "--db", db, "drain", "--retry-base", "1ns", "--retry-max", "1ns", "--exec", "echo ledger unavailable >&2; exit 1")
	wantCode(t, r, exitNotDone)

	// The sender retries: the key is known, so this is a duplicate sighting…
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		res, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourceWebhook, Payload: []byte(`{"name":"batches/seed-1"}`)})
		if err != nil {
			t.Fatal(err)
		}
		if res.New || res.State != sink.StatePending {
			t.Fatalf("redelivery after a failed effect: %+v, want a known key that is still pending", res)
		}
	})
	// …but nothing was marked done, so the work is still owed and runs.
	r = gemrecon(t, "--db", db, "status", key)
	wantCode(t, r, exitNotDone)
	if !strings.Contains(r.stdout, "ledger unavailable") {
		t.Errorf("status should show the failure: %v", r)
	}
	log := filepath.Join(t.TempDir(), "effects.log")
	r = gemrecon(t, "--db", db, "drain", "--exec", `echo "$GEMRECON_KEY $GEMRECON_ATTEMPT" >> `+shellQuote(log))
	wantCode(t, r, exitOK)
	if lines := readLines(t, log); len(lines) != 1 || lines[0] != key+" 2" {
		t.Fatalf("effect log %q, want one successful second attempt", lines)
	}
	wantCode(t, gemrecon(t, "--db", db, "status", key), exitOK)
}

// The work-before-recording ordering: doing the work and recording it
// afterwards lets a crash in between run it again with no trace. In gemrecon
// the claim — state claimed, the attempt's fencing token — is durable before
// the effect starts: the effect itself reads it from the database.
func TestSeedClaimIsDurableBeforeTheEffectStarts(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "s.db")
	ctx := context.Background()
	key := "gemini:batches/seed-2"
	withSink(t, db, sink.Options{}, func(s sink.Sink) {
		if _, err := s.Record(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"name":"batches/seed-2"}`)}); err != nil {
			t.Fatal(err)
		}
	})
	bin := filepath.Join(dir, "gemrecon")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nGEMRECON_CLI_CHILD=1 exec "+shellQuote(os.Args[0])+` "$@"`+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	inside := filepath.Join(dir, "inside.json")
	effect := shellQuote(bin) + " --db " + shellQuote(db) + ` status --json "$GEMRECON_KEY" > ` + shellQuote(inside) +
		`; echo "$GEMRECON_TOKEN" > ` + shellQuote(inside+".token") + "; exit 0"
	r := gemrecon(t, "--db", db, "drain", "--exec", effect)
	wantCode(t, r, exitOK)

	var seen struct {
		State string `json:"state"`
		Token int64  `json:"token"`
	}
	b, err := os.ReadFile(inside)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &seen); err != nil {
		t.Fatalf("status from inside the effect: %v\n%s", err, b)
	}
	tok, _ := os.ReadFile(inside + ".token")
	if seen.State != "claimed" || seen.Token != 1 || strings.TrimSpace(string(tok)) != "1" {
		t.Fatalf("inside the effect the database said state %q token %d (effect's token %s), want claimed with the effect's token 1",
			seen.State, seen.Token, tok)
	}
	wantCode(t, gemrecon(t, "--db", db, "status", key), exitOK)
}
