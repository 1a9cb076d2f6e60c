// Package config reads Meridian's configuration: Kubernetes-style YAML
// documents (Topology, InferenceGatewayConfig, Tenant,
// InferenceModelRewrite, the GIE pool and endpoint-picker shapes, …)
// decoded and validated into one Snapshot, with every error naming the
// file and the field path. The documents come from a directory (LoadDir)
// or from etcd (EtcdSource, watched; Store writes), and the last snapshot that
// validated is kept on disk so a restart serves it when etcd is unreachable.
// On Kubernetes the same documents are cluster objects (package
// config/kube). The +kubebuilder markers on the types below become the
// OpenAPI schemas and CEL rules of their CustomResourceDefinitions;
// validation here stays the authority, the API server's checks come first.
//
// +kubebuilder:validation:Optional
package config
