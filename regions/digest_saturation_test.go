package regions

import (
	"errors"
	"math"
	"testing"
)

// Saturation travels unclamped (an oversubscribed pool says by how much),
// with the pods it was computed over; a digest encoded before these fields
// existed still decodes, as unknown saturation.
func TestDigestSaturation(t *testing.T) {
	in := sampleDigest()
	in.Saturation, in.FreshPods, in.StalePods = 1.37, 8, 2
	b, out := roundTrip(t, in)
	if math.Abs(out.Saturation-in.Saturation) > 1.0/fracScale || out.FreshPods != 8 || out.StalePods != 2 {
		t.Errorf("saturation %v fresh %d stale %d; want 1.37, 8, 2", out.Saturation, out.FreshPods, out.StalePods)
	}

	// The old encoding ends at Produced: drop the three trailing uvarints
	// (1.37 × 65,535 takes 3 bytes, 8 and 2 one each).
	var old Digest
	if err := old.UnmarshalBinary(b[:len(b)-5]); err != nil {
		t.Fatalf("digest without saturation: %v", err)
	}
	if old.Saturation != 0 || old.FreshPods != 0 || !old.Produced.Equal(in.Produced) {
		t.Errorf("old digest decoded as saturation %v fresh %d produced %v", old.Saturation, old.FreshPods, old.Produced)
	}

	for _, bad := range []float64{-0.1, math.NaN(), math.Inf(1), maxSaturation + 1} {
		d := sampleDigest()
		d.Saturation = bad
		if _, err := d.AppendBinary(nil); !errors.Is(err, ErrInvalidDigest) {
			t.Errorf("saturation %v: err %v, want ErrInvalidDigest", bad, err)
		}
	}
}
