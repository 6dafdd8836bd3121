package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeClock is the shared fake clock; the tests advance it.
type fakeClock = clock.Fake

func newFakeClock() *fakeClock { return clock.NewFake() }

// waitFor polls cond (goroutines of the client run meanwhile) and fails
// the test when it does not hold within 10 s of real time. step, when
// non-nil, runs between polls (e.g. to advance a fake clock).
func waitFor(t *testing.T, what string, cond func() bool, step func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		if step != nil {
			step()
		}
		time.Sleep(time.Millisecond) // yield to the client's goroutines
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestClient makes a Client on a fake clock that is not started.
func newTestClient(t testing.TB, mutate func(*Config)) (*Client, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	cfg := Config{Servers: []string{"127.0.0.1:1"}, ProxyID: "p1", Clock: clk, Logger: quietLogger()}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, clk
}

// tokenServer is a test double of rgserver's TokenService: it records
// every request and answers with grant (default: every ask granted in full
// at once), or NOT_LEADER when notLeader is set.
type tokenServer struct {
	tokenpb.UnimplementedTokenServiceServer
	reqs chan *tokenpb.TokenRequest

	mu        sync.Mutex
	notLeader *string
	grant     func(*tokenpb.GroupTokenRequest) *tokenpb.GroupGrant
	silent    bool // record but never answer
}

func newTokenServer() *tokenServer {
	return &tokenServer{reqs: make(chan *tokenpb.TokenRequest, 10000)}
}

func (s *tokenServer) setGrant(f func(*tokenpb.GroupTokenRequest) *tokenpb.GroupGrant) {
	s.mu.Lock()
	s.grant = f
	s.mu.Unlock()
}

func (s *tokenServer) AcquireTokens(stream tokenpb.TokenService_AcquireTokensServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		s.reqs <- req
		s.mu.Lock()
		nl, grant, silent := s.notLeader, s.grant, s.silent
		s.mu.Unlock()
		if silent {
			continue
		}
		resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
		if nl != nil {
			resp.NotLeader = &tokenpb.NotLeader{LeaderAddr: *nl}
		} else {
			for _, g := range req.GetGroups() {
				var gr *tokenpb.GroupGrant
				if grant != nil {
					gr = grant(g)
				} else {
					gr = &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), FillRate: 100, Proxies: 1, RuPerSec: 100}
				}
				gr.Group = g.GetGroup()
				resp.Grants = append(resp.Grants, gr)
			}
		}
		if err := stream.Send(resp); err != nil {
			return nil
		}
	}
}

// rgServer is a test double of rgserver's ResourceGroupService: groups and
// bindings in memory, with revisions and a Watch. While hold is set, watch
// events are queued until release.
type rgServer struct {
	tokenpb.UnimplementedResourceGroupServiceServer

	mu       sync.Mutex
	rev      int64
	groups   map[string]*tokenpb.ResourceGroup
	bindings map[string]*tokenpb.Binding
	watches  map[uint64]*tokenpb.RunawayWatch
	watchSeq uint64
	subs     map[chan *tokenpb.WatchResponse]bool
	hold     bool
	held     []*tokenpb.WatchResponse
	auth     []string // authorization metadata seen on writes
	after    []int64  // after_revision of every Watch call
}

func newRGServer() *rgServer {
	s := &rgServer{groups: map[string]*tokenpb.ResourceGroup{}, bindings: map[string]*tokenpb.Binding{},
		watches: map[uint64]*tokenpb.RunawayWatch{}, subs: map[chan *tokenpb.WatchResponse]bool{}}
	d := tokenpb.GroupToPB(resourcegroup.DefaultGroupDefinition())
	s.rev++
	d.Version = s.rev
	s.groups[d.Name] = d
	return s
}

func (s *rgServer) publishLocked(ev *tokenpb.WatchEvent) {
	resp := &tokenpb.WatchResponse{Revision: s.rev, Events: []*tokenpb.WatchEvent{ev}}
	if s.hold {
		s.held = append(s.held, resp)
		return
	}
	for ch := range s.subs {
		ch <- resp
	}
}

func (s *rgServer) setHold(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = on
	if !on {
		for _, r := range s.held {
			for ch := range s.subs {
				ch <- r
			}
		}
		s.held = nil
	}
}

func (s *rgServer) noteAuth(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.auth = append(s.auth, strings.Join(md.Get("authorization"), ","))
}

