package emulator

// Events: one per thing a user of the sandbox wants to see — a batch added,
// running, finished; a delivery attempt and its answer; an injected fault —
// handed to Config.OnEvent in order from one goroutine (so a slow or
// re-entrant OnEvent never holds up the stand-in or deadlocks it).

import (
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// EventKind names an event.
type EventKind string

// The kinds of events.
const (
	KindListening EventKind = "emulator listening"
	KindCreated   EventKind = "batch created"
	KindRunning   EventKind = "batch running"
	KindFinished  EventKind = "batch finished"
	KindDelivery  EventKind = "delivery"
	KindFault     EventKind = "fault injected"
	KindError     EventKind = "error"
)

// Event is one thing the emulator did.
type Event struct {
	Time time.Time
	Kind EventKind
	// URL is the base URL (listening events).
	URL  string
	Seed uint64 // listening events
	// Batch is the batch concerned ("" for a ping's delivery or a fault).
	Batch string
	// State is the batch's state (created, running, finished).
	State string
	// Source is where a created batch came from: SourceFile,
	// SourceGenerated, SourceAPI or SourceScheduled.
	Source string
	// FinishAt is when a created batch is due to finish (zero: it never
	// finishes, or it was added finished).
	FinishAt time.Time
	// Dynamic is a created batch's webhookConfig URIs.
	Dynamic []string
	// Reason is a finished batch's error message, or an error's text.
	Reason string
	// Delivery is the attempt of a delivery event.
	Delivery *geminifake.DeliveryAttempt
	// Fault is the injected answer of a fault event, with the request's
	// method and path.
	Fault *Fault
}

// Fault is an injected answer to one API request.
type Fault struct {
	Method, Path string
	Status       int
	RetryDelay   time.Duration // for 429s: the google.rpc.RetryInfo delay
}

// Level is the log level the command uses for the event: debug for a batch
// starting to run, warn for an error, info for the rest.
func (ev Event) Level() slog.Level {
	switch ev.Kind {
	case KindRunning:
		return slog.LevelDebug
	case KindError:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// Attrs are the event's fields as log attributes, constant keys first.
func (ev Event) Attrs() []slog.Attr {
	var a []slog.Attr
	if ev.Batch != "" {
		a = append(a, slog.String("batch", ev.Batch))
	}
	switch ev.Kind {
	case KindListening:
		a = append(a, slog.String("url", ev.URL), slog.String("jwks_url", ev.URL+JWKSPath),
			slog.String("seed", strconv.FormatUint(ev.Seed, 10)))
	case KindCreated:
		a = append(a, slog.String("state", ev.State), slog.String("source", ev.Source))
		if !ev.FinishAt.IsZero() {
			a = append(a, slog.Duration("finishes_in", ev.FinishAt.Sub(ev.Time).Round(time.Millisecond)))
		}
		if len(ev.Dynamic) > 0 {
			a = append(a, slog.Any("webhook_config_uris", ev.Dynamic))
		}
	case KindRunning:
		a = append(a, slog.String("state", ev.State))
	case KindFinished:
		a = append(a, slog.String("state", ev.State))
		if ev.Reason != "" {
			a = append(a, slog.String("reason", ev.Reason))
		}
	case KindDelivery:
		d := ev.Delivery
		kind := "static"
		if d.WebhookID == "" {
			kind = "dynamic"
		}
		a = append(a, slog.String("webhook", kind), slog.String("event", d.EventType), slog.String("url", d.URL),
			slog.String("message_id", d.MessageID), slog.Int("attempt", d.Attempt), slog.String("outcome", d.Outcome))
		if d.WebhookID != "" {
			a = append(a, slog.String("webhook_id", d.WebhookID))
		}
		if d.Status != 0 {
			a = append(a, slog.Int("status", d.Status))
		}
		if d.Err != "" {
			a = append(a, slog.String("error", d.Err))
		}
	case KindFault:
		f := ev.Fault
		a = append(a, slog.String("method", f.Method), slog.String("path", f.Path), slog.Int("status", f.Status))
		if f.RetryDelay > 0 {
			a = append(a, slog.Duration("retry_delay", f.RetryDelay))
		}
	case KindError:
		a = append(a, slog.String("error", ev.Reason))
	}
	return a
}

// onAttempt is the delivery engine's OnAttempt: it runs under the
// service's lock, so it only queues.
func (e *Emulator) onAttempt(d geminifake.DeliveryAttempt) {
	if !e.events.on() {
		return
	}
	e.events.push(Event{Time: d.Time, Kind: KindDelivery, Batch: batchOf(d.Body), Delivery: &d})
}

// eventQueue hands events to fn from one goroutine, in order, without
// bounding the queue (events are small and a sandbox's rate is low).
type eventQueue struct {
	fn     func(Event)
	mu     sync.Mutex
	cond   *sync.Cond
	items  []Event
	closed bool
	done   chan struct{}
}

func newEventQueue(fn func(Event)) *eventQueue {
	q := &eventQueue{fn: fn, done: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	if fn == nil {
		close(q.done)
		return q
	}
	go q.run()
	return q
}

func (q *eventQueue) on() bool { return q.fn != nil }

func (q *eventQueue) push(ev Event) {
	if q.fn == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.items = append(q.items, ev)
	q.cond.Signal()
}

func (q *eventQueue) run() {
	defer close(q.done)
	for {
		q.mu.Lock()
		for len(q.items) == 0 && !q.closed {
			q.cond.Wait()
		}
		items := q.items
		q.items = nil
		closed := q.closed
		q.mu.Unlock()
		for _, ev := range items {
			q.fn(ev)
		}
		if closed && len(items) == 0 {
			return
		}
	}
}

// close delivers what is queued, then stops.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Signal()
	q.mu.Unlock()
	<-q.done
}
