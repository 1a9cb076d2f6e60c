// Package kube is the Kubernetes configuration source: Meridian's
// documents kept as cluster objects in one namespace (custom resources of
// the definitions in crds/, GIE's InferencePool, and ConfigMaps labelled
// for body-based routing or for Meridian), read through informers and
// built into config.Snapshots with the same strict decoding and
// validation as the directory and etcd sources. An object that does not
// validate is refused: the snapshot in force keeps serving, and the
// refusal is reported on the object as an Event. Store writes objects
// with optimistic concurrency on their resourceVersion.
//
// It decides nothing about what the configuration means; package config
// does.
package kube

//go:generate go run ./crdgen -out crds -out ../../deploy/helm/meridian/crds
