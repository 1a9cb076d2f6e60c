package tier2

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/priority"
	"github.com/meridian-router/meridian/regions"
)

// pool is one cluster's digest of model m: its saturation as Tier-1
// shipped it over fresh pods, produced age ago.
type pool struct {
	region, cluster string
	sat             float64
	fresh           int
	age             time.Duration
}

func admissionOver(t *testing.T, pools ...pool) (*Admission, *prometheus.Registry) {
	t.Helper()
	var clusters []regions.Cluster
	for _, p := range pools {
		clusters = append(clusters, regions.Cluster{Region: p.region, Name: p.cluster, Tier1: "http://" + p.cluster})
	}
	fleet, err := regions.NewFleet(regions.Config{LocalRegion: "home", Clusters: clusters})
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pools {
		d := regions.Digest{Region: p.region, Cluster: p.cluster, Pool: "m", Model: "m", ReadyPods: p.fresh, TotalPods: p.fresh,
			Saturation: p.sat, FreshPods: p.fresh, Version: uint64(i + 1), Produced: time.Now().Add(-p.age)}
		if _, err := fleet.Digests().Put(d); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	pm, err := priority.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return &Admission{Region: "home", Fleet: fleet, Metrics: pm}, reg
}

// put stores d in a's fleet.
func put(t *testing.T, a *Admission, d regions.Digest) {
	t.Helper()
	if _, err := a.Fleet.Digests().Put(d); err != nil {
		t.Fatal(err)
	}
}

// homeDigest is cluster h1's digest of model m in the home Region: its
// saturation over pods fresh pods, produced now, at version v.
func homeDigest(pods int, sat float64, v uint64) regions.Digest {
	return regions.Digest{Region: "home", Cluster: "h1", Pool: "m", Model: "m", ReadyPods: pods, TotalPods: pods,
		Saturation: sat, FreshPods: pods, Version: v, Produced: time.Now()}
}

// observe hands every Gate its saturation if a digest changed: what Run
// does every 200 ms.
func observe(a *Admission) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for m, g := range a.gates {
		a.observeLocked(m, g)
	}
}

// outcome admits one request and reports what happened: "admitted",
// "spill", "waits" (still queued when the bubble is idle), or the reason
// of a rejection.
func outcome(t *testing.T, a *Admission, band priority.Band) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan string, 1)
	go func() {
		tk, spill, err := a.Admit(ctx, "m", priority.Request{Tenant: "t", Band: band})
		var rej *priority.Rejection
		switch {
		case errors.As(err, &rej):
			res <- rej.Reason.String()
		case errors.Is(err, context.Canceled):
			res <- "waits"
		case err != nil:
			res <- err.Error()
		case spill:
			res <- "spill"
		default:
			tk.Done()
			res <- "admitted"
		}
	}()
	synctest.Wait()
	cancel()
	return <-res
}