func (s *rgServer) CreateGroup(ctx context.Context, r *tokenpb.CreateGroupRequest) (*tokenpb.CreateGroupResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	g := r.GetGroup()
	if g.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "resource group name is empty")
	}
	if _, ok := s.groups[g.GetName()]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "group %q exists", g.GetName())
	}
	s.rev++
	g.Version = s.rev
	s.groups[g.GetName()] = g
	s.publishLocked(&tokenpb.WatchEvent{Group: g})
	return &tokenpb.CreateGroupResponse{Group: g}, nil
}

func (s *rgServer) AlterGroup(ctx context.Context, r *tokenpb.AlterGroupRequest) (*tokenpb.AlterGroupResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	g := r.GetGroup()
	old, ok := s.groups[g.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "group %q not found", g.GetName())
	}
	if g.GetVersion() != 0 && g.GetVersion() != old.GetVersion() {
		return nil, status.Error(codes.Aborted, "version mismatch")
	}
	s.rev++
	g.Version = s.rev
	s.groups[g.GetName()] = g
	s.publishLocked(&tokenpb.WatchEvent{Group: g})
	return &tokenpb.AlterGroupResponse{Group: g}, nil
}

func (s *rgServer) DropGroup(ctx context.Context, r *tokenpb.DropGroupRequest) (*tokenpb.DropGroupResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	if r.GetName() == "default" {
		return nil, status.Error(codes.FailedPrecondition, "can't drop reserved resource group")
	}
	if _, ok := s.groups[r.GetName()]; !ok {
		return nil, status.Errorf(codes.NotFound, "group %q not found", r.GetName())
	}
	delete(s.groups, r.GetName())
	s.rev++
	s.publishLocked(&tokenpb.WatchEvent{Type: tokenpb.WatchEvent_DELETE, Group: &tokenpb.ResourceGroup{Name: r.GetName()}})
	return &tokenpb.DropGroupResponse{}, nil
}

func (s *rgServer) BindUser(ctx context.Context, r *tokenpb.BindUserRequest) (*tokenpb.BindUserResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	b := r.GetBinding()
	if _, ok := s.groups[b.GetGroup()]; !ok {
		return nil, status.Errorf(codes.NotFound, "group %q not found", b.GetGroup())
	}
	s.rev++
	s.bindings[b.GetUser()] = b
	s.publishLocked(&tokenpb.WatchEvent{Binding: b})
	return &tokenpb.BindUserResponse{}, nil
}

func (s *rgServer) UnbindUser(ctx context.Context, r *tokenpb.UnbindUserRequest) (*tokenpb.UnbindUserResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	if _, ok := s.bindings[r.GetUser()]; ok {
		delete(s.bindings, r.GetUser())
		s.rev++
		s.publishLocked(&tokenpb.WatchEvent{Type: tokenpb.WatchEvent_DELETE, Binding: &tokenpb.Binding{User: r.GetUser()}})
	}
	return &tokenpb.UnbindUserResponse{}, nil
}

func (s *rgServer) Watch(r *tokenpb.WatchRequest, stream tokenpb.ResourceGroupService_WatchServer) error {
	ch := make(chan *tokenpb.WatchResponse, 100)
	s.mu.Lock()
	s.after = append(s.after, r.GetAfterRevision())
	snap := &tokenpb.WatchResponse{Revision: s.rev, Snapshot: true}
	names := make([]string, 0, len(s.groups))
	for n := range s.groups {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		snap.Events = append(snap.Events, &tokenpb.WatchEvent{Group: s.groups[n]})
	}
	for _, b := range s.bindings {
		snap.Events = append(snap.Events, &tokenpb.WatchEvent{Binding: b})
	}
	for _, w := range s.watches {
		snap.Events = append(snap.Events, &tokenpb.WatchEvent{Watch: w})
	}
	s.subs[ch] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}()
	if r.GetAfterRevision() == 0 { // this double keeps no history: no catch-up
		parts := []*tokenpb.WatchResponse{snap}
		if r.GetSnapshotInParts() { // one event per part, as small as parts get
			parts = nil
			for i, ev := range snap.Events {
				parts = append(parts, &tokenpb.WatchResponse{Revision: snap.Revision, Snapshot: true,
					Events: []*tokenpb.WatchEvent{ev}, More: i < len(snap.Events)-1})
			}
		}
		for _, p := range parts {
			if err := stream.Send(p); err != nil {
				return nil
			}
		}
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case resp := <-ch:
			if err := stream.Send(resp); err != nil {
				return nil
			}
		}
	}
}

