package poller

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

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

// A download whose response has neither a Content-Length nor chunked
// framing ends when the connection closes, so a connection dropped
// mid-file looks like the end of the file. Before, Download returned such a
// truncated body as the whole file, and results.Dir published it as
// complete (and never fetched it again). Now the byte count of an unframed
// body is checked against the file's sizeBytes (files.get); a framed body
// cut short is an error as before, and a whole unframed file is fine.
func TestUnframedTruncatedDownloadIsNotComplete(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	s.AddFile(geminifake.File{Name: "files/cut", Size: 100_000, Seed: 7, Unframed: true, CutAfter: 30_000})
	s.AddFile(geminifake.File{Name: "files/whole", Size: 100_000, Seed: 7, Unframed: true})
	s.AddFile(geminifake.File{Name: "files/framed-cut", Size: 100_000, Seed: 7, CutAfter: 30_000})
	p := newPoller(t, testConfig(s, &sleeps{}))
	ctx := context.Background()
	for _, f := range []string{"files/cut", "files/framed-cut"} {
		n, err := p.Download(ctx, f, hashWriter{sha256.New()})
		if !errors.Is(err, ErrTransient) {
			t.Errorf("%s: %d bytes, %v; want ErrTransient", f, n, err)
		}
	}
	h := sha256.New()
	n, err := p.Download(ctx, "files/whole", hashWriter{h})
	if err != nil || n != 100_000 || [32]byte(h.Sum(nil)) != sum(geminifake.Content(7, 100_000)) {
		t.Errorf("files/whole: %d bytes, %v (or the bytes differ)", n, err)
	}
}

// The stand-in's File.StallAfter sends (and flushes) that many bytes before
// it holds the download. Before, its request recorder hid the
// http.Flusher, so nothing was flushed: with StallAfter under the server's
// buffer neither the headers nor any byte arrived, and a test of a stall
// "mid-body" (TestDownloadStallsAndWriteErrors' cancelled download) was in
// fact a wait for the headers.
func TestStandInFlushesBeforeStall(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	s.AddFile(geminifake.File{Name: "files/held", Size: 100_000, Seed: 1, StallAfter: 1000})
	cfg := testConfig(s, &sleeps{})
	cfg.RequestTimeout = 200 * time.Millisecond
	n, err := newPoller(t, cfg).Download(context.Background(), "files/held", io.Discard)
	if !errors.Is(err, ErrTransient) || n != 1000 || !strings.Contains(err.Error(), "no data received") {
		t.Errorf("a download held after 1000 bytes: %d bytes, %v; want 1000 bytes, then no data received", n, err)
	}
}
