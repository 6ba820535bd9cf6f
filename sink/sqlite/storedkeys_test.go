package sqlite_test

import (
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
	"github.com/gemrecon/gemrecon/sink/sqlite"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// TestStoredKeys: keys written before spec §12's check existed (here with
// SQL on a second connection, as an older gemrecon's Record wrote them) stay
// readable and usable.
func TestStoredKeys(t *testing.T) {
	sinktest.RunStoredKeys(t,
		func(t *testing.T, opt sink.Options) sink.Sink { return sqlitetest.OpenTemp(t, opt) },
		func(t *testing.T, s sink.Sink, key string, at time.Time) bool {
			t.Helper()
			sqlitetest.StoreRaw(t, s.(*sqlite.Sink).Path(), key, "pending", "", at)
			return true // SQLite's TEXT holds any bytes
		})
}
