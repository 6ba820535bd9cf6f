package webhook

// Outcome is dispatch's name for how one RunKey ended ("done", "retry",
// "dead", "fenced", "busy", "skipped").
type Outcome = string
