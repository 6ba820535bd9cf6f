package postgres

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sinktest"
)

// TestStoredKeys: keys written before spec §12's check existed (here with
// SQL on a second connection, as an older gemrecon's Record wrote them) stay
// readable and usable.
func TestStoredKeys(t *testing.T) {
	baseDSN(t)
	dsns := map[sink.Sink]string{}
	sinktest.RunStoredKeys(t,
		func(t *testing.T, opt sink.Options) sink.Sink {
			s, dsn := openTest(t, opt)
			dsns[s] = dsn
			return s
		},
		func(t *testing.T, s sink.Sink, key string, at time.Time) bool {
			t.Helper()
			// What PostgreSQL could never have stored: text holds no NUL and
			// only valid UTF-8, and a btree entry is at most ~2.7 KB.
			if strings.ContainsRune(key, 0) || !utf8.ValidString(key) || len(key) > 2000 {
				return false
			}
			c := adminConn(t, dsns[s])
			if _, err := c.Exec(context.Background(), `INSERT INTO gemrecon_keys
				(key, state, first_source, sources, seen_count, first_seen_at, last_seen_at, next_attempt_at)
				VALUES ($1, 'pending', 'poll', ARRAY['poll'], 1, $2, $2, $2)`, key, at); err != nil {
				t.Fatalf("inserting a stored key: %v", err)
			}
			return true
		})
}
