package platform_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/sim/simtest"
)

// tier1Config writes a one-scheduler configuration over k live pods.
func tier1Config(t *testing.T, k int) (dir string, pods []*sim.LivePod) {
	t.Helper()
	pods = simtest.StartPods(t, sim.PodSpec{Pod: sim.PodConfig{Name: "p", Profile: simtest.Profile(t, "h100"), Model: "m"}, TimeScale: 50, DefaultMaxTokens: 4}, k)
	var eps []testkit.Endpoint
	for i, p := range pods {
		eps = append(eps, testkit.Endpoint{Name: fmt.Sprintf("p%d", i), Address: p.Addr(), Pool: "m"})
	}
	yaml := `apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: c}
spec:
  schedulers:
  - name: m
    modelName: m
    modelSelector: {matchLabels: {pool: m}}
    weights: {prefix: 5, queue: 1}
` + testkit.StaticEndpoints(eps...)
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, pods
}

func runTier1Test(t *testing.T, f platform.Tier1Config) *platform.Tier1 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	inst, err := platform.StartTier1(ctx, f, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- inst.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tier1 stopped with %v", err)
		}
	})
	testkit.Eventually(t, "tier1 ready", func() bool {
		resp, err := http.Get("http://" + inst.Addr() + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return inst
}

// A Tier-1 in ext_proc mode (meridian tier1 --extproc) answers Envoy with the destination.
func TestTier1ExtProc(t *testing.T) {
	dir, pods := tier1Config(t, 2)
	ext := platformtest.FreePort(t)
	runTier1Test(t, platform.Tier1Config{Source: platform.Source{Dir: dir}, Listen: "127.0.0.1:0", ExtProc: ext,
		ScrapeInterval: 20 * time.Millisecond, MaxMetricsAge: time.Second})
	conn, err := grpc.NewClient(ext, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("route me ", 2000) + `"}]}`)
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	send := func(r *extprocv3.ProcessingRequest) {
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	send(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
			Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}},
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
	var common *extprocv3.CommonResponse
	switch {
	case r.GetRequestHeaders() != nil:
		common = r.GetRequestHeaders().GetResponse()
	case r.GetRequestBody() != nil:
		common = r.GetRequestBody().GetResponse()
	default:
		t.Fatalf("want the routing decision, got %v", r)
	}
	dest := ""
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-gateway-destination-endpoint" {
			dest = string(h.GetHeader().GetRawValue())
		}
	}
	primary := strings.Split(dest, ",")[0]
	if primary != pods[0].Addr() && primary != pods[1].Addr() {
		t.Fatalf("destination %q is not a pod (%s, %s)", dest, pods[0].Addr(), pods[1].Addr())
	}
	if !common.GetClearRouteCache() {
		t.Fatal("route cache not cleared")
	}
	st.CloseSend()
}

// Two Tier-1 replicas with Peers (meridian tier1 --peers) route as one: requests that
// share a prefix, taken alternately, land on the same pod.
func TestTier1ReplicasSharePrefixes(t *testing.T) {
	dir, _ := tier1Config(t, 4)
	h1, h2 := platformtest.FreePort(t), platformtest.FreePort(t)
	common := platform.Tier1Config{Source: platform.Source{Dir: dir}, Listen: "127.0.0.1:0", ScrapeInterval: 20 * time.Millisecond, MaxMetricsAge: time.Second}
	a, b := common, common
	a.Replica, a.Health, a.Peers = "a", h1, []string{h2}
	b.Replica, b.Health, b.Peers = "b", h2, []string{h1}
	ra, rb := runTier1Test(t, a), runTier1Test(t, b)
	urls := []string{"http://" + ra.Addr(), "http://" + rb.Addr()}
	system := strings.Repeat("You are the claims triage assistant for the home insurance line. ", 30)
	served := map[string]int{}
	for i := range 16 {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":"claim %d"}]}`, system, i)
		resp, err := http.Post(urls[i%2]+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		served[resp.Header.Get("x-gateway-destination-endpoint-served")]++
		if i == 0 {
			// Let the first dispatch reach the other replica's index.
			testkit.Eventually(t, "the prefix event to reach replica b", func() bool {
				return ra.Exchange != nil && ra.Exchange.Stats().Sent > 0 && rb.Exchange.Stats().Applied > 0
			})
		}
	}
	best := 0
	for _, n := range served {
		best = max(best, n)
	}
	if best < 14 {
		t.Fatalf("alternating replicas spread a shared prefix over pods %v; want at least 14 of 16 on one", served)
	}
}
