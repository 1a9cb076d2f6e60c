// Package route53test runs a Route 53 endpoint on loopback for tests: the
// REST-XML wire protocol of the calls `meridian dns` makes, over an
// in-memory hosted zone and health checks, with Route 53's rules for
// change batches (atomic; CREATE of an existing record, DELETE of a
// missing or different one, a CNAME beside other records, an unknown
// health check all fail the whole batch).
//
// It is not Route 53: it answers only GetHostedZone, ListHostedZonesByName,
// ListResourceRecordSets, ChangeResourceRecordSets, ListHealthChecks,
// CreateHealthCheck and DeleteHealthCheck, checks that each request is
// signed with Signature Version 4 for service route53 (not that the
// signature is right), and serves no DNS queries.
package route53test

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const xmlns = "https://route53.amazonaws.com/doc/2013-04-01/"

// ResourceRecordSet is a record set as Route 53 stores it.
type ResourceRecordSet struct {
	Name            string           `xml:"Name"`
	Type            string           `xml:"Type"`
	SetIdentifier   string           `xml:"SetIdentifier,omitempty"`
	Region          string           `xml:"Region,omitempty"`
	TTL             *int64           `xml:"TTL,omitempty"`
	ResourceRecords []ResourceRecord `xml:"ResourceRecords>ResourceRecord"`
	HealthCheckID   string           `xml:"HealthCheckId,omitempty"`
}

// ResourceRecord is one value of a record set.
type ResourceRecord struct {
	Value string `xml:"Value"`
}

// HealthCheckConfig is the part of a health check's configuration the
// server keeps.
type HealthCheckConfig struct {
	IPAddress                string `xml:"IPAddress,omitempty"`
	Port                     int    `xml:"Port,omitempty"`
	Type                     string `xml:"Type"`
	ResourcePath             string `xml:"ResourcePath,omitempty"`
	FullyQualifiedDomainName string `xml:"FullyQualifiedDomainName,omitempty"`
	RequestInterval          int    `xml:"RequestInterval,omitempty"`
	FailureThreshold         int    `xml:"FailureThreshold,omitempty"`
}

// HealthCheck is a stored health check.
type HealthCheck struct {
	ID                string            `xml:"Id"`
	CallerReference   string            `xml:"CallerReference"`
	HealthCheckConfig HealthCheckConfig `xml:"HealthCheckConfig"`
	Version           int               `xml:"HealthCheckVersion"`
}

type zone struct {
	id, name string
	records  []ResourceRecordSet
}

// Server is a Route 53 endpoint on 127.0.0.1.
type Server struct {
	// URL is the endpoint to give the SDK (BaseEndpoint).
	URL string
	// AccessKeyID is the only access key the server accepts.
	AccessKeyID string
	// PageSize is the most items one List call returns (Route 53's
	// default is 100); small values exercise the client's paging.
	PageSize int

	srv *httptest.Server

	mu           sync.Mutex
	zones        []*zone
	healthChecks []HealthCheck
	nextID       int
	calls        map[string]int
}

// NewServer starts a server that accepts requests signed with accessKeyID.
// Close it when done.
func NewServer(accessKeyID string) *Server {
	s := &Server{AccessKeyID: accessKeyID, PageSize: 100, calls: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// AddZone creates a hosted zone and returns its ID (without /hostedzone/).
func (s *Server) AddZone(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	z := &zone{id: fmt.Sprintf("Z%010d", s.nextID), name: fqdn(name)}
	ttl := int64(172800)
	z.records = []ResourceRecordSet{
		{Name: z.name, Type: "NS", TTL: &ttl, ResourceRecords: []ResourceRecord{{Value: "ns-1.awsdns-00.org."}}},
		{Name: z.name, Type: "SOA", TTL: &ttl, ResourceRecords: []ResourceRecord{{Value: "ns-1.awsdns-00.org. awsdns-hostmaster.amazon.com. 1 7200 900 1209600 86400"}}},
	}
	s.zones = append(s.zones, z)
	return z.id
}

// Records returns a copy of a zone's record sets.
func (s *Server) Records(zoneID string) []ResourceRecordSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	z := s.zone(zoneID)
	if z == nil {
		return nil
	}
	return slices.Clone(z.records)
}

// HealthChecks returns a copy of the health checks.
func (s *Server) HealthChecks() []HealthCheck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.healthChecks)
}

