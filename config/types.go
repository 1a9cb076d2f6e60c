package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// API groups and versions Meridian reads. HyperPod's group is accepted for
// InferenceGatewayConfig so operators can bring their files unchanged.
const (
	MeridianV1Alpha1   = "meridian.dev/v1alpha1"
	HyperPodV1Alpha1   = "inference.sagemaker.aws.amazon.com/v1alpha1"
	GIEPoolV1          = "inference.networking.k8s.io/v1"
	GIEXV1Alpha2       = "inference.networking.x-k8s.io/v1alpha2"
	GIEEPPConfigV1Alp1 = "inference.networking.x-k8s.io/v1alpha1"
	CoreV1             = "v1"

	// BBRManagedLabel marks a ConfigMap as an adapter → base-model map for
	// body-based routing.
	BBRManagedLabel = "inference.networking.k8s.io/bbr-managed"
)

// Kinds of object a snapshot holds.
const (
	KindGateway         = "InferenceGatewayConfig"
	KindEndpointPicker  = "EndpointPickerConfig"
	KindConfigMap       = "ConfigMap"
	KindInferencePool   = "InferencePool"
	KindModelRewrite    = "InferenceModelRewrite"
	KindTenant          = "Tenant"
	KindTopology        = "Topology"
	KindStaticEndpoints = "StaticEndpoints"
	KindObjective       = "InferenceObjective"
)

// Metadata is the subset of Kubernetes object metadata Meridian uses.
type Metadata struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("50ms", "1m").
//
// +kubebuilder:validation:Type=string
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"1m\" or \"500ms\"")
	}
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("invalid duration %q: want a value such as \"1m\" or \"500ms\"", s)
	}
	*d = Duration(v)
	return nil
}

// ---------------------------------------------------------------------------
// InferenceGatewayConfig

// Gateway is one cluster's Tier-1 configuration (kind InferenceGatewayConfig).
type Gateway struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Metadata   Metadata    `json:"metadata"`
	Spec       GatewaySpec `json:"spec"`
}

// GatewaySpec holds the schedulers of one cluster and how callers are
// authenticated at the Tier-2 in front of it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.schedulers) || size(self.schedulers) <= 1 || (has(self.bbr) && self.bbr.enabled)",message="body-based routing (bbr.enabled) must be on with more than one scheduler"
type GatewaySpec struct {
	// Region and Cluster name where this gateway runs; they must appear in
	// the Topology when one is configured.
	Region  string `json:"region,omitempty"`
	Cluster string `json:"cluster,omitempty"`
	// BBR turns body-based routing on: the adapter named in the body is
	// mapped to its base model through the bbr-managed ConfigMaps.
	// Required when there is more than one scheduler.
	BBR  BBR  `json:"bbr,omitempty"`
	Auth Auth `json:"auth,omitempty"`
	// Schedulers is one pool each; at most 100.
	// +kubebuilder:validation:MaxItems=100
	Schedulers []Scheduler `json:"schedulers"`
}

// BBR configures body-based routing.
type BBR struct {
	Enabled bool `json:"enabled"`
}

// Auth configures caller authentication.
type Auth struct {
	JWT *JWT `json:"jwt,omitempty"`
}

// JWT configures bearer-token verification.
type JWT struct {
	Issuer    string   `json:"issuer"`
	Audiences []string `json:"audiences,omitempty"`
	// JWKSFile and JWKSURL name where the verification keys live; exactly
	// one is required. A relative JWKSFile is resolved against the file that
	// declares it.
	JWKSFile string `json:"jwksFile,omitempty"`
	JWKSURL  string `json:"jwksURL,omitempty"`
	// JWKSRefresh is how often keys from JWKSURL are re-fetched.
	// Zero means 5m.
	JWKSRefresh    Duration       `json:"jwksRefresh,omitempty"`
	RequiredClaims RequiredClaims `json:"requiredClaims,omitempty"`
	// ClockSkew is the tolerance on a token's exp, nbf and iat, for clocks
	// that disagree between the issuer and Tier-2. Zero means 30s.
	ClockSkew Duration `json:"clockSkew,omitempty"`
}

