package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// PoolDefinition is one pool's definition as it takes effect in a
// cluster, field by field: "field=hash" entries, sorted, where each hash
// is of the field's canonical JSON (encoding/json of the decoded value:
// formatting, key order and whether a default was written out do not
// count). Two clusters whose entries are equal run the pool the same way;
// an entry that differs names the field that does. The fields are:
//
//   - modelName, modelSelector, targetPort (8000 when unset)
//   - weights: the scorer weights in effect (from weights, a configMapRef's
//     EndpointPickerConfig, or the defaults)
//   - picker: the rest of the resolved scoring policy (picker, scoring mode,
//     prefix index parameters)
//   - adapters: the LoRA adapters routed to the pool (loraAdapters and the
//     BBR ConfigMaps' adapters of its model), sorted
//   - admission, options: Meridian's per-pool settings ("null" when unset)
//
// Replicas is left out: how many Tier-1 replicas a cluster runs is its own
// capacity, not the pool's behaviour. It is what Tier-1 publishes in its
// pool digests and what `meridian config drift --against` compares.
func (s *Snapshot) PoolDefinition(g *Gateway, sc *Scheduler) []string {
	policy, ok := s.Policy(g.Metadata.Name, sc.Name)
	if !ok {
		policy = DefaultPolicy()
	}
	port := sc.TargetPort
	if port == 0 {
		port = 8000
	}
	adapters := slices.Clone(sc.LoraAdapters)
	for a, base := range s.Adapters {
		if base == sc.ModelName {
			adapters = append(adapters, a)
		}
	}
	slices.Sort(adapters)
	adapters = slices.Compact(adapters)
	picker := policy
	picker.Weights = Weights{}
	fields := []struct {
		name string
		v    any
	}{
		{"modelName", sc.ModelName},
		{"modelSelector", sc.ModelSelector},
		{"targetPort", port},
		{"weights", policy.Weights},
		{"picker", picker},
		{"adapters", adapters},
		{"admission", sc.Admission},
		{"options", sc.Options},
	}
	out := make([]string, 0, len(fields))
	for _, f := range fields {
		out = append(out, f.name+"="+fieldHash(f.v))
	}
	slices.Sort(out)
	return out
}

// fieldHash is the first 8 hex digits of the xxHash64 of v's canonical
// JSON: a value decoded into a generic form and encoded again, so that
// maps' keys are sorted.
func fieldHash(v any) string {
	b, err := json.Marshal(v)
	if err == nil {
		var generic any
		if json.Unmarshal(b, &generic) == nil {
			b, _ = json.Marshal(generic)
		}
	}
	return fmt.Sprintf("%08x", uint32(xxhash.Sum64(b)>>32))
}

// DefinitionDiff names the fields whose entries differ between two
// PoolDefinitions (a field present in only one counts), sorted.
func DefinitionDiff(a, b []string) []string {
	fa, fb := definitionMap(a), definitionMap(b)
	var out []string
	for k, v := range fa {
		if fb[k] != v {
			out = append(out, k)
		}
	}
	for k := range fb {
		if _, ok := fa[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func definitionMap(entries []string) map[string]string {
	m := make(map[string]string, len(entries))
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		m[k] = v
	}
	return m
}
