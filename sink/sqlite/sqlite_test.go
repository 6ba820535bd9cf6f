package sqlite_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// quiet keeps expected warnings (fenced outcomes, conflicts) out of test output.
var quiet = sqlite.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

func openTemp(t testing.TB, opt sink.Options, extra ...sqlite.Option) *sqlite.Sink {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gemrecon.db")
	s, err := sqlite.Open(context.Background(), path, opt, append([]sqlite.Option{quiet}, extra...)...)
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	sinktest.Run(t, func(t *testing.T, opt sink.Options) sink.Sink { return openTemp(t, opt) })
}

// The done cache must not change behaviour: run the suite without it too.
func TestConformanceNoDoneCache(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	sinktest.Run(t, func(t *testing.T, opt sink.Options) sink.Sink {
		return openTemp(t, opt, sqlite.WithDoneCacheSize(-1))
	})
}
