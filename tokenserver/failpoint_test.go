package tokenserver

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/internal/fptest"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

const fpPkg = "github.com/rgproxy/rgproxy/tokenserver/"

// needFailpoints skips a test unless `make test-failpoints` compiled the
// markers in; there it must run.
func needFailpoints(t *testing.T) { fptest.Need(t, fpPkg, failpointsCompiledIn) }

func enable(t *testing.T, name, term string) { fptest.Enable(t, fpPkg, name, term) }

// wantInjected checks that err has code and names the injected fault.
func wantInjected(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if codeOf(err) != code || !strings.Contains(status.Convert(err).Message(), "injected") {
		t.Fatalf("%s: got %v, want %v naming the injected fault", what, err, code)
	}
}

// storedGroups counts the groups named name in a ListGroups answer and
// returns the RU/s of the last.
func storedGroup(t *testing.T, ctx context.Context, rg pb.ResourceGroupServiceClient, name string) (n int, ruPerSec uint64) {
	t.Helper()
	resp, err := rg.ListGroups(ctx, &pb.ListGroupsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range resp.GetGroups() {
		if g.GetName() == name {
			n++
			ruPerSec = g.GetRuPerSec()
		}
	}
	return n, ruPerSec
}

// A group write that fails reports Unavailable and leaves nothing behind:
// the retry creates the group once, and a failed alter keeps the old value.
func TestFailpointEtcdWriteError(t *testing.T) {
	needFailpoints(t)
	ts := startServer(t, startEtcd(t), "")
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	enable(t, "etcdWriteError", "return(true)")
	create := &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}
	_, err := rg.CreateGroup(ctx, create)
	wantInjected(t, "create", err, codes.Unavailable)
	if n, _ := storedGroup(t, ctx, rg, "g"); n != 0 {
		t.Fatalf("failed create left %d groups", n)
	}
	failpoint.Disable(fpPkg + "etcdWriteError")
	if _, err := rg.CreateGroup(ctx, create); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if _, err := rg.CreateGroup(ctx, create); codeOf(err) != codes.AlreadyExists {
		t.Fatalf("second create: %v", err)
	}
	if n, ru := storedGroup(t, ctx, rg, "g"); n != 1 || ru != 100 {
		t.Fatalf("after retry: %d groups at %d RU/s", n, ru)
	}

	enable(t, "etcdWriteError", "return(true)")
	_, err = rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 500}})
	wantInjected(t, "alter", err, codes.Unavailable)
	if n, ru := storedGroup(t, ctx, rg, "g"); n != 1 || ru != 100 {
		t.Fatalf("after failed alter: %d groups at %d RU/s", n, ru)
	}
}

// An alter that loses its compare-and-swap once is retried when it asked
// for no particular version, and reported as Aborted when it did: no
// write is lost or applied behind the caller's back.
func TestFailpointEtcdTxnConflict(t *testing.T) {
	needFailpoints(t)
	ts := startServer(t, startEtcd(t), "")
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}

	enable(t, "etcdTxnConflict", "1*return(true)")
	resp, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 200}})
	if err != nil {
		t.Fatalf("unversioned alter after one conflict: %v", err)
	}
	if _, ru := storedGroup(t, ctx, rg, "g"); ru != 200 {
		t.Fatalf("stored %d RU/s, want 200", ru)
	}

	version := resp.GetGroup().GetVersion()
	enable(t, "etcdTxnConflict", "1*return(true)")
	_, err = rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 300, Version: version}})
	if codeOf(err) != codes.Aborted {
		t.Fatalf("versioned alter after a conflict: %v, want Aborted", err)
	}
	if _, ru := storedGroup(t, ctx, rg, "g"); ru != 200 {
		t.Fatalf("aborted alter stored %d RU/s", ru)
	}
	// The caller re-reads and tries again; the fault was one-shot.
	got, err := rg.GetGroup(ctx, &pb.GetGroupRequest{Name: "g"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 300, Version: got.GetGroup().GetVersion()}}); err != nil {
		t.Fatalf("retry with the read version: %v", err)
	}
	if _, ru := storedGroup(t, ctx, rg, "g"); ru != 300 {
		t.Fatalf("stored %d RU/s, want 300", ru)
	}
}

// Reads that fail report Unavailable; tokens are still granted from the
// settings the server already holds.
func TestFailpointEtcdReadError(t *testing.T) {
	needFailpoints(t)
	ts := startServer(t, startEtcd(t), "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := func(id uint64) *pb.TokenRequest {
		return &pb.TokenRequest{ProxyId: "p", RequestId: id, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 10, DemandRuPerSec: 10}}}
	}
	if r := acquire(t, s, req(1)); len(r.Grants) != 1 || r.Grants[0].Tokens != 10 {
		t.Fatalf("before the fault: %v", r)
	}

	enable(t, "etcdReadError", "return(true)")
	_, err = rg.GetGroup(ctx, &pb.GetGroupRequest{Name: "g"})
	wantInjected(t, "get", err, codes.Unavailable)
	_, err = rg.ListGroups(ctx, &pb.ListGroupsRequest{})
	wantInjected(t, "list", err, codes.Unavailable)
	if r := acquire(t, s, req(2)); len(r.Grants) != 1 || r.Grants[0].Tokens != 10 || r.Grants[0].RuPerSec != 100 {
		t.Fatalf("during the fault: %v", r)
	}

	failpoint.Disable(fpPkg + "etcdReadError")
	if n, ru := storedGroup(t, ctx, rg, "g"); n != 1 || ru != 100 {
		t.Fatalf("after the fault: %d groups at %d RU/s", n, ru)
	}
}

