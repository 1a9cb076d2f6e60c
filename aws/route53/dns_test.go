package route53_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/route53"
	"github.com/aws/aws-sdk-go-v2/service/route53/types"

	dns "github.com/meridian-router/meridian/aws/route53"
	"github.com/meridian-router/meridian/aws/route53/route53test"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
)

const accessKey = "AKIDMERIDIANTEST"

// newClient returns a Route 53 client for srv with static test
// credentials; nothing leaves loopback.
func newClient(t *testing.T, srv *route53test.Server, key string) *route53.Client {
	t.Helper()
	testkit.NoAWSConfig(t)
	c, err := dns.NewClient(context.Background(), dns.ClientOptions{EndpointURL: srv.URL},
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(key, "test-secret-not-a-secret", "")))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func setup(t *testing.T) (*route53test.Server, *route53.Client, string) {
	t.Helper()
	srv := route53test.NewServer(accessKey)
	t.Cleanup(srv.Close)
	zone := srv.AddZone("example.com")
	return srv, newClient(t, srv, accessKey), zone
}

var twoRegions = []dns.Target{
	{Region: "us-east-1", Host: "meridian-use1-0123.elb.us-east-1.amazonaws.com", Port: 80},
	{Region: "eu-west-1", Host: "meridian-euw1-4567.elb.eu-west-1.amazonaws.com", Port: 80},
}

func plan(t *testing.T, c *route53.Client, cfg dns.Config) *dns.Plan {
	t.Helper()
	p, err := dns.MakePlan(context.Background(), c, cfg)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	return p
}

func apply(t *testing.T, c *route53.Client, cfg dns.Config) *dns.Plan {
	t.Helper()
	p := plan(t, c, cfg)
	if err := dns.Apply(context.Background(), c, p); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return p
}

// latency returns the zone's latency records by Region.
func latency(srv *route53test.Server, zone string) map[string]route53test.ResourceRecordSet {
	out := map[string]route53test.ResourceRecordSet{}
	for _, r := range srv.Records(zone) {
		if r.Region != "" {
			out[r.Region] = r
		}
	}
	return out
}

func healthCheck(srv *route53test.Server, id string) (route53test.HealthCheck, bool) {
	for _, h := range srv.HealthChecks() {
		if h.ID == id {
			return h, true
		}
	}
	return route53test.HealthCheck{}, false
}

func TestApplyCreatesLatencyRecordsWithHealthChecks(t *testing.T) {
	srv, c, zone := setup(t)
	cfg := dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}
	p := apply(t, c, cfg)
	if len(p.CreateHealthChecks) != 2 || len(p.Changes) != 2 {
		t.Fatalf("first plan: %d health checks, %d changes", len(p.CreateHealthChecks), len(p.Changes))
	}
	recs := latency(srv, zone)
	if len(recs) != 2 {
		t.Fatalf("latency records: %+v", recs)
	}
	for _, tg := range twoRegions {
		r := recs[tg.Region]
		if r.Name != "api.example.com." || r.Type != "CNAME" || r.SetIdentifier != tg.Region || r.TTL == nil || *r.TTL != 60 {
			t.Errorf("%s: record %+v", tg.Region, r)
		}
		if len(r.ResourceRecords) != 1 || r.ResourceRecords[0].Value != tg.Host+"." {
			t.Errorf("%s: values %+v", tg.Region, r.ResourceRecords)
		}
		h, ok := healthCheck(srv, r.HealthCheckID)
		if !ok {
			t.Fatalf("%s: record's health check %q does not exist", tg.Region, r.HealthCheckID)
		}
		want := route53test.HealthCheckConfig{Type: "HTTP", FullyQualifiedDomainName: tg.Host, Port: 80, ResourcePath: "/readyz", RequestInterval: 30, FailureThreshold: 3}
		if h.HealthCheckConfig != want {
			t.Errorf("%s: health check %+v, want %+v", tg.Region, h.HealthCheckConfig, want)
		}
	}
}

