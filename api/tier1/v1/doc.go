// Package tier1v1 holds the gRPC services a Tier-1 offers besides routing:
// the pool-health feed (PoolHealth) and the replica exchange (Replicas).
//
// Regenerate after editing tier1.proto (protoc from Debian's
// protobuf-compiler; plugins from the Go module proxy):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go generate ./api/...
package tier1v1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative tier1.proto
