package tokenserver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// startEtcd starts one embedded member for the test and returns a client.
func startEtcd(t *testing.T) *clientv3.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := StartEmbeddedEtcd(ctx, EmbedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// testServer is a running Server with a gRPC listener.
type testServer struct {
	srv    *Server
	addr   string
	conn   *grpc.ClientConn
	reg    *prometheus.Registry
	clock  *fakeClock
	cancel context.CancelFunc
	done   chan struct{}
}

func (ts *testServer) stop() {
	ts.cancel()
	<-ts.done
}

// testProxyToken is the proxy credential ("px", 2 streams) of a test
// server started with an admin token.
const testProxyToken = "unit-test-proxy-token"

// startServer runs a Server over cli on a fake clock; it returns once
// settings are loaded. With an admin token it authenticates every call:
// the admin token, or testProxyToken for a proxy.
func startServer(t *testing.T, cli *clientv3.Client, adminToken string) *testServer {
	t.Helper()
	return startServerWith(t, cli, adminToken, nil)
}

// startServerWith is startServer with mutate applied to the Config.
func startServerWith(t *testing.T, cli *clientv3.Client, adminToken string, mutate func(*Config)) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	clock := &fakeClock{now: t0}
	var authCfg AuthConfig
	if adminToken != "" {
		authCfg = AuthConfig{AdminToken: adminToken, ProxyTokens: []ProxyCredential{{Name: "px", Token: testProxyToken, MaxStreams: 2}}}
	}
	auth, err := NewAuthenticator(authCfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Auth:          auth,
		AdvertiseAddr: lis.Addr().String(),
		ElectionTTL:   time.Second,
		Now:           clock.Now,
		Logger:        slog.New(slog.DiscardHandler),
		Registerer:    reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	unary, stream := cfg.Auth.Interceptors()
	gs := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	srv.Register(gs)
	go gs.Serve(lis)
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, addr: lis.Addr().String(), reg: reg, clock: clock, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ts.done)
		if err := srv.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
		gs.Stop()
	}()
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ts.conn = conn
	t.Cleanup(func() {
		conn.Close()
		ts.stop()
	})
	waitFor(t, "settings loaded", func() bool {
		select {
		case <-srv.synced:
			return true
		default:
			return false
		}
	})
	return ts
}

// waitFor polls cond (a real-time wait on etcd, not on the clock under test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func codeOf(err error) codes.Code { return status.Code(err) }

