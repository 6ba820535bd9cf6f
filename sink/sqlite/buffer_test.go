package sqlite_test

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// storedSeen reads seen_count straight from the file, bypassing the sink's
// in-memory buffer.
func storedSeen(t *testing.T, path, key string) int64 {
	t.Helper()
	var n int64
	sqlitetest.QueryRow(t, sqlitetest.ReadOnly(path), `SELECT seen_count FROM gemrecon_keys WHERE key = ?`, []any{key}, &n)
	return n
}

// Duplicates are buffered, then written by the periodic flush (within a
// second) without anyone calling Flush.
func TestDuplicatesFlushPeriodically(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "f.db")
	s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 5 {
		if _, err := s.Record(ctx, sink.Sighting{Key: "k", Source: "poll"}); err != nil {
			t.Fatal(err)
		}
	}
	if e, _ := s.Get(ctx, "k"); e.SeenCount != 5 {
		t.Fatalf("Get.SeenCount = %d, want 5 (buffered sightings included)", e.SeenCount)
	}
	deadline := time.Now().Add(5 * time.Second)
	for storedSeen(t, path, "k") != 5 {
		if time.Now().After(deadline) {
			t.Fatalf("seen_count on disk = %d after 5s, want 5", storedSeen(t, path, "k"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close writes what is buffered; a reopened sink sees every sighting.
func TestCloseFlushes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	s, err := sqlite.Open(ctx, path, sink.Options{}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			src := []string{"poll", "webhook"}[i%2]
			if _, err := s.Record(ctx, sink.Sighting{Key: "k", Source: src}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "k2", Source: "poll"}); err == nil {
		t.Fatal("Record after Close succeeded")
	}
	if n := storedSeen(t, path, "k"); n != 50 {
		t.Fatalf("seen_count after Close = %d, want 50", n)
	}
}

// Conflicts and fenced outcomes are logged with the key.
func TestLogsConflictAndFenced(t *testing.T) {
	ctx := context.Background()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	path := filepath.Join(t.TempDir(), "l.db")
	s, err := sqlite.Open(ctx, path, sink.Options{}, sqlite.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Record(ctx, sink.Sighting{Key: "gemini:batches/c", Source: "poll", Payload: []byte("a"), State: "SUCCEEDED", FromAPI: true})
	s.Record(ctx, sink.Sighting{Key: "gemini:batches/c", Source: "webhook", Payload: []byte("b"), State: "FAILED"})
	c, err := s.Claim(ctx, "gemini:batches/c", "o", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "gemini:batches/c", c.Token+1); err == nil {
		t.Fatal("Complete with a wrong token succeeded")
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"state conflict", "stored=SUCCEEDED seen=FAILED", "fenced outcome discarded", "key=gemini:batches/c"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log = %q, want it to contain %q", out, want)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A lease that would be expired when granted is refused, changing nothing.
func TestNonPositiveLease(t *testing.T) {
	ctx := context.Background()
	s := sqlitetest.OpenTemp(t, sink.Options{})
	if _, err := s.Record(ctx, sink.Sighting{Key: "k", Source: "poll"}); err != nil {
		t.Fatal(err)
	}
	for _, lease := range []time.Duration{0, -time.Second} {
		if _, err := s.Claim(ctx, "k", "o", lease, sink.ClaimOptions{}); err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Fatalf("Claim(lease %v) error = %v, want a positive-lease error", lease, err)
		}
		if cs, err := s.ClaimDue(ctx, "o", lease, 0, sink.ClaimOptions{}); err == nil || len(cs) != 0 {
			t.Fatalf("ClaimDue(lease %v) = %d claims, %v; want an error", lease, len(cs), err)
		}
	}
	if e, err := s.Get(ctx, "k"); err != nil || e.State != sink.StatePending || e.Token != 0 {
		t.Fatalf("Get = %+v, %v; want untouched pending", e, err)
	}
}
