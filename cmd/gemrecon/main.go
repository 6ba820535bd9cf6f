// Command gemrecon makes every Gemini batch completion trigger its downstream
// work once: it records each sighting (webhook delivery or poll pass) under an
// idempotency key in a durable claim/lease sink and runs the user's effect.
//
// This package only parses flags, wires the packages together and maps errors
// to exit codes (spec §8). Each command is an options struct that cobra
// fills and a run method; the rules on the settings are the libraries'
// Validate methods (dispatch, webhook, poller, ingest, sink, emulator), whose
// field-named errors the command shows with its flag names (exit.go). The
// work lives in canon, sink, poller, webhook, dispatch, effect, ingest, serve
// (serve's lifecycle) and internal/demo (the demo).
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one gemrecon command line and returns its exit status.
// SIGINT and SIGTERM go to an interrupts (below): the first stops the
// command, with --grace for running effects; the second ends the grace.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if err := apiKeyFromFile(); err != nil {
		fmt.Fprintf(stderr, "gemrecon: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := &interrupts{cancel: cancel}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for range sigs { // never closed: the process ends when run returns
			in.signal()
		}
	}()
	return execute(ctx, in, args, stdin, stdout, stderr)
}

// apiKeyFile names the file that holds the Gemini API key, for services
// that keep secrets out of their environment (systemd's LoadCredential=,
// a mounted secret): the process's GEMINI_API_KEY is read from it, unless
// GEMINI_API_KEY or GOOGLE_API_KEY is set already.
const apiKeyFile = "GEMINI_API_KEY_FILE"

// apiKeyFromFile sets GEMINI_API_KEY from GEMINI_API_KEY_FILE (see
// apiKeyFile). It runs once per process, before any command: the key
// becomes the environment every part of gemrecon and the SDK reads.
func apiKeyFromFile() error {
	path := os.Getenv(apiKeyFile)
	if path == "" || os.Getenv("GEMINI_API_KEY") != "" || os.Getenv("GOOGLE_API_KEY") != "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", apiKeyFile, err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return fmt.Errorf("%s: %s is empty", apiKeyFile, path)
	}
	return os.Setenv("GEMINI_API_KEY", key)
}

// interrupts is how a gemrecon process answers SIGINT and SIGTERM (run
// feeds it). The first cancels the command's context: nothing new is
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
