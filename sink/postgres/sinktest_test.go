package postgres

import (
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// TestConformance runs the backend-agnostic suite, each test in its own
// schema.
func TestConformance(t *testing.T) {
	baseDSN(t)
	sinktest.Run(t, func(t *testing.T, opt sink.Options) sink.Sink {
		s, _ := openTest(t, opt)
		return s
	})
}
