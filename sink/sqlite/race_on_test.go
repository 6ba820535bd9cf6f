//go:build race

package sqlite_test

// raceEnabled: the race detector makes every child process start several
// times slower.
const raceEnabled = true
