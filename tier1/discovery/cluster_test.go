package discovery

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/meridian-router/meridian/internal/kubetest"
)

// tier1User is the API server's user the watcher runs as; the tests
// grant it pods get, list and watch (the Role the Tier-1 needs) where
// they want it to see pods.
const tier1User = "tier1"

// cluster is a real kube-apiserver with the pods a test sets: there is
// no kubelet, so apply writes a pod's status itself.
type cluster struct {
	*kubetest.Server
	t     *testing.T
	admin kubernetes.Interface
}

func startCluster(t *testing.T, pods ...corev1.Pod) *cluster {
	t.Helper()
	s := kubetest.Start(t, kubetest.Options{Users: []string{tier1User}})
	c := &cluster{Server: s, t: t, admin: s.Client(kubetest.Admin)}
	for _, ns := range []string{"ns", "other", "team-a", "team-b"} {
		s.Namespace(ns)
		s.Grant("tier1-pods", ns, tier1User, "", []string{"pods"}, []string{"get", "list", "watch"})
	}
	for _, p := range pods {
		c.apply(p)
	}
	return c
}

// apply makes the pod on the server look like p: its labels and
// annotations (created if absent), then its status, as a kubelet would
// report it.
func (c *cluster) apply(p corev1.Pod) {
	c.t.Helper()
	ctx := context.Background()
	pods := c.admin.CoreV1().Pods(p.Namespace)
	cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = pods.Create(ctx, &p, metav1.CreateOptions{})
	case err == nil && (!maps.Equal(cur.Labels, p.Labels) || !maps.Equal(cur.Annotations, p.Annotations)):
		cur.Labels, cur.Annotations = p.Labels, p.Annotations
		cur, err = pods.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		c.t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	cur.Status = p.Status
	if _, err := pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("pod %s/%s status: %v", p.Namespace, p.Name, err)
	}
}

// remove deletes a pod. Pods bound to no node go at once.
func (c *cluster) remove(namespace, name string) {
	c.t.Helper()
	if err := c.admin.CoreV1().Pods(namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete pod %s/%s: %v", namespace, name, err)
	}
}

// pods reads the server's pods of a namespace as Pods, the way Run
// converts them.
func (c *cluster) pods(ns string) []Pod {
	c.t.Helper()
	l, err := c.admin.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	objs := make([]any, len(l.Items))
	for i := range l.Items {
		objs[i] = &l.Items[i]
	}
	return podsOf(objs)
}

// requests counts what a client sent: plain lists, and watches that
// stream the initial list (watch-list).
type requests struct {
	mu                sync.Mutex
	lists, watchLists int
}

func (r *requests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/pods") {
			q := req.URL.Query()
			r.mu.Lock()
			switch {
			case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
				r.watchLists++
			case q.Get("watch") != "true":
				r.lists++
			}
			r.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (r *requests) counts() (lists, watchLists int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lists, r.watchLists
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// clientOf is a clientset from cfg that counts its requests in reqs (nil:
// none).
func clientOf(t *testing.T, cfg *rest.Config, reqs *requests) kubernetes.Interface {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	if reqs != nil {
		cfg.WrapTransport = reqs.wrap
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func k8sPod(ns, name, ip string, ready bool, lbls map[string]string) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "vllm",
			Image: "vllm/vllm-openai:latest",
			Ports: []corev1.ContainerPort{{ContainerPort: 8000}},
		}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.ContainersReady, Status: status},
				{Type: corev1.PodReady, Status: status},
			},
		},
	}
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

// holdFinalizer keeps a deleted pod on the server, terminating, until
// release.
const holdFinalizer = "meridian.dev/test-hold"

// terminate deletes a pod that a finalizer holds: it stays, with a
// deletionTimestamp, as a pod does while its containers stop.
func (c *cluster) terminate(namespace, name string) {
	c.t.Helper()
	ctx := context.Background()
	pods := c.admin.CoreV1().Pods(namespace)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	p.Finalizers = append(p.Finalizers, holdFinalizer)
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.remove(namespace, name)
}

// release lets a terminating pod go.
func (c *cluster) release(namespace, name string) {
	c.t.Helper()
	ctx := context.Background()
	pods := c.admin.CoreV1().Pods(namespace)
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == holdFinalizer })
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}
