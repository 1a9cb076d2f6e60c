package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	"github.com/meridian-router/meridian/internal/kubetest"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/sim"
)

// kubeNS is the namespace of Meridian's objects in these tests; kubeUser
// the API server user Meridian (platform and CLI) runs as, with
// kube.WriterRules there.
const kubeNS, kubeUser = "meridian", "meridian"

// kubeEnv is a real API server with `meridian config crds` installed and
// a kubeconfig for kubeUser.
func kubeEnv(t *testing.T) (*kubetest.Server, string) {
	t.Helper()
	s := kubetest.Start(t, kubetest.Options{Users: []string{kubeUser}})
	out, err := runMeridian(t, "config", "crds")
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range strings.Split(out, "\n---\n") {
		docs = append(docs, []byte(d))
	}
	s.InstallCRDs(docs)
	s.Namespace(kubeNS)
	s.GrantRules("meridian", kubeNS, kubeUser, kube.WriterRules())
	return s, s.Kubeconfig(kubeUser, kubeNS)
}

// `meridian config crds` prints every definition the source reads, and
// config apply, diff, get and validate work on the cluster's objects.
func TestKubernetesConfigCommands(t *testing.T) {
	_, kc := kubeEnv(t)
	crds, _ := runMeridian(t, "config", "crds")
	for _, name := range []string{"inferencegatewayconfigs.meridian.dev", "tenants.meridian.dev", "topologies.meridian.dev",
		"staticendpoints.meridian.dev", "inferencegatewayconfigs.inference.sagemaker.aws.amazon.com",
		"inferencemodelrewrites.inference.networking.x-k8s.io", "inferenceobjectives.inference.networking.x-k8s.io",
		"inferencepools.inference.networking.k8s.io"} {
		if !strings.Contains(crds, "name: "+name+"\n") {
			t.Errorf("config crds does not define %s", name)
		}
	}
	const example = "../../deploy/examples/platform"
	run := func(args ...string) string {
		t.Helper()
		out, err := runMeridian(t, append(args, "--kubeconfig", kc)...)
		if err != nil {
			t.Fatalf("meridian %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	if out := run("config", "apply", "-f", example); !strings.Contains(out, "create Tenant/support-team") || !strings.Contains(out, "applied 12 change(s) to 12 object(s) in namespace meridian") {
		t.Fatalf("config apply:\n%s", out)
	}
	if out := run("config", "diff", "-f", example); out != "no changes\n" {
		t.Fatalf("config diff after apply:\n%s", out)
	}
	if out := run("config", "validate"); !strings.Contains(out, "kubernetes namespace meridian") || !strings.Contains(out, "valid: 12 objects") {
		t.Fatalf("config validate:\n%s", out)
	}
	if out := run("config", "get", "Tenant/support-team"); !strings.Contains(out, "maxBand: Critical") {
		t.Fatalf("config get:\n%s", out)
	}
	// An apply whose result Meridian would refuse writes nothing.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: meridian.dev/v1alpha1\nkind: Tenant\nmetadata: {name: support-team}\nspec: {maxBand: Critical, weight: -1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runMeridian(t, "config", "apply", "-f", bad, "--kubeconfig", kc)
	if err == nil || !strings.Contains(err.Error(), "Tenant/support-team: spec.weight: must be ≥ 0, got -1") || !strings.Contains(err.Error(), "nothing was applied") {
		t.Fatalf("invalid apply: %v\n%s", err, out)
	}
}

// kubePlatform is `meridian up --source kubernetes` on free loopback
// ports, seeded into the namespace: us-east-1's cluster use1 serves
// chat-v1 (pod us-chat-0) and fast (us-fast-0 and us-fast-1, scored by
// prefix alone); eu-west-1's euw1 serves chat-v2 (eu-next-0). The public
// name chat goes to chat-v1, sticky per x-session-id. Tenants: team-a (the
// token's) and tiny (two requests an hour).
func kubePlatform(t *testing.T, kc string) *platform.Platform {
	t.Helper()
	return kubePlatformFrom(t, kubePlatformDir(t), kc)
}

// kubePlatformDir writes kubePlatform's configuration into a directory.
func kubePlatformDir(t *testing.T) string {
	t.Helper()
	port := map[string]string{}
	for _, n := range []string{"t2-us", "t1-us", "h-us", "t2-eu", "t1-eu", "h-eu", "us-chat-0", "us-fast-0", "us-fast-1", "eu-next-0"} {
		port[n] = platformtest.FreePort(t)
	}
	var b strings.Builder
	b.WriteString(platformtest.Topology(func(n string) string { return port[n] }) + "  routing: {admission: {criticalReserve: 0.1}, canaryAnalysis: {period: 250ms}}\n")
	fmt.Fprintf(&b, testkit.Gateway("us-east-1", "use1")+testkit.JWTAuth+`  bbr: {enabled: true}
  schedulers:
  - {name: chat, modelName: chat-v1, modelSelector: {matchLabels: {pool: chat}}, admission: {criticalReserve: 0.1}}
  - {name: fast, modelName: fast, modelSelector: {matchLabels: {pool: fast}}, weights: {prefix: 1}}
`+testkit.Gateway("eu-west-1", "euw1")+testkit.JWTAuth+`  schedulers:
  - {name: chat-next, modelName: chat-v2, modelSelector: {matchLabels: {pool: chat-next}}, admission: {criticalReserve: 0.1}}
---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: pods-use1}
spec:
  cluster: use1
  endpoints:
  - {name: us-chat-0, address: %q, labels: {pool: chat, gpu: h100}}
  - {name: us-fast-0, address: %q, labels: {pool: fast, gpu: h100}}
  - {name: us-fast-1, address: %q, labels: {pool: fast, gpu: h100}}
---
apiVersion: meridian.dev/v1alpha1
kind: StaticEndpoints
metadata: {name: pods-euw1}
spec:
  cluster: euw1
  endpoints:
  - {name: eu-next-0, address: %q, labels: {pool: chat-next, gpu: h100}}
---
`+testkit.ChatRewrite+`    targets:
    - {modelRewrite: chat-v1, weight: 100}
  stickiness: {key: header, header: x-session-id, salt: chat-rollout}
`+testkit.Tenant("team-a")+"spec: {maxBand: Critical}\n"+testkit.Tenant("tiny")+`spec:
  limits:
    requests: {limit: 2, per: 1h, burst: 2}
`, port["us-chat-0"], port["us-fast-0"], port["us-fast-1"], port["eu-next-0"])
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "platform.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kubePlatformFrom runs the platform of dir (kubePlatformDir) on the
// objects of kubeNS through kc, writing them first if there are none.
func kubePlatformFrom(t *testing.T, dir, kc string) *platform.Platform {
	t.Helper()
	t.Setenv("TMPDIR", t.TempDir())
	p, err := platformtest.Run(t, platform.Config{Dir: dir, Kubernetes: true, Kubeconfig: kc, Namespace: kubeNS,
		TimeScale: 50, CrossRegionDelay: 5 * time.Millisecond, Tenant: "team-a"})
	if err != nil {
		t.Fatalf("start platform: %v", err)
	}
	for _, region := range p.Regions {
		testkit.Eventually(t, region+" Tier-2 ready with both Regions' digests", func() bool {
			c := platformtest.Client(p, region, p.Token)
			for _, m := range []string{"chat-v1", "chat-v2", "fast"} {
				if _, err := c.Models.Get(context.Background(), m); err != nil {
					return false
				}
			}
			return true
		})
	}
	return p
}

// kubeEdit changes one object the way `kubectl edit` does: read, change,
// write with the resourceVersion read, again on a conflict.
func kubeEdit(t *testing.T, s *kubetest.Server, gvr schema.GroupVersionResource, name string, change func(u *unstructured.Unstructured)) {
	t.Helper()
	dyn, err := kube.NewClients(s.Config(kubetest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	res := dyn.Dynamic.Resource(gvr).Namespace(kubeNS)
	for {
		u, err := res.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(u)
		_, err = res.Update(context.Background(), u, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			t.Fatalf("edit %s %s: %v", gvr.Resource, name, err)
		}
		return
	}
}

func gvrOf(kind, group string) schema.GroupVersionResource {
	for _, r := range kube.Resources {
		if r.Kind == kind && r.Group == group {
			return r.GroupVersionResource
		}
	}
	panic("no resource " + kind + "." + group)
}

// servedKube asks p's region for the public name chat as session and
// returns the cluster that answered.
func servedKube(p *platform.Platform, region, session string) (string, error) {
	var resp *http.Response
	c := platformtest.Client(p, region, p.Token)
	out, err := c.Chat.Completions.New(context.Background(), platformtest.Ask("chat"),
		option.WithResponseInto(&resp), option.WithHeader("x-session-id", session))
	if err != nil {
		return "", err
	}
	if out.Model != "chat" {
		return "", fmt.Errorf("response model %q, want the public name chat", out.Model)
	}
	return resp.Header.Get("x-meridian-cluster"), nil
}

// onCanaryKube reports whether both Tier-2s send between lo and hi of the
// 50 sessions live-0..49 to the canary (euw1).
func onCanaryKube(p *platform.Platform, lo, hi int) func() bool {
	return func() bool {
		for _, region := range p.Regions {
			var n atomic.Int64
			forEach(50, func(i int) {
				if c, err := servedKube(p, region, fmt.Sprint("live-", i)); err == nil && c == "euw1" {
					n.Add(1)
				}
			})
			if n := int(n.Load()); n < lo || n > hi {
				return false
			}
		}
		return true
	}
}

// TestKubernetesPlatform runs the local platform on the Kubernetes
// source: changes made through the API server (a scheduler's weights, a
// tenant's limits, a canary's weight) take effect while requests flow and
// fail none; `meridian canary --kubeconfig` runs whole rollouts; racing
// operators get one win and retries, nothing lost.
func TestKubernetesPlatform(t *testing.T) {
	s, kc := kubeEnv(t)
	p := kubePlatform(t, kc)
	pods := map[string]*sim.LivePod{}
	for _, lp := range p.Pods {
		for _, n := range []string{"us-fast-0", "us-fast-1"} {
			if strings.HasPrefix(lp.Name(), n) {
				pods[n] = lp
			}
		}
	}
	if len(pods) != 2 {
		t.Fatalf("fast pods: %v", pods)
	}

	t.Run("live reload under traffic", func(t *testing.T) {
		us := platformtest.Client(p, "us-east-1", p.Token)
		// A prompt of several prefix blocks (64 characters each), the
		// same every time.
		long := platformtest.Ask("fast")
		long.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("The same long system context, again. ", 12))}
		var ok, failed atomic.Int64
		var firstErr atomic.Value
		stop := testkit.Loop(2, func(w, i int) {
			var err error
			if w == 0 {
				_, err = us.Chat.Completions.New(context.Background(), long)
			} else {
				_, err = servedKube(p, p.Regions[i%2], fmt.Sprint("live-", i%50))
			}
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				ok.Add(1)
			}
		})
		defer stop()

		// Weights: scored by prefix alone, the same prompt always goes to
		// the pod that served it first; with lru alone, to both in turn.
		fastServed := func() (a, b uint64) {
			for range 10 {
				if _, err := us.Chat.Completions.New(context.Background(), long); err != nil {
					t.Fatalf("fast: %v", err)
				}
			}
			return pods["us-fast-0"].Metrics().RequestsOK, pods["us-fast-1"].Metrics().RequestsOK
		}
		a0, b0 := fastServed()
		a1, b1 := fastServed()
		if a1 > a0 && b1 > b0 {
			t.Fatalf("prefix-only weights: both fast pods served the same prompt (%d, %d more)", a1-a0, b1-b0)
		}
		kubeEdit(t, s, gvrOf(config.KindGateway, kube.GroupMeridian), "use1", func(u *unstructured.Unstructured) {
			scheds, _, _ := unstructured.NestedSlice(u.Object, "spec", "schedulers")
			scheds[1].(map[string]any)["weights"] = map[string]any{"lru": int64(1)}
			unstructured.SetNestedSlice(u.Object, scheds, "spec", "schedulers")
		})
		testkit.Eventually(t, "lru weights in force: both fast pods serve", func() bool {
			a0, b0 := fastServed()
			a1, b1 := fastServed()
			return a1 > a0 && b1 > b0
		})

		// Limits: tiny has two requests an hour; raised, it is served.
		tiny := platformtest.Client(p, "us-east-1", platformtest.Token(t, p, "tiny"))
		limited := false
		for range 3 {
			if _, err := tiny.Chat.Completions.New(context.Background(), platformtest.Ask("fast")); err != nil && strings.Contains(err.Error(), "429") {
				limited = true
			}
		}
		if !limited {
			t.Fatal("tiny's third request of the hour was not refused 429")
		}
		kubeEdit(t, s, gvrOf(config.KindTenant, kube.GroupMeridian), "tiny", func(u *unstructured.Unstructured) {
			unstructured.SetNestedMap(u.Object, map[string]any{"limit": int64(1000), "per": "1m", "burst": int64(1000)}, "spec", "limits", "requests")
		})
		testkit.Eventually(t, "tiny's raised limit in force", func() bool {
			_, err := tiny.Chat.Completions.New(context.Background(), platformtest.Ask("fast"))
			return err == nil
		})

		// A canary weight: chat-v2 from none to all but one in a million.
		if !onCanaryKube(p, 0, 0)() {
			t.Fatal("sessions on the canary before it has a weight")
		}
		kubeEdit(t, s, gvrOf(config.KindModelRewrite, "inference.networking.x-k8s.io"), "chat", func(u *unstructured.Unstructured) {
			rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
			rules[0].(map[string]any)["targets"] = []any{
				map[string]any{"modelRewrite": "chat-v1", "weight": int64(1)},
				map[string]any{"modelRewrite": "chat-v2", "weight": int64(999999)},
			}
			unstructured.SetNestedSlice(u.Object, rules, "spec", "rules")
		})
		testkit.Eventually(t, "the canary weight in force in both Regions", onCanaryKube(p, 50, 50))
		kubeEdit(t, s, gvrOf(config.KindModelRewrite, "inference.networking.x-k8s.io"), "chat", func(u *unstructured.Unstructured) {
			rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
			rules[0].(map[string]any)["targets"] = []any{map[string]any{"modelRewrite": "chat-v1", "weight": int64(100)}}
			unstructured.SetNestedSlice(u.Object, rules, "spec", "rules")
		})
		testkit.Eventually(t, "back to stable", onCanaryKube(p, 0, 0))
		stop()
		if failed.Load() > 0 || ok.Load() == 0 {
			t.Fatalf("%d requests failed across the changes (%d succeeded); first: %v", failed.Load(), ok.Load(), firstErr.Load())
		}
	})

	t.Run("an object Meridian refuses is reported and changes nothing", func(t *testing.T) {
		var tier2 string
		for _, m := range p.Metrics {
			if m.Labels["job"] == "meridian-tier2" && m.Labels["region"] == "us-east-1" {
				tier2 = "http://" + m.Addr + "/metrics"
			}
		}
		invalid := func() string {
			resp, err := http.Get(tier2)
			if err != nil {
				return ""
			}
			defer resp.Body.Close()
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			for _, l := range strings.Split(b.String(), "\n") {
				if strings.HasPrefix(l, `meridian_config_reloads_total{result="invalid"}`) {
					return l
				}
			}
			return ""
		}
		before := invalid()
		// The definition allows any number; Meridian wants weight ≥ 0.
		kubeEdit(t, s, gvrOf(config.KindTenant, kube.GroupMeridian), "team-a", func(u *unstructured.Unstructured) {
			unstructured.SetNestedField(u.Object, int64(-1), "spec", "weight")
		})
		testkit.Eventually(t, "the refusal counted at Tier-2", func() bool { return invalid() != before })
		var event string
		testkit.Eventually(t, "a Warning Event on the tenant", func() bool {
			l, err := s.Client(kubetest.Admin).CoreV1().Events(kubeNS).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, ev := range l.Items {
				if ev.InvolvedObject.Kind == config.KindTenant && ev.InvolvedObject.Name == "team-a" && ev.Reason == "Invalid" {
					event = ev.Message
					return true
				}
			}
			return false
		})
		if !strings.Contains(event, "Tenant/team-a: spec.weight: must be ≥ 0, got -1") {
			t.Errorf("event: %s", event)
		}
		if _, err := servedKube(p, "us-east-1", "after-refusal"); err != nil {
			t.Fatalf("a request after the refusal: %v", err)
		}
		kubeEdit(t, s, gvrOf(config.KindTenant, kube.GroupMeridian), "team-a", func(u *unstructured.Unstructured) {
			unstructured.RemoveNestedField(u.Object, "spec", "weight")
		})
	})

	canaryCmd := func(args ...string) (string, error) {
		return runMeridian(t, append(append([]string{"canary"}, args...), "--kubeconfig", kc)...)
	}
	mustCanaryCmd := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := canaryCmd(args...)
		if err != nil {
			t.Fatalf("meridian canary %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	rollout := func(t *testing.T) *config.Rollout {
		t.Helper()
		c, err := kube.NewClients(s.Config(kubetest.Admin))
		if err != nil {
			t.Fatal(err)
		}
		snap, err := (&kube.Store{Dynamic: c.Dynamic, Client: c.Client, Namespace: kubeNS}).Load(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return snap.Rewrites["chat"].Spec.Rollout
	}

	t.Run("canary rollout: start, set-weight, promote, abort", func(t *testing.T) {
		start := append([]string{"start", "chat", "--to", "chat-v2"}, noAbort...)
		mustCanaryCmd(t, append(start, "--weight", "30", "--salt", "chat/weights-test")...)
		testkit.Eventually(t, "30% in force", onCanaryKube(p, 5, 25))
		mustCanaryCmd(t, "set-weight", "chat", "70")
		testkit.Eventually(t, "70% in force", onCanaryKube(p, 26, 45))
		mustCanaryCmd(t, "promote", "chat", "--full")
		testkit.Eventually(t, "full promotion in force", onCanaryKube(p, 50, 50))
		if out := mustCanaryCmd(t, "list"); !strings.Contains(out, "Healthy") {
			t.Fatalf("list after full promotion:\n%s", out)
		}
		mustCanaryCmd(t, "undo", "chat")
		testkit.Eventually(t, "undo in force", onCanaryKube(p, 0, 0))

		mustCanaryCmd(t, append(start, "--steps", "10,50,100", "--interval", "1h", "--salt", "chat/weights-test")...)
		if out := mustCanaryCmd(t, "promote", "chat"); !strings.Contains(out, "2 of 3") {
			t.Fatalf("after promote:\n%s", out)
		}
		testkit.Eventually(t, "step 2 (50%) in force", onCanaryKube(p, 10, 40))
		mustCanaryCmd(t, "abort", "chat")
		if ro := rollout(t); ro == nil || ro.Status != "Aborted" {
			t.Fatalf("rollout after abort: %+v", ro)
		}
		testkit.Eventually(t, "abort returns every session to stable", onCanaryKube(p, 0, 0))
		mustCanaryCmd(t, "undo", "chat")
	})

	t.Run("racing operators: one wins, the others are told to retry", func(t *testing.T) {
		mustCanaryCmd(t, append([]string{"start", "chat", "--to", "chat-v2", "--weight", "5"}, noAbort...)...)
		defer canaryCmd("undo", "chat")
		var wins, retries atomic.Int64
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				out, err := canaryCmd("set-weight", "chat", fmt.Sprint(10+i))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, config.ErrConflict) && strings.Contains(err.Error(), "retry"):
					retries.Add(1)
				default:
					t.Errorf("set-weight: %v\n%s", err, out)
				}
			})
		}
		wg.Wait()
		if wins.Load() == 0 || wins.Load()+retries.Load() != 8 {
			t.Fatalf("%d wins, %d retries of 8", wins.Load(), retries.Load())
		}
		// Nothing lost: the stored weight is one a winner wrote.
		if ro := rollout(t); ro == nil || !strings.HasPrefix(ro.Reason, "weight set to 1") {
			t.Fatalf("rollout after the race: %+v", ro)
		}
	})
}

