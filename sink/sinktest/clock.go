package sinktest

import (
	"time"

	"github.com/gemrecon/gemrecon/internal/testkit"
)

// Clock is a manual clock for sink.Options.Now: testkit's, under the name
// the suite's callers use.
type Clock = testkit.Clock

// NewClock returns a clock that reads start until advanced.
func NewClock(start time.Time) *Clock { return testkit.NewClock(start) }

// FixedRand returns a sink.Options.Rand that always returns v.
func FixedRand(v float64) func() float64 { return func() float64 { return v } }
