package postgres

import "time"

// Options only tests set.

// WithRoundTripTimeout sets the client-side deadline of one round trip
// (default: statement_timeout + RoundTripMargin, 35 s with the default
// statement_timeout): a read waiting for the server's reply, or a write
// waiting for it to take a request, fails after d.
func WithRoundTripTimeout(d time.Duration) Option { return func(c *config) { c.roundTrip = d } }

// withPingIdleAfter changes how long a pooled connection may idle before it
// is pinged on acquire (default pingIdleAfter; 0 pings every time).
func withPingIdleAfter(d time.Duration) Option { return func(c *config) { c.pingIdleAfter = d } }

// oneConn is a DSN whose pool holds one connection.
func oneConn(dsn string) string { return withParam(dsn, "pool_max_conns", "1") }
