package main

import "strings"

// shellQuote quotes s for /bin/sh (the tests' --exec commands). The demo's
// own copy moved with it to internal/demo.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
