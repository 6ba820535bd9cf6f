// Package pgtest gives tests outside sink/postgres a private PostgreSQL
// schema on the server named by GEMRECON_TEST_POSTGRES, or skips them with a
// message that says how to run them. CI (.ci/run) always sets the variable.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable that holds the test server's DSN.
const EnvDSN = "GEMRECON_TEST_POSTGRES"

// DSN returns the test server's DSN, or skips the test when it is not set.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		tb.Skip("set GEMRECON_TEST_POSTGRES=postgres://… to run the PostgreSQL tests (bash .ci/postgres.sh prints one)")
	}
	return dsn
}

// Schema creates a fresh schema, dropped when the test ends, and returns a
// DSN whose search_path is that schema: tests never see each other's rows.
func Schema(tb testing.TB) string {
	tb.Helper()
	dsn, _ := NewSchema(tb)
	return dsn
}

// NewSchema is Schema that also returns the schema's name.
func NewSchema(tb testing.TB) (dsn, schema string) {
	tb.Helper()
	base := DSN(tb)
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("%s must be a postgres:// URL, got %q", EnvDSN, base)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema = "gemrecon_t_" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		tb.Fatalf("connect to %s: %v", EnvDSN, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("create schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			tb.Logf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Logf("drop schema %s: %v", schema, err)
		}
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), schema
}
