package poller

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// manyBatches returns n terminal batches named batches/<prefix>-i.
func manyBatches(prefix string, n int) []geminifake.Batch {
	bs := make([]geminifake.Batch, n)
	for i := range bs {
		bs[i] = geminifake.Batch{Name: fmt.Sprintf("batches/%s-%04d", prefix, i), State: "SUCCEEDED",
			CreateTime: testNow.Add(-time.Duration(i+1) * time.Minute), EndTime: testNow.Add(-time.Duration(i) * time.Minute)}
	}
	return bs
}

// A gateway that drops the pageToken parameter gets the first page again
// and again; the API mints a new token each time, so the repeated-token
// check never fires. The pass stops with ErrEndlessListing once the pages
// listed nothing new for minLoopPages pages and minLoopOps operations,
// instead of reading forever (before: until the context ended). What the
// first page listed was handed over.
func TestEndlessListingFirstPageAgain(t *testing.T) {
	s := startFake(t, geminifake.Options{Order: geminifake.OrderNewestFirst}, manyBatches("loop", 200)...)
	cfg := testConfig(s, &sleeps{})
	cfg.PageSize = 40
	cfg.Lookback = 0 // every page: only the loop check can end this pass
	dropped := 0
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		if r.URL.Query().Get("pageToken") != "" {
			dropped++
		}
		return &geminifake.Fault{DropPageToken: true}
	})
	ops, st, err := collect(t, newPoller(t, cfg))
	if !errors.Is(err, ErrEndlessListing) {
		t.Fatalf("err = %v after %d pages, want ErrEndlessListing", err, st.Pages)
	}
	// Page 1, then three more pages of the same 40 (120 ≥ 100 operations).
	if st.Pages != 4 || len(s.Requests()) != 4 || dropped != 3 {
		t.Errorf("%d pages, %d requests, %d tokens dropped; want 4, 4, 3", st.Pages, len(s.Requests()), dropped)
	}
	seen := map[string]bool{}
	for _, op := range ops {
		seen[op.Name] = true
	}
	if len(seen) != 40 {
		t.Errorf("%d distinct operations handed over, want the first page's 40", len(seen))
	}
	t.Log(err)
}

// Empty pages, each with a fresh token, end the pass after
// MaxEmptyPagesInRow of them.
func TestEndlessListingEmptyPages(t *testing.T) {
	s := startFake(t, geminifake.Options{})
	n := 0
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		n++
		return &geminifake.Fault{Body: fmt.Sprintf(`{"operations":[],"nextPageToken":"empty-%d"}`, n)}
	})
	cfg := testConfig(s, &sleeps{})
	_, st, err := collect(t, newPoller(t, cfg))
	if !errors.Is(err, ErrEndlessListing) || st.Pages != MaxEmptyPagesInRow {
		t.Fatalf("err = %v after %d pages, want ErrEndlessListing after %d", err, st.Pages, MaxEmptyPagesInRow)
	}
}

// What is not a loop: a long listing of distinct operations, empty pages
// fewer than MaxEmptyPagesInRow in a row, and pages that repeat operations
// for fewer than minLoopPages pages (a listing that shifts under new
// batches) are read to their end.
func TestEndlessListingNotALoop(t *testing.T) {
	t.Run("long listing", func(t *testing.T) {
		s := startFake(t, geminifake.Options{}, manyBatches("long", 600)...)
		cfg := testConfig(s, &sleeps{})
		cfg.PageSize = 5
		cfg.Lookback = 0
		ops, st, err := collect(t, newPoller(t, cfg))
		if err != nil || !st.FullScan || len(ops) != 600 {
			t.Fatalf("%d operations, full scan %v, err %v; want 600, a full scan, no error", len(ops), st.FullScan, err)
		}
	})
	t.Run("empty pages and repeats", func(t *testing.T) {
		s := startFake(t, geminifake.Options{})
		page := func(names ...int) string {
			b := `{"operations":[`
			for i, n := range names {
				if i > 0 {
					b += ","
				}
				b += fmt.Sprintf(`{"name":"batches/r-%d","metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch","state":"BATCH_STATE_SUCCEEDED","createTime":"2026-01-01T00:00:00Z"},"done":true}`, n)
			}
			return b + `]`
		}
		var bodies []string
		for i := range MaxEmptyPagesInRow - 1 {
			bodies = append(bodies, fmt.Sprintf(`{"operations":[],"nextPageToken":"e%d"}`, i))
		}
		first := make([]int, 60)
		for i := range first {
			first[i] = i
		}
		bodies = append(bodies, page(first...)+`,"nextPageToken":"p1"}`)
		// Two pages (120 operations) that list only the first page's
		// operations: fewer than minLoopPages pages.
		bodies = append(bodies, page(first...)+`,"nextPageToken":"p2"}`, page(first...)+`,"nextPageToken":"p3"}`)
		bodies = append(bodies, page(1000, 1001)+`,"nextPageToken":"p4"}`, page(first[:50]...)+`,"nextPageToken":"p5"}`,
			page(first[50:]...)+`,"nextPageToken":"p6"}`, page(1002)+`}`)
		i := 0
		s.SetHook(func(r *http.Request) *geminifake.Fault {
			f := &geminifake.Fault{Body: bodies[i]}
			i++
			return f
		})
		cfg := testConfig(s, &sleeps{})
		cfg.Lookback = 0
		_, st, err := collect(t, newPoller(t, cfg))
		if err != nil || !st.FullScan || st.Pages != len(bodies) {
			t.Fatalf("%d of %d pages, full scan %v, err %v; want every page, no error", st.Pages, len(bodies), st.FullScan, err)
		}
	})
}
