package testkit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metric returns the value of the first counter or gauge named name in g
// whose labels include labels (of a histogram, its count of
// observations; 0 when there is none), failing tb when g cannot be
// gathered.
func Metric(tb testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// Value is the current value of m, a counter or a gauge, failing tb for
// another kind of metric.
func Value(tb testing.TB, m prometheus.Metric) float64 {
	tb.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		tb.Fatal(err)
	}
	switch {
	case d.Counter != nil:
		return d.Counter.GetValue()
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	}
	tb.Fatalf("metric %v is neither a counter nor a gauge", m.Desc())
	return 0
}

// Series counts the series c exports.
func Series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// Scraped is a Gatherer of what addr (host:port) serves at /metrics, read
// anew at each Gather (bounded by 10 s): Metric over another process's or
// listener's series.
func Scraped(addr string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		client := http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get("http://" + addr + "/metrics")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
		}
		dec := expfmt.NewDecoder(resp.Body, expfmt.NewFormat(expfmt.TypeTextPlain))
		var out []*dto.MetricFamily
		for {
			mf := &dto.MetricFamily{}
			if err := dec.Decode(mf); err != nil {
				if errors.Is(err, io.EOF) {
					return out, nil
				}
				return out, fmt.Errorf("scrape %s: %w", addr, err)
			}
			out = append(out, mf)
		}
	})
}
