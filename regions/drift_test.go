package regions

import (
	"slices"
	"testing"
	"time"
)

// Drift names, per model, the field or capability that differs between
// clusters and the odd clusters out; equal pools, pools of other models,
// and digests that do not tell are not drift.
func TestDrift(t *testing.T) {
	def := []string{"adapters=11111111", "modelName=22222222", "weights=33333333"}
	mk := func(region, cluster string, edit func(*Digest)) Digest {
		d := pool(region, cluster, "llama")
		d.Definition = slices.Clone(def)
		d.ServedAdapters, d.MaxModelLen, d.ServedModels = []string{"a1", "a2"}, 131072, []string{"llama"}
		if edit != nil {
			edit(&d)
		}
		return d
	}
	same := []Digest{mk("us-east-1", "a", nil), mk("eu-west-1", "b", nil), mk("eu-west-1", "old", func(d *Digest) {
		d.Definition, d.ServedAdapters, d.MaxModelLen, d.ServedModels = nil, nil, 0, nil // an older Tier-1: tells nothing
	}), pool("us-east-1", "a", "other")}
	if got := Drift(same); len(got) != 0 {
		t.Fatalf("equal pools: drift %+v", got)
	}
	drifted := append(same,
		mk("us-west-2", "w", func(d *Digest) { d.Definition[2] = "weights=44444444" }),
		mk("ap-south-1", "s", func(d *Digest) {
			d.ServedAdapters, d.MaxModelLen, d.ServedModels = []string{"a1"}, 32768, []string{"llama@/models/llama-v2"}
		}),
	)
	got := Drift(drifted)
	type item struct{ kind, field, odd string }
	var short []item
	for _, it := range got {
		if it.Model != "llama" || len(it.Odd) != 1 {
			t.Errorf("item %+v: want one odd cluster of llama", it)
			continue
		}
		short = append(short, item{it.Kind, it.Field, it.Odd[0]})
	}
	want := []item{{DriftAdapters, "", "ap-south-1/s"}, {DriftContextLength, "", "ap-south-1/s"}, {DriftDefinition, "weights", "us-west-2/w"},
		{DriftModels, "", "ap-south-1/s"}}
	if !slices.Equal(short, want) {
		t.Errorf("drift %v, want %v", short, want)
	}

	// Since is when a difference was first seen, and a difference that
	// goes and comes back starts again.
	var tr DriftTracker
	t0 := time.Unix(1000, 0)
	tr.Observe(t0, got)
	again := Drift(drifted)
	tr.Observe(t0.Add(time.Minute), again)
	if !again[0].Since.Equal(t0) {
		t.Errorf("since %v, want %v", again[0].Since, t0)
	}
	tr.Observe(t0.Add(2*time.Minute), nil)
	back := Drift(drifted)
	tr.Observe(t0.Add(3*time.Minute), back)
	if !back[0].Since.Equal(t0.Add(3 * time.Minute)) {
		t.Errorf("a difference that came back: since %v, want the time it came back", back[0].Since)
	}
}