// Calls returns how many times each operation was called.
func (s *Server) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.calls))
	for k, v := range s.calls {
		out[k] = v
	}
	return out
}

// Mutations is the number of calls that changed state.
func (s *Server) Mutations() int {
	c := s.Calls()
	return c["ChangeResourceRecordSets"] + c["CreateHealthCheck"] + c["DeleteHealthCheck"]
}

func (s *Server) zone(id string) *zone {
	id = strings.TrimPrefix(id, "/hostedzone/")
	for _, z := range s.zones {
		if z.id == id {
			return z
		}
	}
	return nil
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if err := s.checkSignature(r); err != nil {
		writeError(w, http.StatusForbidden, "Sender", "InvalidSignatureException", err.Error())
		return
	}
	const base = "/2013-04-01/"
	path, ok := strings.CutPrefix(r.URL.Path, base)
	if !ok {
		writeError(w, http.StatusNotFound, "Sender", "UnknownOperation", "no such path "+r.URL.Path)
		return
	}
	parts := strings.Split(strings.TrimSuffix(path, "/"), "/")
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "hostedzonesbyname":
		s.calls["ListHostedZonesByName"]++
		s.listZonesByName(w, r.URL.Query())
	case r.Method == http.MethodGet && len(parts) == 2 && parts[0] == "hostedzone":
		s.calls["GetHostedZone"]++
		s.getZone(w, parts[1])
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "hostedzone" && parts[2] == "rrset":
		s.calls["ListResourceRecordSets"]++
		s.listRecords(w, parts[1], r.URL.Query())
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "hostedzone" && parts[2] == "rrset":
		s.calls["ChangeResourceRecordSets"]++
		s.changeRecords(w, r, parts[1])
	case r.Method == http.MethodGet && len(parts) == 1 && parts[0] == "healthcheck":
		s.calls["ListHealthChecks"]++
		s.listHealthChecks(w, r.URL.Query())
	case r.Method == http.MethodPost && len(parts) == 1 && parts[0] == "healthcheck":
		s.calls["CreateHealthCheck"]++
		s.createHealthCheck(w, r)
	case r.Method == http.MethodDelete && len(parts) == 2 && parts[0] == "healthcheck":
		s.calls["DeleteHealthCheck"]++
		s.deleteHealthCheck(w, parts[1])
	default:
		writeError(w, http.StatusNotFound, "Sender", "UnknownOperation", r.Method+" "+r.URL.Path+" is not served by this test server")
	}
}

// checkSignature checks the request carries a SigV4 Authorization for
// route53 in us-east-1 with the expected access key.
func (s *Server) checkSignature(r *http.Request) error {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 Credential=")
	if !ok {
		return fmt.Errorf("request is not signed with SigV4: Authorization %q", auth)
	}
	cred, _, _ := strings.Cut(rest, ",")
	f := strings.Split(cred, "/")
	if len(f) != 5 || f[0] != s.AccessKeyID || f[2] != "us-east-1" || f[3] != "route53" || f[4] != "aws4_request" {
		return fmt.Errorf("credential scope %q: want %s/DATE/us-east-1/route53/aws4_request", cred, s.AccessKeyID)
	}
	if r.Header.Get("X-Amz-Date") == "" {
		return fmt.Errorf("no X-Amz-Date")
	}
	return nil
}

type xmlZone struct {
	ID                     string `xml:"Id"`
	Name                   string `xml:"Name"`
	CallerReference        string `xml:"CallerReference"`
	PrivateZone            bool   `xml:"Config>PrivateZone"`
	ResourceRecordSetCount int    `xml:"ResourceRecordSetCount"`
}

func (z *zone) xml() xmlZone {
	return xmlZone{ID: "/hostedzone/" + z.id, Name: z.name, CallerReference: "dnstest-" + z.id, ResourceRecordSetCount: len(z.records)}
}

