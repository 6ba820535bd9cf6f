package poller

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gemrecon/gemrecon/internal/geminifake"
)

func sum(r io.Reader) [32]byte {
	h := sha256.New()
	_, _ = io.Copy(h, r)
	return [32]byte(h.Sum(nil))
}

type hashWriter struct{ h hash.Hash }

func (w hashWriter) Write(p []byte) (int, error) { return w.h.Write(p) }

// Download streams the file byte for byte with the request the SDK's
// Files.Download sends (path, alt=media, the key header), counted as one
// download request.
func TestDownloadByteForByte(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	const size = 3<<20 + 12345
	s.AddFile(geminifake.File{Name: "files/big", Size: size, Seed: 42})
	p := newPoller(t, testConfig(s, &sleeps{}))
	h := sha256.New()
	n, err := p.Download(context.Background(), "files/big", hashWriter{h})
	if err != nil || n != size {
		t.Fatalf("Download = %d, %v; want %d bytes", n, err, size)
	}
	if [32]byte(h.Sum(nil)) != sum(geminifake.Content(42, size)) {
		t.Errorf("the downloaded bytes differ from the file")
	}
	r := s.Requests()
	if len(r) != 1 || r[0].Path != "/v1beta/files/big:download" || r[0].Query.Get("alt") != "media" || r[0].Header.Get("x-goog-api-key") != testKey {
		t.Errorf("requests %+v", r)
	}
	if c := counts(s); c.Download != 1 || c.total() != 1 {
		t.Errorf("counts %+v", c)
	}
	// A bare id names the same file.
	var buf bytes.Buffer
	s.AddFile(geminifake.File{Name: "files/small", Data: []byte("{\"x\":1}\n")})
	if n, err := p.Download(context.Background(), "small", &buf); err != nil || n != 8 || buf.String() != "{\"x\":1}\n" {
		t.Errorf("bare id: %d %v %q", n, err, buf.String())
	}
}

// signalWriter reports when it has received at least n bytes.
type signalWriter struct {
	mu   sync.Mutex
	n    int64
	at   int64
	once sync.Once
	got  chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.n += int64(len(p))
	reached := w.n >= w.at
	w.mu.Unlock()
	if reached {
		w.once.Do(func() { close(w.got) })
	}
	return len(p), nil
}

// The body reaches the writer as it arrives: with the server holding the
// rest of the file, the first part is already written. (A transport that
// buffered the body would write nothing until the end.)
func TestDownloadStreamsBeforeTheEnd(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	s.AddFile(geminifake.File{Name: "files/held", Size: 1 << 20, Seed: 1, StallAfter: 300_000})
	p := newPoller(t, testConfig(s, &sleeps{}))
	w := &signalWriter{at: 300_000, got: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := p.Download(context.Background(), "files/held", w)
		done <- err
	}()
	select {
	case <-w.got:
	case err := <-done:
		t.Fatalf("Download ended while the server held the file: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the first 300000 bytes never reached the writer while the server held the rest")
	}
	for deadline := time.Now().Add(20 * time.Second); s.Stalled() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server is not holding the download")
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Download ended while the server held the file: %v", err)
	default:
	}
	s.Unstall("files/held")
	if err := <-done; err != nil || w.n != 1<<20 {
		t.Errorf("after Unstall: %v, %d bytes", err, w.n)
	}
}

// A 32 MiB download allocates far less than the file: one buffer, however
// large the file.
func TestDownloadMemoryFlat(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	const size = 32 << 20
	s.AddFile(geminifake.File{Name: "files/big", Size: size, Seed: 1})
	p := newPoller(t, testConfig(s, &sleeps{}))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := p.Download(context.Background(), "files/big", io.Discard)
	runtime.ReadMemStats(&after)
	if err != nil || n != size {
		t.Fatal(n, err)
	}
	// The whole process, the fake's side included.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("downloading 32 MiB allocated %d MiB", alloc>>20)
	}
}