// A failed persist keeps the leader leading and granting; the next
// persist saves the buckets.
func TestFailpointPersistError(t *testing.T) {
	needFailpoints(t)
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := func(id uint64) *pb.TokenRequest {
		return &pb.TokenRequest{ProxyId: "p", RequestId: id, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 10, DemandRuPerSec: 10}}}
	}
	acquire(t, s, req(1))

	enable(t, "persistError", "return(true)")
	if err := ts.srv.Persist(ctx); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("persist under the fault: %v", err)
	}
	if r := acquire(t, s, req(2)); !ts.srv.IsLeader() || len(r.Grants) != 1 || r.Grants[0].Tokens != 10 {
		t.Fatalf("after a failed persist: leader=%v %v", ts.srv.IsLeader(), r)
	}
	if resp, err := cli.Get(ctx, stateKey("g")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("failed persist wrote %v (%v)", resp, err)
	}

	failpoint.Disable(fpPkg + "persistError")
	if err := ts.srv.Persist(ctx); err != nil {
		t.Fatalf("persist after the fault: %v", err)
	}
	if resp, err := cli.Get(ctx, stateKey("g")); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("state of g after persist: %v (%v)", resp, err)
	}
}

// A failing campaign keeps the server a follower; it retries, and leads
// once the fault is gone.
func TestFailpointCampaignError(t *testing.T) {
	needFailpoints(t)
	retried := make(chan error, 16)
	if err := failpoint.EnableCall(fpPkg+"electionRetry", func(err error) {
		select {
		case retried <- err:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { failpoint.Disable(fpPkg + "electionRetry") })
	enable(t, "campaignError", "return(true)")
	ts := startServer(t, startEtcd(t), "")
	select {
	case err := <-retried:
		if !strings.Contains(err.Error(), "injected") {
			t.Fatalf("election failed with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no failed campaign seen")
	}
	if ts.srv.IsLeader() {
		t.Fatal("leads although every campaign fails")
	}
	failpoint.Disable(fpPkg + "campaignError")
	waitFor(t, "leadership after failed campaigns", ts.srv.IsLeader)
}

// A leader whose resign fails on shutdown still hands over: its session's
// lease is revoked, and the other replica leads.
func TestFailpointResignError(t *testing.T) {
	needFailpoints(t)
	cli := startEtcd(t)
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	b := startServer(t, cli, "")
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })
	enable(t, "resignError", "return(true)")
	a.stop()
	waitFor(t, "b leads after a's failed resign", b.srv.IsLeader)
}

// A passing etcd error must not lift a quota (issue 15): while the leader
// cannot read a group it does not know yet (its settings watch lags, etcd
// reads fail), it answers GRANT_ERROR_UNAVAILABLE, and a proxy keeps the
// group limited (refilled locally at RU_PER_SEC) instead of dropping it,
// which would send its statements to the unlimited `default`.
func TestFailpointEtcdReadErrorKeepsGroupLimited(t *testing.T) {
	needFailpoints(t)
	ts := startServerWith(t, startEtcd(t), "", func(c *Config) { c.Now = time.Now })
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := startProxy(t, ctx, ts)

	enable(t, "settingsWatchLag", "return(5000)")
	enable(t, "etcdReadError", "return(true)")
	const rate = 10
	if err := c.Store().CreateGroup(ctx, resourcegroup.Group{Name: "lim", RUPerSec: rate}); err != nil {
		t.Fatal(err)
	}
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g := acquire(t, s, groupsRequest("probe", 1, []string{"lim"}, 1)).Grants[0]; g.GetErrorCode() != pb.GrantError_GRANT_ERROR_UNAVAILABLE {
		t.Fatalf("the leader answered %v, want GRANT_ERROR_UNAVAILABLE", g)
	}

	// Statements of the group, as fast as they are let through, for 3 s.
	const window = 3 * time.Second
	var ok, throttled, unknown atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(window)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				_, _, err := c.AcquireShare(ctx, nil, "lim", ru.Consumption{RRU: 1, Statements: 1}, 1, 50*time.Millisecond)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, tokenclient.ErrThrottled):
					throttled.Add(1)
				case errors.Is(err, tokenclient.ErrUnknownGroup):
					unknown.Add(1)
				default:
					t.Errorf("AcquireShare: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("while the group could not be read: %d statements ran, %d throttled, %d sent to default", ok.Load(), throttled.Load(), unknown.Load())
	if unknown.Load() != 0 {
		t.Fatalf("%d statements were told the group is unknown (they would run unlimited in default)", unknown.Load())
	}
	// The local refill: RU_PER_SEC × the window plus one second's burst.
	if limit := int64(rate*window.Seconds() + rate + 2); ok.Load() > limit || ok.Load() == 0 || throttled.Load() == 0 {
		t.Fatalf("%d statements ran in %v at %d RU/s (at most %d), %d throttled", ok.Load(), window, rate, limit, throttled.Load())
	}

	// Once etcd answers, the group is served by rgserver again.
	failpoint.Disable(fpPkg + "etcdReadError")
	failpoint.Disable(fpPkg + "settingsWatchLag")
	// The group's series are born when rgserver reads it: until then the
	// series is absent, not yet a failure (the proxy's local tokens may
	// already let a statement through).
	waitFor(t, "rgserver to serve the group", func() bool {
		_, _, err := c.AcquireShare(ctx, nil, "lim", ru.Consumption{RRU: 1, Statements: 1}, 1, time.Second)
		return err == nil && scrape(t, ts)[`rgserver_tokens_granted_total{resource_group="lim"}`] > 0
	})
}
