package tokenclient

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Every error mapError returns is a *resourcegroup.Error whose text is
// readable: it names the rgserver, says why and what became of the
// statement, and never carries gRPC's "rpc error: code = ..." form.
func TestMapError(t *testing.T) {
	refused := `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:4000: connect: connection refused"`
	tests := []struct {
		name     string
		err      error
		want     error
		wantCode uint16
		wantText []string
	}{
		{"exists", status.Error(codes.AlreadyExists, "x"), resourcegroup.ErrExists, resourcegroup.CodeExists, []string{"Resource group 'rg1' already exists"}},
		{"not found", status.Error(codes.NotFound, "x"), resourcegroup.ErrNotFound, resourcegroup.CodeNotFound, []string{"Unknown resource group 'rg1'"}},
		{"invalid", status.Error(codes.InvalidArgument, "invalid group settings: x"), resourcegroup.ErrInvalid, 1105, []string{"invalid group settings: x"}},
		{"precondition passes through", status.Error(codes.FailedPrecondition, "can't drop resource group: rg2 switches to it"), resourcegroup.ErrInvalid, 1105, []string{"can't drop resource group: rg2 switches to it"}},
		{"conflict", status.Error(codes.Aborted, "modified concurrently"), resourcegroup.ErrConflict, 1105, []string{"modified concurrently"}},
		{"unreachable", &rpcFailure{addrs: []string{"127.0.0.1:4000"}, err: status.Error(codes.Unavailable, refused)}, ErrUnavailable, 1105,
			[]string{"rgserver at 127.0.0.1:4000 is unreachable: connection refused; the statement was not applied"}},
		{"none reachable", &rpcFailure{addrs: []string{"a:1", "b:2"}, err: status.Error(codes.Unavailable, refused)}, ErrUnavailable, 1105,
			[]string{"rgserver (tried a:1, b:2) is unreachable: connection refused"}},
		{"unavailable, other cause", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.Unavailable, "server is shutting down")}, ErrUnavailable, 1105,
			[]string{"rgserver at a:1 is unreachable: server is shutting down"}},
		{"deadline", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.DeadlineExceeded, "context deadline exceeded")}, ErrUnavailable, 1105,
			[]string{"rgserver at a:1 did not answer in time", "may or may not have been applied"}},
		{"bad token", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.Unauthenticated, "rgserver does not know this bearer token")}, nil, 1105,
			[]string{"rgserver at a:1 refused this proxy's credential (rgserver does not know this bearer token)", "--token-server-token-file", "--admin-token-file", "not applied"}},
		{"proxy token", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.PermissionDenied, "CreateGroup needs an administrator credential")}, nil, 1105,
			[]string{"rgserver at a:1 does not let this proxy's credential change resource groups", "--token-server-token-file", "not applied"}},
		{"busy", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.ResourceExhausted, "too many")}, nil, 1105, []string{"is busy (too many)", "not applied"}},
		{"old server", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.Unimplemented, "unknown method")}, nil, 1105, []string{"does not implement op", "older than this proxy"}},
		{"internal", &rpcFailure{addrs: []string{"a:1"}, err: status.Error(codes.Internal, "etcd: boom")}, nil, 1105, []string{"op: rgserver at a:1 failed (Internal: etcd: boom)"}},
		{"canceled", context.Canceled, context.Canceled, 1105, []string{"canceled before rgserver answered"}},
		{"plain", errors.New("plain"), nil, 1105, []string{"op: rgserver: plain; the statement was not applied"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := mapError("op", "rg1", tc.err)
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var re *resourcegroup.Error
			if !errors.As(err, &re) || re.Code != tc.wantCode {
				t.Fatalf("%#v, want a *resourcegroup.Error with code %d", err, tc.wantCode)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(re.Message, w) {
					t.Errorf("message %q lacks %q", re.Message, w)
				}
			}
			if strings.Contains(re.Message, "rpc error") || strings.Contains(re.Message, "code =") {
				t.Errorf("gRPC text reaches the client: %q", re.Message)
			}
		})
	}
}

