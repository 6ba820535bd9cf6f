package canon_test

import (
	"encoding/base64"
	"testing"

	"github.com/gemrecon/gemrecon/canon"
)

func BenchmarkKey(b *testing.B) {
	for _, bc := range []struct{ name, in string }{
		{"canonical", "batches/aaa111"},
		{"key", "gemini:batches/aaa111"},
		{"parents", "projects/123/locations/us-central1/batchPredictionJobs/111/"},
		{"url", "https://generativelanguage.googleapis.com/v1beta/batches/aaa111"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := canon.Key(bc.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkFromEvent(b *testing.B) {
	webhook := `{"type":"batch.succeeded","version":"v1","timestamp":"2025-12-10T18:58:31Z","data":{"id":"aaa111"}}`
	for _, bc := range []struct{ name, body string }{
		{"webhook", webhook},
		{"listed", `{"name":"batches/aaa111","metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch","model":"models/gemini-2.5-flash","displayName":"nightly-a","name":"batches/aaa111","output":{"responsesFile":"files/out-aaa"},"createTime":"2025-12-10T18:27:01.407650525Z","endTime":"2025-12-10T18:58:31.548158795Z","updateTime":"2025-12-10T18:58:31.548158754Z","batchStats":{"requestCount":"3","successfulRequestCount":"3"},"state":"BATCH_STATE_SUCCEEDED"},"done":true,"response":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatchOutput","responsesFile":"files/out-aaa"}}`},
		{"pubsub", `{"message":{"data":"` + base64.StdEncoding.EncodeToString([]byte(webhook)) + `","messageId":"1"},"subscription":"projects/p/subscriptions/s"}`},
	} {
		body := []byte(bc.body)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := canon.FromEvent(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCheckKey is the cost spec §12 adds to every new sighting (FromEvent
// runs the same byte scan on the key it builds).
func BenchmarkCheckKey(b *testing.B) {
	for _, bc := range []struct{ name, key string }{
		{"batch", "gemini:batches/aaa111"},
		{"vertex", "gemini:batchPredictionJobs/1234567890123456789"},
		{"non-ASCII", "gemini:batches/é😀-ünïcödé"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := canon.CheckKey(bc.key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
