package postgres

import "time"

// Options only tests set.

// WithSchema keeps gemrecon's tables in the named schema (created if missing,
// unless read-only); it overrides any search_path in the DSN.
func WithSchema(name string) Option { return func(c *config) { c.schema = name } }

// WithStatementTimeout sets statement_timeout on every connection (default
// DefaultStatementTimeout) unless the DSN sets it.
func WithStatementTimeout(d time.Duration) Option {
	return func(c *config) { c.statementTimeout = d }
}

// WithMaxConns bounds the connections the Sink opens (default
// DefaultMaxConns; values below 1 mean 1). The DSN parameter pool_max_conns,
// when present, wins.
func WithMaxConns(n int) Option { return func(c *config) { c.maxConns = n } }

// WithRoundTripTimeout sets the client-side deadline of one round trip
// (default: statement_timeout + RoundTripMargin, 35 s with the default
// statement_timeout): a read waiting for the server's reply, or a write
// waiting for it to take a request, fails after d.
func WithRoundTripTimeout(d time.Duration) Option { return func(c *config) { c.roundTrip = d } }

// withPingIdleAfter changes how long a pooled connection may idle before it
// is pinged on acquire (default pingIdleAfter; 0 pings every time).
func withPingIdleAfter(d time.Duration) Option { return func(c *config) { c.pingIdleAfter = d } }
