// Package cloudwatchtest runs a CloudWatch endpoint on loopback for tests:
// PutMetricData over the wire protocol the AWS SDK for Go v2 uses for
// CloudWatch (Smithy RPC v2 CBOR: POST
// /service/GraniteServiceVersion20100801/operation/PutMetricData, a CBOR
// body, gzip-compressed when large), decoded with an independent CBOR
// library and checked against the API's limits (1,000 datums and 1 MB a
// request, 30 dimensions, 150 values a datum, one of Value,
// StatisticValues or Values). It keeps every accepted datum.
//
// It is not CloudWatch: no other operation, no aggregation, and it checks
// that requests carry a SigV4 Authorization for service monitoring, not
// that the signature is right.
package cloudwatchtest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fxamacker/cbor/v2"
)

// API limits of PutMetricData.
const (
	MaxDatums        = 1000
	MaxRequestBytes  = 1 << 20
	MaxDimensions    = 30
	MaxValues        = 150
	putMetricDataURI = "/service/GraniteServiceVersion20100801/operation/PutMetricData"
)

// Dimension is a name/value pair of a datum.
type Dimension struct {
	Name  string `cbor:"Name"`
	Value string `cbor:"Value"`
}

// StatisticSet is a pre-aggregated datum.
type StatisticSet struct {
	SampleCount float64 `cbor:"SampleCount"`
	Sum         float64 `cbor:"Sum"`
	Minimum     float64 `cbor:"Minimum"`
	Maximum     float64 `cbor:"Maximum"`
}

// Datum is one metric datum as received.
type Datum struct {
	MetricName        string        `cbor:"MetricName"`
	Dimensions        []Dimension   `cbor:"Dimensions,omitempty"`
	Timestamp         time.Time     `cbor:"Timestamp,omitempty"`
	Value             *float64      `cbor:"Value,omitempty"`
	StatisticValues   *StatisticSet `cbor:"StatisticValues,omitempty"`
	Values            []float64     `cbor:"Values,omitempty"`
	Counts            []float64     `cbor:"Counts,omitempty"`
	Unit              string        `cbor:"Unit,omitempty"`
	StorageResolution *int32        `cbor:"StorageResolution,omitempty"`
}

// Dimension returns the value of the named dimension, or "".
func (d Datum) Dimension(name string) string {
	for _, dim := range d.Dimensions {
		if dim.Name == name {
			return dim.Value
		}
	}
	return ""
}

// Request is one accepted PutMetricData call.
type Request struct {
	Namespace string
	Datums    []Datum
	// Gzipped reports whether the body came compressed.
	Gzipped bool
}

type putMetricDataInput struct {
	Namespace              string  `cbor:"Namespace"`
	MetricData             []Datum `cbor:"MetricData"`
	StrictEntityValidation *bool   `cbor:"StrictEntityValidation,omitempty"`
	EntityMetricData       []any   `cbor:"EntityMetricData,omitempty"`
}

var decMode = func() cbor.DecMode {
	m, err := cbor.DecOptions{
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		TimeTag:           cbor.DecTagRequired,
	}.DecMode()
	if err != nil {
		panic(err)
	}
	return m
}()

var units = []string{"Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
	"Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second", "Kilobytes/Second",
	"Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second", "Kilobits/Second", "Megabits/Second",
	"Gigabits/Second", "Terabits/Second", "Count/Second", "None"}

// Server is a CloudWatch endpoint on 127.0.0.1.
type Server struct {
	// URL is the endpoint to give the SDK (BaseEndpoint).
	URL string
	// AccessKeyID is the only access key the server accepts.
	AccessKeyID string
	// Received gets every accepted request, if not nil; sends block, so
	// give it room or read it.
	Received chan Request

	srv *httptest.Server

	mu       sync.Mutex
	requests []Request
	refused  int
	failNext int
}

