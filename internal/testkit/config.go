package testkit

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/config"
)

// Snapshot decodes YAML configuration documents and builds them into the
// configuration at revision rev, failing tb on any decoding or build error.
func Snapshot(tb testing.TB, rev int64, yaml string) *config.Snapshot {
	tb.Helper()
	return SnapshotFile(tb, "test.yaml", rev, yaml)
}

// SnapshotFile is Snapshot of documents read as if from the file at path:
// errors name it, and files they refer to by a relative name (jwksFile)
// are beside it.
func SnapshotFile(tb testing.TB, path string, rev int64, yaml string) *config.Snapshot {
	tb.Helper()
	docs, errs := config.Decode(path, []byte(yaml))
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	s, err := config.Build(docs, rev)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Endpoint is one endpoint of a StaticEndpoints document: its name,
// address (host:port), pool label and, when not "", gpu label (which
// names its latency class).
type Endpoint struct{ Name, Address, Pool, GPU string }

// StaticEndpoints is a StaticEndpoints document named "pods" that lists
// eps, each labelled {pool: Pool} (and gpu: GPU when set), as YAML that starts with the document
// separator "---" (to append to other documents).
func StaticEndpoints(eps ...Endpoint) string {
	var b strings.Builder
	b.WriteString("---\napiVersion: meridian.dev/v1alpha1\nkind: StaticEndpoints\nmetadata: {name: pods}\nspec:\n  endpoints:\n")
	for _, ep := range eps {
		gpu := ""
		if ep.GPU != "" {
			gpu = ", gpu: " + ep.GPU
		}
		fmt.Fprintf(&b, "  - {name: %s, address: %q, labels: {pool: %s%s}}\n", ep.Name, ep.Address, ep.Pool, gpu)
	}
	return b.String()
}

// PodEndpoints lists pods (by pool label) as Endpoints, each named after
// its pool and address (pool-host-port), in no particular order.
func PodEndpoints[P interface{ Addr() string }](pods map[string][]P) []Endpoint {
	var eps []Endpoint
	for pool, ps := range pods {
		for _, p := range ps {
			eps = append(eps, Endpoint{Name: pool + "-" + strings.ReplaceAll(p.Addr(), ":", "-"), Address: p.Addr(), Pool: pool})
		}
	}
	return eps
}

// Cluster is one cluster of a Topology document: its Region, name, Tier-1
// URL and, when not "", the address of its pool-health feed.
type Cluster struct{ Region, Name, Tier1, Health string }

// Topology is a Topology document named "t" that lists clusters, each
// under its Region, the Regions in the order they first appear. It ends
// inside spec: more of its settings (indented two spaces, "  routing: …")
// may follow, then other documents.
func Topology(clusters ...Cluster) string {
	var b strings.Builder
	b.WriteString("apiVersion: meridian.dev/v1alpha1\nkind: Topology\nmetadata: {name: t}\nspec:\n  regions:\n")
	var regions []string
	for _, c := range clusters {
		if !slices.Contains(regions, c.Region) {
			regions = append(regions, c.Region)
		}
	}
	for _, r := range regions {
		fmt.Fprintf(&b, "  - name: %s\n    clusters:\n", r)
		for _, c := range clusters {
			if c.Region != r {
				continue
			}
			fmt.Fprintf(&b, "    - {name: %s, tier1: %q", c.Name, c.Tier1)
			if c.Health != "" {
				fmt.Fprintf(&b, ", health: %q", c.Health)
			}
			b.WriteString("}\n")
		}
	}
	return b.String()
}

// Gateway is the head of cluster's InferenceGatewayConfig (named after the
// cluster) in region, as YAML that starts with the document separator
// "---" (to append to other documents). It ends inside spec: the rest of
// the gateway's spec (indented two spaces, such as ChatScheduler) follows.
func Gateway(region, cluster string) string {
	return fmt.Sprintf("---\napiVersion: meridian.dev/v1alpha1\nkind: InferenceGatewayConfig\nmetadata: {name: %[2]s}\nspec:\n  region: %[1]s\n  cluster: %[2]s\n", region, cluster)
}

// Tenant is the head of the Tenant document name, as YAML that starts with
// the document separator "---"; its spec (with "spec:") may follow.
func Tenant(name string) string {
	return "---\napiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: " + name + "}\n"
}

// ChatScheduler is a gateway's spec.schedulers (at two spaces, as under
// spec:) with one scheduler, "chat", that routes chat-model to the pods
// labelled {pool: chat}. It ends inside the scheduler: more of its
// settings (indented four spaces) or other schedulers may follow.
const ChatScheduler = `  schedulers:
  - name: chat
    modelName: chat-model
    modelSelector: {matchLabels: {pool: chat}}
`

// ChatGateway is cluster c1's InferenceGatewayConfig with ChatScheduler.
// It ends inside the scheduler: more of its settings (indented four
// spaces) may follow, then other documents.
const ChatGateway = `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: c1}
spec:
  cluster: c1
` + ChatScheduler

// ChatRewrite is the head of the InferenceModelRewrite "chat": one rule
// for the public name chat, up to (not including) its targets, which
// follow at four spaces ("    targets: …").
const ChatRewrite = `apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceModelRewrite
metadata: {name: chat}
spec:
  rules:
  - matches: [{model: {value: chat}}]
`

// JWTAuth is a gateway's spec.auth (at two spaces, as under spec:) that
// accepts the JWTs of issuer https://auth.example.com/ for audience
// meridian; the next line of the gateway's spec follows it.
const JWTAuth = `  auth:
    jwt:
      issuer: https://auth.example.com/
      audiences: [meridian]
      jwksURL: https://auth.example.com/jwks.json
`
