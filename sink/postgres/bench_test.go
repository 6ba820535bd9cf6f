package postgres

import (
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// BenchmarkSink is the backend-agnostic suite (sinktest.Bench), the same
// work as sink/sqlite's BenchmarkSink so that the two backends can be read
// side by side. Each run gets a fresh schema and a pool of up to 16
// connections (one per goroutine of the widest sub-benchmark; pgxpool opens
// them on demand); the database clock is in use. Skips without
// GEMRECON_TEST_POSTGRES.
func BenchmarkSink(b *testing.B) {
	baseDSN(b)
	sinktest.Bench(b, func(b *testing.B) sink.Sink {
		dsn, _ := testSchema(b)
		return openDSN(b, withParam(dsn, "pool_max_conns", "16"), sink.Options{})
	})
}