// The Store over gRPC: errors come back as resourcegroup's, the admin token
// is sent, reads come from the cache, and a write returns only once the
// settings cache shows it.
func TestStoreOverGRPC(t *testing.T) {
	s := startServer(t)
	c, clk := startClient(t, func(cfg *Config) { cfg.AdminToken = "secret" }, s.addr)
	st := c.Store()
	ctx := context.Background()

	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "Rg1", RUPerSec: 100}); err != nil {
		t.Fatal(err)
	}
	if g, err := st.GetGroup(ctx, "RG1"); err != nil || g.RUPerSec != 100 || g.Version == 0 {
		t.Fatalf("read-your-write: %+v %v", g, err)
	}
	errTests := []struct {
		name string
		op   func() error
		want error
	}{
		{"create twice", func() error { return st.CreateGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 1}) }, resourcegroup.ErrExists},
		{"create invalid", func() error { return st.CreateGroup(ctx, resourcegroup.Group{}) }, resourcegroup.ErrInvalid},
		{"alter missing", func() error { return st.AlterGroup(ctx, resourcegroup.Group{Name: "nope", RUPerSec: 1}) }, resourcegroup.ErrNotFound},
		{"alter stale", func() error { return st.AlterGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 1, Version: 1}) }, resourcegroup.ErrConflict},
		{"drop default", func() error { return st.DropGroup(ctx, "DEFAULT") }, resourcegroup.ErrInvalid},
		{"drop missing", func() error { return st.DropGroup(ctx, "nope") }, resourcegroup.ErrNotFound},
		{"bind to missing", func() error { return st.BindUser(ctx, resourcegroup.Binding{User: "u", Group: "nope"}) }, resourcegroup.ErrNotFound},
		{"get missing", func() error { _, err := st.GetGroup(ctx, "nope"); return err }, resourcegroup.ErrNotFound},
		{"no binding", func() error { _, err := st.GetBinding(ctx, "u", "%"); return err }, resourcegroup.ErrNotFound},
	}
	for _, tc := range errTests {
		if err := tc.op(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	var re *resourcegroup.Error
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 1}); !errors.As(err, &re) || re.Code != 8248 {
		t.Fatalf("8248: %v", err)
	}

	// Read-your-writes: while the Watch is held back, AlterGroup waits.
	s.rg.setHold(true)
	done := make(chan error, 1)
	go func() { done <- st.AlterGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 200}) }()
	waitFor(t, "the alter to reach the server", func() bool {
		s.rg.mu.Lock()
		defer s.rg.mu.Unlock()
		return s.rg.groups["rg1"].GetRuPerSec() == 200
	}, nil)
	time.Sleep(20 * time.Millisecond) // give a store that does not wait the chance to return
	select {
	case err := <-done:
		t.Fatalf("AlterGroup returned before the cache caught up: %v", err)
	default:
	}
	s.rg.setHold(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g, _ := c.Group("rg1"); g.RUPerSec != 200 {
		t.Fatalf("after alter: %+v", g)
	}

	// The wait is bounded: with the Watch held, a write returns after 1 s.
	s.rg.setHold(true)
	go func() { done <- st.BindUser(ctx, resourcegroup.Binding{User: "app", Host: "%", Group: "rg1"}) }()
	waitFor(t, "the bind to return", func() bool {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			return false
		}
	}, func() { clk.Advance(100 * time.Millisecond) })
	if _, ok := c.Binding("app", "%"); ok {
		t.Fatal("binding visible although the Watch was held")
	}
	s.rg.setHold(false)
	waitFor(t, "the binding in the cache", func() bool { _, ok := c.Binding("app", "%"); return ok }, nil)

	bs, err := st.ListBindings(ctx)
	if err != nil || len(bs) != 1 || bs[0] != (resourcegroup.Binding{User: "app", Host: "%", Group: "rg1"}) {
		t.Fatalf("bindings %+v %v", bs, err)
	}
	if err := st.UnbindUser(ctx, "app", "%"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetBinding(ctx, "app", "%"); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Fatalf("after unbind: %v", err)
	}
	if err := st.DropGroup(ctx, "rg1"); err != nil {
		t.Fatal(err)
	}
	gs, err := st.ListGroups(ctx)
	if err != nil || len(gs) != 1 || gs[0].Name != "default" {
		t.Fatalf("groups after drop: %+v %v", gs, err)
	}
	s.rg.mu.Lock()
	auth := append([]string(nil), s.rg.auth...)
	s.rg.mu.Unlock()
	for _, a := range auth {
		if a != "Bearer secret" {
			t.Fatalf("authorization metadata %q", a)
		}
	}
	if len(auth) == 0 {
		t.Fatal("no write reached the server")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "late", RUPerSec: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// After its server dies the Watch resumes on another replica from the last
// revision seen, and Store writes fail over to a reachable replica.
func TestWatchResumeAndStoreFailover(t *testing.T) {
	rg := newRGServer()
	s1 := startServerWith(t, rg)
	s2 := startServerWith(t, rg)
	c, clk := startClient(t, nil, s1.addr, s2.addr)
	ctx := context.Background()
	if err := c.Store().CreateGroup(ctx, resourcegroup.Group{Name: "a", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	rev := c.cache.revision()
	s1.grpcS.Stop()
	waitFor(t, "the watch to resume", func() bool {
		rg.mu.Lock()
		defer rg.mu.Unlock()
		return len(rg.after) == 2
	}, func() { clk.Advance(50 * time.Millisecond) })
	rg.mu.Lock()
	after := rg.after[1]
	rg.mu.Unlock()
	if after != rev || rev == 0 {
		t.Fatalf("resumed after revision %d, want %d", after, rev)
	}
	if err := c.Store().CreateGroup(ctx, resourcegroup.Group{Name: "b", RUPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Group("b"); !ok {
		t.Fatal("write through the second replica not visible")
	}
	if _, ok := c.Group("a"); !ok {
		t.Fatal("resume lost the cache")
	}
}
