package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Options are the test hooks of NewWithOptions.
type Options struct {
	StatsTTL  time.Duration    // how long a Stats result is reused; 0: DefaultStatsTTL
	Now       func() time.Time // the cache's clock; nil: time.Now
	NoRuntime bool             // leave out the go_* and process_* metrics
}

// NewWithOptions is New with the stats cache's TTL and clock replaced and,
// with NoRuntime, the runtime collectors unregistered.
func NewWithOptions(s StatsReader, opt Options) *Metrics {
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
