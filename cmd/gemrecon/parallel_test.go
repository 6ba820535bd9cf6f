package main

import (
	"sync"
	"testing"
)

// The package's tests that wait on children run in parallel (testkit.Main
// lets six run at once). The replica tests count list requests per second
// of wall time, so they run apart from the others: together with each
// other, and with no other parallel test of the package. A test calls
// parallel or parallelTimed instead of t.Parallel, unless it has parallel
// subtests (TestScripts): those would need -parallel slots that tests
// waiting for their group hold, so such a test keeps to t.Parallel and its
// subtests join the group instead (TestScripts: each script, in Setup).

// parallel is t.Parallel for a test that may share the machine with any
// test but a replica test.
func parallel(t *testing.T) { testGroups.enter(t, anyTests) }

// parallelTimed is t.Parallel for a replica test.
func parallelTimed(t *testing.T) { testGroups.enter(t, timedTests) }

const (
	anyTests = iota
	timedTests
)

// groups lets the tests of one group run at the same time as each other,
// never with a test of the other group. A waiting timed test keeps further
// tests of the other group out, so that the timed ones run together as soon
// as the running ones end.
type groups struct {
	mu      sync.Mutex
	changed *sync.Cond
	running [2]int
	waiting [2]int
}

var testGroups = func() *groups {
	g := &groups{}
	g.changed = sync.NewCond(&g.mu)
	return g
}()

func (g *groups) enter(t *testing.T, group int) {
	t.Helper()
	t.Parallel()
	t.Cleanup(g.join(group))
}

// join waits until a test of group may run, and returns the function that
// says it has ended.
func (g *groups) join(group int) (leave func()) {
	g.mu.Lock()
	g.waiting[group]++
	for g.running[1-group] > 0 || (group == anyTests && g.waiting[timedTests] > 0) {
		g.changed.Wait()
	}
	g.waiting[group]--
	g.running[group]++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.running[group]--
		g.changed.Broadcast()
		g.mu.Unlock()
	}
}
