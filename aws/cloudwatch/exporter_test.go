package cloudwatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/aws/cloudwatch/cloudwatchtest"
	"github.com/meridian-router/meridian/internal/testkit"
)

const accessKey = "AKIDMERIDIANTEST"

// newClient returns a client for srv with static test credentials and one
// attempt per call (no retry back-off in tests); nothing leaves loopback.
func newClient(t *testing.T, srv *cloudwatchtest.Server, key string) *cloudwatch.Client {
	t.Helper()
	testkit.NoAWSConfig(t)
	c, err := NewClient(context.Background(), ClientOptions{Region: "us-east-1", EndpointURL: srv.URL},
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(key, "test-secret-not-a-secret", "")),
		awsconfig.WithRetryMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// counters is a source the test moves forward.
type counters struct {
	mu sync.Mutex
	a  Aggregates
}

func (c *counters) get() Aggregates {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := Aggregates{Requests: map[string]uint64{}, Throttled: map[string]uint64{}, TTFT: map[string]Histogram{}, Failovers: c.a.Failovers}
	for k, v := range c.a.Requests {
		cp.Requests[k] = v
	}
	for k, v := range c.a.Throttled {
		cp.Throttled[k] = v
	}
	for k, v := range c.a.TTFT {
		cp.TTFT[k] = Histogram{Buckets: append([]Bucket(nil), v.Buckets...), Count: v.Count, Sum: v.Sum}
	}
	return cp
}

func (c *counters) set(f func(a *Aggregates)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.a.Requests == nil {
		c.a = Aggregates{Requests: map[string]uint64{}, Throttled: map[string]uint64{}, TTFT: map[string]Histogram{}}
	}
	f(&c.a)
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newExporter(t *testing.T, srv *cloudwatchtest.Server, src *counters, cfg Config) *Exporter {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	e, err := New(newClient(t, srv, accessKey), cfg, src.get)
	if err != nil {
		t.Fatal(err)
	}
	e.now = func() time.Time { return t0 }
	return e
}

// find returns the value of the one datum with name and model ("" for
// the Region total).
func find(t *testing.T, ds []cloudwatchtest.Datum, name, model string) cloudwatchtest.Datum {
	t.Helper()
	var found []cloudwatchtest.Datum
	for _, d := range ds {
		if d.MetricName == name && d.Dimension("ModelName") == model {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d datums %s{ModelName=%q}", len(found), name, model)
	}
	return found[0]
}

func value(t *testing.T, d cloudwatchtest.Datum) float64 {
	t.Helper()
	if d.Value == nil {
		t.Fatalf("%s has no Value", d.MetricName)
	}
	return *d.Value
}

func TestFlushPublishesIntervalDifferences(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	src := &counters{}
	src.set(func(a *Aggregates) {
		// Before the exporter starts: not published.
		a.Requests["qwen"] = 1000
		a.Throttled["qwen"] = 10
		a.Failovers = 7
		a.TTFT["qwen"] = Histogram{Buckets: []Bucket{{0.25, 500}, {1, 900}, {math.Inf(1), 1000}}, Count: 1000}
	})
	e := newExporter(t, srv, src, Config{})
	e.baseline()
	src.set(func(a *Aggregates) {
		a.Requests["qwen"] += 400
		a.Throttled["qwen"] += 20
		a.Requests["llama"] = 100
		a.Failovers += 3
		// 300 ≤ 0.25 s, 100 in (0.25, 1]: p99 = 0.25 + 0.75·(396−300)/100 = 0.97.
		a.TTFT["qwen"] = Histogram{Buckets: []Bucket{{0.25, 800}, {1, 1300}, {math.Inf(1), 1400}}, Count: 1400}
	})
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 || reqs[0].Namespace != "Meridian" {
		t.Fatalf("requests: %+v", reqs)
	}
	ds := reqs[0].Datums
	for _, d := range ds {
		if d.Dimension("Region") != "us-east-1" || !d.Timestamp.Equal(t0) {
			t.Errorf("%s: Region %q, timestamp %v", d.MetricName, d.Dimension("Region"), d.Timestamp)
		}
	}
	for _, c := range []struct {
		name, model, unit string
		want              float64
	}{
		{"Requests", "qwen", "Count", 400},
		{"Throttled", "qwen", "Count", 20},
		{"ThrottleRate", "qwen", "Percent", 5},
		{"Requests", "llama", "Count", 100},
		{"Throttled", "llama", "Count", 0},
		{"Requests", "", "Count", 500},
		{"Throttled", "", "Count", 20},
		{"ThrottleRate", "", "Percent", 4},
		{"Failovers", "", "Count", 3},
		{"TTFTP99", "qwen", "Seconds", 0.97},
	} {
		d := find(t, ds, c.name, c.model)
		if got := value(t, d); math.Abs(got-c.want) > 1e-9 || d.Unit != c.unit {
			t.Errorf("%s{%s} = %v %s, want %v %s", c.name, c.model, got, d.Unit, c.want, c.unit)
		}
	}
	dist := find(t, ds, "TTFT", "qwen")
	if fmt.Sprint(dist.Values) != "[0.25 1]" || fmt.Sprint(dist.Counts) != "[300 100]" || dist.Unit != "Seconds" {
		t.Errorf("TTFT distribution: values %v counts %v", dist.Values, dist.Counts)
	}

	// Nothing new: zeros, not repeats.
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds = srv.Requests()[1].Datums
	if got := value(t, find(t, ds, "Requests", "")); got != 0 {
		t.Errorf("second flush Requests = %v", got)
	}
	for _, d := range ds {
		if d.MetricName == "TTFT" || d.MetricName == "TTFTP99" || d.MetricName == "ThrottleRate" {
			t.Errorf("an idle interval published %s", d.MetricName)
		}
	}
}

func TestCounterResetCountsFromZero(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	src := &counters{}
	src.set(func(a *Aggregates) { a.Requests["qwen"] = 500 })
	e := newExporter(t, srv, src, Config{})
	e.baseline()
	src.set(func(a *Aggregates) { a.Requests["qwen"] = 30 }) // restarted
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := value(t, find(t, srv.Datums(), "Requests", "qwen")); got != 30 {
		t.Errorf("after a reset Requests = %v, want 30", got)
	}
}

func TestBatchesOfAtMostMaxDatums(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	src := &counters{}
	src.set(func(a *Aggregates) {})
	e := newExporter(t, srv, src, Config{})
	e.baseline()
	const models = 1200
	src.set(func(a *Aggregates) {
		for i := range models {
			m := fmt.Sprintf("model-%04d", i)
			a.Requests[m] = 10
			a.Throttled[m] = 1
		}
	})
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Per model Requests, Throttled, ThrottleRate; Region totals of the
	// same three plus Failovers.
	want := models*3 + 4
	total, gz := 0, 0
	for _, r := range srv.Requests() {
		if len(r.Datums) > MaxDatumsPerRequest {
			t.Errorf("a request of %d datums", len(r.Datums))
		}
		total += len(r.Datums)
		if r.Gzipped {
			gz++
		}
	}
	if total != want || len(srv.Requests()) != (want+MaxDatumsPerRequest-1)/MaxDatumsPerRequest {
		t.Errorf("%d datums in %d requests, want %d", total, len(srv.Requests()), want)
	}
	if gz == 0 {
		t.Error("no request came gzip-compressed: the server's gzip path is untested")
	}
	if got := value(t, find(t, srv.Datums(), "Requests", "")); got != models*10 {
		t.Errorf("Region Requests = %v", got)
	}
}

func TestFailedPublicationIsSentLater(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	src := &counters{}
	src.set(func(a *Aggregates) {})
	e := newExporter(t, srv, src, Config{MaxDatumsPerRequest: 2})
	e.baseline()
	src.set(func(a *Aggregates) { a.Requests["qwen"] = 100 })
	srv.FailNext(1)
	err := e.Flush(context.Background())
	if err == nil || !strings.Contains(err.Error(), "InternalServiceFault") {
		t.Fatalf("err = %v", err)
	}
	src.set(func(a *Aggregates) { a.Requests["qwen"] = 150 })
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, d := range srv.Datums() {
		if d.MetricName == "Requests" && d.Dimension("ModelName") == "qwen" {
			sum += *d.Value
		}
	}
	if sum != 150 {
		t.Errorf("Requests published across the failure add up to %v, want 150 (none lost, none twice)", sum)
	}
	for _, r := range srv.Requests() {
		if len(r.Datums) > 2 {
			t.Errorf("a request of %d datums with MaxDatumsPerRequest 2", len(r.Datums))
		}
	}
}

func TestRunPublishesEveryTickAndOnShutdown(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	srv.Received = make(chan cloudwatchtest.Request, 16)
	src := &counters{}
	src.set(func(a *Aggregates) {})
	e := newExporter(t, srv, src, Config{Interval: time.Minute})
	ticks := make(chan time.Time)
	var interval time.Duration
	e.newTicker = func(d time.Duration) (<-chan time.Time, func()) { interval = d; return ticks, func() {} }
	e.baseline() // before the test moves the counters
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var errs []error
	go func() {
		defer close(done)
		e.Run(ctx, func(err error) { errs = append(errs, err) })
	}()
	for i := 1; i <= 2; i++ {
		src.set(func(a *Aggregates) { a.Requests["qwen"] += 10 })
		ticks <- t0
		r := <-srv.Received
		if got := value(t, find(t, r.Datums, "Requests", "qwen")); got != 10 {
			t.Errorf("tick %d: Requests = %v", i, got)
		}
	}
	src.set(func(a *Aggregates) { a.Requests["qwen"] += 5 })
	cancel()
	r := <-srv.Received
	if got := value(t, find(t, r.Datums, "Requests", "qwen")); got != 5 {
		t.Errorf("final flush: Requests = %v", got)
	}
	<-done
	if interval != time.Minute || len(errs) != 0 {
		t.Errorf("interval %v, errors %v", interval, errs)
	}
}

func TestQuantile(t *testing.T) {
	h := Histogram{Buckets: []Bucket{{0.1, 0}, {0.5, 100}, {math.Inf(1), 100}}, Count: 100}
	if got := h.quantile(0.99); math.Abs(got-0.496) > 1e-12 {
		t.Errorf("p99 = %v, want 0.496", got)
	}
	over := Histogram{Buckets: []Bucket{{1, 10}, {math.Inf(1), 100}}, Count: 100}
	if got := over.quantile(0.99); got != 1 {
		t.Errorf("p99 in the overflow = %v, want the last bound 1", got)
	}
	if !math.IsNaN((Histogram{}).quantile(0.99)) {
		t.Error("empty histogram has a quantile")
	}
}

func TestFromGatherer(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_requests_total"}, []string{"model_name", "target_model_name", "region", "cluster", "code"})
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "meridian_tier2_ttft_seconds", Buckets: []float64{0.25, 1}}, []string{"model_name", "target_model_name", "stream"})
	failovers := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "meridian_tier2_failovers_total"}, []string{"from_region", "to_region"})
	reg.MustRegister(requests, ttft, failovers)
	requests.WithLabelValues("qwen", "qwen-v1", "us-east-1", "us-east-1a", "200").Add(90)
	requests.WithLabelValues("qwen", "qwen-v2", "eu-west-1", "eu-west-1a", "200").Add(6)
	requests.WithLabelValues("qwen", "qwen-v1", "", "", "429").Add(4)
	for range 3 {
		ttft.WithLabelValues("qwen", "qwen-v1", "true").Observe(0.1)
	}
	ttft.WithLabelValues("qwen", "qwen-v2", "true").Observe(0.5)
	// Whole answers (their first byte is their last) stay out of TTFT.
	ttft.WithLabelValues("qwen", "qwen-v1", "false").Observe(0.8)
	ttft.WithLabelValues("qwen", "qwen-v1", "false").Observe(3)
	failovers.WithLabelValues("us-east-1", "eu-west-1").Add(6)

	a := FromGatherer(reg)()
	if a.Requests["qwen"] != 100 || a.Throttled["qwen"] != 4 || a.Failovers != 6 {
		t.Errorf("aggregates = %+v", a)
	}
	h := a.TTFT["qwen"]
	if h.Count != 4 || fmt.Sprint(h.Buckets) != "[{0.25 3} {1 4}]" {
		t.Errorf("merged TTFT = %+v", h)
	}
	if empty := FromGatherer(prometheus.NewRegistry())(); len(empty.Requests) != 0 || empty.Failovers != 0 {
		t.Errorf("empty registry: %+v", empty)
	}
}

func TestNewValidates(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	c := newClient(t, srv, accessKey)
	src := func() Aggregates { return Aggregates{} }
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Region is required"},
		{Config{Region: "us-east-1", MaxDatumsPerRequest: 1001}, "1 to 1000"},
		{Config{Region: "us-east-1", Interval: -time.Second}, "negative interval"},
	} {
		if _, err := New(c, tc.cfg, src); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := New(nil, Config{Region: "x"}, src); err == nil {
		t.Error("nil client accepted")
	}
}

func TestRefusedCredentials(t *testing.T) {
	srv := cloudwatchtest.NewServer(accessKey)
	defer srv.Close()
	e, err := New(newClient(t, srv, "AKIDSOMEONEELSE"), Config{Region: "us-east-1"}, func() Aggregates { return Aggregates{} })
	if err != nil {
		t.Fatal(err)
	}
	err = e.Flush(context.Background())
	var apiErr interface{ ErrorCode() string }
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "AccessDenied" {
		t.Fatalf("err = %v", err)
	}
}
