package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Limits from HyperPod's documented behaviour.
const (
	MaxSchedulers   = 100
	MaxLoraAdapters = 50
)

// Build validates decoded documents as a whole and returns the snapshot
// they make. Every problem is reported at once; on any error no snapshot
// is returned.
func Build(docs []Document, revision int64) (*Snapshot, error) {
	b := &builder{
		s: &Snapshot{
			Revision:        revision,
			EndpointPickers: map[string]*EndpointPickerConfig{},
			ConfigMaps:      map[string]*ConfigMap{},
			Pools:           map[string]*InferencePool{},
			Rewrites:        map[string]*ModelRewrite{},
			Tenants:         map[string]*Tenant{},
			Objectives:      map[string]*InferenceObjective{},
			Adapters:        map[string]string{},
			Objects:         map[ObjectKey]Object{},
			policies:        map[string]SchedulerPolicy{},
		},
		where: map[ObjectKey]string{},
	}
	b.collect(docs)
	b.validate()
	if len(b.errs) > 0 {
		return nil, b.errs
	}
	return b.s, nil
}

type builder struct {
	s     *Snapshot
	errs  Errors
	where map[ObjectKey]string // object → origin for messages
	// anonymous EndpointPickerConfigs get a synthetic name per origin
	anon int
}

func (b *builder) errf(key ObjectKey, path, format string, args ...any) {
	b.errs = append(b.errs, FieldError{Origin: b.where[key], Object: key.String(), Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (b *builder) collect(docs []Document) {
	for _, d := range docs {
		key := d.Key
		if key.Kind == KindEndpointPicker && key.Name == "" {
			b.anon++
			key.Name = fmt.Sprintf("%s#%d", filepath.Base(d.Origin), b.anon)
			d.Key = key
		}
		where := d.Origin
		if d.Line > 1 {
			where = fmt.Sprintf("%s:%d", d.Origin, d.Line)
		}
		if prev, dup := b.s.Objects[key]; dup {
			b.where[key] = where
			b.errf(key, "metadata.name", "duplicate: %s is also defined in %s", key, prev.Origin)
			continue
		}
		b.where[key] = where
		b.s.Objects[key] = d.Object
		switch v := d.Value.(type) {
		case *Gateway:
			b.s.Gateways = append(b.s.Gateways, v)
		case *EndpointPickerConfig:
			b.s.EndpointPickers[key.Name] = v
		case *ConfigMap:
			b.s.ConfigMaps[key.Name] = v
		case *InferencePool:
			b.s.Pools[key.Name] = v
		case *ModelRewrite:
			b.s.Rewrites[key.Name] = v
		case *Tenant:
			b.s.Tenants[key.Name] = v
		case *Topology:
			if b.s.Topology != nil {
				b.errf(key, "", "only one Topology is allowed; %s is also defined", ObjectKey{KindTopology, b.s.Topology.Metadata.Name})
				continue
			}
			b.s.Topology = v
		case *StaticEndpoints:
			b.s.StaticEndpoints = append(b.s.StaticEndpoints, v)
		case *InferenceObjective:
			b.s.Objectives[key.Name] = v
		}
	}
	sort.Slice(b.s.Gateways, func(i, j int) bool { return b.s.Gateways[i].Metadata.Name < b.s.Gateways[j].Metadata.Name })
	sort.Slice(b.s.StaticEndpoints, func(i, j int) bool {
		return b.s.StaticEndpoints[i].Metadata.Name < b.s.StaticEndpoints[j].Metadata.Name
	})
}

func (b *builder) validate() {
	// Order matters: adapters and served models feed later checks.
	for _, name := range slices.Sorted(maps.Keys(b.s.ConfigMaps)) {
		b.configMap(b.s.ConfigMaps[name])
	}
	for _, name := range slices.Sorted(maps.Keys(b.s.EndpointPickers)) {
		key := ObjectKey{KindEndpointPicker, name}
		b.endpointPicker(key, "", b.s.EndpointPickers[name])
	}
	b.topology()
	served := map[string]bool{} // model names a scheduler serves
	for _, g := range b.s.Gateways {
		for _, sc := range g.Spec.Schedulers {
			served[sc.ModelName] = true
		}
	}
	for _, g := range b.s.Gateways {
		b.gateway(g)
	}
	// Adapters: their base model must be served.
	for _, name := range slices.Sorted(maps.Keys(b.s.ConfigMaps)) {
		cm := b.s.ConfigMaps[name]
		if cm.Metadata.Labels[BBRManagedLabel] != "true" {
			continue
		}
		if base := strings.TrimSpace(cm.Data["baseModel"]); base != "" && !served[base] {
			b.errf(ObjectKey{KindConfigMap, name}, "data.baseModel", "base model %q is not served by any scheduler", base)
		}
	}
	callable := func(m string) bool {
		if served[m] {
			return true
		}
		base, ok := b.s.Adapters[m]
		return ok && served[base]
	}
	for _, name := range slices.Sorted(maps.Keys(b.s.Pools)) {
		b.pool(b.s.Pools[name])
	}
	for _, name := range slices.Sorted(maps.Keys(b.s.Rewrites)) {
		b.rewrite(b.s.Rewrites[name], callable)
	}
	for _, name := range slices.Sorted(maps.Keys(b.s.Tenants)) {
		b.tenant(b.s.Tenants[name], callable)
	}
	for _, se := range b.s.StaticEndpoints {
		b.staticEndpoints(se)
	}
	for _, name := range slices.Sorted(maps.Keys(b.s.Objectives)) {
		b.objective(b.s.Objectives[name])
	}
}

func (b *builder) configMap(cm *ConfigMap) {
	key := ObjectKey{KindConfigMap, cm.Metadata.Name}
	if cm.Metadata.Labels[BBRManagedLabel] != "true" {
		return // a carrier for an EndpointPickerConfig, checked when referenced
	}
	base := strings.TrimSpace(cm.Data["baseModel"])
	if base == "" {
		b.errf(key, "data.baseModel", "required in a %s=true ConfigMap", BBRManagedLabel)
	}
	raw, ok := cm.Data["adapters"]
	if !ok {
		b.errf(key, "data.adapters", "required: a YAML list of adapter names")
		return
	}
	var adapters []string
	if err := yaml.UnmarshalStrict([]byte(raw), &adapters); err != nil {
		b.errf(key, "data.adapters", "want a YAML list of adapter names: %v", err)
		return
	}
	for i, a := range adapters {
		a = strings.TrimSpace(a)
		if a == "" {
			b.errf(key, fmt.Sprintf("data.adapters[%d]", i), "empty adapter name")
			continue
		}
		if prev, dup := b.s.Adapters[a]; dup && prev != base {
			b.errf(key, fmt.Sprintf("data.adapters[%d]", i), "adapter %q already maps to base model %q", a, prev)
			continue
		}
		b.s.Adapters[a] = base
	}
}

// Plugin types Meridian understands in an EndpointPickerConfig. Filters and
// profile handlers are accepted for compatibility; Meridian's built-in
// filters (ready, fresh, serves the model) always run.
var pluginTypes = map[string]string{
	"queue-scorer":                 "queue",
	"kv-cache-utilization-scorer":  "kvCache",
	"kv-cache-scorer":              "kvCache",
	"prefix-cache-scorer":          "prefix",
	"lora-affinity-scorer":         "loraAffinity",
	"running-requests-size-scorer": "runningRequests",
	"running-requests-scorer":      "runningRequests",
	"predicted-latency-scorer":     "predictedLatency",
	"lru-scorer":                   "lru",
	"max-score-picker":             PickerMaxScore,
	"random-picker":                PickerRandom,
	"weighted-random-picker":       PickerWeightedRandom,
	"single-profile-handler":       "",
	"decode-filter":                "",
	"low-queue-filter":             "",
	"lora-affinity-filter":         "",
	"least-queue-filter":           "",
	"least-kv-cache-filter":        "",
	"decision-tree-filter":         "",
}

func knownPluginTypes() string {
	keys := slices.Sorted(maps.Keys(pluginTypes))
	return strings.Join(keys, ", ")
}

// prefixParams are the prefix-cache-scorer's parameters, decoded strictly:
// an unknown one is an error with its path.
type prefixParams struct {
	BlockSize              int   `json:"blockSize"`
	HashBlockSize          int   `json:"hashBlockSize"`
	MaxPrefixBlocksToMatch int   `json:"maxPrefixBlocksToMatch"`
	LRUCapacityPerServer   int   `json:"lruCapacityPerServer"`
	AutoTune               *bool `json:"autoTune"`
}

// pluginParams are the parameters GIE defines for each plugin type other
// than prefix-cache-scorer (decoded on its own). Meridian reads none of them
// (its filters and picker are built in: docs/configuration.md), but a
// parameter GIE does not define for the type is a typo that would silently
// do nothing, so it is an error with its path.
var pluginParams = map[string][]string{
	"max-score-picker":       {"maxNumOfEndpoints"},
	"random-picker":          {"maxNumOfEndpoints"},
	"weighted-random-picker": {"maxNumOfEndpoints"},
	"low-queue-filter":       {"threshold"},
	"lora-affinity-filter":   {"threshold"},
	"decision-tree-filter":   {"current", "nextOnSuccess", "nextOnFailure", "nextOnSuccessOrFailure"},
}

// otherPluginParams checks the parameters of a plugin other than
// prefix-cache-scorer: an object whose keys GIE defines for the type.
func (b *builder) otherPluginParams(key ObjectKey, path string, pl PluginSpec) bool {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(pl.Parameters, &m); err != nil {
		if string(pl.Parameters) == "null" {
			return true
		}
		b.errf(key, path+".parameters", "want an object of parameters")
		return false
	}
	ok := true
	known := pluginParams[pl.Type]
	names := slices.Sorted(maps.Keys(m))
	for _, k := range names {
		if slices.Contains(known, k) {
			continue
		}
		ok = false
		if len(known) == 0 {
			b.errf(key, path+".parameters."+k, "strict decoding error: unknown field %q (%s takes no parameters)", k, pl.Type)
		} else {
			b.errf(key, path+".parameters."+k, "strict decoding error: unknown field %q (%s takes %s)", k, pl.Type, strings.Join(known, ", "))
		}
	}
	return ok
}

// endpointPicker validates an EndpointPickerConfig and resolves it into a
// policy. prefix is prepended to field paths (for configs carried inside a
// ConfigMap).
func (b *builder) endpointPicker(key ObjectKey, prefix string, c *EndpointPickerConfig) (SchedulerPolicy, bool) {
	p := DefaultPolicy()
	p.Weights = Weights{}
	ok := true
	fail := func(path, format string, args ...any) {
		ok = false
		b.errf(key, prefix+path, format, args...)
	}
	byName := map[string]string{} // plugin name → type
	for i, pl := range c.Plugins {
		path := fmt.Sprintf("plugins[%d]", i)
		if _, known := pluginTypes[pl.Type]; !known {
			fail(path+".type", "unknown plugin type %q; known types: %s", pl.Type, knownPluginTypes())
			continue
		}
		name := pl.Name
		if name == "" {
			name = pl.Type
		}
		if _, dup := byName[name]; dup {
			fail(path+".name", "duplicate plugin name %q", name)
			continue
		}
		byName[name] = pl.Type
		if pl.Type != "prefix-cache-scorer" && len(pl.Parameters) > 0 {
			if !b.otherPluginParams(key, prefix+path, pl) {
				ok = false
			}
			continue
		}
		if pl.Type == "prefix-cache-scorer" && len(pl.Parameters) > 0 {
			var pp prefixParams
			var generic any
			if err := json.Unmarshal(pl.Parameters, &generic); err != nil {
				fail(path+".parameters", "%v", err)
				continue
			}
			if errs := checkShape("", generic, reflect.TypeOf(pp)); len(errs) > 0 {
				for _, e := range errs {
					fail(join(path+".parameters", e.path), "%s", e.msg)
				}
				continue
			}
			if err := json.Unmarshal(pl.Parameters, &pp); err != nil {
				fail(path+".parameters", "%v", err)
				continue
			}
			if pp.AutoTune != nil && !*pp.AutoTune {
				fail(path+".parameters.autoTune", "false is not supported: Tier-1 always sizes the prefix index from what the servers report (autoTune true); set blockSize and lruCapacityPerServer for servers that report nothing")
				continue
			}
			p.PrefixAutoTune = pp.AutoTune
			bs := pp.BlockSize
			if bs == 0 {
				bs = pp.HashBlockSize
			}
			if bs < 0 || pp.MaxPrefixBlocksToMatch < 0 || pp.LRUCapacityPerServer < 0 {
				fail(path+".parameters", "values must be ≥ 0")
				continue
			}
			if bs > 0 {
				p.BlockSize = bs
			}
			if pp.MaxPrefixBlocksToMatch > 0 {
				p.MaxPrefixBlocks = pp.MaxPrefixBlocksToMatch
			}
			if pp.LRUCapacityPerServer > 0 {
				p.LRUCapacityPerServer = pp.LRUCapacityPerServer
			}
		}
	}
	profiles := c.SchedulingProfiles
	if len(profiles) == 0 {
		// No profile: every scorer declared gets weight 1, as GIE does.
		var refs []ProfilePlugin
		for _, pl := range c.Plugins {
			n := pl.Name
			if n == "" {
				n = pl.Type
			}
			refs = append(refs, ProfilePlugin{PluginRef: n})
		}
		profiles = []SchedulingProfile{{Name: "default", Plugins: refs}}
	}
	if len(profiles) > 1 {
		fail("schedulingProfiles", "Meridian runs one scheduling profile per scheduler; got %d", len(profiles))
	}
	prof := profiles[0]
	for j, ref := range prof.Plugins {
		path := fmt.Sprintf("schedulingProfiles[0].plugins[%d]", j)
		typ, found := byName[ref.PluginRef]
		if !found {
			fail(path+".pluginRef", "no plugin named %q in plugins", ref.PluginRef)
			continue
		}
		w := 1.0
		if ref.Weight != nil {
			w = *ref.Weight
		}
		if w < 0 {
			fail(path+".weight", "must be ≥ 0, got %v", w)
			continue
		}
		switch role := pluginTypes[typ]; role {
		case "queue":
			p.Weights.Queue += w
		case "kvCache":
			p.Weights.KVCache += w
		case "prefix":
			p.Weights.Prefix += w
		case "loraAffinity":
			p.Weights.LoraAffinity += w
		case "runningRequests":
			p.Weights.RunningRequests += w
		case "predictedLatency":
			p.Weights.PredictedLatency += w
		case "lru":
			p.Weights.LRU += w
		case PickerMaxScore, PickerRandom, PickerWeightedRandom:
			p.Picker = role
		}
	}
	if ok && p.Weights == (Weights{}) && p.Picker != PickerRandom {
		fail("schedulingProfiles[0].plugins", "no scorer with a positive weight")
	}
	return p, ok
}

func (b *builder) topology() {
	t := b.s.Topology
	if t == nil {
		return
	}
	key := ObjectKey{KindTopology, t.Metadata.Name}
	if len(t.Spec.Regions) == 0 {
		b.errf(key, "spec.regions", "at least one Region is required")
	}
	regions, clusters := map[string]bool{}, map[string]bool{}
	if g := t.Spec.Gossip; g != nil {
		switch g.Profile {
		case "", "lan", "wan", "local":
		default:
			b.errf(key, "spec.gossip.profile", "want lan, wan or local, got %q", g.Profile)
		}
		for _, d := range []struct {
			name string
			v    Duration
		}{{"gossipInterval", g.GossipInterval}, {"pushPullInterval", g.PushPullInterval}, {"probeInterval", g.ProbeInterval},
			{"probeTimeout", g.ProbeTimeout}, {"streamTimeout", g.StreamTimeout}} {
			if d.v < 0 || d.v.D() > time.Hour {
				b.errf(key, "spec.gossip."+d.name, "must be a duration between 0 and 1h, got %s", d.v.D())
			}
		}
		if g.GossipNodes < 0 || g.GossipNodes > 1000 {
			b.errf(key, "spec.gossip.gossipNodes", "must be 0..1000, got %d", g.GossipNodes)
		}
		if g.ProbeTimeout != 0 && g.ProbeInterval != 0 && g.ProbeTimeout > g.ProbeInterval {
			b.errf(key, "spec.gossip.probeTimeout", "must not exceed probeInterval (%s), got %s", g.ProbeInterval.D(), g.ProbeTimeout.D())
		}
	}
	defer func() {
		r := t.Spec.Routing
		if r == nil {
			return
		}
		if w := r.Weights; w != nil {
			for name, v := range map[string]float64{"kvHeadroom": w.KVHeadroom, "queueDepth": w.QueueDepth,
				"regionProximity": w.RegionProximity, "errorRate": w.ErrorRate, "prefixAffinity": w.PrefixAffinity} {
				if v < 0 {
					b.errf(key, "spec.routing.weights."+name, "must be ≥ 0, got %v", v)
				}
			}
		}
		b.admission(key, "spec.routing.admission", r.Admission)
		if a := r.Admission; a != nil && a.ClusterQueueTime != nil {
			if v := *a.ClusterQueueTime; v < 0 || v.D() > time.Minute {
				b.errf(key, "spec.routing.admission.clusterQueueTime", "must be a duration between 0 and 1m, got %s", v.D())
			}
		}
		if r.DigestMaxAge < 0 || r.DigestMaxAge.D() > time.Hour {
			b.errf(key, "spec.routing.digestMaxAge", "must be a duration between 0 and 1h, got %s", r.DigestMaxAge.D())
		}
		if rb := r.RetryBudget; rb != nil {
			if rb.Ratio < 0 || rb.Ratio > 10 || math.IsNaN(rb.Ratio) {
				b.errf(key, "spec.routing.retryBudget.ratio", "must be 0..10 retries per request, got %v", rb.Ratio)
			}
			if rb.Window < 0 || rb.Window.D() > time.Hour {
				b.errf(key, "spec.routing.retryBudget.window", "must be a duration between 0 and 1h, got %s", rb.Window.D())
			}
			if rb.MinRetries < 0 || rb.MinRetries > 1_000_000 {
				b.errf(key, "spec.routing.retryBudget.minRetries", "must be 0..1000000, got %d", rb.MinRetries)
			}
		}
		if o := r.OutlierDetection; o != nil {
			p := "spec.routing.outlierDetection."
			if o.ConsecutiveFailures < 0 || o.ConsecutiveFailures > 1_000_000 {
				b.errf(key, p+"consecutiveFailures", "must be 0..1000000, got %d", o.ConsecutiveFailures)
			}
			if o.FailureRate < 0 || o.FailureRate > 1 || math.IsNaN(o.FailureRate) {
				b.errf(key, p+"failureRate", "must be a fraction in (0, 1], got %v", o.FailureRate)
			}
			if o.MinRequests < 0 || o.MinRequests > 1_000_000 {
				b.errf(key, p+"minRequests", "must be 0..1000000, got %d", o.MinRequests)
			}
			if o.ReadmitShare < 0 || o.ReadmitShare > 1 || math.IsNaN(o.ReadmitShare) {
				b.errf(key, p+"readmitShare", "must be a fraction in (0, 1], got %v", o.ReadmitShare)
			}
			for _, d := range []struct {
				name string
				v    Duration
			}{{"interval", o.Interval}, {"baseEjection", o.BaseEjection}, {"maxEjection", o.MaxEjection}, {"ejectionMemory", o.EjectionMemory}, {"readmitStep", o.ReadmitStep}} {
				if d.v < 0 || d.v.D() > 24*time.Hour {
					b.errf(key, p+d.name, "must be a duration between 0 and 24h, got %s", d.v.D())
				}
			}
			if o.MaxEjection != 0 && o.BaseEjection != 0 && o.MaxEjection < o.BaseEjection {
				b.errf(key, p+"maxEjection", "must be at least baseEjection (%s), got %s", o.BaseEjection.D(), o.MaxEjection.D())
			}
		}
		if ca := r.CanaryAnalysis; ca != nil {
			if ca.Period < 0 || ca.Period.D() > time.Hour {
				b.errf(key, "spec.routing.canaryAnalysis.period", "must be a duration between 0 and 1h, got %s", ca.Period.D())
			} else if ca.Period != 0 && ca.Period.D() < 100*time.Millisecond {
				b.errf(key, "spec.routing.canaryAnalysis.period", "must be at least 100ms, got %s", ca.Period.D())
			}
			if ca.Window < 0 || ca.Window.D() > 24*time.Hour {
				b.errf(key, "spec.routing.canaryAnalysis.window", "must be a duration between 0 and 24h, got %s", ca.Window.D())
			}
		}
		if r.LoadFactor != 0 && r.LoadFactor <= 1 {
			b.errf(key, "spec.routing.loadFactor", "must be > 1 (1+ε), got %v", r.LoadFactor)
		}
		for i, rtt := range r.RTTs {
			path := fmt.Sprintf("spec.routing.rtts[%d]", i)
			if !regions[rtt.A] {
				b.errf(key, path+".a", "Region %q is not in the Topology", rtt.A)
			}
			if !regions[rtt.B] {
				b.errf(key, path+".b", "Region %q is not in the Topology", rtt.B)
			}
			if rtt.RTT <= 0 {
				b.errf(key, path+".rtt", "must be a positive duration")
			}
		}
	}()
	for i, r := range t.Spec.Regions {
		path := fmt.Sprintf("spec.regions[%d]", i)
		if r.Name == "" {
			b.errf(key, path+".name", "required")
		} else if regions[r.Name] {
			b.errf(key, path+".name", "duplicate Region %q", r.Name)
		}
		regions[r.Name] = true
		for j, a := range r.Tier2 {
			if err := checkHostPort(a); err != nil {
				b.errf(key, fmt.Sprintf("%s.tier2[%d]", path, j), "%v", err)
			}
		}
		for j, a := range r.Gossip {
			if err := checkHostPort(a); err != nil {
				b.errf(key, fmt.Sprintf("%s.gossip[%d]", path, j), "%v", err)
			}
		}
		for j, c := range r.Clusters {
			cp := fmt.Sprintf("%s.clusters[%d]", path, j)
			if c.Name == "" {
				b.errf(key, cp+".name", "required")
			} else if clusters[c.Name] {
				b.errf(key, cp+".name", "duplicate cluster %q (cluster names are global)", c.Name)
			}
			clusters[c.Name] = true
			if u, err := url.Parse(c.Tier1); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				b.errf(key, cp+".tier1", "want an http(s) URL such as http://tier1.us-east-1a:8080, got %q", c.Tier1)
			}
			if c.Health != "" {
				if err := checkHostPort(c.Health); err != nil {
					b.errf(key, cp+".health", "%v", err)
				}
			}
		}
	}
}

func (b *builder) clusterKnown(region, cluster string) (bool, string) {
	t := b.s.Topology
	if t == nil {
		return true, ""
	}
	regionFound := false
	for _, r := range t.Spec.Regions {
		if region != "" && r.Name != region {
			continue
		}
		regionFound = true
		if cluster == "" {
			return true, ""
		}
		for _, c := range r.Clusters {
			if c.Name == cluster {
				return true, ""
			}
		}
	}
	switch {
	case region != "" && !regionFound:
		return false, fmt.Sprintf("Region %q is not in the Topology", region)
	case region != "":
		return false, fmt.Sprintf("cluster %q is not in Region %q of the Topology", cluster, region)
	}
	return false, fmt.Sprintf("cluster %q is not in the Topology", cluster)
}

func (b *builder) gateway(g *Gateway) {
	key := ObjectKey{KindGateway, g.Metadata.Name}
	sp := g.Spec
	if sp.Region != "" || sp.Cluster != "" {
		if ok, why := b.clusterKnown(sp.Region, sp.Cluster); !ok {
			path := "spec.cluster"
			if strings.HasPrefix(why, "Region") {
				path = "spec.region"
			}
			b.errf(key, path, "%s", why)
		}
	}
	if j := sp.Auth.JWT; j != nil {
		if j.Issuer == "" {
			b.errf(key, "spec.auth.jwt.issuer", "required")
		}
		switch {
		case j.JWKSFile == "" && j.JWKSURL == "":
			b.errf(key, "spec.auth.jwt", "set jwksFile or jwksURL")
		case j.JWKSFile != "" && j.JWKSURL != "":
			b.errf(key, "spec.auth.jwt", "set either jwksFile or jwksURL, not both")
		case j.JWKSURL != "":
			if u, err := url.Parse(j.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
				b.errf(key, "spec.auth.jwt.jwksURL", "want an http(s) URL, got %q", j.JWKSURL)
			}
		case j.JWKSFile != "":
			if origin := b.s.Objects[key].Origin; isFile(origin) {
				p := j.JWKSFile
				if !filepath.IsAbs(p) {
					p = filepath.Join(filepath.Dir(origin), p)
				}
				if _, err := os.Stat(p); err != nil {
					b.errf(key, "spec.auth.jwt.jwksFile", "cannot read %s: %v", p, err)
				}
			}
		}
		if j.ClockSkew < 0 {
			b.errf(key, "spec.auth.jwt.clockSkew", "must be ≥ 0")
		}
		if j.JWKSRefresh < 0 {
			b.errf(key, "spec.auth.jwt.jwksRefresh", "must be ≥ 0")
		}
	}
	if len(sp.Schedulers) == 0 {
		b.errf(key, "spec.schedulers", "at least one scheduler is required")
	}
	if len(sp.Schedulers) > MaxSchedulers {
		b.errf(key, "spec.schedulers", "at most %d schedulers per gateway, got %d", MaxSchedulers, len(sp.Schedulers))
	}
	if len(sp.Schedulers) > 1 && !sp.BBR.Enabled {
		b.errf(key, "spec.bbr.enabled", "body-based routing must be enabled with more than one scheduler (%d configured)", len(sp.Schedulers))
	}
	names, models := map[string]int{}, map[string]int{}
	for i, sc := range sp.Schedulers {
		path := fmt.Sprintf("spec.schedulers[%d]", i)
		if sc.Name == "" {
			b.errf(key, path+".name", "required")
		} else if j, dup := names[sc.Name]; dup {
			b.errf(key, path+".name", "duplicate scheduler name %q (also spec.schedulers[%d])", sc.Name, j)
		} else {
			names[sc.Name] = i
		}
		if sc.ModelName == "" {
			b.errf(key, path+".modelName", "required")
		} else if j, dup := models[sc.ModelName]; dup {
			b.errf(key, path+".modelName", "duplicate modelName %q (also spec.schedulers[%d])", sc.ModelName, j)
		} else {
			models[sc.ModelName] = i
		}
		if len(sc.ModelSelector.MatchLabels) == 0 {
			b.errf(key, path+".modelSelector.matchLabels", "required: the labels that select this pool's pods")
		}
		if sc.TargetPort < 0 || sc.TargetPort > 65535 {
			b.errf(key, path+".targetPort", "must be a port number 1-65535, got %d", sc.TargetPort)
		}
		if sc.Replicas < 0 {
			b.errf(key, path+".replicas", "must be ≥ 0, got %d", sc.Replicas)
		}
		if len(sc.LoraAdapters) > MaxLoraAdapters {
			b.errf(key, path+".loraAdapters", "at most %d adapters per scheduler, got %d", MaxLoraAdapters, len(sc.LoraAdapters))
		}
		seen := map[string]bool{}
		for j, a := range sc.LoraAdapters {
			if a == "" {
				b.errf(key, fmt.Sprintf("%s.loraAdapters[%d]", path, j), "empty adapter name")
			} else if seen[a] {
				b.errf(key, fmt.Sprintf("%s.loraAdapters[%d]", path, j), "duplicate adapter %q", a)
			}
			seen[a] = true
		}
		switch sc.Scoring {
		case "", ScoringMeridian, ScoringGIE:
		default:
			b.errf(key, path+".scoring", "unknown scoring %q; want %q or %q", sc.Scoring, ScoringMeridian, ScoringGIE)
		}
		b.admission(key, path+".admission", sc.Admission)
		if sc.Admission != nil && sc.Admission.ClusterQueueTime != nil {
			b.errf(key, path+".admission.clusterQueueTime", "is Tier-2's: set it in the Topology's spec.routing.admission (a Tier-1 Gate has no cluster Gate behind it)")
		}
		b.schedulerOptions(key, path+".options", sc.Options)
		policy, ok := b.schedulerPolicy(key, path, sc)
		if ok {
			b.s.policies[g.Metadata.Name+"/"+sc.Name] = policy
		}
	}
}

// admission checks a pool's admission settings.
func (b *builder) admission(key ObjectKey, path string, a *Admission) {
	if a == nil {
		return
	}
	if a.QueueThreshold < 0 || math.IsNaN(a.QueueThreshold) || math.IsInf(a.QueueThreshold, 0) {
		b.errf(key, path+".queueThreshold", "must be a number > 0 (waiting requests per pod), got %v", a.QueueThreshold)
	}
	if a.KVCacheThreshold < 0 || a.KVCacheThreshold > 1 || math.IsNaN(a.KVCacheThreshold) {
		b.errf(key, path+".kvCacheThreshold", "must be a fraction in (0, 1], got %v", a.KVCacheThreshold)
	}
	if r := a.CriticalReserve; r != nil && (*r < 0 || *r >= 1 || math.IsNaN(*r)) {
		b.errf(key, path+".criticalReserve", "must be a fraction in [0, 1), got %v", *r)
	}
	if a.MaxQueued < 0 || a.MaxQueued > 1_000_000 {
		b.errf(key, path+".maxQueued", "must be 1..1000000, got %d", a.MaxQueued)
	}
	if a.MaxQueuedBytes < 0 || a.MaxQueuedBytes > 64<<30 {
		b.errf(key, path+".maxQueuedBytes", "must be 1..%d, got %d", int64(64<<30), a.MaxQueuedBytes)
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"staleAfter", a.StaleAfter}, {"standardMaxWait", a.StandardMaxWait}, {"criticalMaxWait", a.CriticalMaxWait}, {"retryAfter", a.RetryAfter}} {
		if d.v < 0 || d.v.D() > time.Hour {
			b.errf(key, path+"."+d.name, "must be a duration between 0 and 1h, got %s", d.v.D())
		}
	}
}

// schedulerOptions checks a pool's scorer options.
func (b *builder) schedulerOptions(key ObjectKey, path string, o *SchedulerOptions) {
	if o == nil {
		return
	}
	if o.Fallbacks < -1 || o.Fallbacks > 16 {
		b.errf(key, path+".fallbacks", "must be -1 (none) to 16, got %d", o.Fallbacks)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"queueHalf", o.QueueHalf}, {"runningHalf", o.RunningHalf}, {"queueSaturation", o.QueueSaturation}} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			b.errf(key, path+"."+f.name, "must be a number > 0, got %v", f.v)
		}
	}
	if o.KVSaturation < 0 || o.KVSaturation > 1 || math.IsNaN(o.KVSaturation) {
		b.errf(key, path+".kvSaturation", "must be a fraction in (0, 1], got %v", o.KVSaturation)
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"maxMetricsAge", o.MaxMetricsAge}, {"latencyScale", o.LatencyScale}} {
		if d.v < 0 || d.v.D() > time.Hour {
			b.errf(key, path+"."+d.name, "must be a duration between 0 and 1h, got %s", d.v.D())
		}
	}
	if l := o.LatencyClassLabel; l != "" && l != "-" && !validLabelKey(l) {
		b.errf(key, path+".latencyClassLabel", "must be a label key (such as gpu or example.com/accelerator) or -, got %q", l)
	}
	if p := o.Prefix; p != nil {
		if p.BlockSize < 0 || p.BlockSize > 65536 {
			b.errf(key, path+".prefix.blockSize", "must be 1..65536 characters, got %d", p.BlockSize)
		}
		if p.MaxPrefixBlocksToMatch < 0 || p.MaxPrefixBlocksToMatch > 65536 {
			b.errf(key, path+".prefix.maxPrefixBlocksToMatch", "must be 1..65536, got %d", p.MaxPrefixBlocksToMatch)
		}
		if p.LRUCapacityPerServer < 0 || p.LRUCapacityPerServer > 100_000_000 {
			b.errf(key, path+".prefix.lruCapacityPerServer", "must be 1..100000000, got %d", p.LRUCapacityPerServer)
		}
		if p.AutoTune != nil && !*p.AutoTune {
			b.errf(key, path+".prefix.autoTune", "false is not supported: Tier-1 always sizes the prefix index from what the servers report")
		}
	}
}

