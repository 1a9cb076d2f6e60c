// Package discovery decides which model-server pods each Tier-1 scheduler
// routes to.
//
// It has two halves. Endpoints is a pure function: given a configuration
// snapshot, the cluster's name and the pods currently known, it returns
// every scheduler's targets (address and stable ID). Kubernetes watches the
// pods of one namespace with client-go shared informers and hands the
// current set to a callback whenever it changes in a way Endpoints can see.
//
// The package decides membership only: whether a target is healthy enough to
// take a request (fresh metrics, queue depth, a failing scrape) is the
// scheduler's business, and turning targets into tier1.Endpoints, keeping
// their state across updates, is the data plane's.
package discovery

import (
	"cmp"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/meridian-router/meridian/config"
)

// DefaultTargetPort is the model-server port of a scheduler whose
// targetPort is unset (HyperPod's and vLLM's default).
const DefaultTargetPort = 8000

// Pod is what discovery knows of one Kubernetes pod.
type Pod struct {
	Namespace, Name string
	// IP is the pod's primary IP (status.podIP); empty until the pod is
	// scheduled and its sandbox is up.
	IP string
	// Labels are the pod's labels. Shared, read-only.
	Labels map[string]string
	// Ready is true when the pod's Ready condition is True and the pod is
	// not being deleted.
	Ready bool
}

// Key is namespace/name, the pod's identity in the API server.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Equal reports whether two pods look the same to Endpoints.
func (p Pod) Equal(q Pod) bool {
	return p.Namespace == q.Namespace && p.Name == q.Name && p.IP == q.IP &&
		p.Ready == q.Ready && maps.Equal(p.Labels, q.Labels)
}

// Target is one endpoint a scheduler may route to.
type Target struct {
	// ID is stable across updates while the endpoint exists:
	// namespace/name:port for a pod, the endpoint's name for a static one.
	ID string
	// Address is host:port, what the proxy dials.
	Address string
	// Labels are the pod's or static endpoint's labels. Shared, read-only.
	Labels map[string]string
}

// Endpoints returns the targets of every scheduler of the cluster's gateway
// (config.Snapshot.Gateway), keyed by scheduler name. Every scheduler has a
// key; one with nothing to route to maps to an empty slice. Each slice is
// sorted by ID and holds an ID once. With no snapshot or no gateway for the
// cluster it returns nil.
//
// A scheduler's Kubernetes targets come from one of two places:
//
//   - The InferencePools that apply to it: a pool applies when its name is
//     the scheduler's name or its selector's matchLabels equal the
//     scheduler's modelSelector.matchLabels (GIE operators describe the
//     same pool twice, so either link works). Each applicable pool
//     contributes every pod its selector matches (only pods of the pool's
//     namespace when it has one), once per spec.targetPorts entry. The
//     scheduler's own targetPort is then not used: the pool says where the
//     model server listens.
//   - Without an applicable pool: the pods matching the scheduler's
//     modelSelector, on its targetPort (DefaultTargetPort when zero).
//
// Only pods that are Ready and have a valid IP count. A pod target's ID is
// namespace/name:port and its address podIP:port.
//
// Static endpoints visible to the cluster (config.Snapshot.Endpoints) whose
// labels match the modelSelector or an applicable pool's selector are
// targets too, at the address they were written with, named by their
// endpoint name. They have no readiness: a dead one is found by scraping.
// Should a static name equal a pod target's ID, the pod wins.
func Endpoints(s *config.Snapshot, cluster string, pods []Pod) map[string][]Target {
	if s == nil {
		return nil
	}
	g := s.Gateway(cluster)
	if g == nil {
		return nil
	}
	live := make([]*Pod, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		if ip, err := netip.ParseAddr(p.IP); p.Ready && err == nil && ip.Zone() == "" {
			live = append(live, p)
		}
	}
	out := make(map[string][]Target, len(g.Spec.Schedulers))
	for _, sc := range g.Spec.Schedulers {
		out[sc.Name] = schedulerTargets(s, cluster, sc, live)
	}
	return out
}

// selection is one label selector and where it finds pods.
type selection struct {
	labels    map[string]string
	namespace string   // "" = any
	ports     []string // decimal, formatted once per call
}

// schedulerTargets returns one scheduler's targets among live pods (Ready,
// with a valid IP).
func schedulerTargets(s *config.Snapshot, cluster string, sc config.Scheduler, live []*Pod) []Target {
	sels := poolSelections(s, sc)
	if len(sels) == 0 {
		port := sc.TargetPort
		if port == 0 {
			port = DefaultTargetPort
		}
		sels = []selection{{labels: sc.ModelSelector.MatchLabels, ports: []string{strconv.Itoa(port)}}}
	}

	targets := []Target{}
	for _, p := range live {
		for _, sel := range sels {
			if sel.namespace != "" && sel.namespace != p.Namespace {
				continue
			}
			if !config.MatchLabels(sel.labels, p.Labels) {
				continue
			}
			for _, ps := range sel.ports {
				targets = append(targets, Target{
					ID:      p.Namespace + "/" + p.Name + ":" + ps,
					Address: net.JoinHostPort(p.IP, ps),
					Labels:  p.Labels,
				})
			}
		}
	}
	// Pods go first so that the stable sort keeps a pod ahead of a static
	// endpoint with the same ID, and CompactFunc keeps the pod.
	for _, ep := range staticEndpoints(s, cluster, sc, sels) {
		targets = append(targets, Target{ID: ep.Name, Address: ep.Address, Labels: ep.Labels})
	}
	slices.SortStableFunc(targets, func(a, b Target) int { return cmp.Compare(a.ID, b.ID) })
	return slices.CompactFunc(targets, func(a, b Target) bool { return a.ID == b.ID })
}

// poolSelections returns the selections of the InferencePools that apply to
// a scheduler, in pool-name order.
func poolSelections(s *config.Snapshot, sc config.Scheduler) []selection {
	var sels []selection
	for _, name := range slices.Sorted(maps.Keys(s.Pools)) {
		p := s.Pools[name]
		if p == nil {
			continue
		}
		if name != sc.Name && !sameLabels(p.Spec.Selector.MatchLabels, sc.ModelSelector.MatchLabels) {
			continue
		}
		ports := make([]string, 0, len(p.Spec.TargetPorts))
		for _, tp := range p.Spec.TargetPorts {
			ports = append(ports, strconv.Itoa(tp.Number))
		}
		sels = append(sels, selection{
			labels:    p.Spec.Selector.MatchLabels,
			namespace: p.Metadata.Namespace,
			ports:     ports,
		})
	}
	return sels
}

// sameLabels is map equality, except that two empty selectors are not the
// same pool: an empty selector selects nothing.
func sameLabels(a, b map[string]string) bool {
	return len(a) > 0 && maps.Equal(a, b)
}

// staticEndpoints returns the static endpoints visible to the cluster that
// the scheduler's modelSelector or any of its pool selections match, each
// once.
func staticEndpoints(s *config.Snapshot, cluster string, sc config.Scheduler, sels []selection) []config.StaticEndpoint {
	if len(s.StaticEndpoints) == 0 {
		return nil
	}
	out := s.Endpoints(cluster, sc.ModelSelector.MatchLabels)
	for _, sel := range sels {
		if maps.Equal(sel.labels, sc.ModelSelector.MatchLabels) {
			continue
		}
		out = append(out, s.Endpoints(cluster, sel.labels)...)
	}
	return out
}
