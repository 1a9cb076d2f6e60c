package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/sim"
)

// The Envoy Region works as its values file says: the chart's HTTPRoute
// sends every /v1/ request to the InferencePool whose picker is the
// release's Tier-1, and for every model the cluster serves (each
// scheduler's model and LoRA adapters), the ext_proc exchange Envoy has
// with that picker (headers, then the body in FULL_DUPLEX_STREAMED chunks,
// as GIE's InferencePool configures it) names pods of that model's pool
// only; the primary, asked as Envoy would, serves the model.
func TestChartEnvoyRegionRoutesEveryModel(t *testing.T) {
	const cluster = "eu-west-1a"
	vals := readValues(t, filepath.Join(examplesDir, "values-eu-west-1.yaml"))
	if vals["cluster"] != cluster {
		t.Fatalf("values-eu-west-1.yaml is for cluster %v, want %s", vals["cluster"], cluster)
	}
	out, err := render(loadChart(t), vals)
	if err != nil {
		t.Fatal(err)
	}
	m, errs := decode(out)
	for _, err := range errs {
		t.Fatal(err)
	}
	if len(m.httpRoutes) != 1 || len(m.httpRoutes[0].Spec.Rules) != 1 {
		t.Fatalf("%d HTTPRoutes, want one with one rule", len(m.httpRoutes))
	}
	rule := m.httpRoutes[0].Spec.Rules[0]
	if len(rule.Matches) != 1 || len(rule.Matches[0].Headers) != 0 || *rule.Matches[0].Path.Value != "/v1/" || len(rule.BackendRefs) != 1 {
		t.Fatalf("route rule %+v: want every /v1/ request to one pool", rule)
	}
	var pool *config.InferencePool
	for _, p := range m.inferencePools {
		if p.Metadata.Name == string(rule.BackendRefs[0].Name) {
			pool = p
		}
	}
	if pool == nil || pool.Spec.EndpointPickerRef == nil || pool.Spec.EndpointPickerRef.Name != "meridian-tier1" {
		t.Fatalf("the route's pool %v does not name the release's Tier-1 as its picker", rule.BackendRefs[0].Name)
	}

	snap, err := config.LoadDir(platformDir)
	if err != nil {
		t.Fatal(err)
	}
	g := snap.Gateway(cluster)
	if g == nil {
		t.Fatalf("no gateway for %s in %s", cluster, platformDir)
	}
	p, err := platformtest.Run(t, platform.Config{Ports: platform.PortsAuto, TimeScale: 50, ExtProc: true, Tenant: "support-team"})
	if err != nil {
		t.Fatal(err)
	}
	byAddr := map[string]*sim.LivePod{}
	for _, lp := range p.Pods {
		byAddr[lp.Addr()] = lp
	}
	mine := map[string]bool{} // the cluster's pods, by endpoint name
	for _, se := range snap.StaticEndpoints {
		if se.Spec.Cluster == cluster {
			for _, ep := range se.Spec.Endpoints {
				mine[ep.Name] = true
			}
		}
	}
	conn, err := grpc.NewClient(p.ExtProc[cluster], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)

	models := 0
	for _, sc := range g.Spec.Schedulers {
		for _, model := range append([]string{sc.ModelName}, sc.LoraAdapters...) {
			models++
			t.Run(model, func(t *testing.T) {
				body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4,
					"messages": []map[string]string{{"role": "user", "content": strings.Repeat("route this claim ", 500)}}})
				dest := pick(t, client, body)
				for _, addr := range dest {
					lp := byAddr[addr]
					// A simulated pod is named after its endpoint, "-0" added.
					if lp == nil || !mine[strings.TrimSuffix(lp.Name(), "-0")] || !config.MatchLabels(sc.ModelSelector.MatchLabels, lp.Labels()) {
						t.Fatalf("destination %v names %s, not a pod of %s's pool %v in %s", dest, addr, model, sc.ModelSelector.MatchLabels, cluster)
					}
				}
				resp, err := http.Post("http://"+dest[0]+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), fmt.Sprintf("%q", model)) {
					t.Fatalf("the primary answered %d: %s", resp.StatusCode, b)
				}
			})
		}
	}
	if models < 7 {
		t.Fatalf("%d models in %s's gateway, want the example's 7", models, cluster)
	}
}

// pick has the exchange an Envoy Gateway has with an InferencePool's
// picker for one request and returns the destination endpoints, primary
// first.
func pick(t *testing.T, c extprocv3.ExternalProcessorClient, body []byte) []string {
	t.Helper()
	st, err := c.Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer st.CloseSend()
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	send := func(r *extprocv3.ProcessingRequest) {
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
			Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: ":authority", RawValue: []byte("inference.example.com")}, {Key: "content-type", RawValue: []byte("application/json")}}}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
	})
	for data := body; len(data) > 0; {
		n := min(len(data), 4096)
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: data[:n], EndOfStream: n == len(data)}}})
		data = data[n:]
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ir := r.GetImmediateResponse(); ir != nil {
		t.Fatalf("the picker answered %d itself: %s", ir.GetStatus().GetCode(), ir.GetBody())
	}
	common := r.GetRequestHeaders().GetResponse()
	if common == nil {
		t.Fatalf("want the destination with the request headers' answer, got %v", r)
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			dest := strings.Split(string(h.GetHeader().GetRawValue()), ",")
			if slices.Contains(dest, "") {
				t.Fatalf("destination %q", h.GetHeader().GetRawValue())
			}
			return dest
		}
	}
	t.Fatal("no x-gateway-destination-endpoint header")
	return nil
}