// RequiredClaims says which claims a caller's token must carry and which of
// them carry the tenant and the criticality.
type RequiredClaims struct {
	// Present lists claims that must exist in every token.
	Present []string `json:"present,omitempty"`
	// Tenant names the claim that carries the tenant. Default "tenant".
	Tenant string `json:"tenant,omitempty"`
	// Criticality names the claim that carries the band
	// (Critical, Standard, Sheddable). Default "criticality"; a token
	// without it is Standard.
	Criticality string `json:"criticality,omitempty"`
}

// TenantClaim returns the claim carrying the tenant, with its default.
func (r RequiredClaims) TenantClaim() string {
	if r.Tenant == "" {
		return "tenant"
	}
	return r.Tenant
}

// CriticalityClaim returns the claim carrying the band, with its default.
func (r RequiredClaims) CriticalityClaim() string {
	if r.Criticality == "" {
		return "criticality"
	}
	return r.Criticality
}

// Scheduler is one model pool: which pods serve it and how Tier-1 scores
// them.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.weights) && has(self.configMapRef))",message="set either weights or configMapRef, not both"
type Scheduler struct {
	Name string `json:"name"`
	// ModelName is the model name callers send (the body's "model").
	ModelName     string        `json:"modelName"`
	ModelSelector ModelSelector `json:"modelSelector"`
	// TargetPort is the model-server port on each pod. Default 8000.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	TargetPort int `json:"targetPort,omitempty"`
	// Replicas is the desired number of Tier-1 replicas (informational in
	// standalone mode; used by the Helm chart).
	Replicas int `json:"replicas,omitempty"`
	// Weights and ConfigMapRef are mutually exclusive. With neither, the
	// documented defaults apply (queue 2, kvCache 2, prefix 3).
	Weights      *Weights      `json:"weights,omitempty"`
	ConfigMapRef *ConfigMapRef `json:"configMapRef,omitempty"`
	// LoraAdapters served by this pool; at most 50.
	// +kubebuilder:validation:MaxItems=50
	LoraAdapters []string `json:"loraAdapters,omitempty"`
	// Scoring selects the scorer semantics: "meridian" (default) or "gie"
	// (the Gateway API Inference Extension's exact semantics, the baseline).
	// Meridian's own field.
	// +kubebuilder:validation:Enum=meridian;gie
	Scoring string `json:"scoring,omitempty"`
	// Admission tunes this pool's admission by priority band at Tier-1;
	// unset fields keep priority's defaults. Meridian's own field.
	Admission *Admission `json:"admission,omitempty"`
	// Options tune Tier-1's scorers for this pool; unset fields keep the
	// defaults (tier1.DefaultOptions). Meridian's own field.
	Options *SchedulerOptions `json:"options,omitempty"`
}

// SchedulerOptions are tier1.Options for one pool, plus the prefix index.
type SchedulerOptions struct {
	// Fallbacks is how many endpoints after the primary a decision
	// returns for retries before the first byte. Default 2; -1 means none.
	Fallbacks int `json:"fallbacks,omitempty"`
	// MaxMetricsAge is how old a pod's last scrape may be before the pod
	// is avoided: only a last fallback (all stale: all used). Default 1s
	// (20 scrapes of 50 ms).
	MaxMetricsAge Duration `json:"maxMetricsAge,omitempty"`
	// QueueHalf and RunningHalf are the waiting and running requests
	// (scraped plus dispatched since the scrape: Tier-1's in-flight
	// accounting) at which the queue and running-requests scores halve.
	// Defaults 4 and 64.
	QueueHalf   float64 `json:"queueHalf,omitempty"`
	RunningHalf float64 `json:"runningHalf,omitempty"`
	// QueueSaturation and KVSaturation are where a pod's cached prefix
	// stops counting for the prefix score. Defaults 8 and 0.95.
	QueueSaturation float64 `json:"queueSaturation,omitempty"`
	KVSaturation    float64 `json:"kvSaturation,omitempty"`
	// LatencyScale is the predicted TTFT at which the predictedLatency
	// score halves (the latency model's scale). Default 500ms.
	LatencyScale Duration `json:"latencyScale,omitempty"`
	// LatencyClassLabel is the pod label (of a Kubernetes pod, or of a
	// static endpoint) whose value names the pod's hardware class: pods of
	// the pool with the same value share one latency model, which learns
	// from all their first tokens. Pods without the label learn alone.
	// Default "gpu"; "-" makes every pod learn alone.
	LatencyClassLabel string `json:"latencyClassLabel,omitempty"`
	// Prefix sizes the prefix index; it overrides the prefix plugin's
	// parameters of an EndpointPickerConfig.
	Prefix *PrefixOptions `json:"prefix,omitempty"`
}

