package kube

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/meridian-router/meridian/config"
)

// Resource is one kind of cluster object the source reads: where the API
// server serves it and which configuration kind it is.
type Resource struct {
	schema.GroupVersionResource
	// Kind is the configuration kind (config.KindTenant, …); objects of
	// the resource are decoded as that kind at GroupVersion.
	Kind string
	// Root names the Go type in package config whose fields the
	// resource's schema is generated from; "" for a resource whose
	// definition is not Meridian's (ConfigMaps, GIE's InferencePool).
	Root string
	// ListKind, Singular and ShortNames complete the CRD's names.
	Singular   string
	ShortNames []string
	// LabelSelector narrows the objects read (ConfigMaps: only those
	// labelled for Meridian).
	LabelSelector string
}

// GroupMeridian is the API group of Meridian's own kinds.
const GroupMeridian = "meridian.dev"

// ConfigLabel marks a ConfigMap that Meridian reads besides the BBR ones
// (one holding an EndpointPickerConfig that a scheduler's configMapRef
// names).
const ConfigLabel = "meridian.dev/config"

// Resources are every resource the source reads, in the order their
// definitions print.
var Resources = []Resource{
	{GroupVersionResource: schema.GroupVersionResource{Group: GroupMeridian, Version: "v1alpha1", Resource: "inferencegatewayconfigs"},
		Kind: config.KindGateway, Root: "Gateway", Singular: "inferencegatewayconfig", ShortNames: []string{"igc"}},
	{GroupVersionResource: schema.GroupVersionResource{Group: "inference.sagemaker.aws.amazon.com", Version: "v1alpha1", Resource: "inferencegatewayconfigs"},
		Kind: config.KindGateway, Root: "Gateway", Singular: "inferencegatewayconfig"},
	{GroupVersionResource: schema.GroupVersionResource{Group: GroupMeridian, Version: "v1alpha1", Resource: "tenants"},
		Kind: config.KindTenant, Root: "Tenant", Singular: "tenant"},
	{GroupVersionResource: schema.GroupVersionResource{Group: GroupMeridian, Version: "v1alpha1", Resource: "topologies"},
		Kind: config.KindTopology, Root: "Topology", Singular: "topology"},
	{GroupVersionResource: schema.GroupVersionResource{Group: GroupMeridian, Version: "v1alpha1", Resource: "staticendpoints"},
		Kind: config.KindStaticEndpoints, Root: "StaticEndpoints", Singular: "staticendpoints"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencemodelrewrites"},
		Kind: config.KindModelRewrite, Root: "ModelRewrite", Singular: "inferencemodelrewrite"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferenceobjectives"},
		Kind: config.KindObjective, Root: "InferenceObjective", Singular: "inferenceobjective"},
	{GroupVersionResource: schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"},
		Kind: config.KindInferencePool},
	{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Kind: config.KindConfigMap, LabelSelector: config.BBRManagedLabel + "=true"},
	{GroupVersionResource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		Kind: config.KindConfigMap, LabelSelector: ConfigLabel + "=true"},
}

// APIVersion is the resource's group/version as objects carry it.
func (r Resource) APIVersion() string { return r.GroupVersion().String() }
