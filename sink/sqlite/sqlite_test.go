package sqlite_test

import (
	"testing"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// quiet keeps expected warnings (fenced outcomes, conflicts) out of test output.
var quiet = sqlitetest.Quiet

func TestConformance(t *testing.T) {
	t.Parallel()
	sinktest.Run(t, func(t *testing.T, opt sink.Options) sink.Sink { return sqlitetest.OpenTemp(t, opt) })
}
