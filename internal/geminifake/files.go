package geminifake

// Results of batches: files served at GET /v1beta/files/{id}:download?alt=media
// (generated, so a file of any size costs no memory), names answered with
// 403 (batches or files of another project), and a batch's state as a get
// sees it apart from what the list shows.

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// File is a file the fake serves for download. A batch names it in
// ResponsesFile.
type File struct {
	// Name is "files/<id>".
	Name string
	// Data, when non-nil, is the content. Otherwise the content is Size
	// bytes generated from Seed by Content, never held in memory.
	Data []byte
	Size int64
	Seed uint64
	// BytesPerSecond, when > 0, paces the body (flushed as it goes), so a
	// test can act while a download is under way.
	BytesPerSecond int64
	// StallAfter, when > 0, sends (and flushes) this many bytes and then
	// holds the response until the client goes away or Unstall is called:
	// a download stopped mid-transfer at a known point.
	StallAfter int64
	// Unframed sends the body without Content-Length or chunked framing,
	// ended by closing the connection (HTTP/1.0 style, as some proxies
	// do): the client cannot tell the end of the file from a dropped
	// connection.
	Unframed bool
	// CutAfter, when > 0, closes the connection after this many bytes of
	// the body: a connection dropped mid-transfer (with Unframed, one that
	// looks like the end of the file).
	CutAfter int64
}

// extraState is what files.go keeps on a Server (under Server.mu); the
// zero value is empty.
type extraState struct {
	files    map[string]*fileEntry
	denied   map[string]bool
	getState map[string]string
	stalled  int
}

type fileEntry struct {
	f       File
	release chan struct{} // closed by Unstall
}

// AddFile adds a file, or replaces the one with the same name (downloads
// already under way finish with the old one).
func (s *Server) AddFile(f File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.extra.files == nil {
		s.extra.files = map[string]*fileEntry{}
	}
	s.extra.files[f.Name] = &fileEntry{f: f, release: make(chan struct{})}
}

// Unstall releases the downloads of a file held by StallAfter and lets
// later downloads run to the end.
func (s *Server) Unstall(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.extra.files[name]; ok && e.f.StallAfter > 0 {
		close(e.release)
		f := e.f
		f.StallAfter = 0
		s.extra.files[name] = &fileEntry{f: f, release: make(chan struct{})}
	}
}

// Stalled returns how many downloads StallAfter holds right now.
func (s *Server) Stalled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.extra.stalled
}

// Deny makes a get of this batch name, or a download of this file name,
// answer 403 PERMISSION_DENIED (as for a batch of another project), whether
// or not the fake holds it. Lists are not affected. Allow undoes it.
func (s *Server) Deny(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.extra.denied == nil {
		s.extra.denied = map[string]bool{}
	}
	s.extra.denied[name] = true
}

// Allow undoes Deny.
func (s *Server) Allow(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.extra.denied, name)
}

// SetGetState makes a get of the batch answer with this state while the
// list keeps showing the batch's own (SetState changes both): the API as
// it is seen now against a listing read a moment earlier. "" removes it.
func (s *Server) SetGetState(name, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if state == "" {
		delete(s.extra.getState, name)
		return
	}
	if s.extra.getState == nil {
		s.extra.getState = map[string]string{}
	}
	s.extra.getState[name] = state
}

