// Package route53 keeps the global DNS name of a Meridian platform in Route 53:
// one latency-based record per Region, pointing at that Region's Tier-2
// load balancer, each guarded by a Route 53 health check on /readyz, so
// callers reach the nearest Region whose Tier-2 is ready.
//
// It decides which records and health checks the name needs and the
// smallest set of changes that gets Route 53 there (a plan), and applies a
// plan: health checks first, then every record change in one atomic change
// batch, then the health checks nothing uses any more. Applying twice
// changes nothing the second time. It does not create hosted zones or load
// balancers, does not wait for changes to reach Route 53's name servers,
// and leaves records of the name it does not manage alone unless told to
// prune them.
package route53

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/route53"
	"github.com/aws/aws-sdk-go-v2/service/route53/types"

	"github.com/meridian-router/meridian/config"
)

// Target is one Region's entry point.
type Target struct {
	// Region is the AWS Region of the load balancer: Route 53 answers
	// callers with the Region of lowest latency to them. It is also the
	// record's set identifier.
	Region string
	// Host is the load balancer's DNS name (a CNAME record) or an IPv4
	// address (an A record). All targets of a name are of one kind.
	Host string
	// Port is where the health check probes /readyz.
	Port int
}

func (t Target) String() string {
	return t.Region + "=" + net.JoinHostPort(t.Host, strconv.Itoa(t.Port))
}

// ParseTarget parses REGION=HOST:PORT (the --target flag).
func ParseTarget(s string) (Target, error) {
	region, addr, ok := strings.Cut(s, "=")
	if !ok || region == "" {
		return Target{}, fmt.Errorf("dns: target %q: want REGION=HOST:PORT", s)
	}
	t, err := targetFromAddress(region, addr)
	if err != nil {
		return Target{}, fmt.Errorf("dns: target %q: %w", s, err)
	}
	return t, nil
}

func targetFromAddress(region, addr string) (Target, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return Target{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return Target{}, fmt.Errorf("port %q is not a port number", port)
	}
	return Target{Region: region, Host: host, Port: p}, nil
}

// TargetsFromTopology returns one target per Region of the Topology: the
// Region's Tier-2 address, which on EKS is its load balancer's DNS name.
// A Region listing several Tier-2 addresses needs a --target instead.
func TargetsFromTopology(t *config.Topology) ([]Target, error) {
	if t == nil {
		return nil, errors.New("dns: the configuration has no Topology")
	}
	var out []Target
	var errs []error
	for i, r := range t.Spec.Regions {
		switch len(r.Tier2) {
		case 0:
			errs = append(errs, fmt.Errorf("dns: topology spec.regions[%d] (%s): no tier2 address", i, r.Name))
			continue
		case 1:
		default:
			errs = append(errs, fmt.Errorf("dns: topology spec.regions[%d] (%s): %d tier2 addresses; name the load balancer with --target %s=HOST:PORT", i, r.Name, len(r.Tier2), r.Name))
			continue
		}
		tg, err := targetFromAddress(r.Name, r.Tier2[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("dns: topology spec.regions[%d].tier2[0]: %w", i, err))
			continue
		}
		out = append(out, tg)
	}
	return out, errors.Join(errs...)
}

