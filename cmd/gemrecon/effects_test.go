package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// TestFencedOutcomeExits4 (issue 12 item 12): an attempt whose key was
// taken over while its effect ran has its outcome fenced: the effect may
// have run twice. drain and poll say so and exit 4, not 0.
func TestFencedOutcomeExits4(t *testing.T) {
	t.Run("drain", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "s.db")
		key := "gemini:batches/fenced"
		withSink(t, db, sink.Options{}, func(s sink.Sink) {
			if _, err := s.Record(context.Background(), sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: []byte(`{"name":"batches/fenced"}`)}); err != nil {
				t.Fatal(err)
			}
		})
		r := runTakenOver(t, db, key, "--db", db, "drain")
		wantCode(t, r, exitNotDone)
		if !strings.Contains(r.stderr, "fenced=1") || !strings.Contains(r.stderr, "may have run twice") {
			t.Errorf("drain's summary does not say that an outcome was fenced:\n%s", r.stderr)
		}
	})
	t.Run("poll", func(t *testing.T) {
		t.Setenv("GEMINI_API_KEY", testAPIKey)
		t.Setenv("GOOGLE_API_KEY", "")
		api := fakeAPI(t, "SUCCEEDED")
		db := filepath.Join(t.TempDir(), "s.db")
		r := runTakenOver(t, db, "gemini:"+geminifake.GeminiName("b0"), pollArgs(db, api)...)
		wantCode(t, r, exitNotDone)
	})
}

// runTakenOver runs the command line args (drain or poll on db) with an
// --exec effect that waits for a file; meanwhile another holder, an hour
// later by its clock (past the command's lease), takes key over; then the
// effect exits 0 and the command's outcome is fenced.
func runTakenOver(t *testing.T, db, key string, args ...string) result {
	t.Helper()
	dir := t.TempDir()
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	effect := "touch " + shellQuote(started) + "; while [ ! -e " + shellQuote(goOn) + " ]; do sleep 0.01; done; exit 0"
	args = append(args, "--exec", effect, "--lease", "1m", "--effect-timeout", "50s")
	done := make(chan result, 1)
	go func() { done <- gemrecon(t, args...) }()
	waitFor(t, 30*time.Second, func() bool { _, err := os.Stat(started); return err == nil })

	ctx := context.Background()
	later := func() time.Time { return time.Now().Add(time.Hour) }
	s, err := sqlite.Open(ctx, db, sink.Options{Now: later})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Claim(ctx, key, "thief", time.Hour)
	if cerr := s.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil || !c.Takeover || c.Token != 2 {
		t.Fatalf("Claim by the other holder = %+v, %v; want a takeover with token 2", c, err)
	}
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return <-done
}