func TestAdmission(t *testing.T) {
	type want struct{ critical, standard, sheddable string }
	cases := []struct {
		name  string
		pools []pool
		want  want
	}{
		{"home has headroom", []pool{{"home", "h1", 0.3, 4, 0}, {"away", "a1", 0.1, 4, 0}},
			want{"admitted", "admitted", "admitted"}},
		{"home saturated, away has headroom: spill", []pool{{"home", "h1", 1.2, 4, 0}, {"away", "a1", 0.3, 4, 0}},
			want{"spill", "spill", "saturated"}},
		{"home saturated as a whole, one home cluster has headroom: Critical goes", []pool{{"home", "h1", 2.0, 4, 0}, {"home", "h2", 0.4, 4, 0}, {"away", "a1", 1.5, 4, 0}},
			want{"admitted", "waits", "saturated"}},
		{"everything saturated, home within its clusters' backlog: Critical goes to wait there, Standard waits", []pool{{"home", "h1", 1.1, 4, 0}, {"away", "a1", 1.5, 4, 0}},
			want{"admitted", "waits", "saturated"}},
		{"everything saturated past the backlog: Critical and Standard wait", []pool{{"home", "h1", 1.5, 4, 0}, {"away", "a1", 1.5, 4, 0}},
			want{"waits", "waits", "saturated"}},
		{"home past the reserve, within its clusters' backlog: Standard goes to wait there", []pool{{"home", "h1", 0.6, 4, 0}, {"away", "a1", 1.5, 4, 0}},
			want{"admitted", "admitted", "saturated"}},
		{"home between the reserve and 1: only Critical", []pool{{"home", "h1", 0.95, 4, 0}, {"away", "a1", 1.5, 4, 0}},
			want{"admitted", "waits", "saturated"}},
		{"home between the reserve and 1, away has headroom: Critical stays, Standard spills", []pool{{"home", "h1", 0.95, 4, 0}, {"away", "a1", 0.3, 4, 0}},
			want{"admitted", "spill", "saturated"}},
		{"away between the reserve and 1: no room for Standard there either", []pool{{"home", "h1", 1.2, 4, 0}, {"away", "a1", 0.95, 4, 0}},
			want{"spill", "waits", "saturated"}},
		{"stale home digest: blind", []pool{{"home", "h1", 0.1, 4, 3 * time.Second}, {"away", "a1", 1.5, 4, 0}},
			want{"admitted", "admitted", "no_metrics"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a, _ := admissionOver(t, tc.pools...)
				got := want{outcome(t, a, priority.Critical), outcome(t, a, priority.Standard), outcome(t, a, priority.Sheddable)}
				if got != tc.want {
					t.Errorf("Critical, Standard, Sheddable: %+v; want %+v", got, tc.want)
				}
			})
		})
	}
}

// A digest from a Tier-1 that does not ship saturation is approximated
// from its mean queue per ready pod.
func TestAdmissionWithoutShippedSaturation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := admissionOver(t)
		d := regions.Digest{Region: "home", Cluster: "h1", Pool: "m", Model: "m", ReadyPods: 2, TotalPods: 2, QueueTotal: 12,
			Version: 1, Produced: time.Now()}
		put(t, a, d)
		if s := a.saturation("m", "home", true); !s.Saturated() || s.Value != 1.2 {
			t.Fatalf("saturation %+v; want 12 / 2 pods / 5 = 1.2", s)
		}
		if got := outcome(t, a, priority.Sheddable); got != "saturated" {
			t.Errorf("Sheddable: %s", got)
		}
	})
}

// An unchanged digest is not observed again: the Gate keeps counting what
// it admitted since that digest was produced.
func TestAdmissionObservesChangedDigestsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One pod: five requests fill it; Standard stops at 1.75 (the
		// default Critical reserve is 0.65) plus the cluster backlog of 2,
		// so four get in.
		a, _ := admissionOver(t, pool{"home", "h1", 0, 1, 0})
		ctx := context.Background()
		for range 4 {
			if _, _, err := a.Admit(ctx, "m", priority.Request{Tenant: "t", Band: priority.Standard}); err != nil {
				t.Fatal(err)
			}
		}
		observe(a)
		if got := outcome(t, a, priority.Standard); got != "waits" {
			t.Fatalf("fifth Standard request after re-observing the same digest: %s; want waits", got)
		}
		// A newer digest replaces the Gate's count.
		d := homeDigest(1, 0.2, 2)
		put(t, a, d)
		observe(a)
		if got := outcome(t, a, priority.Standard); got != "admitted" {
			t.Fatalf("after a fresh digest: %s; want admitted", got)
		}
	})
}

