package sqlite

import (
	"fmt"
	"testing"
)

func TestDoneCacheBounded(t *testing.T) {
	c := newDoneCache(3)
	for i := range 5 {
		c.add(fmt.Sprint(i), doneInfo{firstSource: "poll"})
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, got := c.get(fmt.Sprint(i)); got != want {
			t.Fatalf("get(%q) = %v, want %v (oldest entries evicted first)", fmt.Sprint(i), got, want)
		}
	}
	if len(c.m) != 3 {
		t.Fatalf("cache holds %d keys, want 3", len(c.m))
	}
	c.reset()
	if _, ok := c.get("4"); ok {
		t.Fatal("get after reset found a key")
	}
	off := newDoneCache(-1)
	off.add("k", doneInfo{})
	if _, ok := off.get("k"); ok {
		t.Fatal("a disabled cache kept a key")
	}
}

func TestStatBufferMerges(t *testing.T) {
	b := newStatBuffer()
	b.add("k", sightingDelta{source: "poll", now: 10})
	b.add("k", sightingDelta{source: "webhook", now: 5, conflict: true})
	b.add("k", sightingDelta{source: "poll", now: 7})
	d, ok := b.peek("k")
	if !ok || d.seen != 3 || d.last != 10 || d.conflicts != 1 || len(d.sources) != 2 {
		t.Fatalf("peek = %+v, %v; want 3 seen, last 10, 1 conflict, 2 sources", d, ok)
	}
	m := b.take()
	if b.len() != 0 || len(m) != 1 {
		t.Fatalf("take left %d, returned %d", b.len(), len(m))
	}
	b.add("k", sightingDelta{source: "poll", now: 20})
	b.putBack(m)
	if d, _ := b.peek("k"); d.seen != 4 || d.last != 20 {
		t.Fatalf("after putBack = %+v, want 4 seen, last 20", d)
	}
}
