// Package commitcost measures what a durable commit costs: for an SQLite
// sink, the WAL frames (pages) each commit appends, by table and index, the
// WAL bytes per commit and the checkpoints; for any sink, the sequential
// new-completion and duplicate rates; and the seed document's own sink
// (../shared/bench/seed000_sink.py) on the same disk. Its command,
// internal/commitcost/cmd, prints BENCHMARKS.md's table of issue 17.
package commitcost

import (
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sort"
	"strings"
)

// WAL header and frame header sizes (https://sqlite.org/fileformat.html#walformat).
const (
	walHeaderSize = 32
	frameHeader   = 24
)

// Frame is one WAL frame: a page image appended by a write transaction.
type Frame struct {
	Page   uint32 // page number in the database file
	Commit bool   // the last frame of a commit (it records the database size)
}

// WAL reads the frames an SQLite database's write-ahead log gains. It reads
// the -wal file beside the database with ordinary reads, without locks: it
// is a measuring instrument for a file whose writer is in the same process
// and idle between calls (call Read after each operation returned).
type WAL struct {
	path     string
	pageSize int64
	salt     [8]byte
	next     int64 // index of the next frame to read in the current generation
	restarts int
}

// OpenWAL positions a reader at the current end of dbPath's WAL: Read
// returns only frames appended from now on.
func OpenWAL(dbPath string) (*WAL, error) {
	w := &WAL{path: dbPath + "-wal"}
	if _, err := w.Read(); err != nil {
		return nil, err
	}
	w.restarts = 0
	return w, nil
}

// Restarts is how often the WAL started again from its beginning since
// OpenWAL: each restart follows a checkpoint that copied every frame into
// the database file.
func (w *WAL) Restarts() int { return w.restarts }

// PageSize is the database's page size as the WAL header records it (0
// before the first frame).
func (w *WAL) PageSize() int64 { return w.pageSize }

// FrameBytes is the size of one frame in the WAL: its header and a page.
func (w *WAL) FrameBytes() int64 { return frameHeader + w.pageSize }

// Read returns the frames appended since the last Read (or OpenWAL).
func (w *WAL) Read() ([]Frame, error) {
	f, err := os.Open(w.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var h [walHeaderSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil // empty WAL: nothing written yet
		}
		return nil, err
	}
	if m := binary.BigEndian.Uint32(h[0:4]); m != 0x377f0682 && m != 0x377f0683 {
		return nil, fmt.Errorf("commitcost: %s: not a WAL (magic %#x)", w.path, m)
	}
	w.pageSize = int64(binary.BigEndian.Uint32(h[8:12]))
	if w.pageSize == 1 {
		w.pageSize = 65536
	}
	var salt [8]byte
	copy(salt[:], h[16:24])
	if salt != w.salt {
		if w.salt != ([8]byte{}) {
			w.restarts++
		}
		w.salt, w.next = salt, 0
	}
	var out []Frame
	var fh [frameHeader]byte
	for {
		off := walHeaderSize + w.next*(frameHeader+w.pageSize)
		if _, err := f.ReadAt(fh[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		if [8]byte(fh[8:16]) != salt {
			return out, nil // a frame of an earlier generation: the end
		}
		out = append(out, Frame{Page: binary.BigEndian.Uint32(fh[0:4]), Commit: binary.BigEndian.Uint32(fh[4:8]) != 0})
		w.next++
	}
}

// Btrees maps each page of the database at dbPath to the table or index
// whose b-tree holds it (SQLite's dbstat table, read through the WAL). Page
// 1 holds the database header and sqlite_schema.
func Btrees(dbPath string) (map[uint32]string, error) {
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: dbPath}).EscapedPath(), RawQuery: "mode=ro"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query(`SELECT name, pageno FROM dbstat`)
	if err != nil {
		return nil, fmt.Errorf("commitcost: dbstat: %w", err)
	}
	defer rows.Close()
	m := map[uint32]string{}
	for rows.Next() {
		var name string
		var pg uint32
		if err := rows.Scan(&name, &pg); err != nil {
			return nil, err
		}
		m[pg] = name
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if _, ok := m[1]; ok {
		m[1] = "page 1 (header, sqlite_schema)"
	}
	return m, nil
}

// Tally counts the frames of one kind of commit.
type Tally struct {
	Commits int
	Frames  int
	// Pages counts frames by page number (resolved to b-trees by ByBtree).
	Pages map[uint32]int
}

// Add counts frames (one operation's).
func (t *Tally) Add(fs []Frame) {
	if t.Pages == nil {
		t.Pages = map[uint32]int{}
	}
	for _, f := range fs {
		t.Frames++
		t.Pages[f.Page]++
		if f.Commit {
			t.Commits++
		}
	}
}

// PerCommit is frames per commit.
func (t Tally) PerCommit() float64 {
	if t.Commits == 0 {
		return 0
	}
	return float64(t.Frames) / float64(t.Commits)
}

// BtreeShare is one b-tree's frames per commit.
type BtreeShare struct {
	Name      string
	PerCommit float64
}

// ByBtree is frames per commit by b-tree, most first; pages no b-tree holds
// now are "(free list or since freed)".
func (t Tally) ByBtree(btrees map[uint32]string) []BtreeShare {
	n := map[string]int{}
	for pg, c := range t.Pages {
		name, ok := btrees[pg]
		if !ok {
			name = "(free list or since freed)"
		}
		n[name] += c
	}
	var out []BtreeShare
	for name, c := range n {
		out = append(out, BtreeShare{Name: name, PerCommit: float64(c) / float64(max(t.Commits, 1))})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerCommit != out[j].PerCommit {
			return out[i].PerCommit > out[j].PerCommit
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// FormatShares writes shares as "name 1.00, name 0.50".
func FormatShares(shares []BtreeShare) string {
	var b strings.Builder
	for i, s := range shares {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f", s.Name, s.PerCommit)
	}
	return b.String()
}
