package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
)

// The purge guard of spec §7 against a real database: a purge younger than
// the longest lookback a poll recorded is refused, every purge once a poll
// read every page (lookback 0), unless Force.
func TestPurgeRequestCheck(t *testing.T) {
	ctx := context.Background()
	s := sqlitetest.OpenTemp(t, sink.Options{})
	check := func(r sink.PurgeRequest, refused bool, want string) {
		t.Helper()
		err := r.Check(ctx, s)
		if refused != errors.Is(err, sink.ErrPurgeRefused) || (want != "" && !strings.Contains(fmtErr(err), want)) {
			t.Errorf("Check(%+v) = %v, want refused=%v containing %q", r, err, refused, want)
		}
	}
	check(sink.PurgeRequest{OlderThan: time.Hour}, false, "") // no poll recorded
	if err := s.NoteLookback(ctx, 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	check(sink.PurgeRequest{OlderThan: 24 * time.Hour}, true, "24h0m0s is shorter than the longest poll lookback 72h0m0s")
	check(sink.PurgeRequest{OlderThan: 72 * time.Hour}, false, "")
	check(sink.PurgeRequest{OlderThan: time.Hour, Force: true}, false, "")
	if err := s.NoteLookback(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check(sink.PurgeRequest{OlderThan: 1000 * time.Hour}, true, "lookback 0 (every page, forever)")
	check(sink.PurgeRequest{OlderThan: 1000 * time.Hour, Force: true}, false, "")
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestPurgeRequestValidate(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Hour} {
		if err := (sink.PurgeRequest{OlderThan: d}).Validate(); err == nil {
			t.Errorf("Validate(OlderThan %v) = nil, want an error", d)
		}
	}
	if err := (sink.PurgeRequest{OlderThan: time.Hour}).Validate(); err != nil {
		t.Errorf("Validate(OlderThan 1h) = %v, want nil", err)
	}
}
