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
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one gemrecon command line and returns its exit status.
// SIGINT and SIGTERM go to an interrupts (interrupt.go): the first stops the
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
