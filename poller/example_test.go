package poller_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
	"github.com/gemrecon/gemrecon/poller"
)

// One pass against the local stand-in: only the terminal batch is handed over.
func ExamplePoller_PassWith() {
	now := time.Date(2025, 12, 12, 0, 0, 0, 0, time.UTC)
	fake := geminifake.New(geminifake.Options{APIKey: "k"})
	fake.Add(
		geminifake.Batch{Name: "batches/done1", State: "BATCH_STATE_SUCCEEDED", CreateTime: now.Add(-2 * time.Hour), EndTime: now.Add(-time.Hour)},
		geminifake.Batch{Name: "batches/busy1", State: "BATCH_STATE_RUNNING", CreateTime: now.Add(-time.Hour)},
	)
	url, err := fake.Start("")
	if err != nil {
		panic(err)
	}
	defer fake.Close()

	cfg := poller.DefaultConfig()
	cfg.APIKey, cfg.BaseURL = "k", url
	cfg.Now = func() time.Time { return now }
	p, err := poller.New(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	st, err := p.PassWith(context.Background(), poller.PassOptions{}, func(page []poller.Operation) error {
		for _, op := range page {
			fmt.Println(op.Name, op.State)
		}
		return nil
	})
	fmt.Println(st.Listed, st.Terminal, st.Requests, err)
	// Output:
	// batches/done1 SUCCEEDED
	// 2 1 1 <nil>
}
