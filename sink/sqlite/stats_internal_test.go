package sqlite

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// TestStatsLatencyRanks checks the one-sort percentiles against nearest-rank
// computed here, for small and uneven counts of done keys with many ties,
// and with pending keys that must not count.
func TestStatsLatencyRanks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, n := range []int{1, 2, 3, 7, 100, 101, 250} {
		s, err := Open(ctx, filepath.Join(t.TempDir(), "gemrecon.db"), sink.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		var lat []int64
		for i := range n + 5 {
			state, first, l := "done", rng.Int64N(1000), rng.Int64N(20) // ties
			if i >= n {
				state, l = "pending", 1_000_000 // larger than any done latency
			}
			if _, err := s.db.rdb.ExecContext(ctx, `INSERT INTO gemrecon_keys
				(key, state, first_source, sources, first_seen_at, last_seen_at, done_at, due_at)
				VALUES (?1, ?2, 'poll', ',poll,', ?3, ?3, ?4, ?4)`, fmt.Sprintf("k%d", i), state, first, first+l); err != nil {
				t.Fatal(err)
			}
			if state == "done" {
				lat = append(lat, l)
			}
		}
		slices.Sort(lat)
		nearest := func(p float64) time.Duration {
			idx := int(math.Ceil(p*float64(len(lat)))) - 1
			return time.Duration(lat[min(max(idx, 0), len(lat)-1)])
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := [3]time.Duration{st.LatencyP50, st.LatencyP99, st.LatencyMax}
		want := [3]time.Duration{nearest(0.5), nearest(0.99), nearest(1)}
		if got != want {
			t.Errorf("Stats(%d done) p50, p99, max = %v, want %v", n, got, want)
		}
		s.Close()
	}
}
