package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSnapshotOfStaticEndpoints(t *testing.T) {
	s := Snapshot(t, 7, ChatGateway+"    weights: {prefix: 3}\n"+StaticEndpoints(Endpoint{"pod-a", "10.0.0.1:8000", "chat"}, Endpoint{"pod-b", "10.0.0.2:8000", "chat"}))
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
	if len(eps) != 2 || eps[1].Name != "pod-b" || eps[1].Address != "10.0.0.2:8000" || eps[1].Labels["pool"] != "chat" {
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