// validLabelKey reports whether k is a Kubernetes label key: an optional
// DNS-subdomain prefix and a slash, then a name of 1 to 63 letters, digits,
// '-', '_' and '.', starting and ending with a letter or digit.
func validLabelKey(k string) bool {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		prefix, name = "", k
	} else if prefix == "" || len(prefix) > 253 || strings.Trim(prefix, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
		return false
	}
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if !alnum(name[0]) || !alnum(name[len(name)-1]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !alnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

// objective checks an InferenceObjective.
func (b *builder) objective(o *InferenceObjective) {
	key := ObjectKey{KindObjective, o.Metadata.Name}
	if p := o.Spec.Priority; p != nil && (*p < -1_000_000 || *p > 1_000_000) {
		b.errf(key, "spec.priority", "must be -1000000..1000000, got %d", *p)
	}
	if pr := o.Spec.PoolRef; pr != nil && len(b.s.Pools) > 0 {
		if _, ok := b.s.Pools[pr.Name]; !ok {
			b.errf(key, "spec.poolRef.name", "no InferencePool named %q", pr.Name)
		}
	}
}

func (b *builder) schedulerPolicy(key ObjectKey, path string, sc Scheduler) (SchedulerPolicy, bool) {
	var p SchedulerPolicy
	switch {
	case sc.Weights != nil && sc.ConfigMapRef != nil:
		b.errf(key, path+".weights", "set either weights or configMapRef, not both")
		return p, false
	case sc.Weights != nil:
		w := *sc.Weights
		ws := []struct {
			name string
			v    float64
		}{{"queue", w.Queue}, {"kvCache", w.KVCache}, {"prefix", w.Prefix}, {"loraAffinity", w.LoraAffinity},
			{"runningRequests", w.RunningRequests}, {"predictedLatency", w.PredictedLatency}, {"lru", w.LRU}}
		ok := true
		for _, x := range ws {
			if x.v < 0 {
				b.errf(key, path+".weights."+x.name, "must be ≥ 0, got %v", x.v)
				ok = false
			}
		}
		if w == (Weights{}) {
			b.errf(key, path+".weights", "at least one weight must be positive")
			ok = false
		}
		p = DefaultPolicy()
		p.Weights = w
		if !ok {
			return p, false
		}
	case sc.ConfigMapRef != nil:
		ref := sc.ConfigMapRef
		if ref.Name == "" {
			b.errf(key, path+".configMapRef.name", "required")
			return p, false
		}
		var ok bool
		p, ok = b.resolveRef(key, path+".configMapRef", ref)
		if !ok {
			return p, false
		}
	default:
		p = DefaultPolicy()
		if sc.Scoring == ScoringGIE {
			p.Weights = GIEWeights() // GIE's own default profile
		}
	}
	if sc.Scoring != "" {
		p.Scoring = sc.Scoring
	}
	if o := sc.Options; o != nil && o.Prefix != nil {
		if o.Prefix.BlockSize > 0 {
			p.BlockSize = o.Prefix.BlockSize
		}
		if o.Prefix.MaxPrefixBlocksToMatch > 0 {
			p.MaxPrefixBlocks = o.Prefix.MaxPrefixBlocksToMatch
		}
		if o.Prefix.LRUCapacityPerServer > 0 {
			p.LRUCapacityPerServer = o.Prefix.LRUCapacityPerServer
		}
		if o.Prefix.AutoTune != nil {
			p.PrefixAutoTune = o.Prefix.AutoTune
		}
	}
	return p, true
}

// resolveRef finds the EndpointPickerConfig a configMapRef names: a
// document of that kind with that name, or a ConfigMap whose data key holds
// one.
func (b *builder) resolveRef(key ObjectKey, path string, ref *ConfigMapRef) (SchedulerPolicy, bool) {
	if epp, ok := b.s.EndpointPickers[ref.Name]; ok {
		// Already validated on its own; resolve without re-reporting.
		saved := b.errs
		p, good := b.endpointPicker(ObjectKey{KindEndpointPicker, ref.Name}, "", epp)
		b.errs = saved
		if !good {
			b.errf(key, path, "EndpointPickerConfig %q is invalid (see its errors)", ref.Name)
		}
		return p, good
	}
	cm, ok := b.s.ConfigMaps[ref.Name]
	if !ok {
		b.errf(key, path+".name", "no EndpointPickerConfig or ConfigMap named %q", ref.Name)
		return SchedulerPolicy{}, false
	}
	dataKey := ref.Key
	if dataKey == "" {
		dataKey = "config.yaml"
	}
	raw, ok := cm.Data[dataKey]
	if !ok {
		b.errf(key, path+".key", "ConfigMap %q has no data key %q", ref.Name, dataKey)
		return SchedulerPolicy{}, false
	}
	cmKey := ObjectKey{KindConfigMap, ref.Name}
	docs, errs := Decode(b.where[cmKey]+" data."+dataKey, []byte(raw))
	if len(errs) > 0 {
		b.errs = append(b.errs, errs...)
		return SchedulerPolicy{}, false
	}
	if len(docs) != 1 {
		b.errf(cmKey, "data."+dataKey, "want exactly one EndpointPickerConfig document, got %d", len(docs))
		return SchedulerPolicy{}, false
	}
	epp, ok := docs[0].Value.(*EndpointPickerConfig)
	if !ok {
		b.errf(cmKey, "data."+dataKey, "want an EndpointPickerConfig, got %s", docs[0].Key.Kind)
		return SchedulerPolicy{}, false
	}
	return b.endpointPicker(cmKey, "data."+dataKey+": ", epp)
}

func (b *builder) pool(p *InferencePool) {
	key := ObjectKey{KindInferencePool, p.Metadata.Name}
	if len(p.Spec.Selector.MatchLabels) == 0 {
		b.errf(key, "spec.selector.matchLabels", "required")
	}
	if n := len(p.Spec.TargetPorts); n < 1 || n > 8 {
		b.errf(key, "spec.targetPorts", "want 1 to 8 ports, got %d", n)
	}
	for i, port := range p.Spec.TargetPorts {
		if port.Number < 1 || port.Number > 65535 {
			b.errf(key, fmt.Sprintf("spec.targetPorts[%d].number", i), "must be a port number 1-65535, got %d", port.Number)
		}
	}
	if r := p.Spec.EndpointPickerRef; r != nil {
		if r.Name == "" {
			b.errf(key, "spec.endpointPickerRef.name", "required")
		}
		switch r.FailureMode {
		case "", "FailClose", "FailOpen":
		default:
			b.errf(key, "spec.endpointPickerRef.failureMode", "want FailClose or FailOpen, got %q", r.FailureMode)
		}
	}
}

func (b *builder) rewrite(r *ModelRewrite, callable func(string) bool) {
	key := ObjectKey{KindModelRewrite, r.Metadata.Name}
	if pr := r.Spec.PoolRef; pr != nil && len(b.s.Pools) > 0 {
		if _, ok := b.s.Pools[pr.Name]; !ok {
			b.errf(key, "spec.poolRef.name", "no InferencePool named %q", pr.Name)
		}
	}
	if len(r.Spec.Rules) == 0 {
		b.errf(key, "spec.rules", "at least one rule is required")
	}
	for i, rule := range r.Spec.Rules {
		path := fmt.Sprintf("spec.rules[%d]", i)
		for j, m := range rule.Matches {
			mp := fmt.Sprintf("%s.matches[%d].model", path, j)
			if m.Model == nil {
				continue
			}
			if m.Model.Type != "" && m.Model.Type != "Exact" {
				b.errf(key, mp+".type", "only Exact is supported, got %q", m.Model.Type)
			}
			if m.Model.Value == "" {
				b.errf(key, mp+".value", "required")
			}
		}
		if len(rule.Targets) == 0 {
			b.errf(key, path+".targets", "at least one target is required")
		}
		for j, t := range rule.Targets {
			tp := fmt.Sprintf("%s.targets[%d]", path, j)
			if t.ModelRewrite == "" {
				b.errf(key, tp+".modelRewrite", "required")
			} else if !callable(t.ModelRewrite) {
				b.errf(key, tp+".modelRewrite", "target model %q is not served by any scheduler", t.ModelRewrite)
			}
			if t.Weight < 1 || t.Weight > 1_000_000 {
				b.errf(key, tp+".weight", "must be 1..1000000, got %d", t.Weight)
			}
			for k, c := range t.Clusters {
				if ok, why := b.clusterKnown("", c); !ok {
					b.errf(key, fmt.Sprintf("%s.clusters[%d]", tp, k), "%s", why)
				}
			}
		}
	}
	if st := r.Spec.Stickiness; st != nil {
		switch st.Key {
		case "", "tenant":
		case "header":
			if st.Header == "" {
				b.errf(key, "spec.stickiness.header", "required when key is header")
			}
		default:
			b.errf(key, "spec.stickiness.key", "want tenant or header, got %q", st.Key)
		}
	}
	if ro := r.Spec.Rollout; ro != nil {
		if ro.Stable == "" {
			b.errf(key, "spec.rollout.stable", "required")
		}
		if ro.Canary == "" {
			b.errf(key, "spec.rollout.canary", "required")
		}
		prev := int64(0)
		for i, s := range ro.Steps {
			if s < 0 || s > 100 || s < prev {
				b.errf(key, fmt.Sprintf("spec.rollout.steps[%d]", i), "steps are increasing percentages 0-100, got %d after %d", s, prev)
			}
			prev = s
		}
		if ro.Step < 0 || (len(ro.Steps) > 0 && ro.Step >= len(ro.Steps)) {
			b.errf(key, "spec.rollout.step", "out of range: %d with %d steps", ro.Step, len(ro.Steps))
		}
	}
}

func (b *builder) tenant(t *Tenant, callable func(string) bool) {
	key := ObjectKey{KindTenant, t.Metadata.Name}
	if !validBand(t.Spec.MaxBand, true) {
		b.errf(key, "spec.maxBand", "want Critical, Standard or Sheddable, got %q", t.Spec.MaxBand)
	}
	if t.Spec.Weight < 0 {
		b.errf(key, "spec.weight", "must be ≥ 0, got %v", t.Spec.Weight)
	}
	for i, m := range t.Spec.Models {
		if !callable(m) && !b.rewritten(m) {
			b.errf(key, fmt.Sprintf("spec.models[%d]", i), "model %q is not served by any scheduler or rewrite", m)
		}
	}
	l := t.Spec.Limits
	b.rate(key, "spec.limits.requests", l.Requests)
	b.rate(key, "spec.limits.tokens", l.Tokens)
	for i, mr := range l.PerModel {
		path := fmt.Sprintf("spec.limits.perModel[%d]", i)
		if mr.Model == "" {
			b.errf(key, path+".model", "required")
		}
		b.rate(key, path+".requests", mr.Requests)
		b.rate(key, path+".tokens", mr.Tokens)
	}
	for i, br := range l.PerBand {
		path := fmt.Sprintf("spec.limits.perBand[%d]", i)
		if !validBand(br.Band, false) {
			b.errf(key, path+".band", "want Critical, Standard or Sheddable, got %q", br.Band)
		}
		b.rate(key, path+".requests", br.Requests)
		b.rate(key, path+".tokens", br.Tokens)
	}
}

// rewritten reports whether a public model name is matched by a rewrite.
func (b *builder) rewritten(model string) bool {
	for _, r := range b.s.Rewrites {
		for _, rule := range r.Spec.Rules {
			for _, m := range rule.Matches {
				if m.Model != nil && m.Model.Value == model {
					return true
				}
			}
		}
	}
	return false
}

func (b *builder) rate(key ObjectKey, path string, r *Rate) {
	if r == nil {
		return
	}
	if r.Limit <= 0 {
		b.errf(key, path+".limit", "must be > 0, got %d", r.Limit)
	}
	if r.Per <= 0 {
		b.errf(key, path+".per", "required: a positive duration such as \"1m\"")
	}
	if r.Burst < 0 {
		b.errf(key, path+".burst", "must be ≥ 0, got %d", r.Burst)
	}
}

func (b *builder) staticEndpoints(se *StaticEndpoints) {
	key := ObjectKey{KindStaticEndpoints, se.Metadata.Name}
	if se.Spec.Cluster != "" {
		if ok, why := b.clusterKnown("", se.Spec.Cluster); !ok {
			b.errf(key, "spec.cluster", "%s", why)
		}
	}
	names := map[string]bool{}
	for i, ep := range se.Spec.Endpoints {
		path := fmt.Sprintf("spec.endpoints[%d]", i)
		if ep.Name == "" {
			b.errf(key, path+".name", "required")
		} else if names[ep.Name] {
			b.errf(key, path+".name", "duplicate endpoint %q", ep.Name)
		}
		names[ep.Name] = true
		if err := checkHostPort(ep.Address); err != nil {
			b.errf(key, path+".address", "%v", err)
		}
	}
}

func validBand(s string, allowEmpty bool) bool {
	switch s {
	case BandCritical, BandStandard, BandSheddable:
		return true
	case "":
		return allowEmpty
	}
	return false
}

func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" {
		return fmt.Errorf("want host:port, got %q", a)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("want host:port with a port 1-65535, got %q", a)
	}
	return nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