// Count returns how many recorded requests had this method and path (the
// decoded URL path, e.g. "/v1beta/batches/abc").
func (s *Server) Count(method, path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.requests {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}

func (s *Server) writeDenied(w http.ResponseWriter, name string) {
	writeError(w, http.StatusForbidden, "The caller does not have permission to access "+name+" (or it may not exist).")
}

// getBatch answers a get: 403 for a denied name, 404 for an unknown one,
// else the batch (with the state SetGetState gave, if any).
func (s *Server) getBatch(w http.ResponseWriter, name string, render func(Batch) any) {
	s.mu.Lock()
	denied := s.extra.denied[name]
	e, ok := s.byName[name]
	var v any
	if ok && !denied {
		b := e.b
		if st, over := s.extra.getState[name]; over {
			b.State = st
		}
		v = render(b)
	}
	s.mu.Unlock()
	switch {
	case denied:
		s.writeDenied(w, name)
	case !ok:
		writeError(w, http.StatusNotFound, "Requested entity was not found.")
	default:
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		_ = json.NewEncoder(w).Encode(v)
	}
}

// defaultFileLines is the content of a responses file the test did not add:
// one line per request the batch counted (at least one).
func defaultFile(b Batch) File {
	h := fnv.New64a()
	h.Write([]byte(b.ResponsesFile))
	return File{Name: b.ResponsesFile, Seed: h.Sum64(), Size: max(b.RequestCount, 1) * LineSize}
}

// serveFile answers GET /v1beta/files/{id}:download?alt=media, and
// files.get (GET /v1beta/files/{id}: the File resource's name, sizeBytes
// and mimeType).
func (s *Server) serveFile(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutSuffix(strings.TrimPrefix(r.URL.Path, "/v1beta/files/"), ":download")
	if !ok && id != "" && !strings.Contains(id, "/") && !strings.Contains(id, ":") {
		s.serveFileGet(w, r, "files/"+id)
		return
	}
	if !ok || id == "" || strings.Contains(id, "/") {
		writeError(w, http.StatusNotFound, "geminifake: no such path "+r.URL.Path+" (only files/{id}:download is served)")
		return
	}
	if !s.checkKey(w, r, false) {
		return
	}
	if r.URL.Query().Get("alt") != "media" {
		writeError(w, http.StatusBadRequest, "geminifake: only alt=media downloads are served")
		return
	}
	name := "files/" + id
	e, ok := s.fileFor(w, name)
	if !ok {
		return
	}
	f := e.f
	var body io.Reader
	size := f.Size
	if f.Data != nil {
		body, size = bytes.NewReader(f.Data), int64(len(f.Data))
	} else {
		body = Content(f.Seed, f.Size)
	}
	if f.Unframed || f.CutAfter > 0 {
		s.serveRaw(w, f, body, size)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	ctx := r.Context()
	chunk := int64(32 << 10)
	if f.BytesPerSecond > 0 {
		chunk = min(chunk, max(f.BytesPerSecond/50, 1))
	}
	buf := make([]byte, chunk)
	start := time.Now()
	var sent int64
	for sent < size {
		want := min(chunk, size-sent)
		if f.StallAfter > 0 && sent < f.StallAfter {
			want = min(want, f.StallAfter-sent)
		}
		n, err := io.ReadFull(body, buf[:want])
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			sent += int64(n)
		}
		if err != nil {
			return
		}
		if f.BytesPerSecond > 0 {
			flush()
			due := start.Add(time.Duration(float64(sent) / float64(f.BytesPerSecond) * float64(time.Second)))
			if !sleepUntil(ctx, due) {
				return
			}
		}
		if f.StallAfter > 0 && sent == f.StallAfter && sent < size {
			flush()
			s.mu.Lock()
			s.extra.stalled++
			s.mu.Unlock()
			select {
			case <-e.release:
			case <-ctx.Done():
			}
			s.mu.Lock()
			s.extra.stalled--
			s.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
		}
	}
}

// serveRaw writes a download on the hijacked connection: the head (with
// Content-Length unless f.Unframed), then the body up to f.CutAfter bytes
// (all of it when 0), then closes the connection.
func (s *Server) serveRaw(w http.ResponseWriter, f File, body io.Reader, size int64) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, http.StatusInternalServerError, "geminifake: cannot hijack the connection")
		return
	}
	conn, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n"
	if !f.Unframed {
		head += "Content-Length: " + strconv.FormatInt(size, 10) + "\r\n"
	}
	_, _ = buf.WriteString(head + "\r\n")
	n := size
	if f.CutAfter > 0 {
		n = min(n, f.CutAfter)
	}
	_, _ = io.CopyN(buf, body, n)
	_ = buf.Flush()
}

// fileFor looks up the file name for a download or files.get: an added
// file, else, for a file a batch names that the test did not add, a small
// default. It answers the request itself (403 for a denied file, 404 for an
// unknown one) and returns false when it did.
func (s *Server) fileFor(w http.ResponseWriter, name string) (*fileEntry, bool) {
	s.mu.Lock()
	denied := s.extra.denied[name]
	e, ok := s.extra.files[name]
	if !ok {
		for _, be := range s.byName {
			if be.b.ResponsesFile == name {
				e, ok = &fileEntry{f: defaultFile(be.b), release: make(chan struct{})}, true
				break
			}
		}
	}
	s.mu.Unlock()
	switch {
	case denied:
		s.writeDenied(w, name)
		return nil, false
	case !ok:
		writeError(w, http.StatusNotFound, "Requested entity was not found.")
		return nil, false
	}
	return e, true
}