// ResolveTargets combines the Topology's Regions (nil: none) with
// REGION=HOST:PORT overrides: an override replaces its Region's Tier-2
// address or adds a Region the Topology does not have.
func ResolveTargets(top *config.Topology, overrides []string) ([]Target, error) {
	byRegion := map[string]Target{}
	var errs []error
	for _, o := range overrides {
		t, err := ParseTarget(o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := byRegion[t.Region]; dup {
			errs = append(errs, fmt.Errorf("dns: Region %s has two --target flags", t.Region))
		}
		byRegion[t.Region] = t
	}
	var out []Target
	if top != nil {
		rest := &config.Topology{}
		for _, r := range top.Spec.Regions {
			if _, ok := byRegion[r.Name]; !ok {
				rest.Spec.Regions = append(rest.Spec.Regions, r)
			}
		}
		ts, err := TargetsFromTopology(rest)
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, ts...)
	}
	for _, t := range byRegion {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out, errors.Join(errs...)
}

// Config is what the global name should look like.
type Config struct {
	// Zone is the hosted zone: its ID (Z0123...) or its name
	// (example.com). A name must match exactly one public zone.
	Zone string
	// Name is the global DNS name (api.example.com), inside Zone.
	Name string
	// Targets are the Regions' entry points, one per Region.
	Targets []Target
	// TTL of the records, in seconds. Zero means 60: short enough that a
	// Region whose health check fails drops out of answers within about
	// a minute plus the health check's detection time.
	TTL int64
	// HealthPath is the path the health checks request. Zero means
	// /readyz, Tier-2's readiness endpoint.
	HealthPath string
	// HTTPS makes the health checks use HTTPS (no certificate check, as
	// Route 53 does). Zero means HTTP.
	HTTPS bool
	// HealthInterval is seconds between checks from each checker: 10 or
	// 30. Zero means 30; 10 detects a failure three times sooner and
	// costs more.
	HealthInterval int
	// FailureThreshold is how many consecutive failures mark a target
	// unhealthy, 1..10. Zero means 3.
	FailureThreshold int
	// Prune deletes latency records of Name whose Region is not among
	// Targets. Zero (false) reports them and leaves them alone.
	Prune bool
}

func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = 60
	}
	if c.HealthPath == "" {
		c.HealthPath = "/readyz"
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 30
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = 3
	}
	c.Name = fqdn(c.Name)
	return c
}

// ErrInvalid marks a Config that cannot be planned.
var ErrInvalid = errors.New("invalid")

func (c Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
	}
	if c.Zone == "" {
		bad("a hosted zone is required (--zone)")
	}
	if c.Name == "." {
		bad("a name is required (--name)")
	}
	if len(c.Targets) == 0 {
		bad("no targets: give a Topology (--config) or --target REGION=HOST:PORT")
	}
	if c.TTL < 0 {
		bad("TTL %d is negative", c.TTL)
	}
	if c.HealthInterval != 10 && c.HealthInterval != 30 {
		bad("health check interval %ds: Route 53 allows 10 or 30", c.HealthInterval)
	}
	if c.FailureThreshold < 1 || c.FailureThreshold > 10 {
		bad("failure threshold %d: Route 53 allows 1 to 10", c.FailureThreshold)
	}
	if !strings.HasPrefix(c.HealthPath, "/") {
		bad("health path %q must start with /", c.HealthPath)
	}
	seen := map[string]bool{}
	kinds := map[string]bool{}
	for _, t := range c.Targets {
		if t.Region == "" || t.Host == "" {
			bad("target %s: Region and Host are required", t)
			continue
		}
		if seen[t.Region] {
			bad("Region %s has two targets", t.Region)
		}
		seen[t.Region] = true
		if t.Port < 1 || t.Port > 65535 {
			bad("target %s: port %d", t, t.Port)
		}
		if a, err := netip.ParseAddr(t.Host); err == nil {
			switch {
			case !a.Is4():
				bad("target %s: only IPv4 addresses or DNS names", t)
			case !publicAddr(a):
				bad("target %s: Route 53 cannot health-check a loopback, private or link-local address; give the load balancer's DNS name (--target %s=HOST:PORT)", t, t.Region)
			}
		}
		kinds[recordType(t.Host)] = true
	}
	if len(kinds) > 1 {
		bad("targets mix IP addresses and DNS names; a name's latency records are all A or all CNAME")
	}
	return errors.Join(errs...)
}

// publicAddr reports whether Route 53's health checkers could reach a.
func publicAddr(a netip.Addr) bool {
	return !(a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified())
}

func recordType(host string) string {
	if _, err := netip.ParseAddr(host); err == nil {
		return "A"
	}
	return "CNAME"
}

// Record is one latency record of the name, as Meridian manages it.
type Record struct {
	Region string
	Type   string // A or CNAME
	Value  string
	TTL    int64
	// HealthCheckID is the Route 53 health check guarding the record;
	// empty in a plan when the health check is still to be created.
	HealthCheckID string
}

func (r Record) String() string {
	hc := r.HealthCheckID
	if hc == "" {
		hc = "(new)"
	}
	return fmt.Sprintf("%s %s %s ttl=%d health-check=%s", r.Region, r.Type, r.Value, r.TTL, hc)
}

