package poller

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

// A successful answer larger than the limit the transport reads. The tests
// set the limit (Config.maxBody) to a few kilobytes: at MaxResponseBody
// each would need a 64 MiB page for the SDK to decode.

// bigBatches are SUCCEEDED batches whose inlined responses make each
// operation about 1.2 KB as listed.
func bigBatches(n int) []geminifake.Batch {
	resp := json.RawMessage(`{"response":{"text":"` + strings.Repeat("x", 1000) + `"}}`)
	var bs []geminifake.Batch
	for i := range n {
		bs = append(bs, geminifake.Batch{Name: fmt.Sprintf("batches/big%d", i), State: "SUCCEEDED",
			CreateTime: testNow.Add(-time.Duration(i+1) * time.Minute), InlinedResponses: []json.RawMessage{resp}})
	}
	return bs
}

// A list page beyond the limit fails the pass with ErrBodyTooLarge, which
// names the limit and says to lower --page-size; it is not "malformed", not
// retried, and nothing of it is handed over. A smaller page size then lists
// every operation.
func TestListPageTooLarge(t *testing.T) {
	bs := bigBatches(6)
	s := startFake(t, geminifake.Options{}, bs...)
	sl := &sleeps{}
	cfg := testConfig(s, sl) // PageSize 10: the six operations in one page
	cfg.maxBody = 3000
	ops, st, err := collect(t, newPoller(t, cfg))
	if !errors.Is(err, ErrBodyTooLarge) || errors.Is(err, ErrMalformedPage) {
		t.Fatalf("err = %v, want ErrBodyTooLarge (not ErrMalformedPage)", err)
	}
	var big *BodyTooLargeError
	if !errors.As(err, &big) || big.Kind != "list page" || big.Status != http.StatusOK || big.Limit != 3000 || big.PageSize != 10 {
		t.Errorf("errors.As: %+v", big)
	}
	for _, want := range []string{"page 1", "list page", "HTTP 200", "larger than 3000 bytes", "lower --page-size (now 10)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if n := len(listRequests(s)); n != 1 || st.Requests != 1 || st.Retries != 0 || len(sl.all()) != 0 {
		t.Errorf("the fake saw %d list requests; stats %+v, waits %v; want one request, no retry", n, st, sl.all())
	}
	if len(ops) != 0 || st.Listed != 0 || st.Pages != 0 || st.FullScan {
		t.Errorf("handed over %q, stats %+v; want nothing listed", names(ops), st)
	}

	s.ResetRequests()
	cfg.PageSize = 1
	ops, st, err = collect(t, newPoller(t, cfg))
	if err != nil {
		t.Fatalf("--page-size 1: %v", err)
	}
	if got, want := names(ops), terminalNames(bs); !slices.Equal(got, want) || st.Pages != 6 {
		t.Errorf("--page-size 1: handed over %q in %d pages, want %q", got, st.Pages, want)
	}
}

// listBody is a list page of one SUCCEEDED operation, padded with spaces
// inside the JSON to exactly n bytes.
func listBody(t *testing.T, n int) string {
	t.Helper()
	head := `{"operations":[{"name":"batches/edge","metadata":{"@type":"type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch",` +
		`"name":"batches/edge","state":"BATCH_STATE_SUCCEEDED","createTime":"2025-12-11T06:00:00Z"},"done":true}]`
	tail := `}`
	pad := n - len(head) - len(tail)
	if pad < 0 {
		t.Fatalf("a page of %d bytes cannot hold the operation", n)
	}
	return head + strings.Repeat(" ", pad) + tail
}