func TestSecondApplyChangesNothing(t *testing.T) {
	srv, c, _ := setup(t)
	cfg := dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}
	apply(t, c, cfg)
	before := srv.Mutations()
	p := apply(t, c, cfg)
	if !p.Empty() || len(p.Unchanged) != 2 {
		t.Errorf("second plan not empty: %+v", p)
	}
	if got := srv.Mutations(); got != before {
		t.Errorf("second apply made %d mutating calls", got-before)
	}
	var out strings.Builder
	if err := p.Write(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no changes") || strings.Count(out.String(), "= record") != 2 {
		t.Errorf("plan output:\n%s", out.String())
	}
}

func TestMovedLoadBalancerReplacesRecordAndHealthCheck(t *testing.T) {
	srv, c, zone := setup(t)
	cfg := dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}
	apply(t, c, cfg)
	oldHC := latency(srv, zone)["eu-west-1"].HealthCheckID

	moved := []dns.Target{twoRegions[0], {Region: "eu-west-1", Host: "meridian-euw1-new.elb.eu-west-1.amazonaws.com", Port: 80}}
	cfg.Targets = moved
	p := plan(t, c, cfg)
	var out strings.Builder
	p.Write(&out)
	if len(p.CreateHealthChecks) != 1 || len(p.Changes) != 1 || p.Changes[0].Action != types.ChangeActionUpsert || len(p.DeleteHealthChecks) != 1 {
		t.Fatalf("plan:\n%s", out.String())
	}
	for _, want := range []string{"+ health check eu-west-1", "~ record eu-west-1 CNAME meridian-euw1-new", "was eu-west-1 CNAME meridian-euw1-4567", "- health check " + oldHC, "= record us-east-1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan output lacks %q:\n%s", want, out.String())
		}
	}
	if err := dns.Apply(context.Background(), c, p); err != nil {
		t.Fatal(err)
	}
	r := latency(srv, zone)["eu-west-1"]
	if r.ResourceRecords[0].Value != "meridian-euw1-new.elb.eu-west-1.amazonaws.com." || r.HealthCheckID == oldHC {
		t.Errorf("eu-west-1 after apply: %+v", r)
	}
	if _, ok := healthCheck(srv, oldHC); ok {
		t.Error("the old health check was not deleted")
	}
	if n := len(srv.HealthChecks()); n != 2 {
		t.Errorf("%d health checks, want 2", n)
	}
	if p := plan(t, c, cfg); !p.Empty() {
		t.Errorf("plan after apply not empty: %+v", p)
	}
}

func TestRemovedRegionKeptUnlessPruned(t *testing.T) {
	srv, c, zone := setup(t)
	cfg := dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}
	apply(t, c, cfg)
	cfg.Targets = twoRegions[:1]
	p := plan(t, c, cfg)
	if !p.Empty() || len(p.Unmanaged) != 1 || p.Unmanaged[0].Region != "eu-west-1" {
		t.Fatalf("without prune: %+v", p)
	}
	cfg.Prune = true
	p = apply(t, c, cfg)
	if len(p.Changes) != 1 || p.Changes[0].Action != types.ChangeActionDelete || len(p.DeleteHealthChecks) != 1 {
		t.Fatalf("with prune: %+v", p)
	}
	if recs := latency(srv, zone); len(recs) != 1 || recs["us-east-1"].Name == "" {
		t.Errorf("records after prune: %+v", recs)
	}
	if n := len(srv.HealthChecks()); n != 1 {
		t.Errorf("%d health checks after prune, want 1", n)
	}
}

func TestSwitchToAddressesInOneBatch(t *testing.T) {
	srv, c, zone := setup(t)
	cfg := dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}
	apply(t, c, cfg)
	batches := srv.Calls()["ChangeResourceRecordSets"]
	cfg.Targets = []dns.Target{{Region: "us-east-1", Host: "203.0.113.10", Port: 8080}, {Region: "eu-west-1", Host: "203.0.113.20", Port: 8080}}
	apply(t, c, cfg)
	if got := srv.Calls()["ChangeResourceRecordSets"] - batches; got != 1 {
		t.Errorf("%d change batches, want 1", got)
	}
	for region, r := range latency(srv, zone) {
		if r.Type != "A" {
			t.Errorf("%s: type %s", region, r.Type)
		}
		h, _ := healthCheck(srv, r.HealthCheckID)
		if h.HealthCheckConfig.IPAddress != r.ResourceRecords[0].Value || h.HealthCheckConfig.Port != 8080 {
			t.Errorf("%s: health check %+v for %+v", region, h.HealthCheckConfig, r)
		}
	}
	if n := len(srv.HealthChecks()); n != 2 {
		t.Errorf("%d health checks, want 2", n)
	}
}

