package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/meridian-router/meridian/config"
)

// ErrEmpty reports a namespace that holds none of Meridian's objects: all
// deleted by mistake, or the wrong namespace. It is refused like an
// invalid configuration.
var ErrEmpty = errors.New("config: no Meridian objects in the namespace")

// Source serves the configuration kept as cluster objects in one
// namespace and follows changes through informers (dynamic client, one
// per resource the API server serves; a resource whose definition is not
// installed is skipped and logged).
//
// Every change rebuilds the whole configuration with the same strict
// decoding and validation as the directory and etcd sources. A
// configuration that does not validate is refused: logged at Error,
// reported to OnReload and, object by object, as a Warning Event
// (reason Invalid) on the object at fault; the snapshot in force keeps
// serving. A rebuild whose objects are unchanged publishes nothing.
//
// The reader needs get, list and watch on the resources (Resources), and
// create on events to report refusals.
type Source struct {
	config.Broadcaster
	// Dynamic reads the objects. Required.
	Dynamic dynamic.Interface
	// Client finds which resources the API server serves and writes
	// Events. Required.
	Client kubernetes.Interface
	// Namespace holds the objects. Required.
	Namespace string
	// StartTimeout bounds the first sync in Start. Zero means 30s.
	StartTimeout time.Duration
	// Logger receives reload outcomes. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, when set, is called after each rebuild with its outcome
	// (nil error on success). It must not block.
	OnReload func(rev int64, err error)
	// Check, when set, is the consumer's own test of a valid snapshot
	// (config.EtcdSource.Check). It must not block.
	Check func(*config.Snapshot) error

	informers []watched
	trigger   chan struct{}
	stop      context.CancelFunc
	running   sync.WaitGroup // the informers

	mu       sync.Mutex
	lastErr  error
	rev      int64
	reported map[types.UID]string // the refusal last reported on each object
}

type watched struct {
	Resource
	inf cache.SharedIndexInformer
}

func (s *Source) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// Served returns the resources of Resources that the API server serves,
// and logs those it does not (their definitions are not installed).
func Served(dc discovery.DiscoveryInterface, log *slog.Logger) ([]Resource, error) {
	var out []Resource
	lists := map[string]*metav1.APIResourceList{}
	for _, r := range Resources {
		gv := r.GroupVersion().String()
		l, ok := lists[gv]
		if !ok {
			var err error
			l, err = dc.ServerResourcesForGroupVersion(gv)
			if err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("config: kubernetes: discovering %s: %w", gv, err)
			}
			lists[gv] = l
		}
		if l != nil && slices.ContainsFunc(l.APIResources, func(a metav1.APIResource) bool { return a.Name == r.Resource }) {
			out = append(out, r)
			continue
		}
		if log != nil {
			log.Warn("config: kubernetes: resource not served (install its definition: meridian config crds | kubectl apply -f -); its objects are not read",
				"resource", r.Resource+"."+r.Group, "version", r.Version)
		}
	}
	return out, nil
}

// Start starts the informers and builds the first snapshot once they
// have synced. It fails when they do not sync within StartTimeout or the
// namespace's configuration does not validate; nothing keeps running
// then. After a successful Start, Run must follow.
func (s *Source) Start(ctx context.Context) error {
	if s.Dynamic == nil || s.Client == nil || s.Namespace == "" {
		return errors.New("config: kubernetes source needs Dynamic, Client and Namespace")
	}
	served, err := Served(s.Client.Discovery(), s.log())
	if err != nil {
		return err
	}
	s.trigger = make(chan struct{}, 1)
	s.reported = map[types.UID]string{}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = cancel
	for _, r := range served {
		sel := r.LabelSelector
		inf := dynamicinformer.NewFilteredDynamicInformer(s.Dynamic, r.GroupVersionResource, s.Namespace, 0,
			cache.Indexers{}, func(o *metav1.ListOptions) { o.LabelSelector = sel }).Informer()
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.poke() },
			DeleteFunc: func(any) { s.poke() },
			UpdateFunc: func(old, obj any) {
				if !statusOnly(old, obj) {
					s.poke()
				}
			},
		}); err != nil {
			cancel()
			s.running.Wait()
			return err
		}
		res := r
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			s.log().Warn("config: kubernetes: listing or watching failed; retrying",
				"resource", res.Resource+"."+res.Group, "namespace", s.Namespace, "error", err)
		}); err != nil {
			cancel()
			s.running.Wait()
			return err
		}
		s.informers = append(s.informers, watched{Resource: r, inf: inf})
		s.running.Go(func() { inf.RunWithContext(runCtx) })
	}
	to := s.StartTimeout
	if to <= 0 {
		to = 30 * time.Second
	}
	syncCtx, syncCancel := context.WithTimeout(ctx, to)
	defer syncCancel()
	for _, w := range s.informers {
		if !cache.WaitForCacheSync(syncCtx.Done(), w.inf.HasSynced) {
			cancel()
			s.running.Wait()
			return fmt.Errorf("config: kubernetes: %s in namespace %s not listed within %s: %w", w.Resource.Resource, s.Namespace, to, syncCtx.Err())
		}
	}
	if err := s.rebuild(ctx); err != nil {
		cancel()
		s.running.Wait()
		return err
	}
	return nil
}

// statusOnly reports an update that changed neither an object's spec
// (generation) nor its labels and annotations: a status write.
func statusOnly(old, obj any) bool {
	o, ok1 := old.(*unstructured.Unstructured)
	n, ok2 := obj.(*unstructured.Unstructured)
	if !ok1 || !ok2 || n.GetGeneration() == 0 {
		return false // ConfigMaps have no generation
	}
	return o.GetGeneration() == n.GetGeneration() &&
		maps.Equal(o.GetLabels(), n.GetLabels()) && maps.Equal(o.GetAnnotations(), n.GetAnnotations())
}