// A body of exactly the limit is read and listed; one byte more is
// ErrBodyTooLarge, whether the answer gives its length (Content-Length,
// refused before reading) or not (chunked: read up to one byte past the
// limit). Each is one request.
func TestListPageAtTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
	}{
		{"Content-Length", 1500, false},
		{"chunked", 20000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := listBody(t, tc.size)
			var requests atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("Content-Type", "application/json; charset=UTF-8")
				if tc.chunked {
					w.WriteHeader(http.StatusOK)
					half := len(body) / 2
					_, _ = w.Write([]byte(body[:half]))
					w.(http.Flusher).Flush() // the length is not known: chunked
					_, _ = w.Write([]byte(body[half:]))
					return
				}
				w.Header().Set("Content-Length", fmt.Sprint(len(body)))
				_, _ = w.Write([]byte(body))
			}))
			t.Cleanup(srv.Close)
			var lengths []int64
			cfg := DefaultConfig()
			cfg.APIKey, cfg.BaseURL, cfg.PageSize, cfg.Sleep = testKey, srv.URL, 10, (&sleeps{}).sleep
			cfg.Now = func() time.Time { return testNow }
			cfg.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil {
					lengths = append(lengths, resp.ContentLength)
				}
				return resp, err
			})}

			cfg.maxBody = int64(len(body))
			ops, st, err := collect(t, newPoller(t, cfg))
			if err != nil {
				t.Fatalf("a body of exactly the limit: %v", err)
			}
			if got := names(ops); !slices.Equal(got, []string{"batches/edge"}) || !st.FullScan {
				t.Errorf("a body of exactly the limit: handed over %q, stats %+v", got, st)
			}

			requests.Store(0)
			cfg.maxBody = int64(len(body)) - 1
			_, st, err = collect(t, newPoller(t, cfg))
			var big *BodyTooLargeError
			if !errors.As(err, &big) || big.Limit != cfg.maxBody {
				t.Fatalf("one byte over the limit: err = %v, want a *BodyTooLargeError", err)
			}
			if wantLen := map[bool]int64{true: 0, false: int64(len(body))}[tc.chunked]; big.Length != wantLen {
				t.Errorf("Length %d, want %d", big.Length, wantLen)
			}
			if n := requests.Load(); n != 1 || st.Retries != 0 {
				t.Errorf("one byte over the limit: %d requests, %d retries; want 1, none", n, st.Retries)
			}
			if wantLen := map[bool]int64{true: -1, false: int64(len(body))}[tc.chunked]; lengths[0] != wantLen {
				t.Errorf("the server sent Content-Length %d, want %d (the case this test is about)", lengths[0], wantLen)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Get of an operation beyond the limit: ErrUnexpected (an answer that
// decides nothing, counted by confirmation as a failed attempt) and
// ErrBodyTooLarge, never ErrTransient (which would be asked again and
// again), after one request.
func TestGetTooLarge(t *testing.T) {
	bs := bigBatches(1)
	s := startFake(t, geminifake.Options{}, bs...)
	cfg := testConfig(s, &sleeps{})
	cfg.maxBody = 1000
	p := newPoller(t, cfg)
	_, err := getOne(t, p, bs[0].Name)
	if !errors.Is(err, ErrBodyTooLarge) || !errors.Is(err, ErrUnexpected) || errors.Is(err, ErrTransient) {
		t.Fatalf("err = %v, want ErrUnexpected and ErrBodyTooLarge, not ErrTransient", err)
	}
	for _, want := range []string{"get batches/big0", "get operation", "larger than 1000 bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "page-size") {
		t.Errorf("error %q speaks of the page size of a get", err)
	}
	if c := counts(s); c.Get != 1 || c.total() != 1 {
		t.Errorf("counts %+v; want one get", c)
	}
}

// A 403 on Get whose credential probe (a list page of one) comes back too
// large to read: the probe was answered, so the credential works and the
// batch is of another project.
func TestProbeTooLarge(t *testing.T) {
	s := startFake(t, geminifake.Options{}, bigBatches(1)...)
	s.SetHook(func(r *http.Request) *geminifake.Fault {
		if r.URL.Path != "/v1beta/batches" {
			return &geminifake.Fault{Status: http.StatusForbidden, Message: "Permission denied."}
		}
		return nil
	})
	cfg := testConfig(s, &sleeps{})
	cfg.maxBody = 1000
	p := newPoller(t, cfg)
	_, err := getOne(t, p, "batches/elsewhere")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	if c := counts(s); c.Get != 1 || c.Probe != 1 {
		t.Errorf("counts %+v; want one get, one probe", c)
	}
}