// The requests waiting in a cluster's own Gate count as load: a pool at
// 0.3 with ten requests waiting in Tier-1's Gate over four pods is at 0.8,
// past the Standard limit (0.35, plus 0.4 for the default cluster backlog
// of 2 per pod) though not past Critical's.
func TestAdmissionCountsClusterGateWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := admissionOver(t)
		d := homeDigest(4, 0.3, 1)
		put(t, a, d)
		if got := outcome(t, a, priority.Standard); got != "admitted" {
			t.Fatalf("Standard at 0.3 with nothing waiting in Tier-1: %s; want admitted", got)
		}
		d.Version, d.GateWaiting = 2, 10
		put(t, a, d)
		observe(a)
		if s := a.saturation("m", "home", true); s.Value != 0.8 {
			t.Fatalf("saturation %v; want 0.3 + 10 / (4 pods × 5) = 0.8", s.Value)
		}
		if got := outcome(t, a, priority.Standard); got != "waits" {
			t.Errorf("Standard with ten waiting in Tier-1's Gate: %s; want waits", got)
		}
		if got := outcome(t, a, priority.Critical); got != "admitted" {
			t.Errorf("Critical with ten waiting in Tier-1's Gate: %s; want admitted", got)
		}
	})
}

func TestAdmissionBandCountsDowngrades(t *testing.T) {
	a, reg := admissionOver(t)
	snap := &config.Snapshot{Tenants: map[string]*config.Tenant{"payments": {Spec: config.TenantSpec{MaxBand: config.BandCritical}}}}
	if b := a.Band(snap, "payments", priority.Critical); b != priority.Critical {
		t.Errorf("payments: %s", b)
	}
	if b := a.Band(snap, "intruder", priority.Critical); b != priority.Standard {
		t.Errorf("intruder: %s", b)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "meridian_priority_downgrades_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	if n != 1 {
		t.Errorf("downgrades counted %v, want 1", n)
	}
	// A reload that raises the tenant's maxBand applies at once.
	next := &config.Snapshot{Tenants: map[string]*config.Tenant{"intruder": {Spec: config.TenantSpec{MaxBand: config.BandCritical}}}}
	if b := a.Band(next, "intruder", priority.Critical); b != priority.Critical {
		t.Errorf("intruder after reload: %s", b)
	}
}

// Configure applies the Topology's spec.routing.admission live: with no
// Critical reserve, Standard is admitted at a home saturation of 0.8 that
// the default reserve (0.65) and cluster backlog (at least 2 per pod, 0.4)
// hold for Critical; with clusterQueueTime 0s (no cluster backlog),
// Standard waits at 0.5.
func TestAdmissionConfigureLive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := admissionOver(t, pool{"home", "h1", 0.8, 4, 0}, pool{"away", "a1", 1.5, 4, 0})
		if got := outcome(t, a, priority.Standard); got != "waits" {
			t.Fatalf("Standard at 0.8 with the default reserve: %s; want waits", got)
		}
		none := 0.0
		a.Configure(&config.Admission{CriticalReserve: &none})
		if got := outcome(t, a, priority.Standard); got != "admitted" {
			t.Fatalf("Standard at 0.8 with no reserve: %s; want admitted", got)
		}
		if got := outcome(t, a, priority.Sheddable); got != "admitted" {
			t.Fatalf("Sheddable at 0.8 with no reserve: %s; want admitted", got)
		}
		a.Configure(nil) // back to the defaults
		if got := outcome(t, a, priority.Standard); got != "waits" {
			t.Fatalf("Standard after the settings were removed: %s; want waits", got)
		}

		b, _ := admissionOver(t, pool{"home", "h1", 0.5, 4, 0}, pool{"away", "a1", 1.5, 4, 0})
		if got := outcome(t, b, priority.Standard); got != "admitted" {
			t.Fatalf("Standard at 0.5 with the default cluster backlog: %s; want admitted", got)
		}
		zero := config.Duration(0)
		b.Configure(&config.Admission{ClusterQueueTime: &zero})
		if got := outcome(t, b, priority.Standard); got != "waits" {
			t.Fatalf("Standard at 0.5 with clusterQueueTime 0s: %s; want waits", got)
		}
		b.Configure(nil)
		if got := outcome(t, b, priority.Standard); got != "admitted" {
			t.Fatalf("Standard at 0.5 with the default clusterQueueTime again: %s; want admitted", got)
		}
	})
}