// Refusals before the body are retried as for every request, honouring the
// server's delay; a 404 is ErrNotFound, a denied file after a probe too, a
// wrong key ErrAuth.
func TestDownloadRetriesAndErrors(t *testing.T) {
	s := startFake(t, geminifake.Options{}, getBatches()...)
	s.AddFile(geminifake.File{Name: "files/f", Size: 10_000, Seed: 5})
	sl := &sleeps{}
	cfg := testConfig(s, sl)
	cfg.MaxRetries = 2
	p := newPoller(t, cfg)

	s.InjectFault(geminifake.Fault{Status: 503, RetryAfter: "2"})
	var buf bytes.Buffer
	if n, err := p.Download(context.Background(), "files/f", &buf); err != nil || n != 10_000 {
		t.Fatalf("after one 503: %d, %v", n, err)
	}
	if d := sl.all(); len(d) != 1 || d[0] != 2*time.Second {
		t.Errorf("waits %v, want [2s]", d)
	}
	if c := counts(s); c.Download != 2 {
		t.Errorf("download requests %d, want 2", c.Download)
	}

	storm := geminifake.Fault{Status: 429, RetryDelay: 9 * time.Second}
	s.InjectFault(storm, storm, storm)
	_, err := p.Download(context.Background(), "files/f", io.Discard)
	var te *TransientError
	if !errors.As(err, &te) || te.Status != 429 || te.RetryAfter != 9*time.Second {
		t.Errorf("429 storm: %v", err)
	}

	if _, err = p.Download(context.Background(), "files/none", io.Discard); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown file: %v", err)
	}
	s.Deny("files/f")
	if _, err = p.Download(context.Background(), "files/f", io.Discard); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "another project") {
		t.Errorf("denied file: %v", err)
	}
	s.Allow("files/f")
	cfg.APIKey = "wrong"
	s2 := startFake(t, geminifake.Options{APIKey: "right"})
	cfg.BaseURL = s2.URL()
	if _, err = newPoller(t, cfg).Download(context.Background(), "files/f", io.Discard); !errors.Is(err, ErrAuth) {
		t.Errorf("wrong key: %v", err)
	}
	for _, bad := range []string{"files/", "files/a/b", "files/a?b", "files/..", "files/%41"} {
		if _, err = p.Download(context.Background(), bad, io.Discard); !errors.Is(err, ErrInvalidName) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	cfg = testConfig(s, sl)
	cfg.Backend, cfg.Project, cfg.Location = BackendVertex, "123", "us-central1"
	if _, err = newPoller(t, cfg).Download(context.Background(), "files/f", io.Discard); !errors.Is(err, ErrInvalidName) {
		t.Errorf("vertex: %v", err)
	}
}

// A body that stops arriving fails after RequestTimeout without data, as a
// transient error that says how far it got; a slow writer is not a stalled
// body (the timer runs only while waiting for data); a write error comes
// back as it is, not as transient.
func TestDownloadStallsAndWriteErrors(t *testing.T) {
	t.Parallel()
	s := startFake(t, geminifake.Options{}, getBatches()...)
	s.AddFile(geminifake.File{Name: "files/stuck", Size: 100_000, Seed: 1, StallAfter: 10_000})
	cfg := testConfig(s, &sleeps{})
	cfg.RequestTimeout = 200 * time.Millisecond
	p := newPoller(t, cfg)
	var buf bytes.Buffer
	n, err := p.Download(context.Background(), "files/stuck", &buf)
	if !errors.Is(err, ErrTransient) || n != 10_000 || !strings.Contains(err.Error(), "no data received for 200ms") {
		t.Errorf("stalled body: %d bytes, %v", n, err)
	}

	s.AddFile(geminifake.File{Name: "files/f", Size: 1 << 20, Seed: 2})
	slow := &slowWriter{delay: 500 * time.Millisecond, times: 1}
	if n, err = p.Download(context.Background(), "files/f", slow); err != nil || n != 1<<20 {
		t.Errorf("a write of 500ms (RequestTimeout 200ms): %d, %v", n, err)
	}

	full := errorWriter{after: 50_000, err: syscall.ENOSPC}
	n, err = p.Download(context.Background(), "files/f", &full)
	if !errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrTransient) || n != 50_000 {
		t.Errorf("writer error: %d, %v", n, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.AddFile(geminifake.File{Name: "files/held", Size: 100_000, Seed: 1, StallAfter: 1000})
	cfg.RequestTimeout = time.Minute
	p = newPoller(t, cfg)
	go func() {
		for s.Stalled() == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err = p.Download(ctx, "files/held", io.Discard); !errors.Is(err, ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled mid-body: %v", err)
	}
}

type slowWriter struct {
	delay time.Duration
	times int
	n     int64
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if w.times > 0 {
		w.times--
		time.Sleep(w.delay)
	}
	w.n += int64(len(p))
	return len(p), nil
}

type errorWriter struct {
	after int64
	n     int64
	err   error
}

func (w *errorWriter) Write(p []byte) (int, error) {
	if room := w.after - w.n; int64(len(p)) > room {
		w.n += room
		return int(room), w.err
	}
	w.n += int64(len(p))
	return len(p), nil
}

// Redirects are followed; the API key goes along to the same host only.
func TestDownloadRedirectDropsKeyAcrossHosts(t *testing.T) {
	target := geminifake.New(geminifake.Options{}) // no key check: the test looks at what arrives
	if _, err := target.Start(""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	target.AddFile(geminifake.File{Name: "files/r", Data: []byte("data\n")})
	tu, _ := url.Parse(target.URL())
	other := "http://localhost:" + tu.Port() // the same server under another host name
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other+r.URL.RequestURI(), http.StatusFound)
	}))
	t.Cleanup(redirector.Close)
	cfg := testConfig(target, &sleeps{})
	cfg.BaseURL = redirector.URL + "/"
	var buf bytes.Buffer
	if _, err := newPoller(t, cfg).Download(context.Background(), "files/r", &buf); err != nil || buf.String() != "data\n" {
		t.Fatalf("through a redirect: %q, %v", buf.String(), err)
	}
	r := target.Requests()
	if len(r) != 1 || r[0].Header.Get("x-goog-api-key") != "" {
		t.Errorf("the key went along to another host: %+v", r)
	}
	// To the same host, it goes along.
	same := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/moved/") {
			http.StripPrefix("/moved", target).ServeHTTP(w, r)
			return
		}
		http.Redirect(w, r, "/moved"+r.URL.RequestURI(), http.StatusFound)
	}))
	t.Cleanup(same.Close)
	cfg.BaseURL = same.URL + "/"
	target.ResetRequests()
	if _, err := newPoller(t, cfg).Download(context.Background(), "files/r", io.Discard); err != nil {
		t.Fatal(err)
	}
	if r := target.Requests(); len(r) != 1 || r[0].Header.Get("x-goog-api-key") != testKey {
		t.Errorf("same-host redirect lost the key: %+v", r)
	}
	// A redirect loop decides nothing, and is not retried as transient.
	loop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.RequestURI(), http.StatusFound)
	}))
	t.Cleanup(loop.Close)
	cfg.BaseURL = loop.URL + "/"
	if _, err := newPoller(t, cfg).Download(context.Background(), "files/r", io.Discard); !errors.Is(err, ErrUnexpected) || errors.Is(err, ErrTransient) {
		t.Errorf("a redirect loop: %v", err)
	}
}

