package webhook_test

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/internal/loadgen"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// deliverConcurrently sends the same signed event to the given base URLs
// (round robin), n at once, and returns the response statuses.
func deliverConcurrently(t *testing.T, bases []string, n int, body []byte) []string {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	statuses := make([]string, n)
	codes := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := signed(t, testSecret, "msg_same", time.Now(), body) // one delivery, retried: same id
			<-start
			r := do(t, client, http.MethodPost, bases[i%len(bases)]+"/webhook", body, h)
			statuses[i], codes[i] = r.Status, r.Code
		}()
	}
	close(start)
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusAccepted {
			t.Errorf("delivery %d = %d, want 202", i, c)
		}
	}
	return statuses
}

func checkOneAccepted(t *testing.T, statuses []string) {
	t.Helper()
	accepted := 0
	for _, s := range statuses {
		switch s {
		case "accepted":
			accepted++
		case "duplicate", "done": // done: the dispatcher finished before this one arrived
		default:
			t.Errorf("status %q, want accepted, duplicate or done", s)
		}
	}
	if accepted != 1 {
		t.Errorf("statuses %v: %d accepted, want exactly 1", statuses, accepted)
	}
}

// waitDone polls until key is done (bounded).
func waitDone(t *testing.T, s sink.Sink, key string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e, err := s.Get(context.Background(), key)
		if err == nil && e.State == sink.StateDone {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s not done within 20s: %+v, %v", key, e, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConcurrentDuplicatesOneProcess(t *testing.T) {
	path := sqlitetest.Path(t)
	effects := filepath.Join(t.TempDir(), "effects")
	s := sqlitetest.Open(t, path, sink.Options{})
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects}, Logger: slog.New(slog.DiscardHandler), Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}, Dispatcher: d})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := serve(t, h, webhook.ServerOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = d.Run(ctx) }()
	defer func() { cancel(); <-runDone }()

	checkOneAccepted(t, deliverConcurrently(t, []string{base}, 8, event("same-1")))
	waitDone(t, s, "gemini:batches/same-1")
	// More deliveries after done start nothing.
	for _, st := range deliverConcurrently(t, []string{base}, 4, event("same-1")) {
		if st != "done" {
			t.Errorf("delivery after done = %q, want done", st)
		}
	}
	cancel()
	<-runDone
	if got := effectLines(t, effects); !slices.Equal(got, []string{"gemini:batches/same-1"}) {
		t.Errorf("effect runs = %q, want exactly one", got)
	}
	e, _ := s.Get(context.Background(), "gemini:batches/same-1")
	if e.Attempts != 1 {
		t.Errorf("attempts = %d, want 1", e.Attempts)
	}
}

func TestConcurrentDuplicatesTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two serve processes")
	}
	dir := t.TempDir()
	db, effects := filepath.Join(dir, "gemrecon.db"), filepath.Join(dir, "effects")
	// Create and migrate the file first, so the children race only on keys.
	sqlitetest.Open(t, db, sink.Options{}).Close()
	a := startChild(t, db, effects, true)
	b := startChild(t, db, effects, true)

	checkOneAccepted(t, deliverConcurrently(t, []string{a.base, b.base}, 8, event("same-2")))
	s := sqlitetest.Open(t, db, sink.Options{ReadOnly: true})
	waitDone(t, s, "gemini:batches/same-2")
	a.term(t)
	b.term(t)
	if got := effectLines(t, effects); !slices.Equal(got, []string{"gemini:batches/same-2"}) {
		t.Errorf("effect runs across two processes = %q, want exactly one", got)
	}
}

// checkNoLoss asserts that every acknowledged key is in the database at
// path, then "restarts" (a fresh sink and dispatcher) and checks that every
// one of them ends done, each effect running once.
func checkNoLoss(t *testing.T, path string, acks []loadgen.Ack) {
	t.Helper()
	if len(acks) == 0 {
		t.Fatal("no request was acknowledged: the test proved nothing")
	}
	ctx := context.Background()
	s := sqlitetest.Open(t, path, sink.Options{})
	for _, a := range acks {
		if _, err := s.Get(ctx, a.Key); err != nil {
			t.Errorf("acknowledged key %s (status %s) missing after shutdown: %v", a.Key, a.Status, err)
		}
	}
	effects := filepath.Join(t.TempDir(), "effects")
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: &appendEffect{path: effects}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Drain(ctx); err != nil {
		t.Fatalf("Drain after restart: %v", err)
	}
	for _, a := range acks {
		if e, err := s.Get(ctx, a.Key); err != nil || e.State != sink.StateDone {
			t.Errorf("acknowledged key %s after restart and drain = %s, %v; want done", a.Key, e.State, err)
		}
	}
	runs := effectLines(t, effects)
	seen := map[string]bool{}
	for _, k := range runs {
		if seen[k] {
			t.Errorf("effect ran twice for %s", k)
		}
		seen[k] = true
	}
	t.Logf("%d acknowledged, %d effects after restart", len(acks), len(runs))
}

func TestNoLossUnderShutdownInProcess(t *testing.T) {
	path := sqlitetest.Path(t)
	s := sqlitetest.Open(t, path, sink.Options{})
	h, err := newHandler(webhook.Config{Sink: s, Secrets: []string{testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	base, stop := serve(t, h, webhook.ServerOptions{})
	var acked atomic.Int64
	stopped := make(chan error, 1)
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		URL: base + "/webhook", Secret: testSecret, Workers: 8, Count: 5000,
		Body: loadgen.NewKeys("inproc"), StopOnTransportError: true,
		OnAck: func(loadgen.Ack) {
			if acked.Add(1) == 100 {
				go func() { stopped <- stop() }() // mid-run, requests in flight
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Serve after shutdown = %v, want nil (clean drain)", err)
	}
	if res.TransportErrors == 0 {
		t.Errorf("no request failed: shutdown did not happen mid-run (%d sent)", res.Sent)
	}
	for c := range res.ByStatus {
		if c != http.StatusAccepted {
			t.Errorf("statuses %v: want only 202 (or no response)", res.ByStatus)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkNoLoss(t, path, res.Acks)
}

func TestNoLossUnderSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a serve process")
	}
	dir := t.TempDir()
	db := filepath.Join(dir, "gemrecon.db")
	c := startChild(t, db, filepath.Join(dir, "effects"), false)
	var acked atomic.Int64
	var once sync.Once
	termed := make(chan struct{})
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		URL: c.base + "/webhook", Secret: testSecret, Workers: 8, Count: 5000,
		Body: loadgen.NewKeys("sigterm"), StopOnTransportError: true,
		OnAck: func(loadgen.Ack) {
			if acked.Add(1) >= 100 {
				once.Do(func() {
					_ = c.cmd.Process.Signal(syscall.SIGTERM)
					close(termed)
				})
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	<-termed
	select {
	case err := <-c.done:
		if err != nil {
			t.Errorf("child exit after SIGTERM = %v, want 0\n%s", err, c.stderr.String())
		}
		c.done <- err
	case <-time.After(30 * time.Second):
		t.Fatalf("child did not exit within 30s of SIGTERM")
	}
	if res.TransportErrors == 0 {
		t.Errorf("no request failed: SIGTERM did not land mid-run (%d sent)", res.Sent)
	}
	checkNoLoss(t, db, res.Acks)
}
