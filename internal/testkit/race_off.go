//go:build !race

package testkit

// Race reports whether the race detector is on (go test -race).
const Race = false
