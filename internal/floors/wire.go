//go:build !before18082bd

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

// startReceiver starts serve's receiver on ln as `gemrecon serve` wires it
// (serve.Receiver: the webhook path of package ingest, kicking or handing
// claims to d; serve.Start: d's workers and the HTTP server), so that the
// product path measured here is whatever serve does. The build tag
// before18082bd swaps in the wiring of the revision before issue 23's
// rewrite (wire_18082bd.go), for BENCHMARKS.md's before/after.
func startReceiver(ctx context.Context, ln net.Listener, s sink.Sink, d *dispatch.Dispatcher, m *metrics.Metrics, secret string) (*serve.Server, error) {
	h, err := serve.Receiver(webhook.Config{Secrets: []string{secret}, Dispatcher: d, Metrics: m}, s)
	if err != nil {
		return nil, err
	}
	return serve.Start(ctx, serve.Config{Listener: ln, Handler: h, Dispatcher: d}), nil
}

// observer is the dispatcher's Observer: the metrics, as serve's, and done
// hears each attempt's outcome.
type observer struct {
	m    *metrics.Metrics
	done chan<- string
}

func (o observer) ObserveEffect(outcome string, d time.Duration) {
	o.m.ObserveEffect(outcome, d)
	o.done <- outcome
}
