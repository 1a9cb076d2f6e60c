package regions

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
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
	// AdmitRate and GateMaxQueued one each) and the four empty fields of
	// the definition and what the pods serve.
	var old Digest
	if err := old.UnmarshalBinary(b[:len(b)-8-4]); err != nil {
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
	if err := old.UnmarshalBinary(b[:len(b)-6-4]); err != nil { // 300, 2,500 and 1,000 take two bytes each; then four empty fields
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

// The definition and what the pods serve came last: they travel, a digest
// encoded before them decodes with neither (nothing known), and their
// sizes are bounded.
func TestDigestDefinitionAndServed(t *testing.T) {
	in := sampleDigest()
	in.Definition = []string{"adapters=0a1b2c3d", "weights=deadbeef"}
	in.ServedAdapters = []string{"a1", "a2"}
	in.MaxModelLen = 131072
	in.ServedModels = []string{"llama@/models/llama-3.1-8b-v2"}
	b, out := roundTrip(t, in)
	if !slices.Equal(out.Definition, in.Definition) || !slices.Equal(out.ServedAdapters, in.ServedAdapters) || out.MaxModelLen != 131072 ||
		!slices.Equal(out.ServedModels, in.ServedModels) {
		t.Errorf("decoded definition %v served %v max len %d models %v", out.Definition, out.ServedAdapters, out.MaxModelLen, out.ServedModels)
	}
	// The encoding before them is the same digest's without them, less
	// their four empty fields (one byte each).
	before := in
	before.Definition, before.ServedAdapters, before.MaxModelLen, before.ServedModels = nil, nil, 0, nil
	pre, err := before.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	pre = pre[:len(pre)-4]
	if !bytes.HasPrefix(b, pre) {
		t.Fatal("the new fields do not trail the old encoding")
	}
	var old Digest
	if err := old.UnmarshalBinary(pre); err != nil {
		t.Fatalf("digest without definition: %v", err)
	}
	if old.Definition != nil || old.ServedAdapters != nil || old.MaxModelLen != 0 || old.ServedModels != nil || old.GateMaxQueued != in.GateMaxQueued {
		t.Errorf("old digest decoded as definition %v served %v max len %d", old.Definition, old.ServedAdapters, old.MaxModelLen)
	}
	for name, edit := range map[string]func(*Digest){
		"too many fields":   func(d *Digest) { d.Definition = make([]string, maxDefinition+1) },
		"long entry":        func(d *Digest) { d.Definition = []string{strings.Repeat("x", maxEntryLen+1)} },
		"empty entry":       func(d *Digest) { d.Definition = []string{""} },
		"too many served":   func(d *Digest) { d.ServedAdapters = make([]string, maxAdapters+1) },
		"negative max len":  func(d *Digest) { d.MaxModelLen = -1 },
		"empty served name": func(d *Digest) { d.ServedAdapters = []string{""} },
		"long served model": func(d *Digest) { d.ServedModels = []string{strings.Repeat("m", maxServedLen+1)} },
		"too many models":   func(d *Digest) { d.ServedModels = make([]string, maxAdapters+1) },
	} {
		d := sampleDigest()
		edit(&d)
		if _, err := d.AppendBinary(nil); !errors.Is(err, ErrInvalidDigest) {
			t.Errorf("%s: err %v, want ErrInvalidDigest", name, err)
		}
	}
}