// poke wakes Run; changes that arrive while it rebuilds are coalesced.
func (s *Source) poke() {
	select {
	case s.trigger <- struct{}{}:
	default:
	}
}

// Run rebuilds on every change until ctx ends, then stops the informers,
// waits for them to end and closes subscriptions.
func (s *Source) Run(ctx context.Context) {
	defer s.Close()
	defer s.running.Wait()
	defer s.stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.trigger:
		}
		_ = s.rebuild(ctx) // a refusal is logged, reported and counted
	}
}

// LastError returns the error of the last rebuild, or nil.
func (s *Source) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// stored is one object read from an informer.
type stored struct {
	r Resource
	u *unstructured.Unstructured
}

// rebuild validates what the informers hold and publishes it when valid
// and changed.
func (s *Source) rebuild(ctx context.Context) error {
	var objs []stored
	seen := map[types.UID]bool{}
	var rev int64
	for _, w := range s.informers {
		rev = max(rev, resourceVersion(w.inf.LastSyncResourceVersion()))
		for _, o := range w.inf.GetStore().List() {
			u, ok := o.(*unstructured.Unstructured)
			if !ok || seen[u.GetUID()] {
				continue // a ConfigMap both labels select is read once
			}
			seen[u.GetUID()] = true
			objs = append(objs, stored{w.Resource, u})
		}
	}
	s.mu.Lock()
	if rev <= s.rev {
		rev = s.rev + 1
	}
	s.mu.Unlock()

	snap, err := s.build(objs, rev)
	s.mu.Lock()
	s.lastErr = err
	s.mu.Unlock()
	if s.OnReload != nil {
		s.OnReload(rev, err)
	}
	s.report(ctx, objs, err)
	if err != nil {
		running := int64(0)
		if cur := s.Snapshot(); cur != nil {
			running = cur.Revision
		}
		s.log().Error("config: kubernetes objects refused; keeping the running configuration",
			"namespace", s.Namespace, "revision", rev, "running", running, "error", err)
		return err
	}
	if cur := s.Snapshot(); cur != nil && sameObjects(cur, snap) {
		return nil
	}
	s.mu.Lock()
	s.rev = rev
	s.mu.Unlock()
	s.Publish(snap)
	return nil
}

func (s *Source) build(objs []stored, rev int64) (*config.Snapshot, error) {
	if len(objs) == 0 {
		return nil, fmt.Errorf("%w %s (were they all deleted?); apply the configuration again", ErrEmpty, s.Namespace)
	}
	var docs []config.Document
	var errs config.Errors
	for _, o := range objs {
		d, e := documentOf(o.r, o.u)
		docs = append(docs, d...)
		errs = append(errs, e...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	snap, err := config.Build(docs, rev)
	if err != nil {
		return nil, err
	}
	if s.Check != nil {
		if err := s.Check(snap); err != nil {
			return nil, fmt.Errorf("%w: revision %d: %w", config.ErrUnusable, rev, err)
		}
	}
	return snap, nil
}

// sameObjects reports whether two snapshots hold the same documents.
func sameObjects(a, b *config.Snapshot) bool {
	return maps.EqualFunc(a.Objects, b.Objects, func(x, y config.Object) bool { return string(x.JSON) == string(y.JSON) })
}

// report writes a Warning Event on each object a refusal names, once per
// object and message.
func (s *Source) report(ctx context.Context, objs []stored, err error) {
	errs, _ := config.AsErrors(err)
	msgs := map[string][]string{}
	for _, e := range errs {
		msgs[e.Origin] = append(msgs[e.Origin], e.Error())
	}
	now := map[types.UID]string{}
	for _, o := range objs {
		m, ok := msgs[Origin(o.r, o.u.GetNamespace(), o.u.GetName())]
		if !ok {
			continue
		}
		msg := strings.Join(m, "\n")
		now[o.u.GetUID()] = msg
		s.mu.Lock()
		same := s.reported[o.u.GetUID()] == msg
		s.mu.Unlock()
		if !same {
			s.event(ctx, o, msg)
		}
	}
	s.mu.Lock()
	s.reported = now
	s.mu.Unlock()
}

// event records a refusal on the object, as `kubectl describe` and
// `kubectl get events` show it.
func (s *Source) event(ctx context.Context, o stored, msg string) {
	if len(msg) > 1000 {
		msg = msg[:1000] + "…"
	}
	t := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: o.u.GetName() + ".", Namespace: o.u.GetNamespace()},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: o.u.GetAPIVersion(), Kind: o.u.GetKind(), Namespace: o.u.GetNamespace(),
			Name: o.u.GetName(), UID: o.u.GetUID(), ResourceVersion: o.u.GetResourceVersion(),
		},
		Type:           corev1.EventTypeWarning,
		Reason:         "Invalid",
		Message:        msg + " (not applied; the configuration in force keeps serving)",
		Source:         corev1.EventSource{Component: "meridian"},
		FirstTimestamp: t,
		LastTimestamp:  t,
		Count:          1,
	}
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.Client.CoreV1().Events(o.u.GetNamespace()).Create(ectx, ev, metav1.CreateOptions{}); err != nil {
		s.log().Warn("config: kubernetes: cannot record the refusal as an Event", "object", o.u.GetName(), "error", err)
	}
}
