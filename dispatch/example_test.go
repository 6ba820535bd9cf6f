package dispatch_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gemrecon/gemrecon/dispatch"
	"github.com/gemrecon/gemrecon/effect"
	"github.com/gemrecon/gemrecon/sink"
	"github.com/gemrecon/gemrecon/sink/sqlite"
)

// Record a completion twice (webhook, then poll), then drain: the effect
// runs once, on the API's operation (the poll sighting confirmed the key),
// with the webhook's body beside it.
func ExampleDispatcher_Drain() {
	dir, _ := os.MkdirTemp("", "gemrecon-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(dir, "gemrecon.db"), sink.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	hook := []byte(`{"type":"batch.succeeded","data":{"id":"abc"}}`)
	op := []byte(`{"name":"batches/abc","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}`)
	s.Record(ctx, sink.Sighting{Key: "gemini:batches/abc", Source: sink.SourceWebhook, Payload: hook, State: "SUCCEEDED"})
	s.Record(ctx, sink.Sighting{Key: "gemini:batches/abc", Source: sink.SourcePoll, Payload: op, State: "SUCCEEDED", FromAPI: true})
	d, err := dispatch.New(dispatch.Config{Sink: s, Effect: effect.NewPrint(os.Stdout, nil), Concurrency: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	sum, err := d.Drain(ctx)
	fmt.Printf("%+v %v\n", sum, err)
	sum, err = d.Drain(ctx)
	fmt.Printf("%+v %v\n", sum, err)
	// Output:
	// {"key":"gemini:batches/abc","name":"batches/abc","state":"SUCCEEDED","source":"webhook","attempt":1,"token":1,"operation":{"name":"batches/abc","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true},"confirmed":true,"batch_state":"SUCCEEDED","webhook":{"type":"batch.succeeded","data":{"id":"abc"}},"rerun":false}
	// {Claimed:1 OK:1 Failed:0 Dead:0 Fenced:0 Unconfirmed:0 HandedBack:0} <nil>
	// {Claimed:0 OK:0 Failed:0 Dead:0 Fenced:0 Unconfirmed:0 HandedBack:0} <nil>
}
