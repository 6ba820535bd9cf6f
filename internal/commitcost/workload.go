package commitcost

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/sink"
)

// Steps of a new completion, as after callbacks name them.
const (
	StepRecordClaim = "record+claim"
	StepComplete    = "complete"
)

// payload is a new completion's sighting payload (as sinktest.Bench's).
var payload = []byte(`{"name":"batches/x","metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`)

// NewCompletions runs n new completions one after another, each
// RecordAndClaim → Complete (two durable commits: the claim before the
// effect, done after it), and returns the time they took. after, when not
// nil, is called after each step (untimed accounting may go there, but it is
// inside the measured time).
func NewCompletions(ctx context.Context, s sink.Sink, n int, prefix string, after func(step string) error) (time.Duration, error) {
	start := time.Now()
	for i := range n {
		key := fmt.Sprintf("gemini:batches/%s-%d", prefix, i)
		_, c, err := s.RecordAndClaim(ctx, sink.Sighting{Key: key, Source: sink.SourcePoll, Payload: payload}, sink.ClaimRequest{Owner: "commitcost", Lease: time.Minute})
		if err == nil && c == nil {
			err = fmt.Errorf("commitcost: %s was not claimed when it was recorded", key)
		}
		if err != nil {
			return 0, err
		}
		if after != nil {
			if err := after(StepRecordClaim); err != nil {
				return 0, err
			}
		}
		if err := s.Complete(ctx, key, c.Token); err != nil {
			return 0, err
		}
		if after != nil {
			if err := after(StepComplete); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

// Duplicates records keys sightings (untimed, 16 goroutines), completes them
// when done is set, then times n Records of them, cycling, one after
// another, as a webhook redelivery (pending keys) or a poll pass (done keys)
// records them.
func Duplicates(ctx context.Context, s sink.Sink, keys, n int, done bool) (time.Duration, error) {
	sgs := make([]sink.Sighting, keys)
	for i := range sgs {
		name := fmt.Sprintf("batches/dup-%d", i)
		sgs[i] = sink.Sighting{Key: "gemini:" + name, Source: sink.SourceWebhook, State: "SUCCEEDED",
			Payload: fmt.Appendf(nil, `{"name":%q,"metadata":{"state":"BATCH_STATE_SUCCEEDED"}}`, name)}
		if done {
			sgs[i].Source, sgs[i].FromAPI = sink.SourcePoll, true
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(sgs); i += 16 {
				if _, err := s.Record(ctx, sgs[i]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	want := sink.StatePending
	if done {
		want = sink.StateDone
		cs, err := s.ClaimDue(ctx, "commitcost", time.Minute, 0)
		if err != nil {
			return 0, err
		}
		for _, c := range cs {
			if err := s.Complete(ctx, c.Key, c.Token); err != nil {
				return 0, err
			}
		}
	}
	start := time.Now()
	for i := range n {
		r, err := s.Record(ctx, sgs[i%keys])
		if err != nil {
			return 0, err
		}
		if r.State != want {
			return 0, fmt.Errorf("commitcost: duplicate of %s: state %s, want %s", sgs[i%keys].Key, r.State, want)
		}
	}
	return time.Since(start), nil
}

// Seed is one run of the seed document's sink.
type Seed struct {
	NewPerS, DupPerS float64
}

var seedLine = regexp.MustCompile(`new_per_s=([0-9.]+) dup_per_s=([0-9.]+)`)

// RunSeed runs the seed's sink script (python3 script dir n): n new
// completions, then the same n again, all skipped.
func RunSeed(ctx context.Context, script, dir string, n int) (Seed, error) {
	out, err := exec.CommandContext(ctx, "python3", script, dir, strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		return Seed{}, fmt.Errorf("commitcost: %s: %v: %s", script, err, out)
	}
	m := seedLine.FindSubmatch(out)
	if m == nil {
		return Seed{}, fmt.Errorf("commitcost: %s printed no new_per_s=… dup_per_s=…: %s", script, out)
	}
	nw, _ := strconv.ParseFloat(string(m[1]), 64)
	dp, _ := strconv.ParseFloat(string(m[2]), 64)
	return Seed{NewPerS: nw, DupPerS: dp}, nil
}

// CountSyncs runs argv under strace -f -c -e trace=fdatasync,fsync and
// returns the calls of each of the two, counted by strace.
func CountSyncs(ctx context.Context, argv []string) (map[string]int, error) {
	if _, err := exec.LookPath("strace"); err != nil {
		return nil, err
	}
	args := append([]string{"-f", "-c", "-e", "trace=fdatasync,fsync", "-o", "/dev/stderr", "--"}, argv...)
	cmd := exec.CommandContext(ctx, "strace", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		return nil, fmt.Errorf("commitcost: strace %s: %v: %s%s", strings.Join(argv, " "), err, out, stderr.Bytes())
	}
	return parseStraceSummary(stderr.String()), nil
}

// parseStraceSummary reads the calls column of strace -c's table.
func parseStraceSummary(s string) map[string]int {
	calls := map[string]int{"fdatasync": 0, "fsync": 0}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		name := f[len(f)-1]
		if _, ok := calls[name]; !ok {
			continue
		}
		// % time, seconds, usecs/call, calls, [errors,] syscall
		if n, err := strconv.Atoi(f[3]); err == nil {
			calls[name] = n
		}
	}
	return calls
}
