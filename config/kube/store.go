package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/meridian-router/meridian/config"
)

// GuardName is the ConfigMap every Commit rewrites first, with the
// resourceVersion it read as a precondition: two applies that read the
// same state conflict even when they change different objects (their
// union might not validate), as etcd's guard key makes them.
const GuardName = "meridian-config-guard"

// Store reads and writes the configuration kept as cluster objects in
// one namespace. Every write carries the resourceVersion it read, so two
// operators never overwrite each other: the later one gets
// config.ErrConflict and must read again.
type Store struct {
	Dynamic   dynamic.Interface
	Client    kubernetes.Interface
	Namespace string
}

// current is one object as read from the API server: its document, or
// why it does not decode.
type current struct {
	r    Resource
	u    *unstructured.Unstructured
	doc  config.Document
	errs config.Errors
}

// state is every object of the namespace at one read.
type state struct {
	objects  map[config.ObjectKey]current
	guardRV  string // "" when the guard does not exist yet
	revision int64
}

// problems are the decoding errors of the objects keep selects.
func (st *state) problems(keep func(config.ObjectKey) bool) config.Errors {
	var errs config.Errors
	for _, k := range slices.SortedFunc(maps.Keys(st.objects), compareKeys) {
		if keep(k) {
			errs = append(errs, st.objects[k].errs...)
		}
	}
	return errs
}

func (s *Store) read(ctx context.Context) (*state, error) {
	served, err := Served(s.Client.Discovery(), nil)
	if err != nil {
		return nil, err
	}
	st := &state{objects: map[config.ObjectKey]current{}}
	seen := map[string]bool{}
	for _, r := range served {
		l, err := s.Dynamic.Resource(r.GroupVersionResource).Namespace(s.Namespace).List(ctx, metav1.ListOptions{LabelSelector: r.LabelSelector})
		if err != nil {
			return nil, fmt.Errorf("config: kubernetes: list %s in %s: %w", r.Resource, s.Namespace, err)
		}
		st.revision = max(st.revision, resourceVersion(l.GetResourceVersion()))
		for i := range l.Items {
			u := &l.Items[i]
			if seen[string(u.GetUID())] {
				continue
			}
			seen[string(u.GetUID())] = true
			// An object that does not decode is kept under its kind and
			// name, so that an apply of that object can replace it.
			key := config.ObjectKey{Kind: r.Kind, Name: u.GetName()}
			c := current{r: r, u: u}
			docs, errs := documentOf(r, u)
			if len(docs) == 1 && len(errs) == 0 {
				c.doc = docs[0]
			} else {
				c.errs = errs
			}
			if prev, ok := st.objects[key]; ok {
				c.errs = append(c.errs, config.FieldError{Origin: Origin(r, u.GetNamespace(), u.GetName()), Object: key.String(),
					Path: "metadata.name", Msg: "duplicate: " + key.String() + " is also defined as " + Origin(prev.r, u.GetNamespace(), u.GetName())})
			}
			st.objects[key] = c
		}
	}
	guard, err := s.Client.CoreV1().ConfigMaps(s.Namespace).Get(ctx, GuardName, metav1.GetOptions{})
	switch {
	case err == nil:
		st.guardRV = guard.ResourceVersion
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("config: kubernetes: read %s: %w", GuardName, err)
	}
	return st, nil
}

// Load returns the configuration the namespace holds, validated.
func (s *Store) Load(ctx context.Context) (*config.Snapshot, error) {
	st, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	if errs := st.problems(func(config.ObjectKey) bool { return true }); len(errs) > 0 {
		return nil, errs
	}
	docs := make([]config.Document, 0, len(st.objects))
	for _, k := range slices.SortedFunc(maps.Keys(st.objects), compareKeys) {
		docs = append(docs, st.objects[k].doc)
	}
	return config.Build(docs, st.revision)
}

func compareKeys(a, b config.ObjectKey) int { return strings.Compare(a.String(), b.String()) }

// Plan is a validated set of changes against the objects as read.
type Plan struct {
	config.Plan
	namespace string
	guardRV   string
	state     map[config.ObjectKey]current
	next      map[config.ObjectKey]config.Document
}

