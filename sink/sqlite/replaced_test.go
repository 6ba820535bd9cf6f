package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// The database file is deleted, or another file is renamed over it, while a
// sink has it open: the first commit after that answers an error (its write
// went to a file no one else can see), and so does everything after — new
// keys, duplicates answered from memory, Ping — with one loud log line.
func TestFileDeletedOrReplacedUnderTheSink(t *testing.T) {
	for _, tt := range []struct {
		name  string
		do    func(t *testing.T, path string)
		found string
	}{
		{"deleted", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, "the path names no file now"},
		{"replaced", func(t *testing.T, path string) {
			other := filepath.Join(filepath.Dir(path), "other.db")
			s, err := openRW(other, sink.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
		}, "the path names another file now"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "sink.db")
			var logs safeLog
			s, err := sqlite.Open(ctx, path, sink.Options{}, sqlite.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			done := "gemini:batches/done-before"
			if _, err := s.Record(ctx, sink.Sighting{Key: done, Source: sink.SourceWebhook}); err != nil {
				t.Fatal(err)
			}
			c, err := s.Claim(ctx, done, "w", time.Minute, sink.ClaimOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Complete(ctx, done, c.Token); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Record(ctx, sink.Sighting{Key: done, Source: sink.SourcePoll}); err != nil {
				t.Fatal(err) // now in the done cache
			}

			tt.do(t, path)

			_, err = s.Record(ctx, sink.Sighting{Key: "gemini:batches/after", Source: sink.SourceWebhook})
			wantReplaced(t, "Record(new key) after", path, err, tt.found)
			wantReplaced(t, "Ping after", path, s.Ping(ctx), tt.found)
			_, err = s.Record(ctx, sink.Sighting{Key: done, Source: sink.SourceWebhook})
			wantReplaced(t, "Record(cached done key) after", path, err, tt.found)
			_, err = s.ClaimDue(ctx, "w", time.Minute, 10, sink.ClaimOptions{})
			wantReplaced(t, "ClaimDue after", path, err, tt.found)
			if !errors.Is(s.Broken(), sqlite.ErrFileReplaced) {
				t.Fatalf("Broken = %v, want ErrFileReplaced", s.Broken())
			}
			if n := strings.Count(logs.String(), "THE DATABASE IS UNUSABLE"); n != 1 {
				t.Fatalf("the loud error was logged %d times, want once:\n%s", n, logs.String())
			}
		})
	}
}

func wantReplaced(t *testing.T, what, path string, err error, found string) {
	t.Helper()
	oneLine(t, what, err, path, "deleted or replaced while open", found, "restart gemrecon")
	if !errors.Is(err, sqlite.ErrFileReplaced) || !errors.Is(err, sink.ErrUnusable) {
		t.Fatalf("%s: %v does not wrap ErrFileReplaced and ErrUnusable", what, err)
	}
}

// safeLog is a log destination safe for concurrent writers.
type safeLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *safeLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *safeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
