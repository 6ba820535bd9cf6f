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

func TestProbe(t *testing.T) {
	for _, p := range []Probe{{Bytes: 128}, {Bytes: 16 << 10}} {
		dir := t.TempDir()
		r, err := p.Run(dir, 0, 10)
		if err != nil {
			t.Fatalf("%v: %v", p, err)
		}
		if r.Syncs != 10 || r.Rate() <= 0 {
			t.Errorf("%v: %+v, want 10 syncs at a positive rate", p, r)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%v left %d files behind", p, len(left))
		}
	}
	if r, err := (Probe{Bytes: 128}).Run(t.TempDir(), 30*time.Millisecond, 0); err != nil || r.Syncs == 0 || r.Elapsed < 30*time.Millisecond {
		t.Errorf("Probe for 30ms = %+v, %v; want some syncs over at least 30ms", r, err)
	}
	if _, err := (Probe{}).Run(t.TempDir(), 0, 1); err == nil {
		t.Errorf("Probe of 0 bytes = nil error")
	}
}
