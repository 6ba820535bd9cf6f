package poller

import (
	"testing"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Get (confirmation, spec §9.2) reads "done": true as the listing does: a
// batch in a state gemrecon does not know, or none, that the operation says
// is done has finished; a known unfinished state wins over done. Before, a
// webhook-first key of such a batch was "not terminal" on every recheck
// until it counted as a failed attempt 48 h on.
func TestGetDoneWithUnknownStateIsTerminal(t *testing.T) {
	s := startFake(t, geminifake.Options{})
	p := newPoller(t, testConfig(s, &sleeps{}))
	for _, tc := range []struct {
		body     string
		state    string
		terminal bool
	}{
		{`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SOMETHING_NEW","createTime":"2025-12-11T00:00:00Z"},"done":true}`, "SOMETHING_NEW", true},
		{`{"name":"batches/x","metadata":{"createTime":"2025-12-11T00:00:00Z"},"done":true,"error":{"code":8,"message":"quota"}}`, "", true},
		{`{"name":"batches/x","metadata":{"state":"BATCH_STATE_RUNNING"},"done":true}`, "RUNNING", false},
		{`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SOMETHING_NEW"}}`, "SOMETHING_NEW", false},
	} {
		s.InjectFault(geminifake.Fault{Body: tc.body})
		op, err := getOne(t, p, "batches/x")
		if err != nil || op.State != tc.state || op.Terminal != tc.terminal {
			t.Errorf("%s: state %q terminal %v, %v; want %q %v", tc.body, op.State, op.Terminal, err, tc.state, tc.terminal)
		}
	}
}
