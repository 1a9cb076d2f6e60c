package config

import (
	"sort"
)

// Snapshot is one immutable, validated configuration. Nothing may modify a
// Snapshot after a Source hands it out; readers share it without locks.
type Snapshot struct {
	// Revision identifies the snapshot: the etcd revision for the etcd
	// source, a counter for the directory source.
	Revision int64

	Gateways        []*Gateway // sorted by metadata.name
	EndpointPickers map[string]*EndpointPickerConfig
	ConfigMaps      map[string]*ConfigMap
	Pools           map[string]*InferencePool
	Rewrites        map[string]*ModelRewrite
	Tenants         map[string]*Tenant
	Topology        *Topology // nil when none is configured
	StaticEndpoints []*StaticEndpoints
	// Objectives are the InferenceObjectives by name.
	Objectives map[string]*InferenceObjective

	// Adapters maps a LoRA adapter name to its base model, from the
	// bbr-managed ConfigMaps.
	Adapters map[string]string

	// Objects keeps every object's source (file or etcd key) and its
	// canonical JSON, for diffs and writes.
	Objects map[ObjectKey]Object

	policies map[string]SchedulerPolicy // "gateway/scheduler" → policy
}

// ObjectKey identifies one object of a snapshot.
type ObjectKey struct {
	Kind string
	Name string
}

func (k ObjectKey) String() string { return k.Kind + "/" + k.Name }

// Object is one decoded document and where it came from.
type Object struct {
	Key    ObjectKey
	Origin string // file path, or etcd key
	Line   int    // first line of the document in Origin; 0 when unknown
	JSON   []byte // canonical JSON of the document
}

// Keys returns the snapshot's object keys in a stable order.
func (s *Snapshot) Keys() []ObjectKey {
	keys := make([]ObjectKey, 0, len(s.Objects))
	for k := range s.Objects {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Kind != keys[j].Kind {
			return keys[i].Kind < keys[j].Kind
		}
		return keys[i].Name < keys[j].Name
	})
	return keys
}

// Gateway returns the gateway for a cluster, or nil. With an empty cluster
// it returns the only gateway when there is exactly one.
func (s *Snapshot) Gateway(cluster string) *Gateway {
	if cluster == "" && len(s.Gateways) == 1 {
		return s.Gateways[0]
	}
	for _, g := range s.Gateways {
		if g.Spec.Cluster == cluster || (g.Spec.Cluster == "" && g.Metadata.Name == cluster) {
			return g
		}
	}
	return nil
}

// Policy returns the resolved scoring policy of one scheduler of a gateway.
// It is valid for every scheduler of a validated snapshot.
func (s *Snapshot) Policy(gateway, scheduler string) (SchedulerPolicy, bool) {
	p, ok := s.policies[gateway+"/"+scheduler]
	return p, ok
}

// ObjectivePriorities maps every InferenceObjective's name to its priority
// (0 when unset), for x-gateway-inference-objective.
func (s *Snapshot) ObjectivePriorities() map[string]int {
	out := make(map[string]int, len(s.Objectives))
	for name, o := range s.Objectives {
		p := 0
		if o.Spec.Priority != nil {
			p = *o.Spec.Priority
		}
		out[name] = p
	}
	return out
}

// Tenant returns a tenant by name, or nil.
func (s *Snapshot) Tenant(name string) *Tenant { return s.Tenants[name] }

// Endpoints returns the static endpoints visible to a cluster whose labels
// match the selector.
func (s *Snapshot) Endpoints(cluster string, sel map[string]string) []StaticEndpoint {
	var out []StaticEndpoint
	for _, se := range s.StaticEndpoints {
		if se.Spec.Cluster != "" && cluster != "" && se.Spec.Cluster != cluster {
			continue
		}
		for _, ep := range se.Spec.Endpoints {
			if MatchLabels(sel, ep.Labels) {
				out = append(out, ep)
			}
		}
	}
	return out
}

// MatchLabels reports whether labels carry every key/value of sel. An empty
// selector matches nothing, as a pool without a selector has no pods.
func MatchLabels(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Scorer semantics a scheduler can use.
const (
	ScoringMeridian = "meridian"
	ScoringGIE      = "gie"
)

// Pickers a scheduler can use.
const (
	PickerMaxScore       = "max-score"
	PickerWeightedRandom = "weighted-random"
	PickerRandom         = "random"
)

// SchedulerPolicy is a scheduler's scoring resolved from either its weights
// or its EndpointPickerConfig.
type SchedulerPolicy struct {
	Weights Weights
	// Picker is PickerMaxScore (default), PickerWeightedRandom or
	// PickerRandom.
	Picker string
	// Scoring is ScoringMeridian (default) or ScoringGIE.
	Scoring string
	// Prefix index parameters (GIE prefix-cache-scorer's names).
	// BlockSize is characters per block (default 64); MaxPrefixBlocks caps
	// blocks hashed per request (default 256); LRUCapacityPerServer caps
	// blocks remembered per pod when the pod does not report its GPU
	// blocks (default 31,250).
	BlockSize            int
	MaxPrefixBlocks      int
	LRUCapacityPerServer int
	// PrefixAutoTune is GIE's autoTune parameter of the prefix plugin as
	// written (nil when not set). GIE mode always takes the servers'
	// reported block size and GPU blocks when they report them, which is
	// autoTune true; false is rejected by validation, since Tier-1 has no
	// fixed-size GIE index.
	PrefixAutoTune *bool
}

// DefaultPolicy is the policy of a scheduler with neither weights nor a
// configMapRef.
func DefaultPolicy() SchedulerPolicy {
	return SchedulerPolicy{
		Weights:              DefaultWeights(),
		Picker:               PickerMaxScore,
		Scoring:              ScoringMeridian,
		BlockSize:            64,
		MaxPrefixBlocks:      256,
		LRUCapacityPerServer: 31250,
	}
}
