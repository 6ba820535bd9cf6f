package sqlite

import (
	"context"
	"database/sql"
)

// writerExec runs q on the writer connection (tests that set rows up
// directly), holding it as the writer does.
func (s *Sink) writerExec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return s.wconn.ExecContext(ctx, q, args...)
}
