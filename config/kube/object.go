package kube

import (
	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/meridian-router/meridian/config"
)

// lastApplied is kubectl's copy of what it applied: not configuration.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// Origin names a cluster object in errors: namespace/resource.group/name
// (namespace/configmaps/name for the core group).
func Origin(r Resource, namespace, name string) string {
	res := r.Resource
	if r.Group != "" {
		res += "." + r.Group
	}
	return namespace + "/" + res + "/" + name
}

// documentOf decodes a cluster object as the configuration document it
// holds. The API server's own metadata (uid, resourceVersion, managed
// fields, kubectl's last-applied copy) and the status are left out, so
// the document reads as the file an operator would write.
func documentOf(r Resource, u *unstructured.Unstructured) ([]config.Document, config.Errors) {
	origin := Origin(r, u.GetNamespace(), u.GetName())
	doc, err := documentJSON(r, u)
	if err != nil {
		return nil, config.Errors{{Origin: origin, Object: r.Kind + "/" + u.GetName(), Msg: err.Error()}}
	}
	return config.Decode(origin, doc)
}

func documentJSON(r Resource, u *unstructured.Unstructured) ([]byte, error) {
	md := map[string]any{"name": u.GetName()}
	l := u.GetLabels()
	if r.Kind == config.KindConfigMap {
		// ConfigLabel is how the source finds the ConfigMap, not part
		// of the document.
		l = maps.Clone(l)
		delete(l, ConfigLabel)
	}
	if len(l) > 0 {
		md["labels"] = l
	}
	if a := u.GetAnnotations(); len(a) > 0 {
		a = maps.Clone(a)
		delete(a, lastApplied)
		if len(a) > 0 {
			md["annotations"] = a
		}
	}
	doc := map[string]any{"apiVersion": r.APIVersion(), "kind": r.Kind, "metadata": md}
	if r.Kind == config.KindInferencePool {
		spec, err := poolSpec(u)
		if err != nil {
			return nil, err
		}
		doc["spec"] = spec
		return json.Marshal(doc)
	}
	for k, v := range u.Object {
		switch k {
		case "apiVersion", "kind", "metadata", "status":
		default:
			doc[k] = v
		}
	}
	return json.Marshal(doc)
}

// poolSpec reads a GIE InferencePool through the upstream module's types
// and keeps what Meridian's InferencePool holds: fields GIE adds that
// Meridian does not use (appProtocol) do not make the pool invalid here.
func poolSpec(u *unstructured.Unstructured) (map[string]any, error) {
	var p giev1.InferencePool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, fmt.Errorf("not a GIE InferencePool %s: %w", giev1.GroupVersion, err)
	}
	sel := map[string]any{}
	for k, v := range p.Spec.Selector.MatchLabels {
		sel[string(k)] = string(v)
	}
	ports := make([]any, 0, len(p.Spec.TargetPorts))
	for _, tp := range p.Spec.TargetPorts {
		ports = append(ports, map[string]any{"number": int64(tp.Number)})
	}
	spec := map[string]any{"selector": map[string]any{"matchLabels": sel}, "targetPorts": ports}
	if ref := p.Spec.EndpointPickerRef; ref != nil {
		r := map[string]any{"name": string(ref.Name)}
		// The CRD's defaults (the core group, kind Service) are left
		// out, so the document reads as the file it was applied from.
		if ref.Group != nil && *ref.Group != "" {
			r["group"] = string(*ref.Group)
		}
		if ref.Kind != "" && ref.Kind != "Service" {
			r["kind"] = string(ref.Kind)
		}
		if ref.Port != nil {
			r["port"] = map[string]any{"number": int64(ref.Port.Number)}
		}
		if ref.FailureMode != "" {
			r["failureMode"] = string(ref.FailureMode)
		}
		spec["endpointPickerRef"] = r
	}
	return spec, nil
}

// objectOf is the cluster object a document becomes in namespace: the
// document's fields over base (the object as stored, nil for a new one),
// so that what the API server keeps (uid, resourceVersion, status) stays.
func objectOf(r Resource, namespace string, d config.Document, base *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	var m map[string]any
	if err := json.Unmarshal(d.JSON, &m); err != nil {
		return nil, err
	}
	var u *unstructured.Unstructured
	if base != nil {
		u = base.DeepCopy()
		for k := range u.Object {
			switch k {
			case "apiVersion", "kind", "metadata", "status":
			default:
				delete(u.Object, k)
			}
		}
	} else {
		u = &unstructured.Unstructured{Object: map[string]any{}}
	}
	md, _ := m["metadata"].(map[string]any)
	for k, v := range m {
		if k != "metadata" {
			u.Object[k] = v
		}
	}
	u.SetAPIVersion(r.APIVersion())
	u.SetKind(r.Kind)
	u.SetNamespace(namespace)
	u.SetName(d.Key.Name)
	labels := stringMap(md["labels"])
	if r.Kind == config.KindConfigMap && labels[config.BBRManagedLabel] != "true" {
		// So that the source, which reads only labelled ConfigMaps,
		// finds it.
		if labels == nil {
			labels = map[string]string{}
		}
		labels[ConfigLabel] = "true"
	}
	u.SetLabels(labels)
	ann := stringMap(md["annotations"])
	if base != nil {
		if v, ok := base.GetAnnotations()[lastApplied]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[lastApplied] = v
		}
	}
	u.SetAnnotations(ann)
	return u, nil
}

func stringMap(v any) map[string]string {
	m, _ := v.(map[string]any)
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		out[k], _ = x.(string)
	}
	return out
}

// resourceFor is the resource a document is stored as.
func resourceFor(d config.Document) (Resource, error) {
	for _, r := range Resources {
		if r.Kind == d.Key.Kind && r.APIVersion() == d.APIVersion {
			return r, nil // the first ConfigMap resource for ConfigMaps: one is stored as any other
		}
	}
	if d.Key.Kind == config.KindEndpointPicker {
		return Resource{}, fmt.Errorf("%s is a file format, not a cluster object: put it under the data key config.yaml of a ConfigMap labelled %s=true and name that ConfigMap in the scheduler's configMapRef", d.Key.Kind, ConfigLabel)
	}
	return Resource{}, fmt.Errorf("%s %s is not kept as a cluster object", d.APIVersion, d.Key.Kind)
}

// resourceVersion parses a resourceVersion as the etcd revision it is on
// every API server today; 0 when it is not a number.
func resourceVersion(rv string) int64 {
	n, _ := strconv.ParseInt(rv, 10, 64)
	return n
}