// HealthCheck is a health check the plan creates.
type HealthCheck struct {
	Region string
	// CallerReference identifies the health check to Route 53: derived
	// from the name, Region and settings, so an apply retried after a
	// failure gets the same health check back instead of a second one.
	CallerReference string
	Config          types.HealthCheckConfig
}

func (h HealthCheck) String() string { return describeHealthCheck(&h.Config) }

// RecordChange is one change of a record set.
type RecordChange struct {
	Action types.ChangeAction
	// Old is the record as it is (nil for a CREATE); New as it will be
	// (nil for a DELETE).
	Old, New *Record
	// NewHealthCheck indexes Plan.CreateHealthChecks when New's health
	// check is created by the same apply; -1 otherwise.
	NewHealthCheck int
}

// Plan is the difference between Route 53 and a Config.
type Plan struct {
	ZoneID, ZoneName, Name string

	CreateHealthChecks []HealthCheck
	// DeleteHealthChecks are health checks Meridian created for this name
	// that no record will use after the apply.
	DeleteHealthChecks []string
	Changes            []RecordChange
	Unchanged          []Record
	// Unmanaged are latency records of the name for Regions not in the
	// Config, left alone because Config.Prune is false.
	Unmanaged []Record
}

// Empty reports whether applying the plan would change nothing.
func (p *Plan) Empty() bool {
	return len(p.CreateHealthChecks) == 0 && len(p.DeleteHealthChecks) == 0 && len(p.Changes) == 0
}

