package emulator

// Faults on API requests (--fail-rate): a seeded draw per request, in the
// order requests arrive, so one client's sequence of requests meets the
// same faults on every run with the same seed.

import (
	"net/http"
	"sync"
	"time"

	rand2 "math/rand/v2"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

type faultSource struct {
	rate  float64
	delay time.Duration

	mu  sync.Mutex
	rng *rand2.Rand
	n   int
}

func newFaultSource(seed uint64, rate float64, delay time.Duration) *faultSource {
	return &faultSource{rate: rate, delay: delay, rng: rand2.New(rand2.NewPCG(seed, 0xfa017fa017))}
}

func (f *faultSource) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// draw decides one request's fault; nil answers normally. Both numbers
// are drawn for every request, so the kind of one fault does not shift the
// decisions after it.
func (f *faultSource) draw() *Fault {
	if f.rate == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	x, kind := f.rng.Float64(), f.rng.IntN(4)
	if x >= f.rate {
		return nil
	}
	f.n++
	switch kind {
	case 0, 1:
		return &Fault{Status: http.StatusTooManyRequests, RetryDelay: f.delay}
	case 2:
		return &Fault{Status: http.StatusServiceUnavailable}
	}
	return &Fault{Status: http.StatusInternalServerError}
}

// fault is the stand-in's per-request hook.
func (e *Emulator) fault(r *http.Request) *geminifake.Fault {
	f := e.faults.draw()
	if f == nil {
		return nil
	}
	f.Method, f.Path = r.Method, r.URL.Path
	e.events.push(Event{Time: e.cfg.Now(), Kind: KindFault, Fault: f})
	gf := &geminifake.Fault{Status: f.Status, RetryDelay: f.RetryDelay}
	switch f.Status {
	case http.StatusServiceUnavailable:
		gf.Message = "The service is currently unavailable (emulated fault)."
	case http.StatusInternalServerError:
		gf.Message = "An internal error has occurred (emulated fault)."
	}
	return gf
}