// NewServer starts a server accepting requests signed with accessKeyID.
func NewServer(accessKeyID string) *Server {
	s := &Server{AccessKeyID: accessKeyID}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Requests returns the accepted requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Datums returns every accepted datum, in arrival order.
func (s *Server) Datums() []Datum {
	var out []Datum
	for _, r := range s.Requests() {
		out = append(out, r.Datums...)
	}
	return out
}

// Refused is the number of requests answered with an error.
func (s *Server) Refused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// FailNext makes the next n requests fail with a 500 InternalServiceFault
// (which the SDK retries).
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	s.failNext = n
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != putMetricDataURI {
		s.fail(w, http.StatusNotFound, "UnknownOperationException", "this server answers only POST "+putMetricDataURI+", not "+r.Method+" "+r.URL.Path)
		return
	}
	if err := s.checkHeaders(r); err != nil {
		s.fail(w, http.StatusForbidden, "AccessDeniedException", err.Error())
		return
	}
	s.mu.Lock()
	if s.failNext > 0 {
		s.failNext--
		s.mu.Unlock()
		s.fail(w, http.StatusInternalServerError, "InternalServiceFault", "injected failure")
		return
	}
	s.mu.Unlock()
	raw, err := io.ReadAll(io.LimitReader(r.Body, MaxRequestBytes+1))
	if err != nil {
		s.fail(w, http.StatusBadRequest, "InvalidParameterValueException", err.Error())
		return
	}
	if len(raw) > MaxRequestBytes {
		s.fail(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLargeException", "request larger than 1 MB")
		return
	}
	body := raw
	gzipped := r.Header.Get("Content-Encoding") == "gzip"
	if gzipped {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err == nil {
			body, err = io.ReadAll(zr)
		}
		if err != nil {
			s.fail(w, http.StatusBadRequest, "InvalidParameterValueException", "bad gzip body: "+err.Error())
			return
		}
	}
	var in putMetricDataInput
	if err := decMode.Unmarshal(body, &in); err != nil {
		s.fail(w, http.StatusBadRequest, "InvalidParameterValueException", "cannot decode the CBOR body: "+err.Error())
		return
	}
	if err := validate(&in); err != nil {
		s.fail(w, http.StatusBadRequest, "InvalidParameterValueException", err.Error())
		return
	}
	req := Request{Namespace: in.Namespace, Datums: in.MetricData, Gzipped: gzipped}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()
	w.Header().Set("Smithy-Protocol", "rpc-v2-cbor")
	w.Header().Set("Content-Type", "application/cbor")
	w.Header().Set("X-Amzn-Requestid", "cloudwatchtest")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte{0xa0}) // {}
	if s.Received != nil {
		s.Received <- req
	}
}

func (s *Server) checkHeaders(r *http.Request) error {
	if r.Header.Get("Smithy-Protocol") != "rpc-v2-cbor" || r.Header.Get("Content-Type") != "application/cbor" {
		return fmt.Errorf("want Smithy-Protocol rpc-v2-cbor and Content-Type application/cbor, got %q, %q", r.Header.Get("Smithy-Protocol"), r.Header.Get("Content-Type"))
	}
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 Credential=")
	if !ok {
		return fmt.Errorf("request is not signed with SigV4: Authorization %q", auth)
	}
	cred, _, _ := strings.Cut(rest, ",")
	f := strings.Split(cred, "/")
	if len(f) != 5 || f[0] != s.AccessKeyID || f[3] != "monitoring" || f[4] != "aws4_request" {
		return fmt.Errorf("credential scope %q: want %s/DATE/REGION/monitoring/aws4_request", cred, s.AccessKeyID)
	}
	return nil
}

func validate(in *putMetricDataInput) error {
	if in.Namespace == "" || strings.HasPrefix(in.Namespace, "AWS/") {
		return fmt.Errorf("the parameter Namespace must be set and must not start with AWS/: %q", in.Namespace)
	}
	if n := len(in.MetricData); n == 0 || n > MaxDatums {
		return fmt.Errorf("the collection MetricData must have 1 to %d members, not %d", MaxDatums, n)
	}
	for i, d := range in.MetricData {
		where := fmt.Sprintf("MetricData.member.%d", i+1)
		if d.MetricName == "" {
			return fmt.Errorf("%s.MetricName is required", where)
		}
		if len(d.Dimensions) > MaxDimensions {
			return fmt.Errorf("%s: more than %d dimensions", where, MaxDimensions)
		}
		for _, dim := range d.Dimensions {
			if dim.Name == "" || dim.Value == "" {
				return fmt.Errorf("%s: dimension names and values must not be empty: %+v", where, dim)
			}
		}
		set := 0
		if d.Value != nil {
			set++
		}
		if d.StatisticValues != nil {
			set++
		}
		if d.Values != nil {
			set++
		}
		if set != 1 {
			return fmt.Errorf("%s: exactly one of Value, StatisticValues and Values", where)
		}
		if len(d.Values) > MaxValues || (d.Counts != nil && len(d.Counts) != len(d.Values)) {
			return fmt.Errorf("%s: %d values and %d counts (at most %d, equal lengths)", where, len(d.Values), len(d.Counts), MaxValues)
		}
		if d.Unit != "" && !slices.Contains(units, d.Unit) {
			return fmt.Errorf("%s.Unit %q is not a CloudWatch unit", where, d.Unit)
		}
		if d.Timestamp.IsZero() {
			return fmt.Errorf("%s.Timestamp is required by this server", where)
		}
	}
	return nil
}

func (s *Server) fail(w http.ResponseWriter, status int, typ, msg string) {
	s.mu.Lock()
	s.refused++
	s.mu.Unlock()
	body, _ := cbor.Marshal(map[string]string{"__type": "com.amazonaws.cloudwatch#" + typ, "message": msg})
	w.Header().Set("Smithy-Protocol", "rpc-v2-cbor")
	w.Header().Set("Content-Type", "application/cbor")
	w.Header().Set("X-Amzn-Query-Error", strings.TrimSuffix(typ, "Exception")+";Sender")
	w.WriteHeader(status)
	w.Write(body)
}
