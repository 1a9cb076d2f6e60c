package regions

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Drift kinds: what differs between the pools that serve one model name
// in different clusters.
const (
	// DriftDefinition: a field of the pool's definition as applied
	// (Digest.Definition); Field names it.
	DriftDefinition = "definition"
	// DriftAdapters: the adapters the ready pods can serve.
	DriftAdapters = "adapters"
	// DriftContextLength: the longest request the ready pods accept.
	DriftContextLength = "context_length"
	// DriftModels: the base models the ready pods serve, with what they
	// loaded (a release shows as another root).
	DriftModels = "models"
)

// DriftItem is one way in which the pools serving Model differ.
type DriftItem struct {
	Model string `json:"model"`
	Kind  string `json:"kind"`
	Field string `json:"field,omitempty"` // for DriftDefinition
	// Values are every pool's value, by cluster.
	Values []DriftValue `json:"values"`
	// Odd are the clusters ("region/cluster") whose value is not the one
	// most clusters have; every cluster when no value is the most common.
	Odd []string `json:"odd"`
	// Since is when this difference was first seen (DriftTracker).
	Since time.Time `json:"since"`
}

// DriftValue is one pool's value of a drifted field.
type DriftValue struct {
	Region  string `json:"region"`
	Cluster string `json:"cluster"`
	Pool    string `json:"pool"`
	Value   string `json:"value"`
}

// Drift compares the pools that serve the same model (Digest.Model)
// across clusters and returns how they differ, sorted by model, kind and
// field. A digest without a definition (an older Tier-1) is not compared
// on it, nor one whose pods did not say what they serve (MaxModelLen 0) on
// that. Pools of one cluster are compared as the cluster's.
func Drift(digests []Digest) []DriftItem {
	byModel := map[string][]*Digest{}
	for i := range digests {
		d := &digests[i]
		byModel[d.Model] = append(byModel[d.Model], d)
	}
	var out []DriftItem
	for model, ds := range byModel {
		if len(ds) < 2 {
			continue
		}
		slices.SortFunc(ds, func(a, b *Digest) int { return compareKeys(a, b) })
		fields := map[string]bool{}
		for _, d := range ds {
			for _, e := range d.Definition {
				f, _, _ := strings.Cut(e, "=")
				fields[f] = true
			}
		}
		for _, f := range slices.Sorted(mapKeys(fields)) {
			out = appendDrift(out, model, DriftDefinition, f, ds, func(d *Digest) (string, bool) {
				if len(d.Definition) == 0 {
					return "", false
				}
				for _, e := range d.Definition {
					if k, v, _ := strings.Cut(e, "="); k == f {
						return v, true
					}
				}
				return "(absent)", true
			})
		}
		out = appendDrift(out, model, DriftAdapters, "", ds, func(d *Digest) (string, bool) {
			return strings.Join(d.ServedAdapters, ","), d.MaxModelLen > 0
		})
		out = appendDrift(out, model, DriftContextLength, "", ds, func(d *Digest) (string, bool) {
			return strconv.Itoa(d.MaxModelLen), d.MaxModelLen > 0
		})
		out = appendDrift(out, model, DriftModels, "", ds, func(d *Digest) (string, bool) {
			return strings.Join(d.ServedModels, ","), len(d.ServedModels) > 0
		})
	}
	slices.SortFunc(out, func(a, b DriftItem) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Field, b.Field))
	})
	return out
}

// appendDrift appends an item for model and kind when the clusters'
// values (value: false for a digest that does not tell) differ.
func appendDrift(out []DriftItem, model, kind, field string, ds []*Digest, value func(*Digest) (string, bool)) []DriftItem {
	var vals []DriftValue
	count := map[string]int{}
	for _, d := range ds {
		v, ok := value(d)
		if !ok {
			continue
		}
		vals = append(vals, DriftValue{Region: d.Region, Cluster: d.Cluster, Pool: d.Pool, Value: v})
		count[v]++
	}
	if len(count) < 2 {
		return out
	}
	// The reference is the value most clusters have; without a single
	// most common value, every cluster is odd (none can be told right).
	ref, tie := "", false
	for _, v := range slices.Sorted(mapKeys(count)) {
		switch {
		case ref == "" || count[v] > count[ref]:
			ref, tie = v, false
		case count[v] == count[ref]:
			tie = true
		}
	}
	item := DriftItem{Model: model, Kind: kind, Field: field, Values: vals}
	for _, v := range vals {
		if tie || v.Value != ref {
			item.Odd = append(item.Odd, v.Region+"/"+v.Cluster)
		}
	}
	item.Odd = slices.Compact(item.Odd)
	return append(out, item)
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// DriftTracker remembers since when each difference has been seen, so
// that a report can say how long a drift has lasted. It is not safe for
// concurrent use.
type DriftTracker struct {
	since map[string]time.Time // model/kind/field/odd clusters → first seen
}

// Observe sets each item's Since (now for a difference not seen at the
// last call) and forgets the differences gone. A difference whose odd
// clusters change counts as a new one.
func (t *DriftTracker) Observe(now time.Time, items []DriftItem) {
	next := make(map[string]time.Time, len(items))
	for i := range items {
		it := &items[i]
		k := it.Model + "\x00" + it.Kind + "\x00" + it.Field + "\x00" + strings.Join(it.Odd, ",")
		s, ok := t.since[k]
		if !ok {
			s = now
		}
		next[k], it.Since = s, s
	}
	t.since = next
}
