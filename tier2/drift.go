package tier2

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/regions"
)

// DriftReport is what a Tier-2 knows of the pools that serve one model
// name in different clusters: each pool's definition and served
// capabilities as its Tier-1 reports them, and how they differ
// (regions.Drift). GET /meridian/drift on the metrics listener serves it;
// `meridian config drift` reads it.
type DriftReport struct {
	Instance string              `json:"instance"`
	Region   string              `json:"region"`
	At       time.Time           `json:"at"`
	Pools    []DriftPool         `json:"pools"`
	Drift    []regions.DriftItem `json:"drift"`
}

// DriftPool is one cluster's pool as its latest digest describes it.
type DriftPool struct {
	Region         string   `json:"region"`
	Cluster        string   `json:"cluster"`
	Pool           string   `json:"pool"`
	Model          string   `json:"model"`
	Definition     []string `json:"definition,omitempty"`
	ServedAdapters []string `json:"servedAdapters,omitempty"`
	MaxModelLen    int      `json:"maxModelLen,omitempty"`
	ServedModels   []string `json:"servedModels,omitempty"`
}

// drift keeps the latest report; housekeeping refreshes it.
type drift struct {
	mu      sync.Mutex
	tracker regions.DriftTracker
	report  DriftReport
}

// observeDrift compares the fresh digests, records since when each
// difference has lasted, and sets meridian_tier2_pool_drift.
func (in *Instance) observeDrift(now time.Time) {
	ds := in.Fleet.Digests().Digests()
	items := regions.Drift(ds)
	pools := make([]DriftPool, 0, len(ds))
	for _, d := range ds {
		pools = append(pools, DriftPool{Region: d.Region, Cluster: d.Cluster, Pool: d.Pool, Model: d.Model,
			Definition: d.Definition, ServedAdapters: d.ServedAdapters, MaxModelLen: d.MaxModelLen, ServedModels: d.ServedModels})
	}
	slices.SortFunc(pools, func(a, b DriftPool) int {
		if c := compareStrings(a.Model, b.Model, a.Region, b.Region, a.Cluster, b.Cluster); c != 0 {
			return c
		}
		return compareStrings(a.Pool, b.Pool)
	})
	in.drift.mu.Lock()
	in.drift.tracker.Observe(now, items)
	in.drift.report = DriftReport{Instance: in.cfg.Name, Region: in.cfg.Region, At: now, Pools: pools, Drift: items}
	in.drift.mu.Unlock()
	in.metrics.drift.Reset()
	for _, it := range items {
		in.metrics.drift.WithLabelValues(it.Model, it.Kind).Add(float64(len(it.Odd)))
	}
}

