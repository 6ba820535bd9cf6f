package webhook

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Defaults of ServerOptions.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultDrainTimeout      = 30 * time.Second
)

// NoDrain, as ServerOptions.DrainTimeout (any negative value does the
// same), makes the shutdown close every connection at once instead of
// letting requests in flight finish. Nothing acknowledged is lost: a
// delivery is answered 2xx only once its sighting is durable, so a request
// cut short got no 2xx and its sender retries.
const NoDrain time.Duration = -1

// ServerOptions are the http.Server's limits that a caller may change.
// Zero fields take the defaults (negative ones too, except DrainTimeout's:
// NoDrain). The others are fixed: 30 s to read a request, body included;
// 120 s before an idle keep-alive connection closes; 64 KiB of headers.
type ServerOptions struct {
	// ReadHeaderTimeout cuts off a client that trickles its headers.
	ReadHeaderTimeout time.Duration
	// WriteTimeout bounds the handler and the response. In Sync mode it must
	// exceed the effect timeout plus SyncWait, or a slow effect's answer is
	// lost (the sender then retries, and the key is already done or claimed).
	WriteTimeout time.Duration
	// DrainTimeout bounds the graceful shutdown: requests in flight get this
	// long to finish, then connections are closed. Zero is
	// DefaultDrainTimeout; a negative value (NoDrain) closes them at once.
	DrainTimeout time.Duration
	// Logger receives the server's own errors; nil discards them.
	Logger *slog.Logger
}

// ErrDrainTimeout is returned by Serve when requests were still running at
// the end of the drain and their connections were closed.
var ErrDrainTimeout = errors.New("webhook server: drain timed out; open connections closed")

// Serve serves h on ln until ctx is done (SIGTERM in the CLI), then shuts
// down gracefully: it stops accepting, lets requests in flight finish for up
// to DrainTimeout (each answers only after its sighting is durable, so a
// sender that got 2xx lost nothing), then closes what remains. It returns
// nil after a clean drain, ErrDrainTimeout after a forced one, or the error
// that stopped the server. Request contexts are not cancelled by ctx: a
// Record in progress completes. With DrainTimeout NoDrain there is no
// drain: connections are closed as soon as ctx is done (which cancels their
// requests' contexts, so a Record in progress may stop before it commits:
// either way no 2xx went out), and Serve returns nil, the cut being what
// was asked for (it logs at info when connections were still open); a
// --sync request's effect still ends, as below, before it returns.
//
// A Handler serves under one Serve: its shutdown tells the Handler's --sync
// requests for good.
func Serve(ctx context.Context, ln net.Listener, h *Handler, o ServerOptions) error {
	o.DrainTimeout = cmp.Or(o.DrainTimeout, DefaultDrainTimeout) // negative: NoDrain
	o.Logger = cmp.Or(o.Logger, slog.New(slog.DiscardHandler))
	srv := &http.Server{
		Handler:           h,
		ConnContext:       connContext,
		ReadHeaderTimeout: cmp.Or(max(o.ReadHeaderTimeout, 0), DefaultReadHeaderTimeout),
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      cmp.Or(max(o.WriteTimeout, 0), DefaultWriteTimeout),
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	ll := &limitListener{Listener: ln, max: h.cfg.MaxConns, slots: make(chan struct{}, h.cfg.MaxConns+ProbeConns), done: make(chan struct{})}
	go func() { errc <- srv.Serve(ll) }()
	select {
	case err := <-errc:
		return fmt.Errorf("webhook server: %w", err)
	case <-ctx.Done():
	}
	// Requests are not cancelled at shutdown (a Record in progress
	// completes), but a --sync request's effect is: it gets the
	// dispatcher's grace, as the background workers' effects do.
	h.stopSync()
	// NoDrain: a deadline already past, so Shutdown closes the listener and
	// the idle connections, and returns at once if any request is in flight.
	dctx, cancel := context.WithTimeout(context.Background(), max(o.DrainTimeout, 0))
	defer cancel()
	err := srv.Shutdown(dctx)
	<-errc // http.ErrServerClosed once Shutdown has begun
	if err != nil {
		_ = srv.Close()
		// Close does not wait for handlers: an effect a --sync request
		// runs must still end (its grace, the kill, its outcome recorded)
		// before the process may exit, or the key stays claimed for a
		// whole lease while the effect runs on unsupervised.
		h.syncRuns.Lock()
		h.syncRuns.Unlock()
		if errors.Is(err, context.DeadlineExceeded) {
			if o.DrainTimeout < 0 {
				o.Logger.Info("webhook server: open connections closed at shutdown without a drain; a request they carried got no answer, and its sender retries")
				return nil
			}
			return ErrDrainTimeout
		}
		return fmt.Errorf("webhook server: shutdown: %w", err)
	}
	return nil
}