// serveFileGet answers files.get with the File resource's fields a client
// of the results needs: name, sizeBytes (an int64, so a JSON string) and
// mimeType.
func (s *Server) serveFileGet(w http.ResponseWriter, r *http.Request, name string) {
	if !s.checkKey(w, r, false) {
		return
	}
	e, ok := s.fileFor(w, name)
	if !ok {
		return
	}
	size := e.f.Size
	if e.f.Data != nil {
		size = int64(len(e.f.Data))
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"name": name, "mimeType": "application/jsonl", "sizeBytes": strconv.FormatInt(size, 10), "state": "ACTIVE",
	})
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// LineSize is the length of every line of generated content but the last.
const LineSize = 1024

// Content returns the generated content of a file: size bytes of JSONL,
// the same for the same seed and size, produced as it is read (memory stays
// flat whatever the size). Every line is a batch result the way a
// responses file holds one —
//
//	{"key":"request-0000000001","response":{"candidates":[{"content":{"parts":[{"text":"…"}],"role":"model"},"finishReason":"STOP"}]}}
//
// with text drawn from the seed (a window, chosen per line, of 64 KiB of
// letters and spaces drawn from the seed) and sized so that each line,
// newline included, is LineSize bytes; the last line takes up the remainder (it is
// longer, up to 2×LineSize−1, when the remainder is too short for a line of
// its own). A size smaller than the shortest line gives a prefix of one.
func Content(seed uint64, size int64) io.Reader {
	return &content{seed: seed, size: size}
}

const (
	linePrefix = `{"key":"request-`
	lineMid    = `","response":{"candidates":[{"content":{"parts":[{"text":"`
	lineSuffix = `"}],"role":"model"},"finishReason":"STOP"}]}}` + "\n"
	keyDigits  = 10
	minLine    = int64(len(linePrefix) + keyDigits + len(lineMid) + len(lineSuffix))
)

type content struct {
	seed uint64
	size int64
	pos  int64  // bytes produced
	line int64  // index of the line in buf
	buf  []byte // the current line
	off  int    // read offset in buf
	// table holds letters and spaces drawn from the seed; each line's text
	// is a window of it (copying is faster than drawing every byte).
	table []byte
}

const tableSize = 64 << 10 // more than the longest line's text (2×LineSize)

// textTable draws tableSize letters and spaces from a seed: never a byte
// JSON escapes.
func textTable(seed uint64) []byte {
	t := make([]byte, tableSize)
	x := seed
	for i := 0; i < len(t); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := splitmix(x)
		for j := 0; j < 8; j++ {
			if c := byte(z >> (8 * j)); c%6 == 0 {
				t[i+j] = ' '
			} else {
				t[i+j] = 'a' + c%26
			}
		}
	}
	return t
}

// splitmix is splitmix64's output function.
func splitmix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// lineLen returns the length of line i of a file of this size.
func (c *content) lineLen(i int64) int64 {
	n := c.size / LineSize // whole lines
	rem := c.size % LineSize
	switch {
	case n == 0:
		return c.size
	case rem >= minLine:
		if i < n {
			return LineSize
		}
		return rem
	case i < n-1:
		return LineSize
	}
	return LineSize + rem
}

func (c *content) Read(p []byte) (int, error) {
	if c.pos >= c.size {
		return 0, io.EOF
	}
	total := 0
	for len(p) > 0 && c.pos < c.size {
		if c.off >= len(c.buf) {
			if c.buf != nil {
				c.line++
			}
			c.fill()
		}
		n := copy(p, c.buf[c.off:])
		c.off += n
		c.pos += int64(n)
		p = p[n:]
		total += n
	}
	return total, nil
}

// fill renders line c.line into c.buf.
func (c *content) fill() {
	l := int(c.lineLen(c.line))
	b := c.buf[:0]
	b = append(b, linePrefix...)
	var digits [20]byte
	k := strconv.AppendInt(digits[:0], c.line+1, 10)
	for i := len(k); i < keyDigits; i++ {
		b = append(b, '0')
	}
	b = append(b, k...)
	b = append(b, lineMid...)
	if text := l - int(minLine); text > 0 {
		if c.table == nil {
			c.table = textTable(c.seed)
		}
		// A window of the seed's table, chosen per line.
		at := splitmix(c.seed^uint64(c.line)*0x9e3779b97f4a7c15) % uint64(len(c.table)-text)
		b = append(b, c.table[at:at+uint64(text)]...)
	}
	b = append(b, lineSuffix...)
	if len(b) > l { // a file shorter than one line: a prefix of it
		b = b[:l]
	}
	c.buf, c.off = b, 0
}