func TestPaging(t *testing.T) {
	srv, c, zone := setup(t)
	srv.PageSize = 1
	// Names around the global name, and other people's health checks.
	other := dns.Config{Zone: zone, Name: "aaa.example.com", Targets: twoRegions}
	apply(t, c, other)
	other.Name = "zzz.api.example.com"
	apply(t, c, other)
	cfg := dns.Config{Zone: zone, Name: "api.example.com", Targets: twoRegions}
	apply(t, c, cfg)
	if p := plan(t, c, cfg); !p.Empty() || len(p.Unchanged) != 2 {
		t.Errorf("plan over one-item pages: %+v", p)
	}
	if srv.Calls()["ListResourceRecordSets"] < 6 {
		t.Errorf("paging not exercised: %v", srv.Calls())
	}
}

func TestConflictingRecordFailsWholeBatch(t *testing.T) {
	srv, c, zone := setup(t)
	apply(t, c, dns.Config{Zone: zone, Name: "api.example.com", Targets: twoRegions})
	// A records for us-east-1 and a new Region, without prune: eu-west-1's
	// CNAME stays, and Route 53 refuses A records beside a CNAME.
	cfg := dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{{Region: "us-east-1", Host: "198.51.100.1", Port: 80}, {Region: "ap-south-1", Host: "198.51.100.2", Port: 80}}}
	p := plan(t, c, cfg)
	before := srv.Records(zone)
	err := dns.Apply(context.Background(), c, p)
	var icb *types.InvalidChangeBatch
	if !errors.As(err, &icb) {
		t.Fatalf("err = %v, want InvalidChangeBatch", err)
	}
	if !strings.Contains(err.Error(), "conflicting RRSet") {
		t.Errorf("error does not say why: %v", err)
	}
	if after := srv.Records(zone); len(after) != len(before) || latency(srv, zone)["us-east-1"].Type != "CNAME" {
		t.Errorf("a failed batch changed the zone: %d → %d records", len(before), len(after))
	}
}

