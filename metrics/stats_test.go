package metrics

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func TestStatsCollector(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t: time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)}
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "g.db"), sink.Options{Now: clk.now}, sqlite.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, k := range []string{"gemini:batches/a", "gemini:batches/b", "gemini:batches/c"} {
		if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	clk.add(90 * time.Second)
	c, err := s.Claim(ctx, "gemini:batches/a", "t", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, c.Key, c.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	m := NewWithOptions(s, Options{NoRuntime: true, Now: clk.now, StatsTTL: 5 * time.Second})
	out := scrape(t, m)
	for _, want := range []string{
		"gemrecon_db_up 1",
		`gemrecon_keys{state="pending"} 2`,
		`gemrecon_keys{state="done"} 1`,
		`gemrecon_keys{state="dead"} 0`,
		"gemrecon_oldest_pending_age_seconds 90",
		`gemrecon_completion_to_done_seconds{quantile="1"} 90`,
		"gemrecon_db_duplicates_suppressed_total 1",
		`gemrecon_keys_by_first_source{source="webhook"} 3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q; got:\n%s", want, out)
		}
	}

	// Cached: more sightings within the TTL do not show, and no query runs.
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/d", Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	clk.add(4 * time.Second)
	out = scrape(t, m)
	if !strings.Contains(out, `gemrecon_keys{state="pending"} 2`) {
		t.Errorf("scrape within the TTL re-queried: %s", out)
	}
	if queries(m) != 1 {
		t.Errorf("Stats queries after two scrapes within the TTL = %d, want 1", queries(m))
	}
	clk.add(2 * time.Second)
	out = scrape(t, m)
	if !strings.Contains(out, `gemrecon_keys{state="pending"} 3`) || queries(m) != 2 {
		t.Errorf("scrape after the TTL: queries = %d, want 2; pending 3 in:\n%s", queries(m), out)
	}

	// A TTL under the minimum is raised to it.
	m2 := NewWithOptions(s, Options{NoRuntime: true, Now: clk.now, StatsTTL: time.Millisecond})
	scrape(t, m2)
	clk.add(999 * time.Millisecond)
	scrape(t, m2)
	if queries(m2) != 1 {
		t.Errorf("Stats queries with a 1ms TTL within 999ms = %d, want 1 (MinStatsTTL)", queries(m2))
	}

	// A closed database reports db_up 0 and no database gauges.
	s.Close()
	clk.add(time.Minute)
	out = scrape(t, m)
	if !strings.Contains(out, "gemrecon_db_up 0") || strings.Contains(out, "gemrecon_keys{") {
		t.Errorf("scrape of a closed sink = %s, want db_up 0 and no key gauges", out)
	}
}

func queries(m *Metrics) int {
	m.stats.mu.Lock()
	defer m.stats.mu.Unlock()
	return m.stats.queries
}