func TestEtcdStoreSemantics(t *testing.T) {
	cli := startEtcd(t)
	st := NewEtcdStore(cli)
	ctx := context.Background()
	if err := st.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := st.GetGroup(ctx, "DEFAULT")
	if err != nil || d.RUPerSec != resourcegroup.Unlimited || d.Burst != resourcegroup.BurstUnlimited || d.Version == 0 {
		t.Fatalf("default = %+v, %v", d, err)
	}
	rg1 := resourcegroup.Group{Name: "RG1", RUPerSec: 500, Priority: resourcegroup.PriorityHigh,
		QueryLimit: &resourcegroup.QueryLimit{ExecElapsed: time.Minute, Action: resourcegroup.ActionKill, Watch: resourcegroup.WatchExact, WatchDuration: 10 * time.Minute}}
	tests := []struct {
		name string
		op   func() error
		want error // sentinel, nil = success
	}{
		{"create", func() error { return st.CreateGroup(ctx, rg1) }, nil},
		{"create again", func() error { return st.CreateGroup(ctx, rg1) }, resourcegroup.ErrExists},
		{"create name too long", func() error {
			return st.CreateGroup(ctx, resourcegroup.Group{Name: strings.Repeat("x", 33), RUPerSec: 1})
		}, resourcegroup.ErrInvalid},
		{"create zero rate", func() error { return st.CreateGroup(ctx, resourcegroup.Group{Name: "z"}) }, resourcegroup.ErrInvalid},
		{"alter unknown", func() error { return st.AlterGroup(ctx, resourcegroup.Group{Name: "nope", RUPerSec: 1}) }, resourcegroup.ErrNotFound},
		{"alter stale version", func() error {
			return st.AlterGroup(ctx, resourcegroup.Group{Name: "rg1", RUPerSec: 600, Version: 1})
		}, resourcegroup.ErrConflict},
		{"alter current version", func() error {
			cur, err := st.GetGroup(ctx, "rg1")
			if err != nil {
				return err
			}
			cur.RUPerSec = 800
			return st.AlterGroup(ctx, cur)
		}, nil},
		{"bind to unknown", func() error { return st.BindUser(ctx, resourcegroup.Binding{User: "app", Group: "nope"}) }, resourcegroup.ErrNotFound},
		{"bind", func() error { return st.BindUser(ctx, resourcegroup.Binding{User: "app", Host: "%", Group: "RG1"}) }, nil},
		{"drop default", func() error { return st.DropGroup(ctx, "default") }, resourcegroup.ErrInvalid},
		{"drop unknown", func() error { return st.DropGroup(ctx, "nope") }, resourcegroup.ErrNotFound},
		{"unbind none", func() error { return st.UnbindUser(ctx, "ghost", "%") }, nil},
		{"get no binding", func() error { _, err := st.GetBinding(ctx, "ghost", "%"); return err }, resourcegroup.ErrNotFound},
	}
	for _, tc := range tests {
		err := tc.op()
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	g, err := st.GetGroup(ctx, "rg1")
	if err != nil {
		t.Fatal(err)
	}
	if g.RUPerSec != 800 || g.Priority != resourcegroup.PriorityHigh || g.QueryLimit != nil {
		// AlterGroup replaces the whole definition: the altered copy had the query limit.
		if g.QueryLimit == nil || g.QueryLimit.ExecElapsed != time.Minute || g.QueryLimit.WatchDuration != 10*time.Minute {
			t.Fatalf("rg1 = %+v (limit %+v)", g, g.QueryLimit)
		}
	}
	b, err := st.GetBinding(ctx, "app", "%")
	if err != nil || b != (resourcegroup.Binding{User: "app", Host: "%", Group: "rg1"}) {
		t.Fatalf("binding = %+v, %v", b, err)
	}
	gs, err := st.ListGroups(ctx)
	if err != nil || len(gs) != 2 || gs[0].Name != "default" || gs[1].Name != "rg1" {
		t.Fatalf("list = %+v, %v", gs, err)
	}
	// Binding to default is unbinding; dropping keeps other bindings.
	if err := st.BindUser(ctx, resourcegroup.Binding{User: "app", Group: "default"}); err != nil {
		t.Fatal(err)
	}
	if bs, _ := st.ListBindings(ctx); len(bs) != 0 {
		t.Fatalf("bindings after binding to default: %+v", bs)
	}
	if err := st.DropGroup(ctx, "rg1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetGroup(ctx, "rg1"); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Fatalf("after drop: %v", err)
	}
}

func TestResourceGroupServiceStatusCodes(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "s3cret")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx := context.Background()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	proxy := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testProxyToken)

	if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}}); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("create without token: %v", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer wrong")
	if _, err := c.CreateGroup(bad, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}}); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("create with wrong token: %v", err)
	}
	tests := []struct {
		name string
		call func() error
		want codes.Code
		msg  string
	}{
		{"create", func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "Rg1", RuPerSec: 100, Burst: pb.BurstMode_BURST_MODERATED}})
			return err
		}, codes.OK, ""},
		{"create exists", func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "rg1", RuPerSec: 100}})
			return err
		}, codes.AlreadyExists, "already exists"},
		{"name over 32", func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: strings.Repeat("n", 33), RuPerSec: 1}})
			return err
		}, codes.InvalidArgument, "too long"},
		{"ru_per_sec 0", func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "z"}})
			return err
		}, codes.InvalidArgument, "RU_PER_SEC"},
		{"missing group", func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{})
			return err
		}, codes.InvalidArgument, "missing group"},
		{"get unknown", func() error {
			_, err := c.GetGroup(proxy, &pb.GetGroupRequest{Name: "nope"})
			return err
		}, codes.NotFound, "Unknown resource group 'nope'"},
		{"drop default", func() error {
			_, err := c.DropGroup(admin, &pb.DropGroupRequest{Name: "default"})
			return err
		}, codes.FailedPrecondition, "reserved"},
		{"alter stale", func() error {
			_, err := c.AlterGroup(admin, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "rg1", RuPerSec: 5, Version: 1}})
			return err
		}, codes.Aborted, "concurrently"},
		{"bind unknown group", func() error {
			_, err := c.BindUser(admin, &pb.BindUserRequest{Binding: &pb.Binding{User: "u", Group: "nope"}})
			return err
		}, codes.NotFound, "nope"},
		{"bind", func() error {
			_, err := c.BindUser(admin, &pb.BindUserRequest{Binding: &pb.Binding{User: "u", Host: "%", Group: "rg1"}})
			return err
		}, codes.OK, ""},
		{"reads need a credential", func() error {
			_, err := c.ListGroups(ctx, &pb.ListGroupsRequest{})
			return err
		}, codes.Unauthenticated, "requires authentication"},
		{"a proxy credential reads", func() error {
			_, err := c.ListBindings(proxy, &pb.ListBindingsRequest{})
			return err
		}, codes.OK, ""},
		{"a proxy credential cannot write", func() error {
			_, err := c.CreateGroup(proxy, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "px", RuPerSec: 1}})
			return err
		}, codes.PermissionDenied, "administrator"},
	}
	for _, tc := range tests {
		err := tc.call()
		if codeOf(err) != tc.want || (tc.msg != "" && !strings.Contains(status.Convert(err).Message(), tc.msg)) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
	// The proxy side rebuilds the resourcegroup error, MySQL code included.
	rgErrs := []struct {
		call     func() error
		sentinel error
		code     uint16
	}{
		{func() error {
			_, err := c.CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "rg1", RuPerSec: 1}})
			return err
		}, resourcegroup.ErrExists, resourcegroup.CodeExists},
		{func() error { _, err := c.GetGroup(proxy, &pb.GetGroupRequest{Name: "nope"}); return err }, resourcegroup.ErrNotFound, resourcegroup.CodeNotFound},
		{func() error { _, err := c.DropGroup(admin, &pb.DropGroupRequest{Name: "default"}); return err }, resourcegroup.ErrInvalid, resourcegroup.CodeUnknown},
	}
	for i, tc := range rgErrs {
		err := pb.ErrorFromStatus(tc.call())
		var rgErr *resourcegroup.Error
		if !errors.Is(err, tc.sentinel) || !errors.As(err, &rgErr) || rgErr.Code != tc.code || rgErr.State == "" {
			t.Errorf("case %d: rebuilt error %#v, want %v with code %d", i, err, tc.sentinel, tc.code)
		}
	}
	if err := status.Error(codes.Unavailable, "x"); pb.ErrorFromStatus(err) != err {
		t.Error("a plain status must come back unchanged")
	}

	got, err := c.GetGroup(proxy, &pb.GetGroupRequest{Name: "RG1"})
	if err != nil || got.Group.GetRuPerSec() != 100 || got.Group.GetBurst() != pb.BurstMode_BURST_MODERATED || got.Group.GetVersion() == 0 {
		t.Fatalf("get rg1 = %v, %v", got, err)
	}
	d, err := c.GetGroup(proxy, &pb.GetGroupRequest{Name: "default"})
	if err != nil || !d.Group.GetUnlimited() || d.Group.GetBurst() != pb.BurstMode_BURST_UNLIMITED {
		t.Fatalf("default = %v, %v", d, err)
	}
}

