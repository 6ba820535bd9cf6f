package main

import (
	"errors"
	"fmt"
)

// Exit statuses (spec §5, §7, §8). They are documented in the README and
// docs/design.md §8, and mapped from errors in exactly one place: exitCode.
const (
	exitOK         = 0
	exitFatal      = 1
	exitUsage      = 2
	exitUnknownKey = 3 // status: the key was never recorded
	exitNotDone    = 4 // status: pending or claimed; poll/drain: some effect failed
	exitDead       = 5 // status: dead
)

// exitError carries an exit status through cobra's error return. A nil err
// means the command already said what it had to (status exits 3/4/5 that way).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// withCode attaches an exit status to err (nil err: silent exit).
func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// usageError marks an error as the user's wrong words (exit 2).
func usageError(format string, a ...any) error {
	return withCode(exitUsage, fmt.Errorf(format, a...))
}

// exitCode maps a command's error to its exit status; errors without a code
// are fatal (1).
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return exitFatal
}
