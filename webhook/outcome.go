package webhook

import "github.com/gemrecon/gemrecon/dispatch"

// Outcome is dispatch's name for how one RunKey ended, so that a
// *dispatch.Dispatcher is a Dispatcher as it is.
type Outcome = dispatch.Outcome

// A *dispatch.Dispatcher is what serve passes as Config.Dispatcher.
var _ Dispatcher = (*dispatch.Dispatcher)(nil)