func (s *Server) getZone(w http.ResponseWriter, id string) {
	z := s.zone(id)
	if z == nil {
		writeError(w, http.StatusNotFound, "Sender", "NoSuchHostedZone", "No hosted zone found with ID: "+id)
		return
	}
	writeXML(w, http.StatusOK, struct {
		XMLName    xml.Name `xml:"GetHostedZoneResponse"`
		Xmlns      string   `xml:"xmlns,attr"`
		HostedZone xmlZone  `xml:"HostedZone"`
	}{Xmlns: xmlns, HostedZone: z.xml()})
}

func (s *Server) listZonesByName(w http.ResponseWriter, q url.Values) {
	start := fqdn(q.Get("dnsname"))
	var zs []xmlZone
	sorted := slices.Clone(s.zones)
	slices.SortFunc(sorted, func(a, b *zone) int { return strings.Compare(reverseName(a.name), reverseName(b.name)) })
	for _, z := range sorted {
		if q.Get("dnsname") == "" || reverseName(z.name) >= reverseName(start) {
			zs = append(zs, z.xml())
		}
	}
	writeXML(w, http.StatusOK, struct {
		XMLName     xml.Name  `xml:"ListHostedZonesByNameResponse"`
		Xmlns       string    `xml:"xmlns,attr"`
		HostedZones []xmlZone `xml:"HostedZones>HostedZone"`
		DNSName     string    `xml:"DNSName,omitempty"`
		IsTruncated bool      `xml:"IsTruncated"`
		MaxItems    int       `xml:"MaxItems"`
	}{Xmlns: xmlns, HostedZones: zs, DNSName: q.Get("dnsname"), MaxItems: 100})
}

// recordKey orders record sets as Route 53 lists them.
func recordKey(r ResourceRecordSet) string {
	return reverseName(r.Name) + "\x00" + r.Type + "\x00" + r.SetIdentifier
}

func (s *Server) listRecords(w http.ResponseWriter, id string, q url.Values) {
	z := s.zone(id)
	if z == nil {
		writeError(w, http.StatusNotFound, "Sender", "NoSuchHostedZone", "No hosted zone found with ID: "+id)
		return
	}
	records := slices.Clone(z.records)
	slices.SortFunc(records, func(a, b ResourceRecordSet) int { return strings.Compare(recordKey(a), recordKey(b)) })
	start := ""
	if n := q.Get("name"); n != "" {
		start = recordKey(ResourceRecordSet{Name: fqdn(n), Type: q.Get("type"), SetIdentifier: q.Get("identifier")})
	}
	max := s.PageSize
	if m, err := strconv.Atoi(q.Get("maxitems")); err == nil && m > 0 && m < max {
		max = m
	}
	var page []ResourceRecordSet
	var next *ResourceRecordSet
	for _, r := range records {
		if recordKey(r) < start {
			continue
		}
		if len(page) == max {
			next = &r
			break
		}
		page = append(page, r)
	}
	out := struct {
		XMLName              xml.Name            `xml:"ListResourceRecordSetsResponse"`
		Xmlns                string              `xml:"xmlns,attr"`
		ResourceRecordSets   []ResourceRecordSet `xml:"ResourceRecordSets>ResourceRecordSet"`
		IsTruncated          bool                `xml:"IsTruncated"`
		NextRecordName       string              `xml:"NextRecordName,omitempty"`
		NextRecordType       string              `xml:"NextRecordType,omitempty"`
		NextRecordIdentifier string              `xml:"NextRecordIdentifier,omitempty"`
		MaxItems             int                 `xml:"MaxItems"`
	}{Xmlns: xmlns, ResourceRecordSets: page, MaxItems: max}
	if next != nil {
		out.IsTruncated = true
		out.NextRecordName, out.NextRecordType, out.NextRecordIdentifier = next.Name, next.Type, next.SetIdentifier
	}
	writeXML(w, http.StatusOK, out)
}

