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
// SIGINT and SIGTERM go to an interrupts (interrupt.go): the first stops the
// command, with --grace for running effects; the second ends the grace.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := &interrupts{cancel: cancel}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-sigs:
				in.signal()
			case <-done:
				return
			}
		}
	}()
	return executeWith(ctx, in, args, stdin, stdout, stderr)
}
