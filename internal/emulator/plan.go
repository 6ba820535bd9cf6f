package emulator

// Batches over time: what is added at the start (played-out, generated),
// what batches.create adds, and the scheduler that moves each one to
// RUNNING and then to its final state.

import (
	"container/heap"
	"context"
	"encoding/json"
	"fmt"
	rand2 "math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// Sources of batches, as events name them.
const (
	SourceFile      = "file"
	SourceGenerated = "generated"
	SourceAPI       = "api"
	SourceScheduled = "scheduled" // added with Schedule
)

// step is one scheduled change of a batch.
type step struct {
	at    time.Time
	seq   int // ties break in scheduling order
	name  string
	final *geminifake.Batch // nil: the batch starts RUNNING
}

type stepHeap []*step

func (h stepHeap) Len() int { return len(h) }
func (h stepHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h stepHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *stepHeap) Push(x any)   { *h = append(*h, x.(*step)) }
func (h *stepHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// terminal reports whether a state (any spelling) ends a batch.
func terminal(state string) bool {
	switch geminifake.ShortState(state) {
	case "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "PARTIALLY_SUCCEEDED":
		return true
	}
	return false
}

// pending returns the batch as it is listed before it finishes: PENDING,
// with none of the final state's fields.
func pending(final geminifake.Batch, now time.Time) geminifake.Batch {
	b := geminifake.Batch{
		Name: final.Name, State: "PENDING", DisplayName: final.DisplayName, Model: final.Model,
		CreateTime: final.CreateTime, UpdateTime: final.CreateTime, RequestCount: final.RequestCount,
		WebhookConfig: final.WebhookConfig.Clone(),
	}
	if b.CreateTime.IsZero() {
		b.CreateTime, b.UpdateTime = now, now
	}
	return b
}

// plan adds the configured batches at the start.
func (e *Emulator) plan(now time.Time) error {
	rng := rand2.New(rand2.NewPCG(e.cfg.Seed, 0x5eed0f0b47c8e5))
	within := e.cfg.FinishWithin
	offset := func() time.Duration { return time.Duration(rng.Int64N(int64(within))) + 1 }
	for _, b := range e.cfg.Batches {
		if b.CreateTime.IsZero() {
			b.CreateTime = now
		}
		if within == 0 || !terminal(b.State) {
			e.addNow(b, SourceFile, now)
			continue
		}
		if err := e.schedule(b, now.Add(offset()), SourceFile, now); err != nil {
			return err
		}
	}
	for _, b := range generate(e.cfg, rng, now) {
		if within == 0 {
			b.EndTime, b.UpdateTime = now, now
			e.addNow(b, SourceGenerated, now)
			continue
		}
		if err := e.schedule(b, now.Add(offset()), SourceGenerated, now); err != nil {
			return err
		}
	}
	return nil
}

// addNow adds a batch as it is (its responses file readable at once).
func (e *Emulator) addNow(b geminifake.Batch, source string, now time.Time) {
	e.addResults(b)
	e.api.Add(b)
	e.count(func(st *Stats) { st.Batches++ })
	e.events.push(Event{Time: now, Kind: KindCreated, Batch: b.Name, State: b.State, Source: source, Dynamic: dynamicURIs(b)})
	if terminal(b.State) {
		e.events.push(Event{Time: now, Kind: KindFinished, Batch: b.Name, State: b.State, Reason: reason(b)})
	}
}

// Schedule adds a batch now, PENDING (its CreateTime, or now), and gives it
// its final state and fields after `after`; it is RUNNING from half-way.
// final.State must be terminal. EndTime and UpdateTime become the moment it
// finishes; a SUCCEEDED batch with a ResponsesFile the stand-in does not
// hold gets Responses(final) as its content.
func (e *Emulator) Schedule(final geminifake.Batch, after time.Duration) error {
	now := e.cfg.Now()
	if final.CreateTime.IsZero() {
		final.CreateTime = now
	}
	return e.schedule(final, now.Add(max(after, 0)), SourceScheduled, now)
}

func (e *Emulator) schedule(final geminifake.Batch, at time.Time, source string, now time.Time) error {
	if !terminal(final.State) {
		return fmt.Errorf("emulator: batch %s: a scheduled batch must end in a terminal state, not %q", final.Name, final.State)
	}
	if final.Name == "" {
		return fmt.Errorf("emulator: a scheduled batch needs a name")
	}
	if err := geminifake.CheckWebhookConfig(final.WebhookConfig); err != nil {
		return fmt.Errorf("emulator: batch %s: webhookConfig: %w", final.Name, err)
	}
	if _, exists := e.api.Batch(final.Name); exists && source != SourceAPI {
		return fmt.Errorf("emulator: batch %s exists already", final.Name)
	}
	if source != SourceAPI { // batches.create added its own
		e.api.Add(pending(final, now))
	}
	e.count(func(st *Stats) {
		st.Batches++
		if source == SourceAPI {
			st.Created++
		}
	})
	e.events.push(Event{Time: now, Kind: KindCreated, Batch: final.Name, State: "PENDING", Source: source,
		FinishAt: at, Dynamic: dynamicURIs(final)})
	f := final
	e.mu.Lock()
	half := now.Add(at.Sub(now) / 2)
	e.seq++
	heap.Push(&e.steps, &step{at: half, seq: e.seq, name: final.Name})
	e.seq++
	heap.Push(&e.steps, &step{at: at, seq: e.seq, name: final.Name, final: &f})
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

// created is the stand-in's batches.create hook: the batch succeeds after
// CreatedFinishAfter, with inlined responses for an inline source and a
// responses file for a file source.
func (e *Emulator) created(b geminifake.Batch, req geminifake.CreateRequest) {
	now := e.cfg.Now()
	final := b
	final.State = "SUCCEEDED"
	if len(req.Requests) > 0 {
		final.InlinedResponses = InlinedResponses(b, req.Requests)
		final.SuccessfulCount = int64(len(req.Requests))
	} else {
		// The emulator has no upload endpoint, so it cannot read the input
		// file: the results stand for three requests.
		final.RequestCount, final.SuccessfulCount = 3, 3
		final.ResponsesFile = "files/batch-" + strings.TrimPrefix(b.Name, "batches/")
	}
	if err := e.schedule(final, now.Add(e.cfg.CreatedFinishAfter), SourceAPI, now); err != nil {
		// Cannot happen: the stand-in checked the request.
		e.events.push(Event{Time: now, Kind: KindError, Batch: b.Name, Reason: err.Error()})
	}
}

// Advance applies every scheduled change due at now, in order, and returns
// how many it applied. The scheduler calls it; with Manual, the caller does.
func (e *Emulator) Advance(now time.Time) int {
	n := 0
	for {
		e.mu.Lock()
		if len(e.steps) == 0 || e.steps[0].at.After(now) {
			e.mu.Unlock()
			return n
		}
		st := heap.Pop(&e.steps).(*step)
		e.applying++ // Wait counts it as scheduled until it is applied
		e.mu.Unlock()
		e.apply(st)
		e.mu.Lock()
		e.applying--
		e.mu.Unlock()
		n++
	}
}

// apply makes one change. A batch removed meanwhile, or already finished
// by someone else (a test, a demo), is left alone.
func (e *Emulator) apply(st *step) {
	if st.final == nil {
		moved := false
		e.api.Update(st.name, func(b *geminifake.Batch) {
			if !terminal(b.State) {
				b.State, b.UpdateTime, moved = "RUNNING", st.at, true
			}
		})
		if moved {
			e.events.push(Event{Time: st.at, Kind: KindRunning, Batch: st.name, State: "RUNNING"})
		}
		return
	}
	cur, ok := e.api.Batch(st.name)
	if !ok || terminal(cur.State) {
		return
	}
	final := *st.final
	final.CreateTime = cur.CreateTime
	final.EndTime, final.UpdateTime = st.at, st.at
	e.addResults(final) // readable before the batch says it succeeded
	finished := false
	e.api.Update(st.name, func(b *geminifake.Batch) {
		if !terminal(b.State) {
			*b, finished = final, true
		}
	})
	if !finished {
		return
	}
	e.count(func(st *Stats) { st.Finished++ })
	e.events.push(Event{Time: st.at, Kind: KindFinished, Batch: st.name, State: final.State, Reason: reason(final)})
}

// addResults gives a succeeded batch's responses file readable content,
// unless the stand-in holds that file already.
func (e *Emulator) addResults(b geminifake.Batch) {
	if geminifake.ShortState(b.State) != "SUCCEEDED" || b.ResponsesFile == "" || e.api.HasFile(b.ResponsesFile) {
		return
	}
	e.api.AddFile(geminifake.File{Name: b.ResponsesFile, Data: Responses(b)})
}

// loop runs Advance when the next change is due, until ctx ends.
func (e *Emulator) loop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		e.Advance(e.cfg.Now())
		wait := time.Hour
		e.mu.Lock()
		if len(e.steps) > 0 {
			wait = max(e.steps[0].at.Sub(e.cfg.Now()), 0)
		}
		e.mu.Unlock()
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

func (e *Emulator) count(fn func(*Stats)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fn(&e.stats)
}

// outcomes is the cycle of generated outcomes: five in eight succeed, and
// every kind of end shows up within six batches.
var outcomes = []string{"SUCCEEDED", "FAILED", "SUCCEEDED", "EXPIRED", "SUCCEEDED", "CANCELLED", "SUCCEEDED", "SUCCEEDED"}

// failures are the reasons of generated FAILED batches (google.rpc codes).
var failures = []geminifake.Status{
	{Code: 8, Message: "Enqueued token quota exceeded for this model."},
	{Code: 3, Message: "The input file is not valid JSONL: line 7: unexpected end of input."},
	{Code: 13, Message: "An internal error occurred while processing the batch."},
}

// generate makes the final states of cfg.Generate batches. Names carry a
// tag drawn from the seed, so two runs with different seeds share no name.
func generate(cfg Config, rng *rand2.Rand, now time.Time) []geminifake.Batch {
	if cfg.Generate == 0 {
		return nil
	}
	tag := strconv.FormatUint(rng.Uint64()%(36*36*36*36*36*36), 36)
	width := max(4, len(strconv.Itoa(cfg.Generate)))
	out := make([]geminifake.Batch, 0, cfg.Generate)
	for i := range cfg.Generate {
		id := fmt.Sprintf("gen-%s-%0*d", tag, width, i+1)
		n := int64(1 + rng.IntN(10))
		b := geminifake.Batch{
			Name: geminifake.GeminiName(id), DisplayName: fmt.Sprintf("generated-%0*d", width, i+1),
			Model:        "models/gemini-2.5-flash",
			CreateTime:   now.Add(-time.Duration(rng.Int64N(int64(30 * time.Minute)))).Truncate(time.Millisecond),
			State:        outcomes[i%len(outcomes)],
			RequestCount: n,
		}
		switch b.State {
		case "SUCCEEDED":
			b.SuccessfulCount = n
			b.ResponsesFile = "files/batch-" + id
		case "FAILED":
			f := failures[rng.IntN(len(failures))]
			b.Error = &f
		case "CANCELLED":
			b.Error = &geminifake.Status{Code: 1, Message: "The batch was cancelled."}
		}
		share := rng.Float64() // drawn for every batch, so the URIs do not shift the sequence
		if len(cfg.DynamicURIs) > 0 && share < cfg.DynamicShare {
			b.WebhookConfig = &geminifake.WebhookConfig{
				Uris:         append([]string(nil), cfg.DynamicURIs...),
				UserMetadata: map[string]any{"source": "gemrecon-emulator", "batch": b.DisplayName},
			}
		}
		out = append(out, b)
	}
	return out
}

func dynamicURIs(b geminifake.Batch) []string {
	if b.WebhookConfig == nil {
		return nil
	}
	return b.WebhookConfig.Uris
}

func reason(b geminifake.Batch) string {
	if b.Error == nil {
		return ""
	}
	return b.Error.Message
}

// batchOf reads the batch name out of a delivered event's body ("" for a
// ping or a body it cannot read).
func batchOf(body []byte) string {
	var ev struct {
		Type string `json:"type"`
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &ev) != nil || !strings.HasPrefix(ev.Type, "batch.") || ev.Data.ID == "" {
		return ""
	}
	if strings.HasPrefix(ev.Data.ID, "batches/") {
		return ev.Data.ID
	}
	return geminifake.GeminiName(ev.Data.ID)
}
