package emulator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"google.golang.org/genai"

	"github.com/gemrecon/gemrecon/internal/emulator"
	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/webhook"
)

// The emulator in-process, as `gemrecon demo` can use it: a static
// webhook pointing at a receiver, one scripted batch that succeeds with a
// responses file, a signed delivery that the receiver's verifier accepts,
// and the results through the SDK.
func Example() {
	emu, err := emulator.New(emulator.Config{Listen: "127.0.0.1:0", Seed: 1})
	if err != nil {
		panic(err)
	}
	if err := emu.Start(); err != nil {
		panic(err)
	}
	defer emu.Close()

	type delivery struct {
		h    http.Header
		body []byte
	}
	got := make(chan delivery, 1)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		select {
		case got <- delivery{r.Header.Clone(), body}:
		default: // only the first is shown
		}
	}))
	defer receiver.Close()

	// What `gemrecon webhooks create` does through the SDK.
	_, secret, err := emu.API().Webhooks().Create("demo", receiver.URL, []string{"batch.succeeded"})
	if err != nil {
		panic(err)
	}
	err = emu.Schedule(geminifake.Batch{Name: "batches/demo-1", State: "SUCCEEDED",
		ResponsesFile: "files/demo-1", RequestCount: 2}, 100*time.Millisecond)
	if err != nil {
		panic(err)
	}

	d := <-got
	v, err := webhook.NewVerifier([]string{secret}, nil)
	if err != nil {
		panic(err)
	}
	var ev struct {
		Type string `json:"type"`
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	_ = json.Unmarshal(d.body, &ev)
	fmt.Println(ev.Type, ev.Data.ID, "verified:", v.Verify(d.body, d.h) == nil)

	ctx := context.Background()
	c, err := genai.NewClient(ctx, &genai.ClientConfig{APIKey: emu.APIKey(), HTTPOptions: genai.HTTPOptions{BaseURL: emu.URL()}})
	if err != nil {
		panic(err)
	}
	job, err := c.Batches.Get(ctx, "batches/demo-1", nil)
	if err != nil {
		panic(err)
	}
	data, err := c.Files.Download(ctx, genai.NewDownloadURIFromFile(&genai.File{DownloadURI: job.Dest.FileName}), nil)
	if err != nil {
		panic(err)
	}
	fmt.Print(job.State, "\n", string(data))
	// Output:
	// batch.succeeded demo-1 verified: true
	// JOB_STATE_SUCCEEDED
	// {"key":"request-1","response":{"candidates":[{"content":{"parts":[{"text":"Emulated response 1 of 2 for batches/demo-1."}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"candidatesTokenCount":7,"promptTokenCount":8,"totalTokenCount":15},"modelVersion":"gemini-2.5-flash"}}
	// {"key":"request-2","response":{"candidates":[{"content":{"parts":[{"text":"Emulated response 2 of 2 for batches/demo-1."}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"candidatesTokenCount":7,"promptTokenCount":8,"totalTokenCount":15},"modelVersion":"gemini-2.5-flash"}}
}
