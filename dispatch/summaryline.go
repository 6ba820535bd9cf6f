package dispatch

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// DrainLine is drain's summary line: a Summary's counts and the run's
// duration, under the same field names in the text line and in the JSON
// object that --log-format json asks for (as reconcile.Summary is a poll
// pass's).
type DrainLine struct {
	Summary
	Duration string `json:"duration"` // Go's notation, rounded to the millisecond: "1.42s"
}

// Line returns the summary line of a drain that took d.
func (s Summary) Line(d time.Duration) DrainLine {
	return DrainLine{Summary: s, Duration: d.Round(time.Millisecond).String()}
}

// String renders the text line:
//
//	drain: claimed=3 ok=2 failed=1 dead=0 fenced=0 unconfirmed=0 handed_back=0 duration=1.42s
func (l DrainLine) String() string {
	return fmt.Sprintf("drain: claimed=%d ok=%d failed=%d dead=%d fenced=%d unconfirmed=%d handed_back=%d duration=%s",
		l.Claimed, l.OK, l.Failed, l.Dead, l.Fenced, l.Unconfirmed, l.HandedBack, l.Duration)
}

// WriteLine writes a summary line (drain's, a poll pass's) to w: its text,
// or with asJSON the line as one JSON object.
func WriteLine(w io.Writer, line fmt.Stringer, asJSON bool) error {
	if !asJSON {
		_, err := fmt.Fprintln(w, line.String())
		return err
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
