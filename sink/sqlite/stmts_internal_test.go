package sqlite

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// TestHotPathsPrepared runs the conformance suite and checks that every query
// of the operations it exercises went through a statement prepared at Open:
// a query text missing from writerQueries or readerQueries would be parsed
// again on every call.
func TestHotPathsPrepared(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	sinktest.Run(t, func(t *testing.T, opt sink.Options) sink.Sink {
		path := filepath.Join(t.TempDir(), "gemrecon.db")
		s, err := Open(context.Background(), path, opt, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil {
			t.Fatalf("Open(%q): %v", path, err)
		}
		t.Cleanup(func() { s.Close() })
		t.Cleanup(func() { // runs before Close
			if n := s.unprepared.Load(); n != 0 {
				t.Errorf("%d queries ran without a prepared statement, want 0", n)
			}
		})
		return s
	})
}