func TestZoneLookup(t *testing.T) {
	srv, c, zone := setup(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  dns.Config
		want string
	}{
		{"by ID", dns.Config{Zone: zone, Name: "api.example.com", Targets: twoRegions}, ""},
		{"by ID with prefix", dns.Config{Zone: "/hostedzone/" + zone, Name: "api.example.com", Targets: twoRegions}, ""},
		{"by name with dot", dns.Config{Zone: "Example.COM.", Name: "API.example.com", Targets: twoRegions}, ""},
		{"unknown name", dns.Config{Zone: "example.org", Name: "api.example.org", Targets: twoRegions}, "no public hosted zone named example.org."},
		{"unknown ID", dns.Config{Zone: "Z999", Name: "api.example.com", Targets: twoRegions}, "NoSuchHostedZone"},
		{"name outside zone", dns.Config{Zone: zone, Name: "api.example.net", Targets: twoRegions}, "not inside zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := dns.MakePlan(ctx, c, tc.cfg)
			if tc.want == "" {
				if err != nil || p.ZoneID != zone {
					t.Fatalf("plan = %+v, %v", p, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	srv.AddZone("example.com")
	if _, err := dns.MakePlan(ctx, c, dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions}); err == nil || !strings.Contains(err.Error(), "pass --zone with the ID") {
		t.Errorf("two zones of one name: err = %v", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	_, c, zone := setup(t)
	for _, tc := range []struct {
		name string
		cfg  dns.Config
		want string
	}{
		{"no zone", dns.Config{Name: "api.example.com", Targets: twoRegions}, "hosted zone is required"},
		{"no targets", dns.Config{Zone: zone, Name: "api.example.com"}, "no targets"},
		{"two per Region", dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{twoRegions[0], twoRegions[0]}}, "two targets"},
		{"mixed kinds", dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{twoRegions[0], {Region: "eu-west-1", Host: "192.0.2.1", Port: 80}}}, "mix"},
		{"IPv6", dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{{Region: "us-east-1", Host: "2001:db8::1", Port: 80}}}, "IPv4"},
		{"loopback", dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{{Region: "us-east-1", Host: "127.0.0.1", Port: 8080}}}, "cannot health-check"},
		{"private", dns.Config{Zone: zone, Name: "api.example.com", Targets: []dns.Target{{Region: "us-east-1", Host: "10.1.2.3", Port: 80}}}, "cannot health-check"},
		{"interval", dns.Config{Zone: zone, Name: "api.example.com", Targets: twoRegions, HealthInterval: 15}, "10 or 30"},
		{"threshold", dns.Config{Zone: zone, Name: "api.example.com", Targets: twoRegions, FailureThreshold: 11}, "1 to 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dns.MakePlan(context.Background(), c, tc.cfg)
			if !errors.Is(err, dns.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}

func TestWrongCredentialsRefused(t *testing.T) {
	srv := route53test.NewServer(accessKey)
	defer srv.Close()
	c := newClient(t, srv, "AKIDSOMEONEELSE")
	_, err := dns.MakePlan(context.Background(), c, dns.Config{Zone: "example.com", Name: "api.example.com", Targets: twoRegions})
	if err == nil || !strings.Contains(err.Error(), "InvalidSignatureException") {
		t.Fatalf("err = %v", err)
	}
}

func TestTargets(t *testing.T) {
	docs, _, err := config.ReadDir("../../deploy/examples/platform")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := config.Build(docs, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := dns.TargetsFromTopology(snap.Topology)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (dns.Target{Region: "us-east-1", Host: "127.0.0.1", Port: 8080}) || got[1].Region != "eu-west-1" {
		t.Errorf("targets = %v", got)
	}
	if _, err := dns.TargetsFromTopology(nil); err == nil {
		t.Error("nil topology accepted")
	}
	multi := &config.Topology{Spec: config.TopologySpec{Regions: []config.Region{{Name: "us-east-1", Tier2: []string{"10.0.0.1:80", "10.0.0.2:80"}}, {Name: "eu-west-1"}}}}
	if _, err := dns.TargetsFromTopology(multi); err == nil || !strings.Contains(err.Error(), "--target us-east-1=HOST:PORT") || !strings.Contains(err.Error(), "no tier2 address") {
		t.Errorf("multi-address topology: %v", err)
	}
	tg, err := dns.ParseTarget("eu-west-1=lb.example.com:443")
	if err != nil || tg != (dns.Target{Region: "eu-west-1", Host: "lb.example.com", Port: 443}) {
		t.Errorf("ParseTarget = %v, %v", tg, err)
	}
	for _, bad := range []string{"lb.example.com:443", "=lb:1", "eu-west-1=lb.example.com", "eu-west-1=lb:0", "eu-west-1=lb:http"} {
		if _, err := dns.ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) accepted", bad)
		}
	}
}

func TestResolveTargets(t *testing.T) {
	top := &config.Topology{Spec: config.TopologySpec{Regions: []config.Region{
		{Name: "us-east-1", Tier2: []string{"lb-use1.example.com:80"}},
		{Name: "eu-west-1", Tier2: []string{"10.1.0.1:8080", "10.1.0.2:8080"}},
	}}}
	if _, err := dns.ResolveTargets(top, nil); err == nil {
		t.Error("a Region with two Tier-2 addresses and no --target was accepted")
	}
	got, err := dns.ResolveTargets(top, []string{"eu-west-1=lb-euw1.example.com:80", "ap-south-1=lb-aps1.example.com:80"})
	if err != nil {
		t.Fatal(err)
	}
	want := []dns.Target{
		{Region: "ap-south-1", Host: "lb-aps1.example.com", Port: 80},
		{Region: "eu-west-1", Host: "lb-euw1.example.com", Port: 80},
		{Region: "us-east-1", Host: "lb-use1.example.com", Port: 80},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("target %d = %v, want %v", i, got[i], want[i])
		}
	}
	if _, err := dns.ResolveTargets(nil, []string{"eu-west-1=a:1", "eu-west-1=b:1"}); err == nil {
		t.Error("two --target for one Region accepted")
	}
}
