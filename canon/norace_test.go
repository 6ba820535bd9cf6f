//go:build !race

package canon_test

// raceEnabled is true when the race detector, which changes allocation counts, is on.
const raceEnabled = false
