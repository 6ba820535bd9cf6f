package poller

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// issueBatches is issue 12's reproduction: 30 batches finished 100 h ago
// and 12 finished 2 h ago.
func issueBatches() (all []geminifake.Batch, recent []string) {
	for i := range 30 {
		at := testNow.Add(-100 * time.Hour).Add(time.Duration(i) * time.Minute)
		all = append(all, geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("old-%02d", i)),
			State: "SUCCEEDED", CreateTime: at, EndTime: at.Add(time.Hour)})
	}
	for i := range 12 {
		at := testNow.Add(-2 * time.Hour).Add(time.Duration(i) * time.Minute)
		name := geminifake.GeminiName(fmt.Sprintf("new-%02d", i))
		all = append(all, geminifake.Batch{Name: name, State: "SUCCEEDED", CreateTime: at, EndTime: at.Add(time.Hour)})
		recent = append(recent, name)
	}
	slices.Sort(recent)
	return all, recent
}

// Issue 12, item 1: an API that lists oldest first, pages of 5. The old
// stop rule read one page (all old) and stopped: new=0, all 12 lost. Now
// the second page breaks newest-first order, so the pass reads every page.
func TestOldestFirstListingLosesNothing(t *testing.T) {
	bs, recent := issueBatches()
	s := startFake(t, geminifake.Options{Order: geminifake.OrderOldestFirst}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.PageSize = 5
	var logs strings.Builder
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ops, st, err := collect(t, newPoller(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ops); !slices.Equal(got, recent) {
		t.Errorf("handed over %q, want the 12 recent ones", got)
	}
	if st.Requests != 9 || st.Pages != 9 || !st.FullScan || !st.Unordered || st.SkippedOld != 30 || st.Terminal != 42 {
		t.Errorf("stats %+v: want 9 requests, a full scan, unordered, 30 skipped as old of 42 terminal", st)
	}
	if n := strings.Count(logs.String(), "not newest first"); n != 1 {
		t.Errorf("logged the broken order %d times, want once:\n%s", n, logs.String())
	}
}

// Every listing order, one pass each: newest first costs pages-in-window
// + 1 requests and ends early; oldest first and an order unrelated to age
// (with these fixtures) break the order and read every page; two runs joined
// end to end can hide the second run's completions from a pass that ends
// early — which is what the periodic full scan is for — and a full scan
// finds them in every order.
func TestEveryListingOrder(t *testing.T) {
	bs, recent := issueBatches()
	for _, order := range geminifake.Orders {
		t.Run(order.String(), func(t *testing.T) {
			s := startFake(t, geminifake.Options{Order: order, Seed: 1}, bs...)
			cfg := testConfig(s, &sleeps{})
			cfg.PageSize = 5
			p := newPoller(t, cfg)
			ops, st, err := collect(t, p)
			if err != nil {
				t.Fatal(err)
			}
			got := names(ops)
			switch order {
			case geminifake.OrderNewestFirst:
				// 12 recent on pages 1–3 (5+5+2, the rest of page 3 old): 3
				// pages in the window, then one all-old page ends the pass.
				if !slices.Equal(got, recent) || st.Requests != 3+1 || st.FullScan || st.Unordered {
					t.Errorf("handed over %d, stats %+v; want all 12 for 4 requests, no full scan", len(got), st)
				}
			case geminifake.OrderOldestFirst, geminifake.OrderShuffled:
				if !slices.Equal(got, recent) || !st.FullScan || !st.Unordered || st.Requests != 9 {
					t.Errorf("handed over %d, stats %+v; want all 12 from a full read of 9 pages", len(got), st)
				}
			case geminifake.OrderTwoRuns:
				// Run 0 (its recent batches, then its old ones) looks like one
				// newest-first listing: the pass ends inside it, and run 1's
				// recent batches are not seen.
				var run0, run1 []string
				for _, n := range recent {
					if s.RunOf(n) == 0 {
						run0 = append(run0, n)
					} else {
						run1 = append(run1, n)
					}
				}
				if len(run1) == 0 || !slices.Equal(got, run0) || st.FullScan || st.Unordered {
					t.Errorf("handed over %q (stats %+v); want only run 0's %q, run 1's %q hidden", got, st, run0, run1)
				}
			}
			fops, fst, err := collectWith(t, p, PassOptions{FullScan: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := names(fops); !slices.Equal(got, recent) || !fst.FullScan || fst.Requests != 9 || fst.SkippedOld != 30 {
				t.Errorf("full scan handed over %d, stats %+v; want all 12 from 9 requests", len(got), fst)
			}
		})
	}
}

func collectWith(t *testing.T, p *Poller, opt PassOptions) ([]Operation, PassStats, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ops []Operation
	st, err := p.PassWith(ctx, opt, func(page []Operation) error {
		ops = append(ops, page...)
		return nil
	})
	return ops, st, err
}

// Newest first over many pages: a pass costs pages-in-window + 1 requests,
// whatever the size of the listing beyond the window.
func TestNewestFirstCost(t *testing.T) {
	for _, tc := range []struct{ total, inWindow, pageSize int }{
		{200, 33, 10}, {200, 30, 10}, {1000, 1, 100}, {60, 49, 7},
	} {
		t.Run(fmt.Sprint(tc), func(t *testing.T) {
			var bs []geminifake.Batch
			for i := range tc.total {
				// Batch i was created i hours ago (plus one minute); the first
				// inWindow are inside a lookback of inWindow hours.
				at := testNow.Add(-time.Duration(i)*time.Hour - time.Minute)
				bs = append(bs, geminifake.Batch{Name: geminifake.GeminiName(fmt.Sprintf("c%04d", i)), State: "SUCCEEDED", CreateTime: at})
			}
			s := startFake(t, geminifake.Options{Order: geminifake.OrderNewestFirst}, bs...)
			cfg := testConfig(s, &sleeps{})
			cfg.PageSize = tc.pageSize
			cfg.Lookback = time.Duration(tc.inWindow) * time.Hour
			ops, st, err := collect(t, newPoller(t, cfg))
			if err != nil {
				t.Fatal(err)
			}
			pagesInWindow := (tc.inWindow + tc.pageSize - 1) / tc.pageSize
			want := max(pagesInWindow+1, 2) // the rule needs two pages to see an order
			if len(ops) != tc.inWindow || st.Requests != want || st.FullScan || len(listRequests(s)) != want {
				t.Errorf("handed over %d, stats %+v; want %d for %d requests", len(ops), st, tc.inWindow, want)
			}
		})
	}
}

// An operation without a createTime cannot prove an order: the pass reads
// every page (and hands that operation over: it counts as inside the window).
func TestNoCreateTimeReadsEveryPage(t *testing.T) {
	s := startFake(t, geminifake.Options{})
	pages := map[string]string{
		"":   `{"operations":[{"name":"batches/undated","metadata":{"state":"BATCH_STATE_SUCCEEDED"},"done":true}],"nextPageToken":"p2"}`,
		"p2": `{"operations":[{"name":"batches/old1","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-11-01T00:00:00Z"},"done":true}],"nextPageToken":"p3"}`,
		"p3": `{"operations":[{"name":"batches/old2","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-10-01T00:00:00Z"},"done":true}],"nextPageToken":"p4"}`,
		"p4": `{"operations":[{"name":"batches/late","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-12-11T23:00:00Z"},"done":true}]}`,
	}
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		return &geminifake.Fault{Body: pages[r.URL.Query().Get("pageToken")]}
	})
	ops, st, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ops); !slices.Equal(got, []string{"batches/late", "batches/undated"}) || st.Requests != 4 || !st.FullScan || !st.Unordered || st.SkippedOld != 2 {
		t.Errorf("handed over %q, stats %+v; want late and undated from 4 requests", got, st)
	}
	// The same listing with the undated operation dated like the old ones
	// ends after its first two pages (old, and newest first): batches/late is
	// left to the next full scan.
	pages[""] = strings.Replace(pages[""], `"state"`, `"createTime":"2025-11-02T00:00:00Z","state"`, 1)
	ops, st, err = collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 0 || st.Requests != 2 || st.FullScan || st.Unordered {
		t.Errorf("dated: handed over %q, stats %+v; want nothing from 2 requests", names(ops), st)
	}
}

// Empty pages say nothing about the order: they neither end paging nor
// count toward the two pages the rule needs.
func TestEmptyPagesAreNotEvidence(t *testing.T) {
	s := startFake(t, geminifake.Options{})
	pages := map[string]string{
		"":   `{"operations":[{"name":"batches/old1","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-11-01T00:00:00Z"},"done":true}],"nextPageToken":"p2"}`,
		"p2": `{"operations":[],"nextPageToken":"p3"}`,
		"p3": `{"operations":[{"name":"batches/late","metadata":{"state":"BATCH_STATE_SUCCEEDED","createTime":"2025-12-11T23:00:00Z"},"done":true}]}`,
	}
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		return &geminifake.Fault{Body: pages[r.URL.Query().Get("pageToken")]}
	})
	ops, st, err := collect(t, newPoller(t, testConfig(s, &sleeps{})))
	if err != nil {
		t.Fatal(err)
	}
	if got := names(ops); !slices.Equal(got, []string{"batches/late"}) || st.Requests != 3 || !st.FullScan || !st.Unordered {
		t.Errorf("handed over %q, stats %+v; want batches/late from 3 requests", got, st)
	}
}

