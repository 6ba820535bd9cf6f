package canon_test

import (
	"fmt"

	"github.com/gemrecon/gemrecon/canon"
)

// The webhook, the poller and the command line name one completion three
// different ways; all three give the same key.
func Example() {
	webhook, _ := canon.FromEvent([]byte(`{"type":"batch.succeeded","data":{"id":"aaa111"}}`))
	listed, _ := canon.FromEvent([]byte(`{"name":"batches/aaa111","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}`))
	typed, _ := canon.Key("https://generativelanguage.googleapis.com/v1beta/batches/aaa111/")
	fmt.Println(webhook.Key, webhook.State, webhook.Terminal)
	fmt.Println(listed.Key, listed.State, listed.Terminal)
	fmt.Println(typed)
	// Output:
	// gemini:batches/aaa111 SUCCEEDED true
	// gemini:batches/aaa111 SUCCEEDED true
	// gemini:batches/aaa111
}

func ExampleKey() {
	for _, name := range []string{
		"projects/p/locations/us/operations/abc-123/",
		"gemini:operations/abc-123",
		"BatchJobs/AbC",
	} {
		key, err := canon.Key(name)
		fmt.Println(key, err)
	}
	// Output:
	// gemini:operations/abc-123 <nil>
	// gemini:operations/abc-123 <nil>
	// gemini:batches/AbC <nil>
}

func ExampleFromEvent() {
	ev, err := canon.FromEvent([]byte(`{"name":"batches/ccc333","metadata":{"state":"BATCH_STATE_RUNNING"}}`))
	fmt.Println(ev.Key, ev.State, ev.Terminal, err)

	_, err = canon.FromEvent([]byte(`{"id":"msg_1","type":"batch.succeeded"}`))
	fmt.Println(err)
	// Output:
	// gemini:batches/ccc333 RUNNING false <nil>
	// canon: no operation name in event (want one of name, operation, operationName, resourceName, or data.id); fields present: id, type
}

func ExampleNormalizeState() {
	fmt.Println(canon.NormalizeState("BATCH_STATE_SUCCEEDED"), canon.NormalizeState("JOB_STATE_PAUSED"), canon.IsTerminal("JOB_STATE_PAUSED"))
	// Output: SUCCEEDED PAUSED false
}
