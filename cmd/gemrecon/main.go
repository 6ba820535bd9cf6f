// Command gemrecon makes every Gemini batch completion trigger its downstream
// work once: it records each sighting (webhook delivery or poll pass) under an
// idempotency key in a durable claim/lease sink and runs the user's effect.
//
// This package only parses flags, wires the packages together and maps errors
// to exit codes (spec §8). Each command is an options struct that cobra
// fills and a run method; the rules on the settings are the libraries'
// Validate methods (dispatch, webhook, poller, ingest, sink, emulator), whose
// field-named errors the command shows with its flag names (flags.go). The
// work lives in canon, sink, poller, webhook, dispatch, effect, ingest, serve
// (serve's lifecycle) and internal/demo (the demo).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one gemrecon command line and returns its exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return execute(ctx, args, stdin, stdout, stderr)
}
