package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSnapshotOfStaticEndpoints(t *testing.T) {
	s := Snapshot(t, 7, ChatGateway+"    weights: {prefix: 3}\n"+StaticEndpoints(Endpoint{"pod-a", "10.0.0.1:8000", "chat", ""}, Endpoint{"pod-b", "10.0.0.2:8000", "chat", "h100"}))
	if s.Revision != 7 {
		t.Fatalf("revision %d, want 7", s.Revision)
	}
	if len(s.Gateways) != 1 || s.Gateways[0].Spec.Cluster != "c1" || len(s.Gateways[0].Spec.Schedulers) != 1 {
		t.Fatalf("gateways %+v, want c1's with one scheduler", s.Gateways)
	}
	if got := len(s.StaticEndpoints); got != 1 {
		t.Fatalf("%d StaticEndpoints documents, want 1", got)
	}
	eps := s.StaticEndpoints[0].Spec.Endpoints
	if len(eps) != 2 || eps[1].Name != "pod-b" || eps[1].Address != "10.0.0.2:8000" || eps[1].Labels["pool"] != "chat" ||
		eps[1].Labels["gpu"] != "h100" || len(eps[0].Labels) != 1 {
		t.Fatalf("endpoints %+v", eps)
	}
}

func TestMetricMatchesLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("x", "y").Add(2)
	c.WithLabelValues("x", "z").Add(3)
	g.Set(4)
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"c_total", map[string]string{"a": "x", "b": "z"}, 3},
		{"c_total", map[string]string{"b": "y"}, 2},
		{"c_total", map[string]string{"b": "w"}, 0},
		{"g", nil, 4},
		{"absent", nil, 0},
	} {
		if got := Metric(t, reg, tc.name, tc.labels); got != tc.want {
			t.Errorf("Metric(%s, %v) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

func TestSnapshotOfTopologyGatewaysAndTenant(t *testing.T) {
	s := Snapshot(t, 1, Topology(Cluster{"r1", "c1", "http://127.0.0.1:1", ""}, Cluster{"r2", "c2", "http://127.0.0.1:2", "127.0.0.1:3"}, Cluster{"r1", "c3", "http://127.0.0.1:4", ""})+
		"  routing:\n    weights: {regionProximity: 1}\n"+
		Gateway("r1", "c1")+"  bbr: {enabled: true}\n"+ChatScheduler+"    weights: {prefix: 3}\n"+
		Gateway("r2", "c2")+ChatScheduler+
		Tenant("team-a")+"spec:\n  models: [chat-model]\n"+Tenant("team-b"))
	regions := s.Topology.Spec.Regions
	if len(regions) != 2 || regions[0].Name != "r1" || regions[1].Name != "r2" {
		t.Fatalf("regions %+v, want r1 then r2", regions)
	}
	if c := regions[0].Clusters; len(c) != 2 || c[0].Name != "c1" || c[0].Tier1 != "http://127.0.0.1:1" || c[1].Name != "c3" {
		t.Fatalf("r1's clusters %+v, want c1 then c3", c)
	}
	if c := regions[1].Clusters; len(c) != 1 || c[0].Name != "c2" || c[0].Health != "127.0.0.1:3" {
		t.Fatalf("r2's clusters %+v, want c2 with its health feed", c)
	}
	if s.Topology.Spec.Routing == nil {
		t.Fatal("the routing settings after Topology were lost")
	}
	if len(s.Gateways) != 2 {
		t.Fatalf("%d gateways, want 2", len(s.Gateways))
	}
	for i, want := range []struct{ region, cluster string }{{"r1", "c1"}, {"r2", "c2"}} {
		g := s.Gateways[i]
		if g.Metadata.Name != want.cluster || g.Spec.Region != want.region || g.Spec.Cluster != want.cluster ||
			len(g.Spec.Schedulers) != 1 || g.Spec.Schedulers[0].ModelName != "chat-model" {
			t.Fatalf("gateway %d: %+v, want %s's in %s with the chat scheduler", i, g, want.cluster, want.region)
		}
	}
	if !s.Gateways[0].Spec.BBR.Enabled || s.Gateways[0].Spec.Schedulers[0].Weights.Prefix != 3 {
		t.Fatalf("c1's settings after Gateway and ChatScheduler were lost: %+v", s.Gateways[0].Spec)
	}
	if len(s.Tenants) != 2 || len(s.Tenants["team-a"].Spec.Models) != 1 || s.Tenants["team-b"] == nil {
		t.Fatalf("tenants %+v, want team-a (one model) and team-b", s.Tenants)
	}
}

func TestValueAndSeries(t *testing.T) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"a"})
	c.WithLabelValues("x").Add(2)
	c.WithLabelValues("y").Add(3)
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	g.Set(4)
	if got := Value(t, c.WithLabelValues("y")); got != 3 {
		t.Errorf("counter value %v, want 3", got)
	}
	if got := Value(t, g); got != 4 {
		t.Errorf("gauge value %v, want 4", got)
	}
	if got := Series(c); got != 2 {
		t.Errorf("%d series, want 2", got)
	}
}