func TestWatchSnapshotAndResume(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Snapshot || len(snap.Events) != 2 || snap.Events[0].Group.GetName() != "a" || snap.Events[1].Group.GetName() != "default" {
		t.Fatalf("snapshot = %v", snap)
	}
	if _, err := c.BindUser(ctx, &pb.BindUserRequest{Binding: &pb.Binding{User: "u", Group: "a"}}); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Snapshot || len(ev.Events) != 1 || ev.Events[0].Binding.GetGroup() != "a" || ev.Revision <= snap.Revision {
		t.Fatalf("bind event = %v", ev)
	}
	resumeAt := ev.Revision
	// Changes made while nobody watches are delivered on resume.
	if _, err := c.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DropGroup(ctx, &pb.DropGroupRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	w2, err := c.Watch(ctx, &pb.WatchRequest{AfterRevision: resumeAt})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		r, err := w2.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if r.Snapshot {
			t.Fatalf("unexpected snapshot on resume: %v", r)
		}
		for _, e := range r.Events {
			got = append(got, e.Type.String()+" "+e.Group.GetName())
			if e.Type == pb.WatchEvent_PUT && e.Group.GetRuPerSec() != 20 {
				t.Fatalf("altered group = %v", e.Group)
			}
		}
	}
	if strings.Join(got, ",") != "PUT a,DELETE a" {
		t.Fatalf("resumed events = %v", got)
	}
	// Errors of a server stream arrive with the first Recv.
	w3, err := c.Watch(ctx, &pb.WatchRequest{AfterRevision: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w3.Recv(); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("negative revision: %v", err)
	}
}

// acquire sends one request on a stream and returns the response.
func acquire(t *testing.T, s grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse], req *pb.TokenRequest) *pb.TokenResponse {
	t.Helper()
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestAcquireTokens(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	tc := pb.NewTokenServiceClient(ts.conn)
	s, err := tc.AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The group was created a moment ago: served even before the settings
	// watch has caught up.
	resp := acquire(t, s, &pb.TokenRequest{ProxyId: "p1", RequestId: 7, Groups: []*pb.GroupTokenRequest{
		{Group: "G", TokensWanted: 50, DemandRuPerSec: 10, Consumption: &pb.Consumption{Rru: 3, Wru: 2, ReadBytes: 100, WriteBytes: 10, BackendSeconds: 0.5, Statements: 4}},
		{Group: "default", TokensWanted: 1e6},
		{Group: "missing", TokensWanted: 1},
	}})
	if resp.RequestId != 7 || len(resp.Grants) != 3 || resp.NotLeader != nil {
		t.Fatalf("resp = %v", resp)
	}
	if g := resp.Grants[0]; g.Group != "g" || g.Tokens != 50 || g.TrickleMs != 0 || g.Proxies != 1 || g.RuPerSec != 100 || g.SettingsVersion == 0 {
		t.Fatalf("grant g = %v", g)
	}
	if g := resp.Grants[1]; !g.Unlimited || g.Tokens != 1e6 {
		t.Fatalf("grant default = %v", g)
	}
	if g := resp.Grants[2]; g.Tokens != 0 || !strings.Contains(g.Error, "Unknown resource group 'missing'") {
		t.Fatalf("grant missing = %v", g)
	}
	// The bucket holds 50 now; asking 500 with demand 200 gets a trickle
	// over the trickle period (2 s) at the rate asked for (500 / 5 s).
	resp = acquire(t, s, &pb.TokenRequest{ProxyId: "p1", RequestId: 8, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 500, DemandRuPerSec: 200}}})
	if g := resp.Grants[0]; g.TrickleMs != 2000 || g.Tokens != 200 || g.FillRate != 100 {
		t.Fatalf("trickle grant = %v", g)
	}
	for _, m := range []struct {
		name string
		want float64
	}{
		{`rgserver_ru_consumed_total{resource_group="g",type="rru"}`, 3},
		{`rgserver_ru_consumed_total{resource_group="g",type="wru"}`, 2},
		{`rgserver_read_bytes_total{resource_group="g"}`, 100},
		{`rgserver_write_bytes_total{resource_group="g"}`, 10},
		{`rgserver_backend_seconds_total{resource_group="g"}`, 0.5},
		{`rgserver_statements_total{resource_group="g"}`, 4},
		{`rgserver_tokens_granted_total{resource_group="g"}`, 250},
		{`rgserver_group_ru_per_sec{resource_group="g"}`, 100},
		{`rgserver_group_clients{resource_group="g"}`, 1},
		{`rgserver_is_leader`, 1},
	} {
		if got := scrapeValue(t, ts, m.name); got != m.want {
			t.Errorf("%s = %v, want %v", m.name, got, m.want)
		}
	}
	// One observation per stream message, not per stream.
	if n := histogramCount(t, ts.reg, "rgserver_acquire_tokens_duration_seconds"); n != 2 {
		t.Errorf("histogram count %d, want 2", n)
	}

	// Malformed messages end the stream with InvalidArgument.
	bad := []struct {
		name string
		req  *pb.TokenRequest
	}{
		{"no proxy id", &pb.TokenRequest{}},
		{"negative tokens", &pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: -1}}}},
		{"duplicate group", &pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "g"}, {Group: "G"}}}},
		{"empty group", &pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{}}}},
	}
	for _, b := range bad {
		s, err := tc.AcquireTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(b.req); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); codeOf(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", b.name, err)
		}
	}
	// Changing proxy id mid-stream is malformed too.
	s2, _ := tc.AcquireTokens(ctx)
	acquire(t, s2, &pb.TokenRequest{ProxyId: "a"})
	_ = s2.Send(&pb.TokenRequest{ProxyId: "b"})
	if _, err := s2.Recv(); codeOf(err) != codes.InvalidArgument {
		t.Errorf("proxy id change: %v", err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v", err)
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("histogram %s not found", name)
	return 0
}

func TestFollowerNotLeaderAndFailover(t *testing.T) {
	cli := startEtcd(t)
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	b := startServer(t, cli, "")
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })
	if b.srv.IsLeader() || !b.srv.Ready() {
		t.Fatalf("b: leader=%v ready=%v", b.srv.IsLeader(), b.srv.Ready())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rg := pb.NewResourceGroupServiceClient(b.conn) // writes work on a follower
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100, Burst: pb.BurstMode_BURST_MODERATED}}); err != nil {
		t.Fatal(err)
	}
	// ... but a KILL rule is judged by the leader, which knows the proxies:
	// Unavailable sends the caller on to the next replica.
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: killGroup("gk", 1000)}); codeOf(err) != codes.Unavailable {
		t.Fatalf("a KILL rule through a follower: %v", err)
	}
	s, err := pb.NewTokenServiceClient(b.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp := acquire(t, s, &pb.TokenRequest{ProxyId: "p", RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 10}}})
	if resp.NotLeader == nil || resp.NotLeader.LeaderAddr != a.addr || len(resp.Grants) != 0 {
		t.Fatalf("follower answered %v", resp)
	}
	// The leader spends 600 of the 1000-token burst, persists, and hands over.
	sa, err := pb.NewTokenServiceClient(a.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp = acquire(t, sa, &pb.TokenRequest{ProxyId: "p", Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 600, DemandRuPerSec: 10}}})
	if resp.Grants[0].Tokens != 600 {
		t.Fatalf("leader grant %v", resp)
	}
	if err := a.srv.Persist(ctx); err != nil {
		t.Fatal(err)
	}
	a.srv.mu.Lock()
	oldKey, oldRev := a.srv.leaderKey, a.srv.leaderRev
	a.srv.mu.Unlock()
	a.stop()
	waitFor(t, "b leads", b.srv.IsLeader)
	resp = acquire(t, s, &pb.TokenRequest{ProxyId: "p", RequestId: 2, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 500, DemandRuPerSec: 10}}})
	if resp.NotLeader != nil {
		t.Fatalf("b still says not leader: %v", resp)
	}
	// Only 400 left in the bucket: the new leader does not hand the spent
	// burst out again, so 500 comes as a trickle.
	if g := resp.Grants[0]; g.TrickleMs == 0 {
		t.Fatalf("new leader granted %v at once; state not restored", g)
	}
	// a's fenced write, on its old election key, is refused now that b leads.
	a.srv.mu.Lock()
	a.srv.leaderKey, a.srv.leaderRev = oldKey, oldRev
	// A change to save: an idle leader writes nothing.
	if _, err := a.srv.alloc.Acquire("g", Request{ProxyID: "p", Wanted: 100}, a.clock.Now()); err != nil {
		t.Fatal(err)
	}
	a.srv.mu.Unlock()
	if err := a.srv.Persist(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("stale leader's persist: %v", err)
	}
}

