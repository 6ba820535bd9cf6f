package disksync

import "testing"

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