// Where the cluster already has a definition from another owner (here an
// InferenceObjective installed without Meridian's label, as llm-d's
// would be), `config crds --kubeconfig` leaves it out rather than
// replace it.
func TestKubernetesCRDsLeaveOthersAlone(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{})
	var theirs []byte
	for _, d := range kube.CRDDocuments() {
		if bytes.Contains(d, []byte("name: inferenceobjectives.inference.networking.x-k8s.io\n")) {
			theirs = bytes.Replace(d, []byte("app.kubernetes.io/part-of: meridian"), []byte("app.kubernetes.io/part-of: llm-d"), 1)
		}
	}
	s.InstallCRDs([][]byte{theirs})
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"config", "crds", "--kubeconfig", s.Kubeconfig(kubetest.Admin, "default")})
	if err := root.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "name: inferenceobjectives.inference.networking.x-k8s.io\n") {
		t.Error("config crds --kubeconfig prints the definition another owner installed")
	}
	if n := strings.Count(out.String(), "kind: CustomResourceDefinition\n"); n != len(kube.CRDDocuments())-1 {
		t.Errorf("%d definitions printed, want %d", n, len(kube.CRDDocuments())-1)
	}
	if !strings.Contains(errOut.String(), "left out inferenceobjectives.inference.networking.x-k8s.io") {
		t.Errorf("stderr does not name what was left out: %q", errOut.String())
	}
}
