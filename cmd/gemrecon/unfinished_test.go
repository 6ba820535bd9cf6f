package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Issue 25 item 5 as a user meets it: a poll pass that lists a batch
// pending for 30 h warns of it with the time left before the API expires
// it; stats (text and --json) shows the unfinished batches and the keys
// whose results expire within 6 h; status shows until when a key's results
// are kept.
func TestStuckAndExpiringShown(t *testing.T) {
	t.Setenv("GEMINI_API_KEY", testAPIKey)
	api := fakeAPI(t)
	now := time.Now()
	api.Add(geminifake.Batch{Name: geminifake.GeminiName("stuck"), State: "PENDING", CreateTime: now.Add(-30 * time.Hour)},
		geminifake.Batch{Name: geminifake.GeminiName("late"), State: "SUCCEEDED", CreateTime: now.Add(-45 * time.Hour),
			EndTime: now.Add(-44 * time.Hour)})
	db := initDB(t, filepath.Join(t.TempDir(), "sink.db"))
	r := gemrecon(t, pollArgs(db, api, "--lookback", "72h", "--exec", "exit 3")...)
	if !strings.Contains(r.stderr, "has not finished for over a day") || !strings.Contains(r.stderr, "expires_in=18h") {
		t.Fatalf("poll: want a warning that batches/stuck expires in 18h, got %v", r)
	}
	r = gemrecon(t, "--db", db, "stats")
	wantCode(t, r, exitOK)
	if !strings.Contains(r.stdout, "unfinished:") || !strings.Contains(r.stdout, "PENDING 1; the oldest created 30h") ||
		!strings.Contains(r.stdout, "results expiring:       1 key(s)") {
		t.Fatalf("stats: want the pending batch and one key's results expiring, got %v", r)
	}
	r = gemrecon(t, "--db", db, "stats", "--json")
	var st struct {
		ResultsExpiring int64 `json:"results_expiring"`
		Passes          []struct {
			Unfinished       map[string]int64 `json:"unfinished"`
			OldestUnfinished time.Time        `json:"oldest_unfinished"`
		} `json:"passes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.ResultsExpiring != 1 || len(st.Passes) != 1 ||
		st.Passes[0].Unfinished["PENDING"] != 1 || now.Sub(st.Passes[0].OldestUnfinished).Round(time.Hour) != 30*time.Hour {
		t.Fatalf("stats --json = %+v (%v); want results_expiring 1 and one pass with PENDING 1 created 30h ago:\n%s", st, err, r.stdout)
	}
	r = gemrecon(t, "--db", db, "status", "batches/late")
	if !strings.Contains(r.stdout, "results kept") || !strings.Contains(r.stdout, "the API deletes them 48 h after the batch ended") {
		t.Fatalf("status: want until when the results are kept, got %v", r)
	}
}
