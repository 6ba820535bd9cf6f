package metrics

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gemrecon/gemrecon/internal/testkit"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

func TestStatsCollector(t *testing.T) {
	ctx := context.Background()
	clk := testkit.NewClock(time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC))
	s := sqlitetest.OpenTemp(t, sink.Options{Now: clk.Now})
	for _, k := range []string{"gemini:batches/a", "gemini:batches/b", "gemini:batches/c"} {
		if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/a", Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(90 * time.Second)
	c, err := s.Claim(ctx, "gemini:batches/a", "t", time.Minute, sink.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, c.Key, c.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	m := NewWithOptions(s, Options{NoRuntime: true, Now: clk.Now, StatsTTL: 5 * time.Second})
	e := scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_db_up", nil, 1},
		{"gemrecon_keys", []string{"state=pending"}, 2},
		{"gemrecon_keys", []string{"state=claimed"}, 0},
		{"gemrecon_keys", []string{"state=done"}, 1},
		{"gemrecon_keys", []string{"state=dead"}, 0},
		{"gemrecon_oldest_pending_age_seconds", nil, 90},
		{"gemrecon_completion_to_done_seconds", []string{"quantile=1"}, 90},
		{"gemrecon_completion_to_done_seconds", []string{"quantile=0.5"}, 90},
		{"gemrecon_db_duplicates_suppressed_total", nil, 1},
		{"gemrecon_db_fenced_total", nil, 0},
		{"gemrecon_db_conflicts_total", nil, 0},
		{"gemrecon_keys_by_first_source", []string{"source=webhook"}, 3},
	})
	for name, want := range map[string]dto.MetricType{
		"gemrecon_db_up":                          dto.MetricType_GAUGE,
		"gemrecon_keys":                           dto.MetricType_GAUGE,
		"gemrecon_completion_to_done_seconds":     dto.MetricType_GAUGE,
		"gemrecon_db_duplicates_suppressed_total": dto.MetricType_COUNTER,
		"gemrecon_db_fenced_total":                dto.MetricType_COUNTER,
		"gemrecon_db_conflicts_total":             dto.MetricType_COUNTER,
	} {
		if got := e.typeOf(name); got != want {
			t.Errorf("type of %s = %v, want %v", name, got, want)
		}
	}

	// Cached: more sightings within the TTL do not show, and no query runs.
	if _, err := s.Record(ctx, sink.Sighting{Key: "gemini:batches/d", Source: sink.SourcePoll, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(4 * time.Second)
	scrape(t, m).expect(t, []check{{"gemrecon_keys", []string{"state=pending"}, 2}})
	if queries(m) != 1 {
		t.Errorf("Stats queries after two scrapes within the TTL = %d, want 1", queries(m))
	}
	// WriteTextfile gathers through the same collector and cache.
	if err := m.WriteTextfile(filepath.Join(t.TempDir(), "gemrecon.prom")); err != nil || queries(m) != 1 {
		t.Errorf("WriteTextfile within the TTL: err %v, queries = %d, want nil, 1", err, queries(m))
	}
	clk.Advance(2 * time.Second)
	e = scrape(t, m)
	e.expect(t, []check{
		{"gemrecon_keys", []string{"state=pending"}, 3},
		{"gemrecon_keys_by_first_source", []string{"source=poll"}, 1},
	})
	if queries(m) != 2 {
		t.Errorf("Stats queries after the TTL = %d, want 2", queries(m))
	}

	// A closed database reports db_up 0 and no database series, and the
	// scrape itself still succeeds (200).
	s.Close()
	clk.Advance(time.Minute)
	e = scrape(t, m)
	e.expect(t, []check{{"gemrecon_db_up", nil, 0}})
	for _, name := range []string{"gemrecon_keys", "gemrecon_oldest_pending_age_seconds", "gemrecon_completion_to_done_seconds",
		"gemrecon_db_duplicates_suppressed_total", "gemrecon_db_fenced_total", "gemrecon_db_conflicts_total", "gemrecon_keys_by_first_source"} {
		if e.fams[name] != nil {
			t.Errorf("scrape of a closed sink has %s:\n%s", name, e.raw)
		}
	}
	if _, ok := e.value("gemrecon_fenced_total"); !ok {
		t.Errorf("scrape of a closed sink lacks the process metrics")
	}
}

// queries is how many Stats calls m's collector made.
func queries(m *Metrics) int {
	return int(m.stats.s.(*countingStats).n.Load())
}
