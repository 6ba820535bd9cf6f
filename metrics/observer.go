package metrics

import (
	"time"

	"github.com/gemrecon/gemrecon/dispatch"
)

// Observer returns m as a dispatch.Observer: every attempt's outcome counts
// in gemrecon_effects_total and its duration in
// gemrecon_effect_duration_seconds (fenced ones also in gemrecon_fenced_total).
func (m *Metrics) Observer() dispatch.Observer { return observer{m} }

type observer struct{ m *Metrics }

// EffectFinished implements dispatch.Observer.
func (o observer) EffectFinished(_ string, outcome dispatch.Outcome, d time.Duration) {
	o.m.ObserveEffect(outcome, d)
}
