package emulator

// GET /emulator/status on the emulator's listener: what it has done and
// whether it is idle, so that a script or a test can wait for every
// scheduled batch and delivery to end instead of sleeping.

import (
	"encoding/json"
	"net/http"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// StatusPath is where the emulator answers with its Status (no API key
// needed: it holds counts only).
const StatusPath = "/emulator/status"

// Status is the emulator's state as GET StatusPath renders it.
type Status struct {
	URL  string `json:"url"`
	Seed uint64 `json:"seed,string"`
	// Idle: no scheduled change is left and no delivery is under way.
	Idle             bool `json:"idle"`
	PendingChanges   int  `json:"pending_changes"`
	ActiveDeliveries int  `json:"active_deliveries"`
	Batches          int  `json:"batches"`
	Created          int  `json:"created"`
	Finished         int  `json:"finished"`
	Faults           int  `json:"faults"`
	// Deliveries are the delivery engine's counters.
	Deliveries DeliveryCounts `json:"deliveries"`
}

// DeliveryCounts are geminifake.DeliveryStats in JSON.
type DeliveryCounts struct {
	Messages    int `json:"messages"`
	Attempts    int `json:"attempts"`
	Delivered   int `json:"delivered"`
	Failed      int `json:"failed"`
	Redelivered int `json:"redelivered"`
	Exhausted   int `json:"exhausted"`
	Dropped     int `json:"dropped"`
	Duplicates  int `json:"duplicates"`
	Abandoned   int `json:"abandoned"`
}

func deliveryCounts(d geminifake.DeliveryStats) DeliveryCounts {
	return DeliveryCounts{d.Messages, d.Attempts, d.Delivered, d.Failed, d.Redelivered, d.Exhausted, d.Dropped, d.Duplicates, d.Abandoned}
}

// Status returns the emulator's state now.
func (e *Emulator) Status() Status {
	// Pending changes first, then the delivery counters and the active
	// deliveries in one read: once no change is pending, every message is
	// queued, and with none active every attempt is counted — so an idle
	// status holds every count (a finished duplicate send could otherwise
	// fall between two separate reads).
	pending := e.pendingSteps()
	st := e.ownStats()
	deliveries, active := e.api.Webhooks().StatsActive()
	s := Status{
		URL: e.URL(), Seed: e.cfg.Seed, PendingChanges: pending, ActiveDeliveries: active,
		Batches: st.Batches, Created: st.Created, Finished: st.Finished, Faults: st.Faults,
		Deliveries: deliveryCounts(deliveries),
	}
	s.Idle = s.PendingChanges == 0 && s.ActiveDeliveries == 0
	return s
}

func (e *Emulator) serveStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(e.Status())
}