// Write prints the plan as a diff: + create, ~ update, - delete,
// = unchanged, ? not managed.
func (p *Plan) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "zone %s (%s), name %s\n", p.ZoneName, p.ZoneID, p.Name)
	for _, h := range p.CreateHealthChecks {
		fmt.Fprintf(&b, "+ health check %s: %s\n", h.Region, h)
	}
	for _, c := range p.Changes {
		switch c.Action {
		case types.ChangeActionCreate:
			fmt.Fprintf(&b, "+ record %s\n", c.New)
		case types.ChangeActionUpsert:
			fmt.Fprintf(&b, "~ record %s\n    was %s\n", c.New, c.Old)
		case types.ChangeActionDelete:
			fmt.Fprintf(&b, "- record %s\n", c.Old)
		}
	}
	for _, id := range p.DeleteHealthChecks {
		fmt.Fprintf(&b, "- health check %s (no longer used)\n", id)
	}
	for _, r := range p.Unchanged {
		fmt.Fprintf(&b, "= record %s\n", r)
	}
	for _, r := range p.Unmanaged {
		fmt.Fprintf(&b, "? record %s: Region not in the targets; kept (prune deletes it)\n", r)
	}
	if p.Empty() {
		b.WriteString("no changes\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// callerPrefix marks health checks this package created.
const callerPrefix = "meridian-"

func callerReference(name, region string, c *types.HealthCheckConfig) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s", name, region, describeHealthCheck(c))
	return callerPrefix + hex.EncodeToString(h.Sum(nil))[:40]
}

func describeHealthCheck(c *types.HealthCheckConfig) string {
	host := aws.ToString(c.FullyQualifiedDomainName)
	if host == "" {
		host = aws.ToString(c.IPAddress)
	}
	return fmt.Sprintf("%s %s%s every %ds, unhealthy after %d failures", c.Type,
		net.JoinHostPort(host, strconv.Itoa(int(aws.ToInt32(c.Port)))), aws.ToString(c.ResourcePath),
		aws.ToInt32(c.RequestInterval), aws.ToInt32(c.FailureThreshold))
}

func (c Config) healthCheckConfig(t Target) types.HealthCheckConfig {
	hc := types.HealthCheckConfig{
		Type:             types.HealthCheckTypeHttp,
		Port:             aws.Int32(int32(t.Port)),
		ResourcePath:     aws.String(c.HealthPath),
		RequestInterval:  aws.Int32(int32(c.HealthInterval)),
		FailureThreshold: aws.Int32(int32(c.FailureThreshold)),
	}
	if c.HTTPS {
		hc.Type = types.HealthCheckTypeHttps
	}
	if recordType(t.Host) == "A" {
		hc.IPAddress = aws.String(t.Host)
	} else {
		hc.FullyQualifiedDomainName = aws.String(t.Host)
	}
	return hc
}

// MakePlan reads the zone, its health checks and the name's records, and
// returns the changes that make them match cfg. It changes nothing.
func MakePlan(ctx context.Context, client *route53.Client, cfg Config) (*Plan, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("dns: %w", err)
	}
	zoneID, zoneName, err := findZone(ctx, client, cfg.Zone)
	if err != nil {
		return nil, err
	}
	if cfg.Name != zoneName && !strings.HasSuffix(cfg.Name, "."+zoneName) {
		return nil, fmt.Errorf("dns: %w: name %s is not inside zone %s", ErrInvalid, cfg.Name, zoneName)
	}
	checks, err := listHealthChecks(ctx, client)
	if err != nil {
		return nil, err
	}
	current, err := listLatencyRecords(ctx, client, zoneID, cfg.Name)
	if err != nil {
		return nil, err
	}
	p := &Plan{ZoneID: zoneID, ZoneName: zoneName, Name: cfg.Name}

	byRef := map[string]string{} // caller reference → ID
	mine := map[string]bool{}    // IDs this package created
	for _, h := range checks {
		ref := aws.ToString(h.CallerReference)
		byRef[ref] = aws.ToString(h.Id)
		if strings.HasPrefix(ref, callerPrefix) {
			mine[aws.ToString(h.Id)] = true
		}
	}
	used := map[string]bool{} // health checks the desired records use
	targets := slices.Clone(cfg.Targets)
	sort.Slice(targets, func(i, j int) bool { return targets[i].Region < targets[j].Region })
	for _, t := range targets {
		hc := cfg.healthCheckConfig(t)
		ref := callerReference(cfg.Name, t.Region, &hc)
		want := Record{Region: t.Region, Type: recordType(t.Host), Value: normalizeValue(t.Host), TTL: cfg.TTL, HealthCheckID: byRef[ref]}
		newHC := -1
		if want.HealthCheckID == "" {
			p.CreateHealthChecks = append(p.CreateHealthChecks, HealthCheck{Region: t.Region, CallerReference: ref, Config: hc})
			newHC = len(p.CreateHealthChecks) - 1
		}
		used[want.HealthCheckID] = true
		have, ok := current[t.Region]
		delete(current, t.Region)
		switch {
		case !ok:
			p.Changes = append(p.Changes, RecordChange{Action: types.ChangeActionCreate, New: &want, NewHealthCheck: newHC})
		case have == want:
			p.Unchanged = append(p.Unchanged, have)
		case have.Type != want.Type:
			// A record set cannot change type: delete it and create anew
			// in the same batch.
			old := have
			p.Changes = append(p.Changes,
				RecordChange{Action: types.ChangeActionDelete, Old: &old, NewHealthCheck: -1},
				RecordChange{Action: types.ChangeActionCreate, New: &want, NewHealthCheck: newHC})
		default:
			old := have
			p.Changes = append(p.Changes, RecordChange{Action: types.ChangeActionUpsert, Old: &old, New: &want, NewHealthCheck: newHC})
		}
	}
	stale := slices.Sorted(maps.Keys(current))
	for _, region := range stale {
		r := current[region]
		if cfg.Prune {
			p.Changes = append(p.Changes, RecordChange{Action: types.ChangeActionDelete, Old: &r, NewHealthCheck: -1})
		} else {
			p.Unmanaged = append(p.Unmanaged, r)
			used[r.HealthCheckID] = true
		}
	}
	// Health checks this package made that the changed records leave
	// unused.
	for _, c := range p.Changes {
		if c.Old == nil || c.Old.HealthCheckID == "" || used[c.Old.HealthCheckID] || !mine[c.Old.HealthCheckID] {
			continue
		}
		if !slices.Contains(p.DeleteHealthChecks, c.Old.HealthCheckID) {
			p.DeleteHealthChecks = append(p.DeleteHealthChecks, c.Old.HealthCheckID)
		}
	}
	// Deletes first: a batch that turns CNAMEs into A records must remove
	// the old type before adding the new.
	slices.SortStableFunc(p.Changes, func(a, b RecordChange) int {
		return boolInt(a.Action != types.ChangeActionDelete) - boolInt(b.Action != types.ChangeActionDelete)
	})
	return p, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Apply carries out a plan made by MakePlan: it creates the health
// checks, submits every record change in one batch (Route 53 applies it
// all or not at all), then deletes the health checks left unused. A
// failure part way leaves at most new, unused health checks, which the
// next plan reuses.
func Apply(ctx context.Context, client *route53.Client, p *Plan) error {
	ids := make([]string, len(p.CreateHealthChecks))
	for i, h := range p.CreateHealthChecks {
		cfg := h.Config
		out, err := client.CreateHealthCheck(ctx, &route53.CreateHealthCheckInput{
			CallerReference:   aws.String(h.CallerReference),
			HealthCheckConfig: &cfg,
		})
		if err != nil {
			return fmt.Errorf("dns: creating the health check for %s: %w", h.Region, err)
		}
		ids[i] = aws.ToString(out.HealthCheck.Id)
	}
	if len(p.Changes) > 0 {
		changes := make([]types.Change, 0, len(p.Changes))
		for _, c := range p.Changes {
			r := c.New
			if c.Action == types.ChangeActionDelete {
				r = c.Old
			} else if c.NewHealthCheck >= 0 {
				withID := *r
				withID.HealthCheckID = ids[c.NewHealthCheck]
				r = &withID
			}
			changes = append(changes, types.Change{Action: c.Action, ResourceRecordSet: p.recordSet(r)})
		}
		_, err := client.ChangeResourceRecordSets(ctx, &route53.ChangeResourceRecordSetsInput{
			HostedZoneId: aws.String(p.ZoneID),
			ChangeBatch: &types.ChangeBatch{
				Comment: aws.String("meridian dns apply " + p.Name),
				Changes: changes,
			},
		})
		if err != nil {
			var icb *types.InvalidChangeBatch
			if errors.As(err, &icb) && len(icb.Messages) > 0 {
				return fmt.Errorf("dns: changing the records of %s: %s: %w", p.Name, strings.Join(icb.Messages, "; "), err)
			}
			return fmt.Errorf("dns: changing the records of %s: %w", p.Name, err)
		}
	}
	for _, id := range p.DeleteHealthChecks {
		if _, err := client.DeleteHealthCheck(ctx, &route53.DeleteHealthCheckInput{HealthCheckId: aws.String(id)}); err != nil {
			var gone *types.NoSuchHealthCheck
			if errors.As(err, &gone) {
				continue
			}
			return fmt.Errorf("dns: deleting unused health check %s: %w", id, err)
		}
	}
	return nil
}

func (p *Plan) recordSet(r *Record) *types.ResourceRecordSet {
	rs := &types.ResourceRecordSet{
		Name:            aws.String(p.Name),
		Type:            types.RRType(r.Type),
		SetIdentifier:   aws.String(r.Region),
		Region:          types.ResourceRecordSetRegion(r.Region),
		TTL:             aws.Int64(r.TTL),
		ResourceRecords: []types.ResourceRecord{{Value: aws.String(r.Value)}},
	}
	if r.HealthCheckID != "" {
		rs.HealthCheckId = aws.String(r.HealthCheckID)
	}
	return rs
}

// findZone resolves an ID or a name to the zone's ID and name.
func findZone(ctx context.Context, client *route53.Client, zone string) (id, name string, err error) {
	if looksLikeZoneID(zone) {
		out, err := client.GetHostedZone(ctx, &route53.GetHostedZoneInput{Id: aws.String(zone)})
		if err != nil {
			return "", "", fmt.Errorf("dns: hosted zone %s: %w", zone, err)
		}
		return trimZoneID(aws.ToString(out.HostedZone.Id)), fqdn(aws.ToString(out.HostedZone.Name)), nil
	}
	want := fqdn(zone)
	out, err := client.ListHostedZonesByName(ctx, &route53.ListHostedZonesByNameInput{DNSName: aws.String(want)})
	if err != nil {
		return "", "", fmt.Errorf("dns: looking up hosted zone %s: %w", zone, err)
	}
	var ids []string
	for _, z := range out.HostedZones {
		if fqdn(aws.ToString(z.Name)) != want || (z.Config != nil && z.Config.PrivateZone) {
			continue
		}
		ids = append(ids, trimZoneID(aws.ToString(z.Id)))
	}
	switch len(ids) {
	case 0:
		return "", "", fmt.Errorf("dns: no public hosted zone named %s", want)
	case 1:
		return ids[0], want, nil
	default:
		return "", "", fmt.Errorf("dns: %d public hosted zones are named %s (%s): pass --zone with the ID", len(ids), want, strings.Join(ids, ", "))
	}
}

func looksLikeZoneID(s string) bool {
	s = trimZoneID(s)
	if s == "" || s[0] != 'Z' || strings.Contains(s, ".") {
		return false
	}
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') {
			return false
		}
	}
	return true
}