// PrefixOptions size the prefix index (GIE prefix-cache-scorer's names).
type PrefixOptions struct {
	// BlockSize is characters per block. Default 64.
	BlockSize int `json:"blockSize,omitempty"`
	// MaxPrefixBlocksToMatch caps blocks hashed per request. Default 256.
	MaxPrefixBlocksToMatch int `json:"maxPrefixBlocksToMatch,omitempty"`
	// LRUCapacityPerServer caps blocks remembered per pod that reports no
	// KV cache size. Default 31250.
	LRUCapacityPerServer int `json:"lruCapacityPerServer,omitempty"`
	// AutoTune sizes the index from what the servers report; only true
	// (the default) is supported.
	AutoTune *bool `json:"autoTune,omitempty"`
}

// Admission is one pool's admission by priority band (docs/priority.md):
// when the pool counts as saturated, and what the Gate in front of it
// holds. Every field is optional; zero keeps the default named.
type Admission struct {
	// QueueThreshold is the waiting requests per pod at which a pod counts
	// as full. Default 5 (GIE's).
	QueueThreshold float64 `json:"queueThreshold,omitempty"`
	// KVCacheThreshold is the KV-cache use (0..1] at which a pod counts as
	// full. Default 0.8 (GIE's); vLLM preempts above about 0.9.
	KVCacheThreshold float64 `json:"kvCacheThreshold,omitempty"`
	// StaleAfter is the metrics age beyond which a pod is left out of the
	// saturation. Default 2s.
	StaleAfter Duration `json:"staleAfter,omitempty"`
	// CriticalReserve is the share of the saturation budget kept for
	// Critical requests, 0..1; 0 means no reserve. Unset means 0.65.
	CriticalReserve *float64 `json:"criticalReserve,omitempty"`
	// MaxQueued bounds the requests waiting in the pool's Gate. Default 1000.
	MaxQueued int `json:"maxQueued,omitempty"`
	// MaxQueuedBytes bounds the request bodies held while waiting.
	// Default 268435456 (256 MiB).
	MaxQueuedBytes int64 `json:"maxQueuedBytes,omitempty"`
	// StandardMaxWait and CriticalMaxWait are how long a request of the
	// band may wait before a 429. Defaults 10s and 30s.
	StandardMaxWait Duration `json:"standardMaxWait,omitempty"`
	CriticalMaxWait Duration `json:"criticalMaxWait,omitempty"`
	// RetryAfter is the delay a 429 asks for. Default 1s.
	RetryAfter Duration `json:"retryAfter,omitempty"`
	// ClusterQueueTime (Tier-2's only: Topology spec.routing.admission)
	// is how much work, in time at the rate each cluster's Gate lets
	// requests into its pool, Tier-2 leaves waiting in that Gate before it
	// holds Critical and Standard requests itself; 0s means none. Unset
	// means 500ms.
	ClusterQueueTime *Duration `json:"clusterQueueTime,omitempty"`
}

