package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gemrecon/gemrecon/sink"
)

// Options are the test hooks of NewWithOptions.
type Options struct {
	StatsTTL  time.Duration    // how long a Stats result is reused; 0: DefaultStatsTTL
	Now       func() time.Time // the cache's clock; nil: time.Now
	NoRuntime bool             // leave out the go_* and process_* metrics
}

// NewWithOptions is New with the Stats calls counted (queries), the stats
// cache's TTL and clock replaced and, with NoRuntime, the runtime
// collectors unregistered.
func NewWithOptions(s StatsReader, opt Options) *Metrics {
	if s != nil {
		s = &countingStats{StatsReader: s}
	}
	m := New(s)
	if m.stats != nil {
		if opt.StatsTTL > 0 {
			m.stats.ttl = opt.StatsTTL
		}
		if opt.Now != nil {
			m.stats.now = opt.Now
		}
	}
	if opt.NoRuntime {
		m.reg.Unregister(collectors.NewGoCollector())
		m.reg.Unregister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// countingStats counts the Stats calls made through it.
type countingStats struct {
	StatsReader
	n atomic.Int32
}

func (c *countingStats) Stats(ctx context.Context) (sink.Stats, error) {
	c.n.Add(1)
	return c.StatsReader.Stats(ctx)
}