// testServer is one gRPC server with both services on a local port.
type testServer struct {
	addr  string
	tok   *tokenServer
	rg    *rgServer
	grpcS *grpc.Server
}

func startServer(t *testing.T) *testServer {
	t.Helper()
	return startServerWith(t, newRGServer())
}

// startServerWith starts a server whose ResourceGroupService is rg (shared
// by replicas, as etcd is).
func startServerWith(t *testing.T, rg *rgServer) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{addr: lis.Addr().String(), tok: newTokenServer(), rg: rg, grpcS: grpc.NewServer()}
	tokenpb.RegisterTokenServiceServer(s.grpcS, s.tok)
	tokenpb.RegisterResourceGroupServiceServer(s.grpcS, s.rg)
	go func() { _ = s.grpcS.Serve(lis) }()
	t.Cleanup(s.grpcS.Stop)
	return s
}

// deadAddr returns a local address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// nextReq waits for the next request the token server records.
func (s *testServer) nextReq(t *testing.T, step func()) *tokenpb.TokenRequest {
	t.Helper()
	var got *tokenpb.TokenRequest
	waitFor(t, fmt.Sprintf("a token request at %s", s.addr), func() bool {
		select {
		case got = <-s.tok.reqs:
			return true
		default:
			return false
		}
	}, step)
	return got
}

func groupEntry(req *tokenpb.TokenRequest, name string) *tokenpb.GroupTokenRequest {
	for _, g := range req.GetGroups() {
		if g.GetGroup() == name {
			return g
		}
	}
	return nil
}

// AddWatch of the double: ids count up from 1; the same group, match and
// text return the stored entry (this double does not expire entries; tests
// delete them with expireWatch, as rgserver's lease would).
func (s *rgServer) AddWatch(ctx context.Context, r *tokenpb.AddWatchRequest) (*tokenpb.AddWatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	w := r.GetWatch()
	if w.GetText() == "" {
		return nil, status.Error(codes.InvalidArgument, "invalid runaway watch: empty SQL text or digest")
	}
	for _, old := range s.watches {
		if old.GetGroup() == w.GetGroup() && old.GetMatch() == w.GetMatch() && old.GetText() == w.GetText() {
			return &tokenpb.AddWatchResponse{Watch: old, Existing: true}, nil
		}
	}
	s.watchSeq++
	w.Id = s.watchSeq
	s.watches[w.Id] = w
	s.rev++
	s.publishLocked(&tokenpb.WatchEvent{Watch: w})
	return &tokenpb.AddWatchResponse{Watch: w}, nil
}

func (s *rgServer) RemoveWatch(ctx context.Context, r *tokenpb.RemoveWatchRequest) (*tokenpb.RemoveWatchResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteAuth(ctx)
	if !s.deleteWatchLocked(r.GetId()) {
		return nil, status.Errorf(codes.NotFound, "no runaway watch with the specific ID %d", r.GetId())
	}
	return &tokenpb.RemoveWatchResponse{}, nil
}

// expireWatch deletes a watch as rgserver's lease expiry does.
func (s *rgServer) expireWatch(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deleteWatchLocked(id)
}

func (s *rgServer) deleteWatchLocked(id uint64) bool {
	if _, ok := s.watches[id]; !ok {
		return false
	}
	delete(s.watches, id)
	s.rev++
	s.publishLocked(&tokenpb.WatchEvent{Type: tokenpb.WatchEvent_DELETE, Watch: &tokenpb.RunawayWatch{Id: id}})
	return true
}

// acquireAll pre-charges cons with its whole cost required, through the
// one way in (AcquireShare) without a purse, and returns how long it
// waited; a refusal is counted as throttled, as the policy counts it.
func acquireAll(ctx context.Context, c *Client, group string, cons ru.Consumption, maxWait time.Duration) (time.Duration, error) {
	_, waited, err := c.AcquireShare(ctx, nil, group, cons, cons.RU(), maxWait)
	if errors.Is(err, ErrThrottled) {
		c.CountThrottled(group, cons.RU())
	}
	return waited, err
}

// shareOf is group's Share as AcquireShare would return it now.
func shareOf(c *Client, group string) Share {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	return c.groups.shareLocked(resourcegroup.NormalizeName(group))
}
