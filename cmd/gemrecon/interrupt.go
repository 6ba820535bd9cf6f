package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
)

// interrupts is how a gemrecon process answers SIGINT and SIGTERM (run in
// main.go feeds it). The first cancels the command's context: nothing new is
// claimed, and running effects get --grace to finish (serve's background
// workers only once its HTTP drain is over: serve.Start). The second ends
// that grace at once (dispatch.Dispatcher.EndGrace): the effects are killed, and
// their outcomes recorded, exactly as when the grace runs out, so the
// command exits as it would then, only sooner. Later ones are only logged:
// gemrecon never exits while an effect it started may still run (a key
// whose effect ran on after the exit would be taken over once its lease
// ran out, and run again), nor before a killed effect's outcome is written.
type interrupts struct {
	cancel context.CancelFunc // nil: nothing to cancel (in-process tests)

	mu  sync.Mutex
	n   int          // signals received
	log *slog.Logger // nil until the flags are parsed
	ds  []*dispatch.Dispatcher
}

// setLogger gives the handler the command's logger.
func (in *interrupts) setLogger(l *slog.Logger) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.log = l
}

// add registers a dispatcher whose effects a second signal stops; one
// created after the second signal starts with its grace ended.
func (in *interrupts) add(d *dispatch.Dispatcher) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.ds = append(in.ds, d)
	if in.n >= 2 {
		d.EndGrace()
	}
}

// signal handles one SIGINT or SIGTERM.
func (in *interrupts) signal() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.n++
	if in.n == 1 && in.cancel != nil {
		in.cancel()
	}
	if len(in.ds) == 0 || in.log == nil {
		return // no effect can be running
	}
	switch in.n {
	case 1:
		var grace time.Duration
		for _, d := range in.ds {
			grace = max(grace, d.Grace())
		}
		if grace > 0 {
			in.log.Info("interrupt: stopping; running effects get --grace to finish (interrupt again to stop them now)", "grace", grace)
		}
	case 2:
		in.log.Warn("second interrupt: stopping effects now")
		for _, d := range in.ds {
			d.EndGrace()
		}
	default:
		in.log.Warn("interrupt: already stopping; gemrecon exits once the killed effects' outcomes are recorded")
	}
}