type change struct {
	Action            string            `xml:"Action"`
	ResourceRecordSet ResourceRecordSet `xml:"ResourceRecordSet"`
}

func (s *Server) changeRecords(w http.ResponseWriter, r *http.Request, id string) {
	z := s.zone(id)
	if z == nil {
		writeError(w, http.StatusNotFound, "Sender", "NoSuchHostedZone", "No hosted zone found with ID: "+id)
		return
	}
	var req struct {
		XMLName xml.Name `xml:"ChangeResourceRecordSetsRequest"`
		Comment string   `xml:"ChangeBatch>Comment"`
		Changes []change `xml:"ChangeBatch>Changes>Change"`
	}
	if err := xml.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "malformed ChangeResourceRecordSetsRequest: "+err.Error())
		return
	}
	if len(req.Changes) == 0 {
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "ChangeBatch has no changes")
		return
	}
	// Apply to a copy: a batch is all or nothing.
	records := slices.Clone(z.records)
	var msgs []string
	for _, c := range req.Changes {
		rr := c.ResourceRecordSet
		rr.Name = fqdn(rr.Name)
		if err := s.validRecord(z, rr); err != "" {
			msgs = append(msgs, err)
			continue
		}
		i := slices.IndexFunc(records, func(x ResourceRecordSet) bool {
			return strings.EqualFold(x.Name, rr.Name) && x.Type == rr.Type && x.SetIdentifier == rr.SetIdentifier
		})
		switch c.Action {
		case "CREATE", "UPSERT":
			if i >= 0 && c.Action == "CREATE" {
				msgs = append(msgs, fmt.Sprintf("Tried to create resource record set [name='%s', type='%s', set-identifier='%s'] but it already exists", rr.Name, rr.Type, rr.SetIdentifier))
				continue
			}
			if i >= 0 { // UPSERT replaces the set
				records[i] = rr
				continue
			}
			// A new set: neither action may put one beside a CNAME.
			if m := cnameConflict(records, rr); m != "" {
				msgs = append(msgs, m)
				continue
			}
			records = append(records, rr)
		case "DELETE":
			if i < 0 {
				msgs = append(msgs, fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s', set-identifier='%s'] but it was not found", rr.Name, rr.Type, rr.SetIdentifier))
				continue
			}
			if !sameRecord(records[i], rr) {
				msgs = append(msgs, fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s', set-identifier='%s'] but the values provided do not match the current values", rr.Name, rr.Type, rr.SetIdentifier))
				continue
			}
			records = slices.Delete(records, i, i+1)
		default:
			msgs = append(msgs, "unknown action "+c.Action)
		}
	}
	if len(msgs) > 0 {
		writeXML(w, http.StatusBadRequest, struct {
			XMLName  xml.Name `xml:"InvalidChangeBatch"`
			Xmlns    string   `xml:"xmlns,attr"`
			Messages []string `xml:"Messages>Message"`
		}{Xmlns: xmlns, Messages: msgs})
		return
	}
	z.records = records
	s.nextID++
	writeXML(w, http.StatusOK, struct {
		XMLName     xml.Name `xml:"ChangeResourceRecordSetsResponse"`
		Xmlns       string   `xml:"xmlns,attr"`
		ID          string   `xml:"ChangeInfo>Id"`
		Status      string   `xml:"ChangeInfo>Status"`
		SubmittedAt string   `xml:"ChangeInfo>SubmittedAt"`
		Comment     string   `xml:"ChangeInfo>Comment,omitempty"`
	}{Xmlns: xmlns, ID: fmt.Sprintf("/change/C%010d", s.nextID), Status: "PENDING", SubmittedAt: time.Now().UTC().Format(time.RFC3339), Comment: req.Comment})
}

// validRecord checks one record set as Route 53 would.
func (s *Server) validRecord(z *zone, rr ResourceRecordSet) string {
	if rr.Name != z.name && !strings.HasSuffix(strings.ToLower(rr.Name), "."+strings.ToLower(z.name)) {
		return fmt.Sprintf("RRSet with DNS name %s is not permitted in zone %s", rr.Name, z.name)
	}
	if !slices.Contains([]string{"A", "AAAA", "CNAME", "TXT", "NS", "SOA", "MX"}, rr.Type) {
		return "unsupported type " + rr.Type
	}
	if (rr.Region != "") != (rr.SetIdentifier != "") {
		return fmt.Sprintf("Invalid request: a latency record needs both Region and SetIdentifier (name='%s')", rr.Name)
	}
	if rr.Region != "" && !awsRegion(rr.Region) {
		return fmt.Sprintf("Invalid Region %q", rr.Region)
	}
	if rr.TTL == nil || len(rr.ResourceRecords) == 0 {
		return fmt.Sprintf("Invalid request: Expected exactly one of [AliasTarget, all of [TTL, and ResourceRecords]] (name='%s')", rr.Name)
	}
	if rr.Type == "CNAME" && len(rr.ResourceRecords) != 1 {
		return "a CNAME has exactly one value"
	}
	if rr.HealthCheckID != "" && !slices.ContainsFunc(s.healthChecks, func(h HealthCheck) bool { return h.ID == rr.HealthCheckID }) {
		return "Invalid request: health check " + rr.HealthCheckID + " does not exist"
	}
	return ""
}

func awsRegion(r string) bool {
	parts := strings.Split(r, "-")
	if len(parts) < 3 {
		return false
	}
	_, err := strconv.Atoi(parts[len(parts)-1])
	return err == nil
}

func cnameConflict(records []ResourceRecordSet, rr ResourceRecordSet) string {
	for _, x := range records {
		if strings.EqualFold(x.Name, rr.Name) && (x.Type == "CNAME") != (rr.Type == "CNAME") {
			return fmt.Sprintf("RRSet of type %s with DNS name %s is not permitted because a conflicting RRSet of type %s with the same DNS name already exists", rr.Type, rr.Name, x.Type)
		}
	}
	return ""
}

func sameRecord(a, b ResourceRecordSet) bool {
	if a.Region != b.Region || a.HealthCheckID != b.HealthCheckID || (a.TTL == nil) != (b.TTL == nil) || (a.TTL != nil && *a.TTL != *b.TTL) {
		return false
	}
	return slices.Equal(a.ResourceRecords, b.ResourceRecords)
}

func (s *Server) listHealthChecks(w http.ResponseWriter, q url.Values) {
	max := s.PageSize
	if m, err := strconv.Atoi(q.Get("maxitems")); err == nil && m > 0 && m < max {
		max = m
	}
	marker := q.Get("marker")
	var page []HealthCheck
	next := ""
	for _, h := range s.healthChecks {
		if marker != "" && h.ID < marker {
			continue
		}
		if len(page) == max {
			next = h.ID
			break
		}
		page = append(page, h)
	}
	writeXML(w, http.StatusOK, struct {
		XMLName      xml.Name      `xml:"ListHealthChecksResponse"`
		Xmlns        string        `xml:"xmlns,attr"`
		HealthChecks []HealthCheck `xml:"HealthChecks>HealthCheck"`
		Marker       string        `xml:"Marker"`
		IsTruncated  bool          `xml:"IsTruncated"`
		NextMarker   string        `xml:"NextMarker,omitempty"`
		MaxItems     int           `xml:"MaxItems"`
	}{Xmlns: xmlns, HealthChecks: page, Marker: marker, IsTruncated: next != "", NextMarker: next, MaxItems: max})
}

func (s *Server) createHealthCheck(w http.ResponseWriter, r *http.Request) {
	var req struct {
		XMLName           xml.Name          `xml:"CreateHealthCheckRequest"`
		CallerReference   string            `xml:"CallerReference"`
		HealthCheckConfig HealthCheckConfig `xml:"HealthCheckConfig"`
	}
	if err := xml.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "malformed CreateHealthCheckRequest: "+err.Error())
		return
	}
	c := req.HealthCheckConfig
	switch {
	case req.CallerReference == "":
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "CallerReference is required")
		return
	case !slices.Contains([]string{"HTTP", "HTTPS", "TCP"}, c.Type):
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "unsupported health check type "+c.Type)
		return
	case c.IPAddress != "" && !publicIPv4(c.IPAddress):
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "Route 53 cannot check the health of endpoints in local, private, non-routable or multicast ranges: "+c.IPAddress)
		return
	case (c.IPAddress == "") == (c.FullyQualifiedDomainName == ""):
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "this server wants exactly one of IPAddress and FullyQualifiedDomainName")
		return
	case c.RequestInterval != 0 && c.RequestInterval != 10 && c.RequestInterval != 30:
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "RequestInterval must be 10 or 30")
		return
	case c.FailureThreshold < 0 || c.FailureThreshold > 10:
		writeError(w, http.StatusBadRequest, "Sender", "InvalidInput", "FailureThreshold must be 1..10")
		return
	}
	if c.RequestInterval == 0 {
		c.RequestInterval = 30
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = 3
	}
	// Route 53: the same caller reference and settings return the existing
	// health check; the same reference with other settings is an error.
	for _, h := range s.healthChecks {
		if h.CallerReference == req.CallerReference {
			if h.HealthCheckConfig != c {
				writeError(w, http.StatusConflict, "Sender", "HealthCheckAlreadyExists", "A health check with caller reference "+req.CallerReference+" already exists with other settings")
				return
			}
			writeHealthCheck(w, http.StatusCreated, h)
			return
		}
	}
	s.nextID++
	h := HealthCheck{ID: fmt.Sprintf("hc-%08d-0000-4000-8000-000000000000", s.nextID), CallerReference: req.CallerReference, HealthCheckConfig: c, Version: 1}
	s.healthChecks = append(s.healthChecks, h)
	w.Header().Set("Location", s.URL+"/2013-04-01/healthcheck/"+h.ID)
	writeHealthCheck(w, http.StatusCreated, h)
}

