package tokenserver

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// logBuffer is a goroutine-safe log sink.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServiceLimitFollowsEtcdAcrossLeaders: the flag's limit until SQL
// stores one; SetServiceLimit is an admin call, bounded; every replica
// follows the stored limit, the leader's answers say it is in force (an
// unlimited group is then throttled), a new leader starts with it, and
// the groups' RU_PER_SEC above it are logged.
func TestServiceLimitFollowsEtcdAcrossLeaders(t *testing.T) {
	cli := startEtcd(t)
	var logs logBuffer
	withLimit := func(c *Config) {
		c.ServiceLimit = 500
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}
	a := startServerWith(t, cli, "s3cret", withLimit)
	waitFor(t, "a leads", a.srv.IsLeader)
	b := startServerWith(t, cli, "s3cret", withLimit)
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	px := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testProxyToken)
	rgB := pb.NewResourceGroupServiceClient(b.conn)

	got, err := rgB.GetServiceLimit(px, &pb.GetServiceLimitRequest{})
	if err != nil || got.RuPerSec != 500 || !got.FromFlag {
		t.Fatalf("the flag's limit: %v, %v", got, err)
	}
	if _, err := rgB.SetServiceLimit(px, &pb.SetServiceLimitRequest{RuPerSec: 100}); codeOf(err) != codes.PermissionDenied {
		t.Errorf("a proxy credential set the limit: %v", err)
	}
	if _, err := rgB.SetServiceLimit(admin, &pb.SetServiceLimitRequest{RuPerSec: resourcegroup.MaxRU + 1}); codeOf(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "SERVICE LIMIT") {
		t.Errorf("beyond MaxRU: %v", err)
	}
	for _, g := range []*pb.ResourceGroup{
		{Name: "g1", RuPerSec: 400, Priority: pb.Priority_PRIORITY_HIGH},
		{Name: "g2", RuPerSec: 300},
	} {
		if _, err := rgB.CreateGroup(admin, &pb.CreateGroupRequest{Group: g}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the leader warns of RU_PER_SEC above the limit", func() bool {
		return strings.Contains(logs.String(), "add up to more than the service limit")
	})

	// Stored through the follower; both replicas follow etcd.
	if _, err := rgB.SetServiceLimit(admin, &pb.SetServiceLimitRequest{RuPerSec: 1000}); err != nil {
		t.Fatal(err)
	}
	limitOf := func(ts *testServer) float64 {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return ts.srv.alloc.ServiceLimit().Limit
	}
	waitFor(t, "both replicas hold 1000", func() bool { return limitOf(a) == 1000 && limitOf(b) == 1000 })
	if got, err := pb.NewResourceGroupServiceClient(a.conn).GetServiceLimit(px, &pb.GetServiceLimitRequest{}); err != nil ||
		got.RuPerSec != 1000 || got.FromFlag || got.RuPerSecSum != 700 {
		t.Errorf("GetServiceLimit after SQL: %v, %v", got, err)
	}

	ask := func(ts *testServer, id uint64) *pb.TokenResponse {
		t.Helper()
		s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(px)
		if err != nil {
			t.Fatal(err)
		}
		return acquire(t, s, &pb.TokenRequest{ProxyId: "p", RequestId: id, Groups: []*pb.GroupTokenRequest{
			{Group: resourcegroup.DefaultGroup, TokensWanted: 100000, DemandRuPerSec: 20000}}})
	}
	resp := ask(a, 1)
	if !resp.ServiceLimited || resp.Grants[0].Unlimited || resp.Grants[0].FillRate > 1000 {
		t.Errorf("under the limit, default (UNLIMITED) was granted %v", resp)
	}
	if v := plainGauge(t, a, "rgserver_service_limit_ru_per_second"); v != 1000 {
		t.Errorf("rgserver_service_limit_ru_per_second = %v", v)
	}

	a.stop()
	waitFor(t, "b leads", b.srv.IsLeader)
	if resp := ask(b, 2); !resp.ServiceLimited || resp.Grants[0].Unlimited {
		t.Errorf("the new leader forgot the limit: %v", resp)
	}
	if _, err := rgB.SetServiceLimit(admin, &pb.SetServiceLimitRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "UNLIMITED reaches b", func() bool { return limitOf(b) == 0 })
	if resp := ask(b, 3); resp.ServiceLimited || !resp.Grants[0].Unlimited {
		t.Errorf("the limit lifted (over the flag's 500), default was granted %v", resp)
	}
}

// plainGauge reads an unlabelled gauge from ts's registry.
func plainGauge(t *testing.T, ts *testServer, name string) float64 {
	t.Helper()
	fams, err := ts.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
