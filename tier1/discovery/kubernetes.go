package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Kubernetes watches the pods of one namespace and reports the set whenever
// it changes.
//
// It uses one client-go shared informer. The informer lists and then watches
// (or, against API servers that support it, streams the initial list over
// the watch), resumes a broken watch from the last resource version, and
// re-lists when that version has expired, so Run survives API-server
// restarts and network cuts without help.
//
// The Tier-1's service account needs get, list and watch on pods in
// Namespace (a Role and RoleBinding; a ClusterRole when Namespace is empty).
type Kubernetes struct {
	// Client talks to the API server. Required. NewKubernetes builds one
	// from a kubeconfig file or the in-cluster service account.
	Client kubernetes.Interface

	// Namespace whose pods are watched. Empty means every namespace, which
	// needs cluster-wide list/watch permission and holds every pod of the
	// cluster in memory; set it.
	Namespace string

	// LabelSelector, in kubectl's syntax ("app=vllm,stage!=canary"),
	// narrows the watch on the API server: pods outside it are never sent,
	// so they can never be a target. Empty means every pod of Namespace.
	// Set it to a label every model-server pod carries when the namespace
	// holds many other pods: memory and watch traffic scale with what the
	// selector lets through.
	LabelSelector string

	// Logger receives list and watch failures (for example a Forbidden
	// from missing RBAC), which the informer retries with backoff on its
	// own. Nil means slog.Default().
	Logger *slog.Logger

	// testHookEvent, when set, is called from the informer's handler
	// goroutine after the store holds obj. Tests use it to know the
	// informer has seen a change.
	testHookEvent func(obj any)
}

// ErrNotInCluster is returned (wrapped) by NewKubernetes when no
// kubeconfig is given and the process is not running in a Kubernetes pod:
// a Tier-1 outside Kubernetes uses static endpoints only.
var ErrNotInCluster = rest.ErrNotInCluster

// inClusterNamespaceFile is where Kubernetes mounts the pod's namespace
// next to its service-account token.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// NewKubernetes returns a pod watcher for a namespace. With a kubeconfig
// path it uses that file's current context. With "" it uses the in-cluster
// service account (the pod's mounted token and the
// KUBERNETES_SERVICE_HOST/PORT environment), and fails with ErrNotInCluster
// outside a pod. An empty namespace means the current context's namespace
// (default "default"), or in a cluster the Tier-1's own: POD_NAMESPACE if
// set (the downward API), else the service account's. To watch every
// namespace, set the Namespace field to "" afterwards.
func NewKubernetes(kubeconfig, namespace string) (*Kubernetes, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("discovery: no kubeconfig given and no in-cluster config: %w", err)
		}
		if namespace == "" {
			namespace = os.Getenv("POD_NAMESPACE")
		}
		if namespace == "" {
			b, err := os.ReadFile(inClusterNamespaceFile)
			if err != nil {
				return nil, fmt.Errorf("discovery: in-cluster namespace: set --namespace or POD_NAMESPACE: %w", err)
			}
			namespace = strings.TrimSpace(string(b))
		}
	} else {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{},
		)
		rc, err = cc.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("discovery: kubeconfig %s: %w", kubeconfig, err)
		}
		if namespace == "" {
			if namespace, _, err = cc.Namespace(); err != nil {
				return nil, fmt.Errorf("discovery: kubeconfig %s: namespace: %w", kubeconfig, err)
			}
		}
	}
	rc.UserAgent = "meridian-tier1"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: Kubernetes client: %w", err)
	}
	return &Kubernetes{Client: client, Namespace: namespace}, nil
}

// Run watches pods until ctx is done. Once the informer's first list is in,
// it calls onChange with every pod it knows (Ready or not; Endpoints
// filters), and again each time a pod appears, disappears or changes its
// IP, labels or readiness. Changes to anything else do not call it.
//
// onChange is called from Run's goroutine, one call at a time, with a fresh
// slice sorted by namespace and name that the callee owns. It may block:
// changes that arrive meanwhile are coalesced into one call carrying the
// latest set, so a slow callee sees fewer, newer sets rather than a
// backlog.
//
// Run returns nil when ctx is done, after every goroutine it started has
// ended. It returns an error only for a Kubernetes it cannot run (no
// client, an invalid LabelSelector), before starting anything.
func (k *Kubernetes) Run(ctx context.Context, onChange func([]Pod)) error {
	if k.Client == nil {
		return errors.New("discovery: Kubernetes.Client is nil")
	}
	if onChange == nil {
		return errors.New("discovery: Kubernetes.Run: onChange is nil")
	}
	if _, err := labels.Parse(k.LabelSelector); err != nil {
		return fmt.Errorf("discovery: label selector %q: %w", k.LabelSelector, err)
	}
	log := k.Logger
	if log == nil {
		log = slog.Default()
	}

	factory := informers.NewSharedInformerFactoryWithOptions(k.Client, 0,
		informers.WithNamespace(k.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = k.LabelSelector }),
		informers.WithTransform(trimPod),
	)
	inf := factory.Core().V1().Pods().Informer()

	// A one-slot trigger: however many events arrive while the loop below
	// is busy, it wakes once and reads the store's latest state.
	trigger := make(chan struct{}, 1)
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	hook := k.testHookEvent
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			poke()
			if hook != nil {
				hook(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			o, ok1 := old.(*corev1.Pod)
			n, ok2 := obj.(*corev1.Pod)
			if !ok1 || !ok2 || !podOf(o).Equal(podOf(n)) {
				poke()
			}
			if hook != nil {
				hook(obj)
			}
		},
		DeleteFunc: func(obj any) {
			poke()
			if hook != nil {
				hook(obj)
			}
		},
	}); err != nil {
		return fmt.Errorf("discovery: pod informer: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		log.Warn("discovery: listing or watching pods failed; retrying",
			"namespace", k.Namespace, "labelSelector", k.LabelSelector, "err", err)
	}); err != nil {
		return fmt.Errorf("discovery: pod informer: %w", err)
	}

	factory.StartWithContext(ctx)
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx ended first
	}
	poke() // deliver the first set even when the namespace has no pods

	var last []Pod
	first := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
		}
		pods := podsOf(inf.GetStore().List())
		if !first && slices.EqualFunc(pods, last, Pod.Equal) {
			continue
		}
		first = false
		last = pods
		onChange(slices.Clone(pods))
	}
}

// podsOf converts the informer store's objects, sorted by namespace/name.
func podsOf(objs []any) []Pod {
	pods := make([]Pod, 0, len(objs))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok {
			pods = append(pods, podOf(p))
		}
	}
	slices.SortFunc(pods, func(a, b Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return pods
}

func podOf(p *corev1.Pod) Pod {
	return Pod{
		Namespace: p.Namespace,
		Name:      p.Name,
		IP:        p.Status.PodIP,
		Labels:    p.Labels,
		Ready:     p.DeletionTimestamp == nil && podReady(p),
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// trimPod keeps only what podOf reads (and what the informer needs to
// resume a watch), so the cache holds a few hundred bytes per pod instead
// of its spec, managed fields and container statuses. It is idempotent, as
// client-go requires.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone (cache.DeletedFinalStateUnknown)
	}
	t := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         p.Namespace,
			Name:              p.Name,
			UID:               p.UID,
			ResourceVersion:   p.ResourceVersion,
			Labels:            p.Labels,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{PodIP: p.Status.PodIP},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			t.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
			break
		}
	}
	return t, nil
}
