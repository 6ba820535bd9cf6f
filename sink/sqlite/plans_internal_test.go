package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gemrecon/gemrecon/sink"
)

// TestQueryPlans checks with EXPLAIN QUERY PLAN that the hot queries find
// their rows through an index: a full scan or a sort of every due key would
// make each call cost in proportion to the table.
func TestQueryPlans(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "gemrecon.db"), sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		name, query string
		want        []string // substrings the plan must contain
	}{
		{"key row", `SELECT ` + rowColumns + ` FROM gemrecon_keys WHERE key = ?`, []string{"SEARCH gemrecon_keys USING PRIMARY KEY (key=?)"}},
		{"bodies", `SELECT p.payload, ` + webhookExpr + ` FROM gemrecon_keys k LEFT JOIN gemrecon_payloads p ON p.key = k.key WHERE k.key = ?`,
			[]string{"SEARCH k USING PRIMARY KEY (key=?)", "SEARCH p USING PRIMARY KEY (key=?)"}},
		{"get", selectEntry + `WHERE k.key = ?`, []string{"SEARCH k USING PRIMARY KEY (key=?)"}},
		{"due keys", dueQuery("key", false), []string{"MERGE (UNION ALL)", "USING COVERING INDEX gemrecon_keys_due (state=? AND due_at<?)",
			"USING COVERING INDEX gemrecon_keys_leases (state=? AND due_at<?)"}},
		{"due rows, confirmable", dueQuery(rowColumns, true), []string{"MERGE (UNION ALL)", "USING INDEX gemrecon_keys_due (state=? AND due_at<?)",
			"USING INDEX gemrecon_keys_leases (state=? AND due_at<?)"}},
	}
	for _, tt := range tests {
		rows, err := s.db.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+tt.query, 1, 2, 3, 4, 5, 6, 7)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, notused int
			var detail string
			if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		all := strings.Join(plan, "\n")
		for _, w := range tt.want {
			if !strings.Contains(all, w) {
				t.Errorf("plan(%s) = %q, want it to contain %q", tt.name, all, w)
			}
		}
		for _, bad := range []string{"SCAN gemrecon_keys", "SCAN k", "TEMP B-TREE"} {
			if strings.Contains(all, bad) {
				t.Errorf("plan(%s) = %q, want no %q", tt.name, all, bad)
			}
		}
	}
}

// TestDueKeysMergeOrder checks the merged due query against the plain one it
// replaced ("state IN (...) ORDER BY ..."), on rows with many ties in due_at
// and first_seen_at across both states, for several limits.
func TestDueKeysMergeOrder(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "gemrecon.db"), sink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// 600 keys; state, due_at and first_seen_at from small ranges so that
	// they tie often; keys in an order unrelated to both.
	if _, err := s.db.rdb.ExecContext(ctx, `WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 600)
		INSERT INTO gemrecon_keys (key, state, first_source, sources, first_seen_at, last_seen_at, due_at)
		SELECT 'k' || ((i * 7919) % 1000), CASE i % 4 WHEN 0 THEN 'pending' WHEN 1 THEN 'claimed' WHEN 2 THEN 'done' ELSE 'pending' END,
			'poll', ',poll,', (i * 31) % 5, 0, (i * 17) % 7 FROM c`); err != nil {
		t.Fatal(err)
	}
	const plain = `SELECT key FROM gemrecon_keys WHERE state IN ('pending', 'claimed') AND due_at <= ?1
		ORDER BY due_at, first_seen_at, key LIMIT ?2`
	for _, now := range []int64{-1, 0, 3, 6} {
		for _, limit := range []int{-1, 1, 4, 50, 1000} {
			want, err := plainKeys(ctx, s, plain, now, limit)
			if err != nil {
				t.Fatal(err)
			}
			rows, err := s.db.rdb.QueryContext(ctx, `SELECT key FROM (`+dueQuery("key", false)+`)`, now, limit)
			got, err := collect(rows, err, scanKey)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("dueKeys(now=%d, limit=%d) = %q, want %q", now, limit, got, want)
			}
			if now == 6 && limit == -1 && len(got) != 450 {
				t.Errorf("dueKeys(now=6, all) = %d keys, want 450 (every pending and claimed key)", len(got))
			}
		}
	}
}

func plainKeys(ctx context.Context, s *Sink, q string, now int64, limit int) ([]string, error) {
	rows, err := s.db.rdb.QueryContext(ctx, q, now, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}
