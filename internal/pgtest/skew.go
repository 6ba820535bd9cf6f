package pgtest

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SkewedSchema is NewSchema whose sessions read a server clock that the
// test moves: the schema holds a function now() that returns
// pg_catalog.now() plus an offset kept in a one-row table, and the returned
// DSN's search_path is "schema,pg_catalog". PostgreSQL searches pg_catalog
// first only when the path does not name it; named after the schema, it
// comes second, so an unqualified now() resolves to the schema's function.
// A sink on that DSN without an injected clock then writes and compares
// its times (done_at, leases, due times) with a database clock that differs
// from this process's clock by the offset, as on a server whose clock is
// off. skew sets the offset (it starts at 0); the sink's tables go into the
// schema, the first one the path names.
func SkewedSchema(tb testing.TB) (dsn, schema string, skew func(time.Duration)) {
	tb.Helper()
	dsn, schema = NewSchema(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, DSN(tb))
	if err != nil {
		tb.Fatalf("connect to %s: %v", EnvDSN, err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	clock := schema + ".gemrecon_test_clock"
	for _, q := range []string{
		`CREATE TABLE ` + clock + ` (skew_us bigint NOT NULL)`,
		`INSERT INTO ` + clock + ` VALUES (0)`,
		`CREATE FUNCTION ` + schema + `.now() RETURNS timestamptz LANGUAGE sql STABLE
			AS $$ SELECT pg_catalog.now() + (SELECT skew_us FROM ` + clock + `) * interval '1 microsecond' $$`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			tb.Fatalf("skewed clock in schema %s: %v", schema, err)
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema+",pg_catalog") // no space: pgx reads a "+" in a URL query as itself
	u.RawQuery = q.Encode()
	skew = func(d time.Duration) {
		tb.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `UPDATE `+clock+` SET skew_us = $1`, d.Microseconds()); err != nil {
			tb.Fatalf("set the database clock's skew: %v", err)
		}
	}
	return u.String(), schema, skew
}