func trimZoneID(id string) string { return strings.TrimPrefix(id, "/hostedzone/") }

func listHealthChecks(ctx context.Context, client *route53.Client) ([]types.HealthCheck, error) {
	var out []types.HealthCheck
	pages := route53.NewListHealthChecksPaginator(client, &route53.ListHealthChecksInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("dns: listing health checks: %w", err)
		}
		out = append(out, page.HealthChecks...)
	}
	return out, nil
}

// listLatencyRecords returns the name's latency records (A or CNAME with
// a Region), by Region. Other records of the name are not Meridian's.
func listLatencyRecords(ctx context.Context, client *route53.Client, zoneID, name string) (map[string]Record, error) {
	out := map[string]Record{}
	in := &route53.ListResourceRecordSetsInput{HostedZoneId: aws.String(zoneID), StartRecordName: aws.String(name)}
	for {
		page, err := client.ListResourceRecordSets(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("dns: listing records of %s: %w", name, err)
		}
		for _, rs := range page.ResourceRecordSets {
			if fqdn(aws.ToString(rs.Name)) != name {
				return out, nil // records are listed in name order
			}
			if rs.Region == "" || (rs.Type != types.RRTypeA && rs.Type != types.RRTypeCname) || len(rs.ResourceRecords) != 1 {
				continue
			}
			out[string(rs.Region)] = Record{
				Region:        string(rs.Region),
				Type:          string(rs.Type),
				Value:         normalizeValue(aws.ToString(rs.ResourceRecords[0].Value)),
				TTL:           aws.ToInt64(rs.TTL),
				HealthCheckID: aws.ToString(rs.HealthCheckId),
			}
		}
		if !page.IsTruncated {
			return out, nil
		}
		in.StartRecordName, in.StartRecordType, in.StartRecordIdentifier = page.NextRecordName, page.NextRecordType, page.NextRecordIdentifier
	}
}