// ModelSelector selects pods (Kubernetes or StaticEndpoints) by label.
type ModelSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// ConfigMapRef names an EndpointPickerConfig: a document of that kind with
// this name, or a ConfigMap with this name whose data key Key (default
// "config.yaml") holds one.
type ConfigMapRef struct {
	Name string `json:"name"`
	Key  string `json:"key,omitempty"`
}

// Weights of the seven scorers. Unset weights are zero; at least one must
// be positive.
type Weights struct {
	// +kubebuilder:validation:Minimum=0
	Queue float64 `json:"queue,omitempty"`
	// +kubebuilder:validation:Minimum=0
	KVCache float64 `json:"kvCache,omitempty"`
	// +kubebuilder:validation:Minimum=0
	Prefix float64 `json:"prefix,omitempty"`
	// +kubebuilder:validation:Minimum=0
	LoraAffinity float64 `json:"loraAffinity,omitempty"`
	// +kubebuilder:validation:Minimum=0
	RunningRequests float64 `json:"runningRequests,omitempty"`
	// +kubebuilder:validation:Minimum=0
	PredictedLatency float64 `json:"predictedLatency,omitempty"`
	// +kubebuilder:validation:Minimum=0
	LRU float64 `json:"lru,omitempty"`
}

// DefaultWeights are the weights of a scheduler that names none: HyperPod's
// documented defaults (queue 2, kvCache 2, prefix 3, which are also GIE's
// default profile, GIEWeights) plus predictedLatency 32, which sends a
// request to a slower pod only when that pod's learned latency model
// predicts it answers sooner. Chosen by `meridian replay` on the Mooncake
// trace and checked on the Azure trace (docs/tuning.md); on uniform fleets
// the latency term changes little.
func DefaultWeights() Weights { return Weights{Queue: 2, KVCache: 2, Prefix: 3, PredictedLatency: 32} }

// GIEWeights are the Gateway API Inference Extension's default profile:
// queue 2, kv-cache 2, prefix 3.
func GIEWeights() Weights { return Weights{Queue: 2, KVCache: 2, Prefix: 3} }

// ---------------------------------------------------------------------------
// EndpointPickerConfig (GIE)

// EndpointPickerConfig is GIE's full plugin configuration for a scheduler.
type EndpointPickerConfig struct {
	APIVersion         string              `json:"apiVersion"`
	Kind               string              `json:"kind"`
	Metadata           Metadata            `json:"metadata,omitempty"`
	Plugins            []PluginSpec        `json:"plugins"`
	SchedulingProfiles []SchedulingProfile `json:"schedulingProfiles,omitempty"`
}

// PluginSpec declares one plugin instance.
type PluginSpec struct {
	Name       string          `json:"name,omitempty"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// SchedulingProfile lists plugin references with weights.
type SchedulingProfile struct {
	Name    string          `json:"name"`
	Plugins []ProfilePlugin `json:"plugins"`
}

// ProfilePlugin references a plugin by name; Weight applies to scorers.
type ProfilePlugin struct {
	PluginRef string   `json:"pluginRef"`
	Weight    *float64 `json:"weight,omitempty"`
}

// ---------------------------------------------------------------------------
// ConfigMap (BBR adapters, or an EndpointPickerConfig carrier)

// ConfigMap is a core/v1 ConfigMap.
type ConfigMap struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   Metadata          `json:"metadata"`
	Data       map[string]string `json:"data"`
}

// ---------------------------------------------------------------------------
// InferencePool (GIE v1)

// InferencePool is GIE's pool of model-server pods.
type InferencePool struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   Metadata          `json:"metadata"`
	Spec       InferencePoolSpec `json:"spec"`
}

// InferencePoolSpec follows GIE v1.
type InferencePoolSpec struct {
	Selector          LabelSelector      `json:"selector"`
	TargetPorts       []Port             `json:"targetPorts"`
	EndpointPickerRef *EndpointPickerRef `json:"endpointPickerRef,omitempty"`
}

// LabelSelector selects by exact labels.
type LabelSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// Port is a port number.
type Port struct {
	Number int `json:"number"`
}

// EndpointPickerRef names the picker service.
type EndpointPickerRef struct {
	Group       string `json:"group,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Name        string `json:"name"`
	Port        *Port  `json:"port,omitempty"`
	FailureMode string `json:"failureMode,omitempty"` // FailClose (default) | FailOpen
}

