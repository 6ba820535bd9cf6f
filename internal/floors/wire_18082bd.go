//go:build before18082bd

package floors

import (
	"context"
	"net"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/serve"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook"
)

// startReceiver is wire.go's at revision 18082bd, where webhook.NewHandler
// built the ingest path itself (BENCHMARKS.md, "Issue 23: machinery
// removed", says how to run it there).
func startReceiver(ctx context.Context, ln net.Listener, s sink.Sink, d *dispatch.Dispatcher, m *metrics.Metrics, secret string) (*serve.Server, error) {
	h, err := webhook.NewHandler(webhook.Config{Sink: s, Secrets: []string{secret}, Dispatcher: d, Metrics: m})
	if err != nil {
		return nil, err
	}
	return serve.Start(ctx, serve.Config{Listener: ln, Handler: h, Dispatcher: d}), nil
}

type observer struct {
	m    *metrics.Metrics
	done chan<- string
}

func (o observer) EffectFinished(key string, outcome dispatch.Outcome, d time.Duration) {
	o.m.Observer().EffectFinished(key, outcome, d)
	o.done <- string(outcome)
}
