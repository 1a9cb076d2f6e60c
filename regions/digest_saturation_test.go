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

	// The old encoding ends at Produced: drop the six trailing uvarints
	// (1.37 × 65,535 takes 3 bytes, 8, 2 and the zeros of GateWaiting,
	// AdmitRate and GateMaxQueued one each).
	var old Digest
	if err := old.UnmarshalBinary(b[:len(b)-8]); err != nil {
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

// GateWaiting and AdmitRate came after saturation: they travel, and a
// digest encoded before them decodes with none waiting and no rate.
func TestDigestGateWaiting(t *testing.T) {
	in := sampleDigest()
	in.Saturation, in.FreshPods, in.GateWaiting, in.AdmitRate, in.GateMaxQueued = 0.4, 4, 300, 2.5, 1000
	b, out := roundTrip(t, in)
	if out.GateWaiting != 300 || out.AdmitRate != 2.5 || out.GateMaxQueued != 1000 {
		t.Errorf("gate waiting %d admit rate %v max queued %d; want 300, 2.5, 1000", out.GateWaiting, out.AdmitRate, out.GateMaxQueued)
	}
	var old Digest
	if err := old.UnmarshalBinary(b[:len(b)-6]); err != nil { // 300, 2,500 and 1,000 take two bytes each
		t.Fatalf("digest without gate waiting: %v", err)
	}
	if old.GateWaiting != 0 || old.AdmitRate != 0 || old.FreshPods != 4 {
		t.Errorf("old digest decoded as gate waiting %d admit rate %v fresh %d; want 0, 0, 4", old.GateWaiting, old.AdmitRate, old.FreshPods)
	}
	for _, bad := range []Digest{{GateWaiting: -1}, {AdmitRate: -1}, {AdmitRate: math.NaN()}, {AdmitRate: maxAdmitRate + 1}, {GateMaxQueued: -1}} {
		d := sampleDigest()
		d.GateWaiting, d.AdmitRate, d.GateMaxQueued = bad.GateWaiting, bad.AdmitRate, bad.GateMaxQueued
		if _, err := d.AppendBinary(nil); !errors.Is(err, ErrInvalidDigest) {
			t.Errorf("gate waiting %d admit rate %v: err %v, want ErrInvalidDigest", bad.GateWaiting, bad.AdmitRate, err)
		}
	}
}
