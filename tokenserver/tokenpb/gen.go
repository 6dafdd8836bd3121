// Package tokenpb holds the rgserver's gRPC API: ResourceGroupService (group
// settings, bindings, Watch), TokenService (AcquireTokens) and
// InspectService (cluster-wide views). The Go code is
// generated from tokenpb.proto by protoc with protoc-gen-go v1.36.12 and
// protoc-gen-go-grpc v1.5.1.
package tokenpb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative tokenpb.proto