// ---------------------------------------------------------------------------
// InferenceModelRewrite (GIE v1alpha2 + Meridian fields)

// ModelRewrite splits a public model name across target models.
type ModelRewrite struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Metadata   Metadata         `json:"metadata"`
	Spec       ModelRewriteSpec `json:"spec"`
}

// ModelRewriteSpec follows GIE v1alpha2, plus Meridian's stickiness.
type ModelRewriteSpec struct {
	PoolRef *PoolRef      `json:"poolRef,omitempty"`
	Rules   []RewriteRule `json:"rules"`
	// Stickiness makes assignment deterministic per key (Meridian's own;
	// GIE picks at random per request).
	Stickiness *Stickiness `json:"stickiness,omitempty"`
	// Rollout, when set, is a stepped canary managed by `meridian canary`.
	Rollout *Rollout `json:"rollout,omitempty"`
}

// PoolRef names an InferencePool.
type PoolRef struct {
	Group string `json:"group,omitempty"`
	Kind  string `json:"kind,omitempty"`
	Name  string `json:"name"`
}

// RewriteRule matches models and splits them over targets.
type RewriteRule struct {
	Matches []RewriteMatch  `json:"matches,omitempty"`
	Targets []RewriteTarget `json:"targets"`
}

// RewriteMatch matches the request's model.
type RewriteMatch struct {
	Model *ModelMatch `json:"model,omitempty"`
}

// ModelMatch is an exact model-name match.
type ModelMatch struct {
	Type  string `json:"type,omitempty"` // Exact (default)
	Value string `json:"value"`
}

