package metrics

// What a poll pass did (the outcome label of gemrecon_poll_passes_total;
// spec §5.5): the fleet's passes are the sum over processes of listed and
// forced, and the skipped ones are the replicas that left the listing to
// another.
const (
	PassListed        = "listed"         // held the scope's pass lease and listed (successfully or not)
	PassForced        = "forced"         // listed without the lease (poll --force)
	PassSkippedHeld   = "skipped_held"   // another process held the lease: no listing
	PassSkippedRecent = "skipped_recent" // a pass of the scope started less than the interval allows: no listing
	PassLeaseLost     = "lease_lost"     // listed, but lost the lease (taken over, or not renewed in time) and stopped
	PassError         = "error"          // could not decide (the database refused the pass record or the lease)
)

// passOutcomes are the series DeclarePassScope creates at zero.
var passOutcomes = []string{PassListed, PassSkippedHeld, PassSkippedRecent, PassLeaseLost, PassError}

// DeclarePassScope makes the scope's gemrecon_poll_passes_total series
// exist at 0, so that rate() and alerts see them before the first pass.
func (m *Metrics) DeclarePassScope(scope string) {
	if m == nil {
		return
	}
	for _, o := range passOutcomes {
		m.passes.WithLabelValues(scope, o)
	}
}

// ObservePass counts one poll pass of the scope with the given outcome (one
// of the Pass constants).
func (m *Metrics) ObservePass(scope, outcome string) {
	if m == nil {
		return
	}
	m.passes.WithLabelValues(scope, outcome).Inc()
}
