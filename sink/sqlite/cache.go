package sqlite

import (
	"bytes"
	"slices"
	"sync"
)

// doneInfo is what a duplicate of a done key needs: the first sighting's
// source (a later webhook body of a poll-first key is kept), whether it is
// confirmed (a sighting from the API confirms it once) and its batch state
// (to tell a conflict, spec §9.4).
type doneInfo struct {
	firstSource string
	confirmed   bool
	batchState  string
}

// doneCache is a bounded set of keys known to be done. Done is final (only
// Purge removes such a row), so an entry never goes stale in a way that could
// start an effect: at worst a purged key's re-sighting is counted as a
// duplicate by this process.
type doneCache struct {
	mu   sync.Mutex
	size int
	m    map[string]doneInfo
	ring []string // insertion order, for FIFO eviction
	next int
}

func newDoneCache(size int) *doneCache {
	if size < 0 {
		size = 0
	}
	return &doneCache{size: size, m: make(map[string]doneInfo)}
}

func (c *doneCache) get(key string) (doneInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.m[key]
	return i, ok
}

func (c *doneCache) add(key string, info doneInfo) {
	if c.size == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		return
	}
	if len(c.ring) < c.size {
		c.ring = append(c.ring, key)
	} else {
		delete(c.m, c.ring[c.next])
		c.ring[c.next] = key
		c.next = (c.next + 1) % c.size
	}
	c.m[key] = info
}

// update replaces what is cached of key, if anything is.
func (c *doneCache) update(key string, info doneInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		c.m[key] = info
	}
}

func (c *doneCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m = make(map[string]doneInfo)
	c.ring = nil
	c.next = 0
}

// delta is the not-yet-written sighting statistics of one key.
type delta struct {
	seen      int64
	last      int64 // latest sighting, unix ns
	sources   []string
	conflicts int64
	// webhook is a poll-first key's first webhook body (stored once, where
	// none is yet); verified: a sighting not only dynamically verified came,
	// so the key needs confirmation no more.
	webhook  []byte
	verified bool
}

func (d *delta) merge(o *delta) {
	d.seen += o.seen
	d.last = max(d.last, o.last)
	d.conflicts += o.conflicts
	if d.webhook == nil {
		d.webhook = o.webhook
	}
	d.verified = d.verified || o.verified
	for _, s := range o.sources {
		if !slices.Contains(d.sources, s) {
			d.sources = append(d.sources, s)
		}
	}
}

// statBuffer gathers duplicate sightings in memory until the writer commits.
type statBuffer struct {
	mu sync.Mutex
	m  map[string]*delta
}

func newStatBuffer() *statBuffer { return &statBuffer{m: make(map[string]*delta)} }

// sightingDelta is one duplicate sighting's contribution to a delta.
type sightingDelta struct {
	source   string
	now      int64
	conflict bool
	webhook  []byte // a webhook body to keep, or nil
	verified bool
}

func (b *statBuffer) add(key string, sd sightingDelta) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, ok := b.m[key]
	if !ok {
		cur = &delta{}
		b.m[key] = cur
	}
	cur.seen++
	cur.last = max(cur.last, sd.now)
	if !slices.Contains(cur.sources, sd.source) {
		cur.sources = append(cur.sources, sd.source)
	}
	if sd.conflict {
		cur.conflicts++
	}
	if cur.webhook == nil && sd.webhook != nil {
		cur.webhook = bytes.Clone(sd.webhook) // the caller's buffer may be reused
	}
	cur.verified = cur.verified || sd.verified
}

// take empties the buffer and returns what it held.
func (b *statBuffer) take() map[string]*delta {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.m) == 0 {
		return nil
	}
	m := b.m
	b.m = make(map[string]*delta)
	return m
}

// putBack returns deltas whose write failed.
func (b *statBuffer) putBack(m map[string]*delta) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, d := range m {
		if cur, ok := b.m[k]; ok {
			cur.merge(d)
		} else {
			b.m[k] = d
		}
	}
}

func (b *statBuffer) peek(key string) (delta, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.m[key]
	if !ok {
		return delta{}, false
	}
	c := *d
	c.sources = slices.Clone(d.sources)
	return c, true
}

func (b *statBuffer) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

// rowCacheSize bounds rowCache: the keys not done that were read since the
// last commit to the database.
const rowCacheSize = 10_000

// rowCache holds key rows as a read found them, each valid only while the
// WAL-index header still has the version it had when the row was read (see
// walIndex): as long as no connection of any process has committed since,
// the row is what a read would return now, exactly — not a guess about a
// state another process may have changed. So a duplicate of a key that is
// not done (a webhook redelivery, a poll pass seeing a pending key again)
// costs no read transaction until the next commit. It holds the rows of
// one version: the first look with a newer version empties it.
type rowCache struct {
	mu  sync.Mutex
	ver walVersion
	m   map[string]keyRow
}

func newRowCache() *rowCache { return &rowCache{m: make(map[string]keyRow)} }

// get returns key's row if it was read at version v (the header just read).
func (c *rowCache) get(key string, v walVersion) (keyRow, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v != c.ver {
		clear(c.m)
		c.ver = v
		return keyRow{}, false
	}
	r, ok := c.m[key]
	return r, ok
}

// put keeps r, read after the header had version v (see lookupKeyRow).
func (c *rowCache) put(key string, r keyRow, v walVersion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v != c.ver {
		clear(c.m)
		c.ver = v
	}
	if len(c.m) < rowCacheSize {
		c.m[key] = r
	}
}
