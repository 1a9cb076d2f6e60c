package kube

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Clients are what the source and the store talk to the API server with.
type Clients struct {
	Dynamic dynamic.Interface
	Client  kubernetes.Interface
}

// NewClients builds Clients from a client configuration.
func NewClients(rc *rest.Config) (Clients, error) {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("config: kubernetes client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return Clients{}, fmt.Errorf("config: kubernetes client: %w", err)
	}
	return Clients{Dynamic: dyn, Client: cs}, nil
}

// Connect returns Clients for kubeconfig's current context (the
// in-cluster service account when kubeconfig is "") and the namespace to
// use: namespace when set, else the context's (default "default"), else
// in a cluster POD_NAMESPACE or the service account's.
func Connect(kubeconfig, namespace, userAgent string) (Clients, string, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		if rc, err = rest.InClusterConfig(); err != nil {
			return Clients{}, "", fmt.Errorf("config: no --kubeconfig given and no in-cluster config: %w", err)
		}
		if namespace == "" {
			namespace = os.Getenv("POD_NAMESPACE")
		}
		if namespace == "" {
			b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
			if err != nil {
				return Clients{}, "", fmt.Errorf("config: in-cluster namespace: set --namespace or POD_NAMESPACE: %w", err)
			}
			namespace = strings.TrimSpace(string(b))
		}
	} else {
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}, &clientcmd.ConfigOverrides{})
		if rc, err = cc.ClientConfig(); err != nil {
			return Clients{}, "", fmt.Errorf("config: kubeconfig %s: %w", kubeconfig, err)
		}
		if namespace == "" {
			if namespace, _, err = cc.Namespace(); err != nil {
				return Clients{}, "", fmt.Errorf("config: kubeconfig %s: namespace: %w", kubeconfig, err)
			}
		}
	}
	rc.UserAgent = userAgent
	c, err := NewClients(rc)
	return c, namespace, err
}
