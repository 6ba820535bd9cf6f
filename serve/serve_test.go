package serve_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite/sqlitetest"
	"github.com/gemrecon/gemrecon/webhook"
)

// effectFunc records the keys it ran, or fails with err.
type effectFunc struct {
	mu   sync.Mutex
	keys []string
	err  error
}

func (e *effectFunc) Run(_ context.Context, ev effect.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.keys = append(e.keys, ev.Key)
	return e.err
}

func (e *effectFunc) ran() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.keys...)
}

// start runs a receiver on a real SQLite file and a loopback port.
func start(t *testing.T, ctx context.Context, eff effect.Effect) (*serve.Server, string, sink.Sink) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	s := sqlitetest.OpenTemp(t, sink.Options{})
	dc := dispatch.DefaultConfig()
	dc.Sink, dc.Effect, dc.Logger, dc.Interval = s, eff, quiet, 20*time.Millisecond
	d, err := dispatch.New(dc)
	if err != nil {
		t.Fatal(err)
	}
	wc := webhook.DefaultConfig()
	wc.InsecureNoVerify, wc.Dispatcher, wc.Logger = true, d, quiet
	h, err := serve.Receiver(wc, s)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := serve.Start(ctx, serve.Config{Listener: ln, Handler: h, Dispatcher: d, Logger: quiet,
		Server: webhook.ServerOptions{DrainTimeout: time.Second}})
	return srv, "http://" + ln.Addr().String() + webhook.DefaultPath, s
}

func deliver(t *testing.T, url, id string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"type":"batch.succeeded","data":{"id":"`+id+`"}}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// An accepted delivery's effect runs in the background; Stop shuts the
// server and the workers down cleanly, and the server no longer answers.
func TestStartRunsAcceptedKeysAndStops(t *testing.T) {
	ctx := context.Background()
	eff := &effectFunc{}
	srv, url, s := start(t, ctx, eff)
	if code := deliver(t, url, "a"); code != http.StatusAccepted {
		t.Fatalf("POST = %d, want 202", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		e, err := s.Get(ctx, "gemini:batches/a")
		if err == nil && e.State == sink.StateDone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gemini:batches/a not done after 10s: %+v, %v", e, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("Stop() = %v, want nil", err)
	}
	if got := eff.ran(); len(got) != 1 || got[0] != "gemini:batches/a" {
		t.Errorf("effect ran for %q, want once for gemini:batches/a", got)
	}
	if _, err := http.Post(url, "application/json", strings.NewReader(`{}`)); err == nil {
		t.Errorf("POST after Stop: the server still answers")
	}
}

// A dispatcher whose effect broke stops the server too, and Wait reports
// it.
func TestBrokenEffectStopsTheServer(t *testing.T) {
	eff := &effectFunc{err: effect.Broken(errors.New("stdout went away"))}
	srv, url, _ := start(t, context.Background(), eff)
	deliver(t, url, "b")
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case err := <-done:
		if !errors.Is(err, dispatch.ErrEffectBroken) {
			t.Errorf("Wait() = %v, want one wrapping dispatch.ErrEffectBroken", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server still runs 10s after the effect broke")
	}
}