func TestWatchAfterCompactionSendsSnapshot(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	c := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "a", RuPerSec: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "b", RuPerSec: 10}}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "/rg/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, &pb.WatchRequest{AfterRevision: first.Group.Version - 1})
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !r.Snapshot || len(r.Events) != 3 || r.Revision < resp.Header.Revision {
		t.Fatalf("after compaction got %v, want a snapshot of a, b, default", r)
	}
}

// Bindings an earlier version kept per user name (/rg/users/<user>) move
// to their account when a leader takes office; one already set for the
// account wins. Accounts of one user name are bound apart.
func TestBindingsPerAccountAndMigration(t *testing.T) {
	cli := startEtcd(t)
	ctx := context.Background()
	st := NewEtcdStore(cli)
	for _, g := range []string{"rg1", "rg2"} {
		if err := st.CreateGroup(ctx, resourcegroup.Group{Name: g, RUPerSec: 10}); err != nil {
			t.Fatal(err)
		}
	}
	// What an earlier rgserver wrote.
	for user, rec := range map[string]string{
		"old": `{"host":"%","group":"rg1"}`, "ip": `{"host":"10.%","group":"rg1"}`, "both": `{"host":"%","group":"rg1"}`,
	} {
		if _, err := cli.Put(ctx, keyUsers+user, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.BindUser(ctx, resourcegroup.Binding{User: "both", Host: "%", Group: "rg2"}); err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	waitFor(t, "the migration", func() bool {
		resp, err := cli.Get(ctx, keyUsers, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	for _, tc := range []struct{ user, host, group string }{{"old", "%", "rg1"}, {"ip", "10.%", "rg1"}, {"both", "%", "rg2"}} {
		if b, err := st.GetBinding(ctx, tc.user, tc.host); err != nil || b.Group != tc.group {
			t.Errorf("'%s'@'%s' after migration: %+v %v, want %s", tc.user, tc.host, b, err, tc.group)
		}
	}
	if _, err := st.GetBinding(ctx, "ip", "%"); !errors.Is(err, resourcegroup.ErrNotFound) {
		t.Errorf("'ip'@'%%' is another account than 'ip'@'10.%%': %v", err)
	}
	// Two accounts of one user name, two bindings.
	if err := st.BindUser(ctx, resourcegroup.Binding{User: "ip", Host: "%", Group: "rg2"}); err != nil {
		t.Fatal(err)
	}
	bs, err := st.ListBindings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range bs {
		got = append(got, b.Account()+"="+b.Group)
	}
	if want := "both@%=rg2 ip@%=rg2 ip@10.%=rg1 old@%=rg1"; strings.Join(got, " ") != want {
		t.Fatalf("bindings %q, want %q", strings.Join(got, " "), want)
	}
}