// The backlog left to a cluster's Gate is what that Gate lets in over
// clusterQueueTime: at 100 requests a second, 500 ms is 50 requests, 2.5
// of saturation over four pods, so Standard requests still go at 2.0;
// at 100 ms it is 10 requests (0.5), and they wait. Two clusters' backlogs
// add up. Sheddable requests are refused at the limit all along.
func TestAdmissionBacklogFollowsAdmitRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, _ := admissionOver(t)
		d := homeDigest(4, 2, 1)
		d.AdmitRate = 100
		put(t, a, d)
		if s := a.saturation("m", "home", true); s.Backlog != 2.5 {
			t.Fatalf("backlog %v; want 100/s × 0.5 s / (4 pods × 5) = 2.5", s.Backlog)
		}
		if got := outcome(t, a, priority.Standard); got != "admitted" {
			t.Fatalf("Standard at 2.0 with a backlog of 2.5: %s; want admitted", got)
		}
		if got := outcome(t, a, priority.Sheddable); got != "saturated" {
			t.Fatalf("Sheddable at 2.0: %s; want saturated", got)
		}
		short := config.Duration(100 * time.Millisecond)
		a.Configure(&config.Admission{ClusterQueueTime: &short})
		if got := outcome(t, a, priority.Standard); got != "waits" {
			t.Fatalf("Standard at 2.0 with a backlog of 0.5: %s; want waits", got)
		}

		d2 := d
		d2.Cluster, d2.Saturation, d2.AdmitRate = "h2", 0, 300
		put(t, a, d2)
		// 10 + 30 requests over 8 pods of 5: 1.0.
		if s := a.saturation("m", "home", true); math.Abs(s.Backlog-1) > 1e-9 || s.Value != 1 {
			t.Fatalf("two clusters: saturation %v backlog %v; want 1 and 1", s.Value, s.Backlog)
		}

		// Never more than half of what the cluster's Gate holds: at 300 a
		// second, 100 ms is 30 requests, but a Gate of 40 takes 20.
		d2.Version, d2.GateMaxQueued = d2.Version+1, 40
		put(t, a, d2)
		if s := a.saturation("m", "home", true); math.Abs(s.Backlog-0.75) > 1e-9 {
			t.Fatalf("a cluster Gate of 40: backlog %v; want (10 + 20) / 40 = 0.75", s.Backlog)
		}
	})
}

// Admission reads the pools of the request's model only, with no copy,
// whatever the size of the fleet: before a request reaches the Gate it
// allocates nothing (reading every model's digests cost 90 KB and 130 µs
// a request at 300 pools).
func TestAdmissionPreReadsOneModelWithoutAllocating(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	var clusters []regions.Cluster
	var digests []regions.Digest
	for c := range 50 {
		name := fmt.Sprintf("c%02d", c)
		region := []string{"home", "away"}[c%2]
		clusters = append(clusters, regions.Cluster{Region: region, Name: name, Tier1: "http://" + name})
		for m := range 6 {
			model := fmt.Sprintf("other-%d", m)
			if m == 0 && c < 4 {
				model = "m"
			}
			digests = append(digests, regions.Digest{Region: region, Cluster: name, Pool: model, Model: model, ReadyPods: 4, TotalPods: 4,
				Saturation: 0.9, FreshPods: 4, Version: 1, Produced: time.Now()})
		}
	}
	fleet, err := regions.NewFleet(regions.Config{LocalRegion: "home", Clusters: clusters})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range digests {
		if _, err := fleet.Digests().Put(d); err != nil {
			t.Fatal(err)
		}
	}
	a := &Admission{Region: "home", Fleet: fleet}
	req := priority.Request{Tenant: "t", Band: priority.Standard} // saturated at home: pre reads both Regions' pools
	if s := a.saturation("m", "home", true); !s.Known() || s.Fresh != 8 {
		t.Fatalf("home saturation of m: %+v, want the 2 home pools' 8 fresh pods", s)
	}
	if n := testing.AllocsPerRun(200, func() { a.pre("m", req) }); n != 0 {
		t.Errorf("Admission.pre: %.0f allocations per request, want 0", n)
	}
}
