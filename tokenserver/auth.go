package tokenserver

import (
	"context"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// IsAdminMethod reports whether a full gRPC method name changes settings,
// bindings or runaway watches, and so needs the admin token when one is configured. Reads,
// Watch and AcquireTokens do not (TLS client certificates guard those).
func IsAdminMethod(fullMethod string) bool {
	switch fullMethod {
	case pb.ResourceGroupService_CreateGroup_FullMethodName,
		pb.ResourceGroupService_AlterGroup_FullMethodName,
		pb.ResourceGroupService_DropGroup_FullMethodName,
		pb.ResourceGroupService_BindUser_FullMethodName,
		pb.ResourceGroupService_UnbindUser_FullMethodName,
		pb.ResourceGroupService_AddWatch_FullMethodName,
		pb.ResourceGroupService_RemoveWatch_FullMethodName:
		return true
	}
	return false
}

// checkBearer verifies "authorization: Bearer <token>" in ctx's metadata.
func checkBearer(ctx context.Context, token string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		got, ok := strings.CutPrefix(v, "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "this RPC needs the admin token: send metadata \"authorization: Bearer <token>\"")
}

// AdminAuth returns interceptors that require the bearer token on admin
// RPCs. An empty token disables the check.
func AdminAuth(token string) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if token != "" && IsAdminMethod(info.FullMethod) {
			if err := checkBearer(ctx, token); err != nil {
				return nil, err
			}
		}
		return h(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if token != "" && IsAdminMethod(info.FullMethod) {
			if err := checkBearer(ss.Context(), token); err != nil {
				return err
			}
		}
		return h(srv, ss)
	}
	return unary, stream
}