func fqdn(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// normalizeValue writes DNS names as Route 53 returns them (lower case,
// trailing dot) so that comparisons do not see false differences.
func normalizeValue(host string) string {
	if recordType(host) == "A" {
		return host
	}
	return fqdn(host)
}

// ClientOptions say how to reach Route 53.
type ClientOptions struct {
	// EndpointURL replaces Route 53's endpoint (tests, proxies). Empty
	// means AWS's.
	EndpointURL string
	// Profile is the shared-config profile. Empty means the default
	// chain: environment, shared files, web identity (IRSA on EKS),
	// container and instance roles.
	Profile string
}

// NewClient returns a Route 53 client using the SDK's standard credential
// chain. Route 53 is a global service signed in us-east-1.
func NewClient(ctx context.Context, o ClientOptions, optFns ...func(*awsconfig.LoadOptions) error) (*route53.Client, error) {
	opts := append([]func(*awsconfig.LoadOptions) error{awsconfig.WithRegion("us-east-1")}, optFns...)
	if o.Profile != "" {
		opts = append(opts, awsconfig.WithSharedConfigProfile(o.Profile))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("dns: loading AWS configuration: %w", err)
	}
	return route53.NewFromConfig(cfg, func(r *route53.Options) {
		if o.EndpointURL != "" {
			r.BaseEndpoint = aws.String(o.EndpointURL)
		}
	}), nil
}