// RewriteTarget is one weighted destination model.
type RewriteTarget struct {
	ModelRewrite string `json:"modelRewrite"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	Weight int64 `json:"weight"`
	// Clusters restricts the target to these clusters (any Region); empty
	// means wherever a scheduler serves the target model. Meridian's own.
	Clusters []string `json:"clusters,omitempty"`
}

// Stickiness selects what keeps a caller on one target.
type Stickiness struct {
	// Key is "tenant" (default) or "header".
	// +kubebuilder:validation:Enum=tenant;header
	Key string `json:"key,omitempty"`
	// Header names the request header when Key is "header" (for example
	// x-session-id); requests without it fall back to the tenant.
	Header string `json:"header,omitempty"`
	// Salt changes the assignment between rollouts.
	Salt string `json:"salt,omitempty"`
}

// Rollout is a stepped canary's plan and analysis thresholds.
type Rollout struct {
	Stable   string   `json:"stable"`
	Canary   string   `json:"canary"`
	Steps    []int64  `json:"steps,omitempty"`    // canary weights in percent, e.g. 5,25,50,100
	Interval Duration `json:"interval,omitempty"` // time per step
	Step     int      `json:"step,omitempty"`     // index into Steps
	// StepStarted is when the current step began (RFC 3339).
	StepStarted string         `json:"stepStarted,omitempty"`
	Status      string         `json:"status,omitempty"` // Progressing, Paused, Healthy, Degraded, Aborted
	Reason      string         `json:"reason,omitempty"`
	Analysis    *AnalysisLimit `json:"analysis,omitempty"`
}

// AnalysisLimit holds the thresholds a canary must meet relative to stable.
type AnalysisLimit struct {
	MaxTTFTP99Ratio   float64 `json:"maxTTFTP99Ratio,omitempty"`   // canary / stable; 0 means 1.5
	MaxErrorRateDelta float64 `json:"maxErrorRateDelta,omitempty"` // absolute; 0 means 0.05
	Max429RateDelta   float64 `json:"max429RateDelta,omitempty"`   // absolute; 0 means 0.1
	MinRequests       int64   `json:"minRequests,omitempty"`       // per side before judging; 0 means 20
}

// ---------------------------------------------------------------------------
// InferenceObjective (GIE)

// InferenceObjective names a priority (GIE's v1alpha2 shape): a request
// whose x-gateway-inference-objective header carries the name gets the
// band of spec.priority (positive Critical, 0 Standard, negative
// Sheddable).
type InferenceObjective struct {
	APIVersion string                 `json:"apiVersion"`
	Kind       string                 `json:"kind"`
	Metadata   Metadata               `json:"metadata"`
	Spec       InferenceObjectiveSpec `json:"spec"`
}

// InferenceObjectiveSpec follows GIE.
type InferenceObjectiveSpec struct {
	// Priority: higher is served first; nil means 0 (Standard).
	Priority *int `json:"priority,omitempty"`
	// PoolRef names the InferencePool the objective applies to
	// (informational: Meridian applies objectives to every pool).
	PoolRef *PoolRef `json:"poolRef,omitempty"`
}

// ---------------------------------------------------------------------------
// Tenant

// Tenant is one product team's quota and permissions.
type Tenant struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   Metadata   `json:"metadata"`
	Spec       TenantSpec `json:"spec"`
}

// TenantSpec holds a tenant's limits.
type TenantSpec struct {
	// MaxBand is the highest band the tenant may claim: Critical,
	// Standard (default) or Sheddable. Higher claims are lowered to it.
	// +kubebuilder:validation:Enum=Critical;Standard;Sheddable
	MaxBand string `json:"maxBand,omitempty"`
	// Weight is the tenant's share in fair queueing inside a band.
	// Zero means 1.
	Weight float64 `json:"weight,omitempty"`
	// Models the tenant may call (public names); empty means all.
	Models []string    `json:"models,omitempty"`
	Limits TenantLimit `json:"limits,omitempty"`
}

// TenantLimit holds overall, per-model and per-band limits; every one that
// is set must allow a request.
type TenantLimit struct {
	Requests *Rate       `json:"requests,omitempty"`
	Tokens   *Rate       `json:"tokens,omitempty"`
	PerModel []ModelRate `json:"perModel,omitempty"`
	PerBand  []BandRate  `json:"perBand,omitempty"`
}

// Rate is Limit units per Per, with Burst units allowed at once.
type Rate struct {
	Limit int64    `json:"limit"`
	Per   Duration `json:"per"`
	// Burst is the bucket size. Zero means Limit (a full period's worth).
	Burst int64 `json:"burst,omitempty"`
}

// ModelRate limits one model.
type ModelRate struct {
	Model    string `json:"model"`
	Requests *Rate  `json:"requests,omitempty"`
	Tokens   *Rate  `json:"tokens,omitempty"`
}

// BandRate limits one band.
type BandRate struct {
	Band     string `json:"band"`
	Requests *Rate  `json:"requests,omitempty"`
	Tokens   *Rate  `json:"tokens,omitempty"`
}

// Bands, highest first.
const (
	BandCritical  = "Critical"
	BandStandard  = "Standard"
	BandSheddable = "Sheddable"
)

// ---------------------------------------------------------------------------
// Topology

// Topology names the Regions, their clusters and addresses.
type Topology struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   Metadata     `json:"metadata"`
	Spec       TopologySpec `json:"spec"`
}

// TopologySpec lists Regions and how Tier-2 chooses among their clusters.
type TopologySpec struct {
	Regions []Region `json:"regions"`
	// Routing tunes Tier-2's cluster choice; unset fields keep defaults.
	Routing *Routing `json:"routing,omitempty"`
	// Gossip sets the Tier-2 gossip (memberlist) timings; unset fields
	// keep the profile's. Read when a Tier-2 starts: memberlist cannot
	// change its timers live, so a reload that changes them is reported
	// and applies at the next restart.
	Gossip *Gossip `json:"gossip,omitempty"`
}

// Gossip is the timing of Tier-2's memberlist cluster (tier2/gossip).
// Every Tier-2 of one cluster should run the same settings: memberlist
// has one set of timers for the whole membership.
type Gossip struct {
	// Profile is memberlist's preset: lan, wan or local. Default wan
	// (instances span Regions; what `meridian tier2` always ran).
	Profile string `json:"profile,omitempty"`
	// GossipInterval is how often queued broadcasts go to GossipNodes
	// random members. Default the profile's (100ms local, 200ms lan,
	// 500ms wan).
	GossipInterval Duration `json:"gossipInterval,omitempty"`
	// GossipNodes is how many members each gossip round goes to. Default
	// the profile's (3; 4 for wan).
	GossipNodes int `json:"gossipNodes,omitempty"`
	// PushPullInterval is how often full state is exchanged with one
	// member. Default the profile's (15s local, 30s lan, 60s wan).
	PushPullInterval Duration `json:"pushPullInterval,omitempty"`
	// ProbeInterval and ProbeTimeout drive failure detection and the
	// measured round trips. Defaults the profile's (1s/200ms local,
	// 1s/500ms lan, 5s/3s wan).
	ProbeInterval Duration `json:"probeInterval,omitempty"`
	ProbeTimeout  Duration `json:"probeTimeout,omitempty"`
	// StreamTimeout bounds one TCP exchange (join, push/pull). Default the
	// profile's (1s local, 10s lan, 30s wan).
	StreamTimeout Duration `json:"streamTimeout,omitempty"`
}

// Routing is Tier-2's cluster-choice policy (docs/regions.md). Weights use
// AWS's names plus Meridian's prefix affinity; zero weights keep the
// defaults only when every weight is zero.
type Routing struct {
	Weights *RoutingWeights `json:"weights,omitempty"`
	// LoadFactor is 1+ε of consistent hashing with bounded loads: no
	// cluster takes more than LoadFactor × its fair share of prefixes.
	// Zero means 1.25.
	LoadFactor float64 `json:"loadFactor,omitempty"`
	// RTTs are configured round trips between Regions, used until
	// measured ones arrive.
	RTTs []RegionRTT `json:"rtts,omitempty"`
	// DigestMaxAge is how old a pool-health digest may be and still be
	// used; a cluster with none fresher is not a candidate. Default 5s:
	// ten of Tier-1's 500 ms digests, so a lost digest or a slow gossip
	// round does not drop a cluster.
	DigestMaxAge Duration `json:"digestMaxAge,omitempty"`
	// RetryBudget caps Tier-2's failovers; unset fields keep the defaults.
	RetryBudget *RetryBudget `json:"retryBudget,omitempty"`
	// OutlierDetection ejects failing clusters; unset fields keep the
	// defaults.
	OutlierDetection *OutlierDetection `json:"outlierDetection,omitempty"`
	// Admission tunes Tier-2's global admission by band (one Gate per
	// model, fed from the digests); unset fields keep priority's defaults.
	Admission *Admission `json:"admission,omitempty"`
	// CanaryAnalysis times Tier-2's canary analysis; unset fields keep
	// the defaults.
	CanaryAnalysis *CanaryAnalysis `json:"canaryAnalysis,omitempty"`
}

// CanaryAnalysis times Tier-2's analysis of stepped canaries
// (tier2/canary.go).
type CanaryAnalysis struct {
	// Period is the longest time between two analyses (a rollout with a
	// short step interval is analysed every quarter of it). Default 5s:
	// with the 1m default window, twelve verdicts per window, and a
	// failing canary is aborted within seconds.
	Period Duration `json:"period,omitempty"`
	// Window bounds how far back measurements count. Default 1m.
	Window Duration `json:"window,omitempty"`
}

// RetryBudget lets retries add at most Ratio of the requests seen over
// Window, plus MinRetries per Window.
type RetryBudget struct {
	// Ratio is retries allowed per request. Default 0.2 (Finagle's and
	// Envoy's usual budget: a retry storm adds at most 20% load).
	Ratio float64 `json:"ratio,omitempty"`
	// Window is the period counted. Default 10s.
	Window Duration `json:"window,omitempty"`
	// MinRetries are allowed per Window whatever the traffic. Default 3.
	MinRetries int `json:"minRetries,omitempty"`
}

// OutlierDetection is the shape of Envoy's outlier detection for clusters.
type OutlierDetection struct {
	// ConsecutiveFailures ejects a cluster after this many failures in a
	// row. Default 5 (Envoy's).
	ConsecutiveFailures int `json:"consecutiveFailures,omitempty"`
	// FailureRate ejects a cluster whose failed share over Interval
	// reaches it, after MinRequests. Default 0.5.
	FailureRate float64 `json:"failureRate,omitempty"`
	// MinRequests before FailureRate applies. Default 20.
	MinRequests int `json:"minRequests,omitempty"`
	// Interval FailureRate is computed over. Default 10s (Envoy's).
	Interval Duration `json:"interval,omitempty"`
	// BaseEjection is the first ejection's length, doubled per repeat up
	// to MaxEjection; the backoff resets after EjectionMemory without one.
	// Defaults 2s, 2m, 5m.
	BaseEjection   Duration `json:"baseEjection,omitempty"`
	MaxEjection    Duration `json:"maxEjection,omitempty"`
	EjectionMemory Duration `json:"ejectionMemory,omitempty"`
	// ReadmitShare is the share of traffic a readmitted cluster starts
	// with, doubling every ReadmitStep. Defaults 0.1 and 1s.
	ReadmitShare float64  `json:"readmitShare,omitempty"`
	ReadmitStep  Duration `json:"readmitStep,omitempty"`
}

// RoutingWeights weigh the cluster scorers.
type RoutingWeights struct {
	KVHeadroom      float64 `json:"kvHeadroom,omitempty"`
	QueueDepth      float64 `json:"queueDepth,omitempty"`
	RegionProximity float64 `json:"regionProximity,omitempty"`
	ErrorRate       float64 `json:"errorRate,omitempty"`
	PrefixAffinity  float64 `json:"prefixAffinity,omitempty"`
}

// RegionRTT is a configured round trip between two Regions.
type RegionRTT struct {
	A   string   `json:"a"`
	B   string   `json:"b"`
	RTT Duration `json:"rtt"`
}

// Region is one AWS Region (or any failure domain).
type Region struct {
	Name string `json:"name"`
	// Tier2 lists the Region's Tier-2 HTTP addresses (host:port).
	Tier2 []string `json:"tier2,omitempty"`
	// Gossip lists memberlist addresses to join (host:port).
	Gossip   []string  `json:"gossip,omitempty"`
	Clusters []Cluster `json:"clusters"`
}

// Cluster is one Tier-1 deployment.
type Cluster struct {
	Name string `json:"name"`
	// Tier1 is the cluster's Tier-1 proxy base URL (http://host:port).
	Tier1 string `json:"tier1"`
	// Health is the Tier-1 pool-health gRPC address (host:port).
	Health string `json:"health,omitempty"`
}

// ---------------------------------------------------------------------------
// StaticEndpoints

// StaticEndpoints lists model-server pods for platforms without Kubernetes.
type StaticEndpoints struct {
	APIVersion string              `json:"apiVersion"`
	Kind       string              `json:"kind"`
	Metadata   Metadata            `json:"metadata"`
	Spec       StaticEndpointsSpec `json:"spec"`
}

// StaticEndpointsSpec lists endpoints.
type StaticEndpointsSpec struct {
	// Cluster limits these endpoints to one cluster's Tier-1; empty means
	// every cluster.
	Cluster   string           `json:"cluster,omitempty"`
	Endpoints []StaticEndpoint `json:"endpoints"`
}

// StaticEndpoint is one pod.
type StaticEndpoint struct {
	Name    string            `json:"name"`
	Address string            `json:"address"` // host:port
	Labels  map[string]string `json:"labels,omitempty"`
}