// Lookback 0 reads every page, and a full-scan pass does too however
// newest-first the listing is.
func TestFullScanReadsEveryPage(t *testing.T) {
	bs, _ := issueBatches()
	s := startFake(t, geminifake.Options{Order: geminifake.OrderNewestFirst}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.PageSize = 5
	p := newPoller(t, cfg)
	ops, st, err := collectWith(t, p, PassOptions{FullScan: true})
	if err != nil || len(ops) != 12 || st.Requests != 9 || !st.FullScan || st.SkippedOld != 30 {
		t.Errorf("full scan: %d handed over, stats %+v, err %v; want 12, 9 requests", len(ops), st, err)
	}
	cfg.Lookback = 0
	ops, st, err = collect(t, newPoller(t, cfg))
	if err != nil || len(ops) != 42 || st.Requests != 9 || !st.FullScan || st.SkippedOld != 0 {
		t.Errorf("lookback 0: %d handed over, stats %+v, err %v; want 42, 9 requests", len(ops), st, err)
	}
}

// The scope names backend, effective base URL and a key digest (never the
// key); Vertex names project and location.
func TestScope(t *testing.T) {
	mk := func(mod func(*Config)) string {
		cfg := DefaultConfig()
		cfg.APIKey = "secret-key-1"
		mod(&cfg)
		return newPoller(t, cfg).Scope()
	}
	def := mk(func(*Config) {})
	if !strings.HasPrefix(def, "gemini https://generativelanguage.googleapis.com/ key=sha256:") || strings.Contains(def, "secret") {
		t.Errorf("default scope %q", def)
	}
	if len(def) != len("gemini https://generativelanguage.googleapis.com/ key=sha256:")+12 {
		t.Errorf("key digest in %q is not 12 hex digits", def)
	}
	other := mk(func(c *Config) { c.APIKey = "secret-key-2" })
	slash := mk(func(c *Config) { c.BaseURL = "https://generativelanguage.googleapis.com" })
	fake := mk(func(c *Config) { c.BaseURL = "http://127.0.0.1:9/" })
	if other == def || slash != def || fake != "gemini http://127.0.0.1:9/"+def[len("gemini https://generativelanguage.googleapis.com/"):] {
		t.Errorf("scopes: default %q, other key %q, no slash %q, fake %q", def, other, slash, fake)
	}
	t.Setenv("GOOGLE_GEMINI_BASE_URL", "http://proxy.internal:8080/")
	if env := mk(func(*Config) {}); !strings.HasPrefix(env, "gemini http://proxy.internal:8080/ ") {
		t.Errorf("scope with GOOGLE_GEMINI_BASE_URL: %q", env)
	}
	vx := mk(func(c *Config) {
		c.Backend, c.APIKey, c.Project, c.Location, c.NoCredentials = BackendVertex, "", "proj", "us-central1", true
	})
	if vx != "vertex https://us-central1-aiplatform.googleapis.com/ project=proj location=us-central1" {
		t.Errorf("vertex scope %q", vx)
	}
}
