// Package genaitest holds what tests do with the Gemini SDK
// (google.golang.org/genai) against the local API stand-in or the
// emulator: a client for a base URL and key, every batch listed page by
// page, and which job states are terminal. Nothing but tests may import it.
package genaitest

import (
	"context"
	"testing"

	"google.golang.org/genai"
)

// Client returns an SDK client of the Gemini API at baseURL with apiKey,
// on v1beta as gemrecon's own clients (the WebhookService is there only).
func Client(t testing.TB, baseURL, apiKey string) *genai.Client {
	t.Helper()
	c, err := genai.NewClient(context.Background(), &genai.ClientConfig{
		APIKey: apiKey, Backend: genai.BackendGeminiAPI, HTTPOptions: genai.HTTPOptions{BaseURL: baseURL, APIVersion: "v1beta"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ListAll lists every batch through the SDK's pages of pageSize, by name.
func ListAll(t testing.TB, c *genai.Client, pageSize int32) map[string]*genai.BatchJob {
	t.Helper()
	out := map[string]*genai.BatchJob{}
	page, err := c.Batches.List(context.Background(), &genai.ListBatchJobsConfig{PageSize: pageSize})
	for err != genai.ErrPageDone {
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range page.Items {
			out[b.Name] = b
		}
		page, err = page.Next(context.Background())
	}
	return out
}

// Terminal reports whether a job in state s has finished.
func Terminal(s genai.JobState) bool {
	switch s {
	case genai.JobStateSucceeded, genai.JobStateFailed, genai.JobStateExpired, genai.JobStateCancelled:
		return true
	}
	return false
}
