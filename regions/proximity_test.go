package regions

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/config"
)

func TestProximitySources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg, err := (&Config{LocalRegion: "us-east-1", RTTs: []RegionRTT{{"eu-west-1", "us-east-1", 80 * time.Millisecond}}}).withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		p := newProximity(&cfg)
		for _, c := range []struct {
			region string
			rtt    time.Duration
			src    RTTSource
		}{
			{"us-east-1", 0, RTTDefault},
			{"eu-west-1", 80 * time.Millisecond, RTTConfigured}, // configured as (B, A): applies both ways
			{"ap-south-1", 100 * time.Millisecond, RTTDefault},
		} {
			if rtt, src := p.RTT(c.region); rtt != c.rtt || src != c.src {
				t.Errorf("RTT(%s) = %v %v, want %v %v", c.region, rtt, src, c.rtt, c.src)
			}
		}
		// Measurements are smoothed with gain 1/4.
		p.Observe("eu-west-1", 100*time.Millisecond)
		p.Observe("eu-west-1", 20*time.Millisecond)
		if rtt, src := p.RTT("eu-west-1"); rtt != 80*time.Millisecond || src != RTTMeasured {
			t.Errorf("after 100ms then 20ms: %v %v, want 80ms measured", rtt, src)
		}
		time.Sleep(2*time.Minute + time.Nanosecond)
		if _, src := p.RTT("eu-west-1"); src != RTTConfigured {
			t.Errorf("stale measurement still used (%v)", src)
		}
		// A fresh measurement after a stale one starts over.
		p.Observe("eu-west-1", 30*time.Millisecond)
		if rtt, _ := p.RTT("eu-west-1"); rtt != 30*time.Millisecond {
			t.Errorf("first measurement after going stale: %v, want 30ms", rtt)
		}
	})
}

func TestClustersFromTopology(t *testing.T) {
	topo := &config.Topology{Spec: config.TopologySpec{Regions: []config.Region{
		{Name: "us-east-1", Clusters: []config.Cluster{{Name: "use1-a", Tier1: "http://a"}, {Name: "use1-b", Tier1: "http://b"}}},
		{Name: "eu-west-1", Clusters: []config.Cluster{{Name: "euw1-a", Tier1: "http://c"}}},
	}}}
	got := fmt.Sprint(ClustersFromTopology(topo))
	want := "[{us-east-1 use1-a http://a} {us-east-1 use1-b http://b} {eu-west-1 euw1-a http://c}]"
	if got != want {
		t.Errorf("ClustersFromTopology = %s, want %s", got, want)
	}
	if ClustersFromTopology(nil) != nil {
		t.Error("nil topology gave clusters")
	}
}
