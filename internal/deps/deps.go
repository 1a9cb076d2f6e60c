//go:build tools

// Package deps pins modules that packages still under construction will
// import, so that parallel work shares one go.mod. Remove an entry once a
// real import of it exists.
package deps

import (
	_ "github.com/cespare/xxhash/v2"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/hashicorp/memberlist"
	_ "github.com/openai/openai-go/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/spf13/cobra"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "go.uber.org/goleak"
	_ "golang.org/x/time/rate"
	_ "google.golang.org/grpc"
	_ "sigs.k8s.io/yaml"
)
