package sqlite_test

import (
	"context"
	"database/sql"
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
			db, err := sql.Open("sqlite", "file:"+s.(*sqlite.Sink).Path()+"?_pragma=busy_timeout(5000)")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			ns := at.UnixNano()
			if _, err := db.ExecContext(context.Background(), `INSERT INTO gemrecon_keys
				(key, state, first_source, sources, seen_count, first_seen_at, last_seen_at, next_attempt_at, due_at)
				VALUES (?1, 'pending', 'poll', ',poll,', 1, ?2, ?2, ?2, ?2)`, key, ns); err != nil {
				t.Fatalf("inserting a stored key: %v", err)
			}
			return true // SQLite's TEXT holds any bytes
		})
}
