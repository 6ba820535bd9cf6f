// Package serve owns the lifecycle of a webhook receiver process — `gemrecon
// serve`, and the demo's receiver (spec §6): the HTTP server
// (Receiver, webhook.Serve), the background dispatcher that runs the accepted keys,
// and the reconciliation passes of --poll-every (reconcile.Poll), started
// together and stopped in order. On shutdown the server stops accepting and
// drains its requests first; the dispatcher's workers outlive it, so that
// accepted keys still get their effect started, and then get the
// dispatcher's grace to finish — unless the grace is ended (a second
// signal: Dispatcher.EndGrace), which stops the workers at once; what is
// left is pending in the database for the next run. A dispatcher that
// stops on its own (its effect broke: the NDJSON stdout went away) stops
// the server too: accepting deliveries that nothing here can run would
// hide it.
package serve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/ingest"
	"github.com/gemrecon/gemrecon/metrics"
	"github.com/gemrecon/gemrecon/reconcile"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/webhook"
)

// Config is what one receiver process runs.
type Config struct {
	// Listener and Handler are the HTTP server's (Receiver); Server tunes
	// it (its drain timeout, write timeout, logger).
	Listener net.Listener
	Handler  *webhook.Handler
	Server   webhook.ServerOptions
	// Dispatcher runs the accepted keys in the background (required).
	Dispatcher *dispatch.Dispatcher
	// Poll, when set, runs reconciliation passes while the server runs;
	// OnPass (required with Poll) hears each one's result.
	Poll   *reconcile.Poll
	OnPass func(reconcile.Result)
	// Logger receives the shutdown line (default: discard).
	Logger *slog.Logger
}

// Receiver builds the webhook receiver on s, as serve and the demo run it:
// ingest's webhook path on s (spec §9.1), counting in cfg.Metrics (a new
// Metrics on s when nil) and kicking cfg.Dispatcher after each sighting —
// unless cfg.Sync, whose requests run their key themselves —, behind the
// HTTP side cfg configures (webhook.NewHandler).
func Receiver(cfg webhook.Config, s sink.Sink) (*webhook.Handler, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(s)
	}
	ic := ingest.WebhookConfig{Sink: s, Metrics: cfg.Metrics, Logger: cfg.Logger}
	// A key is claimed in the commit that records it (spec §3): in a free
	// slot of the background workers, or with --sync for the request to
	// run itself.
	if d, ok := cfg.Dispatcher.(*dispatch.Dispatcher); ok && cfg.Sync {
		ic.Claimer = dispatch.Inline{Dispatcher: d}
	} else if ok {
		ic.Kicker, ic.Claimer = d, d
	} else if cfg.Dispatcher != nil && !cfg.Sync {
		ic.Kicker = cfg.Dispatcher
	}
	cfg.Sink, cfg.Ingest = s, ingest.NewWebhooks(ic)
	return webhook.NewHandler(cfg)
}

// Server is a running receiver process.
type Server struct {
	stopServing context.CancelFunc
	done        chan struct{}
	err         error
}

// Start starts the dispatcher, the passes and the HTTP server. They run
// until ctx is done, Stop is called or the dispatcher stops on its own.
func Start(ctx context.Context, cfg Config) *Server {
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	serveCtx, stopServing := context.WithCancel(ctx)
	s := &Server{stopServing: stopServing, done: make(chan struct{})}
	var wg sync.WaitGroup
	var workErr error
	wg.Go(func() {
		if err := cfg.Dispatcher.Run(workCtx); err != nil && !errors.Is(err, context.Canceled) {
			workErr = fmt.Errorf("dispatch: %w", err)
			stopServing()
		}
	})
	if cfg.Poll != nil {
		wg.Go(func() { _ = cfg.Poll.Watch(serveCtx, cfg.OnPass) })
	}
	// A second signal (dispatch's EndGrace during the shutdown) stops the
	// workers now rather than after the HTTP drain: no new effect starts,
	// and the running ones are killed at once (their grace is over), so
	// that a long drain neither keeps them running nor starts effects that
	// would be killed when it ends, each a used attempt.
	stopWatching := context.AfterFunc(serveCtx, func() {
		select {
		case <-cfg.Dispatcher.GraceEnded():
			log.Info("grace ended: stopping the background workers before the HTTP drain is over")
			stopWork()
		case <-s.done:
		}
	})
	go func() {
		defer close(s.done)
		defer stopWork()
		defer stopWatching()
		serveErr := webhook.Serve(serveCtx, cfg.Listener, cfg.Handler, cfg.Server)
		log.Info("webhook server stopped; finishing running effects", "grace", cfg.Dispatcher.Grace())
		stopWork()
		wg.Wait()
		if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
			s.err = serveErr
			return
		}
		s.err = workErr
	}()
	return s
}

// Wait waits until everything Start started has stopped and returns the
// server's error, else the dispatcher's (nil after a clean shutdown).
func (s *Server) Wait() error {
	<-s.done
	return s.err
}

// Stop shuts the receiver down as when ctx is done, and waits.
func (s *Server) Stop() error {
	s.stopServing()
	return s.Wait()
}
