package geminifake

// Per-job (dynamic) webhooks: a batch created with a webhookConfig
// (genai.CreateBatchJobConfig.WebhookConfig) sends its completion event to
// the configuration's URIs, signed by WebhookOptions.DynamicSigner (the
// emulator plugs in internal/fakejwks: v1a Ed25519 and/or an RS256 JWT),
// with the same at-least-once redelivery, drops and duplicates as static
// deliveries. The SDK documents the URIs as "used instead of the
// registered webhooks", so a batch with URIs sends nothing to the static
// ones.

import (
	"maps"
	"slices"
	"strings"
)

// WebhookConfig is a batch's per-job webhook configuration, in the JSON
// names the SDK sends (genai.WebhookConfig).
type WebhookConfig struct {
	// Uris receive the batch's completion event instead of the registered
	// (static) webhooks.
	Uris []string `json:"uris,omitempty"`
	// UserMetadata is included in every webhook event of the batch, as
	// data.user_metadata (where the API puts it is not documented; see
	// docs/gemini-api.md).
	UserMetadata map[string]any `json:"userMetadata,omitempty"`
}

// Clone returns a deep enough copy: the URI list and the metadata map
// (not the values inside it).
func (c *WebhookConfig) Clone() *WebhookConfig {
	if c == nil {
		return nil
	}
	return &WebhookConfig{Uris: slices.Clone(c.Uris), UserMetadata: maps.Clone(c.UserMetadata)}
}

// CheckWebhookConfig refuses a configuration with a URI that is not an
// absolute http or https URL, as the create endpoint does (400).
func CheckWebhookConfig(c *WebhookConfig) error {
	if c == nil {
		return nil
	}
	for _, u := range c.Uris {
		if err := checkURI(u); err != nil {
			return err
		}
	}
	return nil
}

// batchEventDataWithMetadata is a batch event's data with the batch's user
// metadata beside the catalogue's fields.
type batchEventDataWithMetadata struct {
	BatchEventData
	UserMetadata map[string]any `json:"user_metadata,omitempty"`
}

// withUserMetadata adds the batch's user metadata to its event, if it has
// any.
func withUserMetadata(ev Event, b Batch) Event {
	if b.WebhookConfig == nil || len(b.WebhookConfig.UserMetadata) == 0 {
		return ev
	}
	d, ok := ev.Data.(BatchEventData)
	if !ok {
		return ev
	}
	ev.Data = batchEventDataWithMetadata{d, maps.Clone(b.WebhookConfig.UserMetadata)}
	return ev
}

// sendDynamic queues ev for every URI of the batch's webhook configuration,
// signed by DynamicSigner; false when the batch has no URIs. The caller
// holds ws.mu.
func (ws *WebhookService) sendDynamic(b Batch, ev Event) bool {
	if b.WebhookConfig == nil || len(b.WebhookConfig.Uris) == 0 {
		return false
	}
	for _, u := range b.WebhookConfig.Uris {
		ws.enqueue(&message{url: u, signer: ws.opts.DynamicSigner, event: ev})
	}
	return true
}

// StatsActive returns the delivery counters and how many messages are
// being delivered (queued, in an attempt, or waiting to be redelivered),
// read together: when none is, every attempt of every queued message is in
// the counters (two separate reads could miss a duplicate send that
// finished in between).
func (ws *WebhookService) StatsActive() (DeliveryStats, int) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.stats, ws.active
}

// Batch returns the batch name ("batches/…") a batch event is about, ""
// for an event that names none (a ping).
func (e Event) Batch() string {
	var id string
	switch d := e.Data.(type) {
	case BatchEventData:
		id = d.ID
	case batchEventDataWithMetadata:
		id = d.ID
	default:
		return ""
	}
	if id == "" || strings.HasPrefix(id, "batches/") {
		return id
	}
	return GeminiName(id)
}