func writeHealthCheck(w http.ResponseWriter, status int, h HealthCheck) {
	writeXML(w, status, struct {
		XMLName     xml.Name    `xml:"CreateHealthCheckResponse"`
		Xmlns       string      `xml:"xmlns,attr"`
		HealthCheck HealthCheck `xml:"HealthCheck"`
	}{Xmlns: xmlns, HealthCheck: h})
}

func (s *Server) deleteHealthCheck(w http.ResponseWriter, id string) {
	i := slices.IndexFunc(s.healthChecks, func(h HealthCheck) bool { return h.ID == id })
	if i < 0 {
		writeError(w, http.StatusNotFound, "Sender", "NoSuchHealthCheck", "No health check exists with the specified ID "+id)
		return
	}
	for _, z := range s.zones {
		for _, r := range z.records {
			if r.HealthCheckID == id {
				writeError(w, http.StatusBadRequest, "Sender", "HealthCheckInUse", "The health check "+id+" is still referenced from "+r.Name)
				return
			}
		}
	}
	s.healthChecks = slices.Delete(s.healthChecks, i, i+1)
	writeXML(w, http.StatusOK, struct {
		XMLName xml.Name `xml:"DeleteHealthCheckResponse"`
		Xmlns   string   `xml:"xmlns,attr"`
	}{Xmlns: xmlns})
}

func writeXML(w http.ResponseWriter, status int, v any) {
	data, err := xml.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("X-Amzn-Requestid", "dnstest")
	w.WriteHeader(status)
	w.Write([]byte(xml.Header))
	w.Write(data)
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeXML(w, status, struct {
		XMLName   xml.Name `xml:"ErrorResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		Type      string   `xml:"Error>Type"`
		Code      string   `xml:"Error>Code"`
		Message   string   `xml:"Error>Message"`
		RequestID string   `xml:"RequestId"`
	}{Xmlns: xmlns, Type: typ, Code: code, Message: msg, RequestID: "dnstest"})
}

func publicIPv4(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is4() && !(a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified())
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// reverseName orders names label by label from the right, as Route 53
// lists them.
func reverseName(name string) string {
	labels := strings.Split(strings.TrimSuffix(name, "."), ".")
	slices.Reverse(labels)
	return strings.Join(labels, ".")
}
