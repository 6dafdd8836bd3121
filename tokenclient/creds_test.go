package tokenclient

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func TestBearerCredsPickTheToken(t *testing.T) {
	admin := context.WithValue(context.Background(), adminCall{}, true)
	tests := []struct {
		name         string
		creds        bearerCreds
		ctx          context.Context
		wantMetadata string
	}{
		{"stream with both", bearerCreds{proxy: "p", admin: "a"}, context.Background(), "Bearer p"},
		{"write with both", bearerCreds{proxy: "p", admin: "a"}, admin, "Bearer a"},
		{"stream with the admin token only", bearerCreds{admin: "a"}, context.Background(), "Bearer a"},
		{"write with the proxy token only", bearerCreds{proxy: "p"}, admin, "Bearer p"},
	}
	for _, tc := range tests {
		md, err := tc.creds.GetRequestMetadata(tc.ctx)
		if err != nil || md["authorization"] != tc.wantMetadata {
			t.Errorf("%s: %v, %v; want %q", tc.name, md, err, tc.wantMetadata)
		}
	}
	if !(bearerCreds{requireTLS: true}).RequireTransportSecurity() {
		t.Error("requireTLS is not passed to gRPC")
	}
}

func TestConfigRefusesTokensInClear(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"loopback", Config{Servers: []string{"127.0.0.1:3379", "localhost:3379", "[::1]:3379"}, ProxyToken: "p"}, true},
		{"remote without tokens", Config{Servers: []string{"10.0.0.1:3379"}}, true},
		{"remote with a token", Config{Servers: []string{"127.0.0.1:3379", "rgserver-2:3379"}, AdminToken: "a"}, false},
		{"remote with TLS", Config{Servers: []string{"10.0.0.1:3379"}, ProxyToken: "p", TLS: &tls.Config{}}, true},
		{"remote, allowed in clear", Config{Servers: []string{"10.0.0.1:3379"}, ProxyToken: "p", InsecureTokens: true}, true},
	}
	for _, tc := range tests {
		_, err := tc.cfg.withDefaults()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrConfig)) {
			t.Errorf("%s: %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && (strings.Contains(err.Error(), "\"a\"") || strings.Contains(err.Error(), "\"p\"")) {
			t.Errorf("%s: the error shows a token: %v", tc.name, err)
		}
	}
}

// TestTokensSentPerCall: the proxy token rides on the token and watch
// streams, the admin token on writes.
func TestTokensSentPerCall(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{} // method → authorization
	note := func(ctx context.Context, method string) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen[method[strings.LastIndexByte(method, '/')+1:]] = strings.Join(md.Get("authorization"), ",")
		mu.Unlock()
	}
	gs := grpc.NewServer(
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			note(ctx, info.FullMethod)
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			note(ss.Context(), info.FullMethod)
			return h(srv, ss)
		}))
	tokenpb.RegisterTokenServiceServer(gs, newTokenServer())
	tokenpb.RegisterResourceGroupServiceServer(gs, newRGServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	c, _ := startClient(t, func(cfg *Config) { cfg.ProxyToken, cfg.AdminToken = "proxy-tok", "admin-tok" }, lis.Addr().String())
	if err := c.Store().CreateGroup(context.Background(), resourcegroup.Group{Name: "g", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a token stream", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["AcquireTokens"] != ""
	}, nil)
	mu.Lock()
	defer mu.Unlock()
	for m, want := range map[string]string{"AcquireTokens": "Bearer proxy-tok", "Watch": "Bearer proxy-tok", "CreateGroup": "Bearer admin-tok"} {
		if seen[m] != want {
			t.Errorf("%s carried %q, want %q", m, seen[m], want)
		}
	}
}