// ResultsOf finds the responses file, inlined responses (as the fake
// renders them, and embedding batches' field), the operation's response as
// a fallback, and Vertex's output location.
func TestResultsOf(t *testing.T) {
	s := startFake(t, geminifake.Options{}, append(getBatches(), geminifake.Batch{Name: "batches/inl", State: "SUCCEEDED",
		CreateTime: getAt, EndTime: getAt, InlinedResponses: []json.RawMessage{
			json.RawMessage(`{"response":{"candidates":[]},"metadata":{"key":"a"}}`), json.RawMessage(`{"error":{"code":3}}`)}})...)
	p := newPoller(t, testConfig(s, &sleeps{}))
	for name, want := range map[string]Results{
		"batches/ok":      {File: "files/out-ok"},
		"batches/failed":  {},
		"batches/running": {},
	} {
		op, err := getOne(t, p, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ResultsOf(op)
		if err != nil || got.File != want.File || got.HasInlined || got.Location != "" {
			t.Errorf("%s: %+v, %v", name, got, err)
		}
	}
	op, err := getOne(t, p, "batches/inl")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ResultsOf(op)
	if err != nil || !got.HasInlined || len(got.Inlined) != 2 || got.File != "" || !strings.Contains(string(got.Inlined[1]), `"code":3`) {
		t.Errorf("inlined: %+v, %v", got, err)
	}
	for raw, want := range map[string]Results{
		`{"name":"batches/e","metadata":{"output":{"inlinedEmbedContentResponses":{"inlinedResponses":[{"response":{"embedding":{}}}]}}}}`: {HasInlined: true},
		`{"name":"batches/r","response":{"responsesFile":"files/from-response"}}`:                                                          {File: "files/from-response"},
		`{"name":"batches/z","metadata":{"output":{"inlinedResponses":{"inlinedResponses":[]}}}}`:                                          {HasInlined: true},
		`{"name":"p/1","outputInfo":{"gcsOutputDirectory":"gs://b/out/prediction-1"}}`:                                                     {Location: "gs://b/out/prediction-1"},
		`{"name":"p/2","outputInfo":{"bigqueryOutputDataset":"bq://proj.ds","bigqueryOutputTable":"predictions_2025"}}`:                    {Location: "bq://proj.ds.predictions_2025"},
		`{"name":"p/3","state":"JOB_STATE_FAILED"}`:                                                                                        {},
	} {
		got, err := ResultsOf(Operation{Raw: json.RawMessage(raw)})
		if err != nil || got.File != want.File || got.HasInlined != want.HasInlined || got.Location != want.Location {
			t.Errorf("%s: %+v, %v", raw, got, err)
		}
	}
	if _, err := ResultsOf(Operation{Raw: json.RawMessage(`[1]`)}); err == nil {
		t.Errorf("a raw array: no error")
	}
	if _, err := ResultsOf(Operation{Raw: json.RawMessage(`{"metadata":{"output":{"responsesFile":7}}}`)}); err == nil {
		t.Errorf("a number for responsesFile: no error")
	}
}
