package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/platform"
)

// registerSource adds the configuration source's flags to a
// long-running command.
func registerSource(cmd *cobra.Command, f *platform.Source) {
	cmd.Flags().StringVar(&f.Dir, "config", "", "directory (or file) of YAML configuration, reloaded on change")
	cmd.Flags().StringSliceVar(&f.Etcd, "etcd", nil, "etcd endpoints (host:port,...) to read configuration from")
	cmd.Flags().StringVar(&f.Prefix, "prefix", config.DefaultPrefix, "etcd key prefix")
	cmd.Flags().StringVar(&f.Cache, "cache", "", "last-known-good copy of the etcd configuration (default: in the user cache dir)")
	cmd.Flags().StringVar(&f.Root, "config-root", "", "with --etcd or --source kubernetes: the directory relative file paths of the configuration (spec.auth.jwt.jwksFile) are resolved against (default: the working directory)")
	registerKubernetes(cmd, &f.Kubernetes, &f.Kubeconfig, &f.Namespace)
}

// registerKubernetes adds --source kubernetes, --kubeconfig and
// --namespace.
func registerKubernetes(cmd *cobra.Command, on *bool, kubeconfig, namespace *string) {
	cmd.Flags().Var((*sourceKind)(on), "source", "kubernetes: read the configuration from cluster objects (meridian config crds); the directory and etcd sources are chosen by --config and --etcd")
	cmd.Flags().StringVar(kubeconfig, "kubeconfig", "", "kubeconfig for the Kubernetes API (default: the in-cluster service account)")
	cmd.Flags().StringVar(namespace, "namespace", "", "namespace of Meridian's objects (and pods) in Kubernetes (default: the kubeconfig context's, or this pod's)")
}

// sourceKind is --source: "kubernetes" or nothing.
type sourceKind bool

func (s *sourceKind) String() string {
	if s != nil && *s {
		return "kubernetes"
	}
	return ""
}

func (s *sourceKind) Set(v string) error {
	switch v {
	case "kubernetes":
		*s = true
	case "":
		*s = false
	default:
		return fmt.Errorf("%q: want kubernetes (a directory is --config, etcd is --etcd)", v)
	}
	return nil
}

func (s *sourceKind) Type() string { return "kubernetes" }
