package disksync

import (
	"os"
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	r, err := Rate(t.TempDir(), 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	if r.Syncs != 20 || r.Rate() <= 0 {
		t.Errorf("Rate(20) = %+v, want 20 syncs at a positive rate", r)
	}
	if _, err := Rate(t.TempDir(), 0, 0); err == nil {
		t.Errorf("Rate unbounded = nil error")
	}
}

func TestMedian(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct {
		each []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5 * us}, 5 * us},
		{[]time.Duration{9 * us, 1 * us, 4 * us}, 4 * us},
		{[]time.Duration{9 * us, 1 * us, 4 * us, 6 * us}, 5 * us},
	} {
		r := Result{Each: c.each}
		if got := r.Median(); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.each, got, c.want)
		}
	}
	r := Result{Each: []time.Duration{3 * us, 1 * us, 2 * us}}
	r.Median()
	if r.Each[0] != 3*us {
		t.Errorf("Median reordered Each: %v", r.Each)
	}
}

func TestProbe(t *testing.T) {
	for _, p := range []Probe{{Bytes: 128}, {Bytes: 16 << 10}, {Bytes: 4096, Overwrite: true, RingBytes: 3 * 4096}} {
		dir := t.TempDir()
		r, err := p.Run(dir, 0, 10)
		if err != nil {
			t.Fatalf("%v: %v", p, err)
		}
		if r.Syncs != 10 || r.Rate() <= 0 {
			t.Errorf("%v: %+v, want 10 syncs at a positive rate", p, r)
		}
		if len(r.Each) != 10 || r.Median() <= 0 || r.Median() > r.Elapsed {
			t.Errorf("%v: %d times, median %v of %v in all; want 10, a positive median within the total", p, len(r.Each), r.Median(), r.Elapsed)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%v left %d files behind", p, len(left))
		}
	}
	if _, err := (Probe{}).Run(t.TempDir(), 0, 1); err == nil {
		t.Errorf("Probe of 0 bytes = nil error")
	}
}
