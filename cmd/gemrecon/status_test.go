package main

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/pgtest"
	"github.com/gemrecon/gemrecon/sink"
)

// TestStatusSaysWhatIsOverdue: status says when a claimed key's lease has
// expired (its holder died or is paused: the next drain, poll or serve takes
// it over) and when a pending key's next attempt is due, instead of a bare
// time in the past that reads like a live lease; a live lease and a retry
// backing off are printed as before.
func TestStatusSaysWhatIsOverdue(t *testing.T) {
	ctx := context.Background()
	db := newDB(t)
	past := func() time.Time { return time.Now().Add(-2 * time.Hour) }
	withSink(t, db, sink.Options{Now: past}, func(s sink.Sink) {
		for _, k := range []string{"gemini:batches/stale", "gemini:batches/due"} {
			if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Claim(ctx, "gemini:batches/stale", "host-1/4242", time.Minute, sink.ClaimOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	withSink(t, db, sink.Options{RetryBase: time.Hour, RetryMax: time.Hour, Rand: func() float64 { return 0.5 }}, func(s sink.Sink) {
		for _, k := range []string{"gemini:batches/live", "gemini:batches/backoff"} {
			if _, err := s.Record(ctx, sink.Sighting{Key: k, Source: sink.SourceWebhook, Payload: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			c, err := s.Claim(ctx, k, "host-2/7", time.Hour, sink.ClaimOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if k == "gemini:batches/backoff" {
				if _, err := s.Fail(ctx, k, c.Token, sink.Failure{Cause: "boom"}); err != nil {
					t.Fatal(err)
				}
			}
		}
	})

	for _, tc := range []struct {
		name, row, want string
		expired         bool
	}{
		{"batches/stale", "lease:", "held by host-1/4242 until ", true},
		{"batches/live", "lease:", "held by host-2/7 until ", false},
		{"batches/due", "next attempt:", "", true},
		{"batches/backoff", "next attempt:", "", false},
	} {
		r := gemrecon(t, "--db", db, "status", tc.name)
		wantCode(t, r, exitNotDone)
		var line string
		for _, l := range strings.Split(r.stdout, "\n") {
			if strings.HasPrefix(l, tc.row) {
				line = l
			}
		}
		if line == "" || !strings.Contains(line, tc.want) {
			t.Errorf("status %s: no %q line with %q:\n%s", tc.name, tc.row, tc.want, r.stdout)
			continue
		}
		note := "(due now)"
		if tc.row == "lease:" {
			note = "(expired: the next drain, poll or serve takes the key over, counting that attempt as failed)"
		}
		if got := strings.HasSuffix(line, note); got != tc.expired {
			t.Errorf("status %s: %q; want the note %q: %v", tc.name, line, note, tc.expired)
		}
	}
}

// TestStatusUnknownKeepsThePasswordOut: status of an unknown key names the
// database it looked in — a PostgreSQL one by database, host and
// search_path, not by the --db string, whose password would go to stdout
// (and to whatever log collects it).
func TestStatusUnknownKeepsThePasswordOut(t *testing.T) {
	dsn, schema := pgtest.NewSchema(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "hunter2") // the test server trusts, so any password does
	withPassword := u.String()
	wantCode(t, gemrecon(t, "--db", withPassword, "init"), exitOK) // creates the tables

	r := gemrecon(t, "--db", withPassword, "status", "batches/nope")
	wantCode(t, r, exitUnknownKey)
	if strings.Contains(r.stdout+r.stderr, "hunter2") {
		t.Errorf("status printed the password:\n%v", r)
	}
	want := "gemini:batches/nope: unknown (never recorded in PostgreSQL database " + strings.TrimPrefix(u.Path, "/") +
		" on " + u.Host + ", search_path " + schema + ")\n"
	if r.stdout != want {
		t.Errorf("status printed %q, want %q", r.stdout, want)
	}
}
