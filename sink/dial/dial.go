// Package dial opens the sink backend that a --db value names: a
// postgres:// or postgresql:// URL selects PostgreSQL, anything else is a
// SQLite file path (optionally written sqlite:PATH).
package dial

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/postgres"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// IsPostgres reports whether dsn names a PostgreSQL database.
func IsPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Open opens the sink named by dsn; the backend logs to slog.Default().
func Open(ctx context.Context, dsn string, opt sink.Options) (sink.Sink, error) {
	return OpenWithLogger(ctx, dsn, opt, slog.Default())
}

// OpenWithLogger opens the sink named by dsn; the backend reports payload
// conflicts and fenced outcomes to logger.
func OpenWithLogger(ctx context.Context, dsn string, opt sink.Options, logger *slog.Logger) (sink.Sink, error) {
	dsn = strings.TrimSpace(dsn)
	if dsn == "" {
		return nil, errors.New("no database given: set --db or GEMRECON_DB")
	}
	// Return a nil interface, not a typed nil, on error.
	if IsPostgres(dsn) {
		s, err := postgres.Open(ctx, dsn, opt, postgres.WithLogger(logger))
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := sqlite.Open(ctx, strings.TrimPrefix(dsn, "sqlite:"), opt, sqlite.WithLogger(logger))
	if err != nil {
		return nil, err
	}
	return s, nil
}