// PlanApply computes the changes that make the namespace hold docs
// (created or replaced; objects not named are kept) and deletes the named
// objects. The whole resulting configuration is validated first; an
// invalid one is returned as config.Errors and nothing is planned.
func (s *Store) PlanApply(ctx context.Context, docs []config.Document, deletes []config.ObjectKey) (*Plan, error) {
	st, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	next := make(map[config.ObjectKey]config.Document, len(st.objects)+len(docs))
	for k, c := range st.objects {
		next[k] = c.doc // empty for an object that does not decode
	}
	for _, d := range docs {
		if _, err := resourceFor(d); err != nil {
			return nil, config.Errors{{Origin: d.Origin, Object: d.Key.String(), Path: "kind", Msg: err.Error()}}
		}
		next[d.Key] = d
	}
	for _, k := range deletes {
		if _, ok := st.objects[k]; !ok {
			return nil, fmt.Errorf("config: delete %s: not found in namespace %s", k, s.Namespace)
		}
		delete(next, k)
	}
	// Objects that do not decode are refused unless this plan replaces
	// or deletes them.
	if errs := st.problems(func(k config.ObjectKey) bool { _, kept := next[k]; return kept && !replaced(docs, k) }); len(errs) > 0 {
		return nil, errs
	}
	all := make([]config.Document, 0, len(next))
	for _, k := range slices.SortedFunc(maps.Keys(next), compareKeys) {
		all = append(all, next[k])
	}
	result, err := config.Build(all, st.revision)
	if err != nil {
		return nil, err
	}
	p := &Plan{Plan: config.Plan{Revision: st.revision, Result: result}, namespace: s.Namespace, guardRV: st.guardRV, state: st.objects, next: next}
	for _, k := range slices.SortedFunc(maps.Keys(next), compareKeys) {
		old, had := st.objects[k]
		switch {
		case !had:
			p.Changes = append(p.Changes, config.Change{Op: config.OpCreate, Key: k, New: next[k].JSON})
		case !jsonEqual(old.doc.JSON, next[k].JSON) || old.r.APIVersion() != next[k].APIVersion:
			p.Changes = append(p.Changes, config.Change{Op: config.OpUpdate, Key: k, Old: old.doc.JSON, New: next[k].JSON})
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(st.objects), compareKeys) {
		if _, ok := next[k]; !ok {
			p.Changes = append(p.Changes, config.Change{Op: config.OpDelete, Key: k, Old: st.objects[k].doc.JSON})
		}
	}
	slices.SortStableFunc(p.Changes, func(a, b config.Change) int { return compareKeys(a.Key, b.Key) })
	return p, nil
}

func replaced(docs []config.Document, k config.ObjectKey) bool {
	return slices.ContainsFunc(docs, func(d config.Document) bool { return d.Key == k })
}

// Mutate reads the namespace's configuration, lets fn change one object
// and plans the write, as config.Store.Mutate does for etcd.
func (s *Store) Mutate(ctx context.Context, key config.ObjectKey, fn func(cur []byte) ([]byte, error)) (*Plan, error) {
	st, err := s.read(ctx)
	if err != nil {
		return nil, err
	}
	var cur []byte
	origin := "kubernetes"
	if c, ok := st.objects[key]; ok {
		if len(c.errs) > 0 {
			return nil, c.errs
		}
		cur = c.doc.JSON
		origin = c.doc.Origin
	}
	next, err := fn(cur)
	if err != nil {
		return nil, err
	}
	if next == nil {
		return s.PlanApply(ctx, nil, []config.ObjectKey{key})
	}
	docs, errs := config.Decode(origin, next)
	if len(errs) > 0 {
		return nil, errs
	}
	if len(docs) != 1 || docs[0].Key != key {
		return nil, fmt.Errorf("config: mutate %s: the new document must be that object", key)
	}
	return s.PlanApply(ctx, docs, nil)
}

// Commit writes a plan: first the guard (conflicting when any apply
// committed since the plan's read), then each object with the
// resourceVersion it was read at (conflicting when anyone changed it
// since). A conflict returns config.ErrConflict. The API server has no
// multi-object transaction: a failure after the guard leaves the objects
// written before it, and the error says which.
func (s *Store) Commit(ctx context.Context, p *Plan) (int, error) {
	if len(p.Changes) == 0 {
		return 0, nil
	}
	if err := s.writeGuard(ctx, p); err != nil {
		return 0, err
	}
	for i, c := range p.Changes {
		if err := s.write(ctx, p, c); err != nil {
			if i > 0 {
				return i, fmt.Errorf("%w (%d of %d changes were written before it)", err, i, len(p.Changes))
			}
			return 0, err
		}
	}
	return len(p.Changes), nil
}

func (s *Store) writeGuard(ctx context.Context, p *Plan) error {
	cms := s.Client.CoreV1().ConfigMaps(p.namespace)
	data := map[string]string{"revision": fmt.Sprint(p.Revision), "note": "rewritten by every meridian config apply; it makes concurrent applies conflict"}
	var err error
	if p.guardRV == "" {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: GuardName, Namespace: p.namespace}, Data: data}, metav1.CreateOptions{})
	} else {
		_, err = cms.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: GuardName, Namespace: p.namespace, ResourceVersion: p.guardRV}, Data: data}, metav1.UpdateOptions{})
	}
	return apiErr("write "+GuardName, err)
}

func (s *Store) write(ctx context.Context, p *Plan, c config.Change) (err error) {
	what := string(c.Op) + " " + c.Key.String()
	if c.Op == config.OpDelete {
		cur := p.state[c.Key]
		rv := cur.u.GetResourceVersion()
		err := s.Dynamic.Resource(cur.r.GroupVersionResource).Namespace(p.namespace).Delete(ctx, c.Key.Name,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		return apiErr(what, err)
	}
	d := p.next[c.Key]
	r, err := resourceFor(d)
	if err != nil {
		return err
	}
	var base *unstructured.Unstructured
	cur, had := p.state[c.Key]
	if had && cur.r.GroupVersionResource == r.GroupVersionResource {
		base = cur.u
	} else if had {
		// Moved to another group (HyperPod's ↔ Meridian's): create the
		// new object, then delete the old one.
		defer func() {
			if err != nil {
				return
			}
			rv := cur.u.GetResourceVersion()
			err = apiErr(what, s.Dynamic.Resource(cur.r.GroupVersionResource).Namespace(p.namespace).Delete(ctx, c.Key.Name,
				metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}))
		}()
	}
	u, err := objectOf(r, p.namespace, d, base)
	if err != nil {
		return err
	}
	res := s.Dynamic.Resource(r.GroupVersionResource).Namespace(p.namespace)
	if base == nil {
		_, err = res.Create(ctx, u, metav1.CreateOptions{})
	} else {
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
	}
	return apiErr(what, err)
}

// apiErr classifies an API server answer: a changed resourceVersion or an
// object created meanwhile is config.ErrConflict; anything else (a schema
// refusal names the object and field) is returned wrapped.
func apiErr(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%w (%s: %v)", config.ErrConflict, what, err)
	}
	return fmt.Errorf("config: kubernetes: %s: %w", what, err)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