// compareStrings compares pairs (a0, b0), (a1, b1), … in turn.
func compareStrings(pairs ...string) int {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] != pairs[i+1] {
			if pairs[i] < pairs[i+1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// serveDrift answers GET /meridian/drift with the latest DriftReport.
func (in *Instance) serveDrift(w http.ResponseWriter, _ *http.Request) {
	in.drift.mu.Lock()
	rep := in.drift.report
	in.drift.mu.Unlock()
	if rep.At.IsZero() {
		in.observeDrift(time.Now()) // before the first housekeeping round
		in.drift.mu.Lock()
		rep = in.drift.report
		in.drift.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(rep)
}

// FetchDrift asks the Tier-2 admin listener at base (http://host:port)
// for its DriftReport.
func FetchDrift(ctx context.Context, client *http.Client, base string) (DriftReport, error) {
	var rep DriftReport
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/meridian/drift", nil)
	if err != nil {
		return rep, fmt.Errorf("drift: tier2 %s: %w", base, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return rep, fmt.Errorf("drift: tier2 %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return rep, fmt.Errorf("drift: tier2 %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return rep, fmt.Errorf("drift: tier2 %s: %s: %.200s", base, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("drift: tier2 %s: %w", base, err)
	}
	return rep, nil
}

// Divergence is one way a cluster's running pool differs from what it
// should run: from the other clusters' pools of the same model (Kind is a
// regions drift kind), or from the configuration it was compared with
// (Kind "configuration").
type Divergence struct {
	Model   string   `json:"model"`
	Kind    string   `json:"kind"`
	Fields  []string `json:"fields,omitempty"`
	Cluster string   `json:"cluster"` // region/cluster
	Pool    string   `json:"pool,omitempty"`
	Running string   `json:"running,omitempty"`
	Want    string   `json:"want,omitempty"`
	Since   string   `json:"since,omitempty"`
}

// KindConfiguration is a Divergence between a cluster's running pool and
// the configuration it was compared with.
const KindConfiguration = "configuration"

// CompareDrift merges the reports of several Tier-2s (each knows every
// cluster's digests, but a report may be older than another) and returns
// every divergence: the drift they report, and, when want is not nil,
// every pool whose definition differs from the one want gives its
// cluster's scheduler of that name, or that want has and no cluster runs
// (a pool of want that a cluster does not report is named; a pool a
// cluster runs that want lacks is named too). The result is sorted.
func CompareDrift(reports []DriftReport, want *config.Snapshot) []Divergence {
	var out []Divergence
	seen := map[string]bool{}
	pools := map[string]DriftPool{} // region/cluster/pool → the newest report's
	var newest time.Time
	for _, rep := range reports {
		for _, it := range rep.Drift {
			for _, odd := range it.Odd {
				d := Divergence{Model: it.Model, Kind: it.Kind, Cluster: odd, Since: it.Since.UTC().Format(time.RFC3339)}
				if it.Field != "" {
					d.Fields = []string{it.Field}
				}
				for _, v := range it.Values {
					if v.Region+"/"+v.Cluster == odd {
						d.Pool, d.Running = v.Pool, v.Value
					}
				}
				k := d.Model + "\x00" + d.Kind + "\x00" + strings.Join(d.Fields, ",") + "\x00" + odd
				if !seen[k] {
					seen[k] = true
					out = append(out, d)
				}
			}
		}
		for _, p := range rep.Pools {
			k := p.Region + "/" + p.Cluster + "/" + p.Pool
			if _, ok := pools[k]; !ok || rep.At.After(newest) {
				pools[k] = p
			}
		}
		if rep.At.After(newest) {
			newest = rep.At
		}
	}
	if want != nil && want.Topology != nil {
		for _, r := range want.Topology.Spec.Regions {
			for _, c := range r.Clusters {
				g := want.Gateway(c.Name)
				if g == nil {
					continue
				}
				for i := range g.Spec.Schedulers {
					sc := &g.Spec.Schedulers[i]
					k := r.Name + "/" + c.Name + "/" + sc.Name
					p, ok := pools[k]
					wantDef := want.PoolDefinition(g, sc)
					switch {
					case !ok:
						out = append(out, Divergence{Model: sc.ModelName, Kind: KindConfiguration, Cluster: r.Name + "/" + c.Name, Pool: sc.Name,
							Running: "(no digest)", Want: "the pool"})
					case len(p.Definition) == 0:
						// An older Tier-1 does not say: nothing to compare.
					default:
						if fields := config.DefinitionDiff(p.Definition, wantDef); len(fields) > 0 {
							out = append(out, Divergence{Model: sc.ModelName, Kind: KindConfiguration, Fields: fields,
								Cluster: r.Name + "/" + c.Name, Pool: sc.Name})
						}
					}
					delete(pools, k)
				}
			}
		}
		for _, p := range pools {
			if clusterKnown(want, p.Region, p.Cluster) {
				out = append(out, Divergence{Model: p.Model, Kind: KindConfiguration, Cluster: p.Region + "/" + p.Cluster, Pool: p.Pool,
					Running: "the pool", Want: "(not in the configuration)"})
			}
		}
	}
	slices.SortFunc(out, func(a, b Divergence) int {
		return compareStrings(a.Model, b.Model, a.Cluster, b.Cluster, a.Kind, b.Kind, strings.Join(a.Fields, ","), strings.Join(b.Fields, ","), a.Pool, b.Pool)
	})
	return out
}

// clusterKnown reports whether the Topology names region/cluster.
func clusterKnown(s *config.Snapshot, region, cluster string) bool {
	for _, r := range s.Topology.Spec.Regions {
		for _, c := range r.Clusters {
			if r.Name == region && c.Name == cluster {
				return true
			}
		}
	}
	return false
}
