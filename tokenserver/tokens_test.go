package tokenserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// TestAcquireTokensBindsProxyIDsToCredentials: over gRPC, the proxy
// credential "px" (2 streams) holds at most 2 proxy ids; fake ids are
// refused while both stream, a new one replaces one whose stream ended,
// and the group never counts more than 2 proxies of px.
func TestAcquireTokensBindsProxyIDsToCredentials(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "s3cret")
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	admin := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret")
	proxy := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testProxyToken)
	if _, err := pb.NewResourceGroupServiceClient(ts.conn).CreateGroup(admin, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 100}}); err != nil {
		t.Fatal(err)
	}
	tc := pb.NewTokenServiceClient(ts.conn)
	type stream = grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse]
	open := func(sctx context.Context, id string) (stream, *pb.TokenResponse, error) {
		t.Helper()
		s, err := tc.AcquireTokens(sctx)
		if err != nil {
			t.Fatal(err)
		}
		// Send finds a refused stream already ended (io.EOF) when the
		// refusal came first; Recv has the call's status either way.
		_ = s.Send(&pb.TokenRequest{ProxyId: id, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 1, DemandRuPerSec: 1}}})
		resp, err := s.Recv()
		return s, resp, err
	}
	clients := func() int {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return ts.srv.alloc.Proxies("g")
	}

	if _, _, err := open(ctx, "anonymous"); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("no credential: %v", err)
	}
	actx, acancel := context.WithCancel(proxy)
	a, _, err := open(actx, "a")
	if err != nil {
		t.Fatal(err)
	}
	// b shares a's credential: the two ids, neither running statements,
	// take one place of MAX_CONCURRENCY (alloc.go, concurrencyDivisor).
	b, resp, err := open(proxy, "b")
	if err != nil || resp.Grants[0].Proxies != 1 || clients() != 2 {
		t.Fatalf("b: %v, %v; %d slots", resp, err, clients())
	}
	for i := range 30 {
		if _, _, err := open(proxy, fmt.Sprintf("fake-%d", i)); codeOf(err) != codes.ResourceExhausted {
			t.Fatalf("fake id %d: %v", i, err)
		}
	}
	if n := clients(); n != 2 {
		t.Fatalf("%d proxies in g after 30 fake ids, want 2", n)
	}
	// The admin credential is not bounded.
	if _, resp, err := open(admin, "ops"); err != nil || resp.Grants[0].Proxies != 2 || clients() != 3 {
		t.Fatalf("admin: %v, %v; %d slots", resp, err, clients())
	}
	// a's stream ends: a new id takes its place, and a's slot goes at once.
	acancel()
	_, _ = a.Recv()
	waitFor(t, "a's stream to end", func() bool {
		_, resp, err := open(proxy, "c")
		return err == nil && resp.Grants[0].Proxies == 2 && clients() == 3
	})
	ts.srv.mu.Lock()
	_, aLeft := ts.srv.alloc.Group("g").slots["px/a"]
	ts.srv.mu.Unlock()
	if aLeft {
		t.Fatal("a's slot survived its replacement")
	}
	// (c may have been refused while a's stream was still ending.)
	if got := scrapeValue(t, ts, `rgserver_auth_refused_total{reason="stream_limit"}`); got < 30 {
		t.Errorf("stream_limit refusals = %v, want at least 30", got)
	}
	// An id that comes back on a new stream takes itself over; the old
	// stream ends at its next message.
	if _, _, err := open(proxy, "b"); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(&pb.TokenRequest{ProxyId: "b"}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(); codeOf(err) != codes.Aborted {
		t.Fatalf("the replaced stream: %v, want Aborted", err)
	}
	// Watch streams: 2 proxies, and one more for a reconnect.
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	for i := range 4 {
		w, err := rg.Watch(proxy, &pb.WatchRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Recv()
		if want := i < 3; (err == nil) != want || (!want && codeOf(err) != codes.ResourceExhausted) {
			t.Fatalf("watch %d: %v", i, err)
		}
	}
	for range 4 {
		w, err := rg.Watch(admin, &pb.WatchRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if err != nil {
			t.Fatalf("the admin credential is not bounded: %v", err)
		}
	}
}

// TestUnknownGroupsBounded: unknown names are read from etcd at most
// unknownLookupBurst at once per stream (then unknownLookupRate a second),
// a name etcd does not hold is remembered for missTTL, and neither a cached
// nor a limited name is ever answered NOT_FOUND; a group created a moment
// after it was found missing is not refused as missing.
func TestUnknownGroupsBounded(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(names ...string) []*pb.GroupGrant {
		req := &pb.TokenRequest{ProxyId: "p"}
		for _, n := range names {
			req.Groups = append(req.Groups, &pb.GroupTokenRequest{Group: n, TokensWanted: 1})
		}
		return acquire(t, s, req).Grants
	}
	var names []string
	for i := range 200 {
		names = append(names, fmt.Sprintf("nope%d", i))
	}
	count := func(gs []*pb.GroupGrant) (notFound, unavailable int) {
		for _, g := range gs {
			switch g.ErrorCode {
			case pb.GrantError_GRANT_ERROR_NOT_FOUND:
				notFound++
			case pb.GrantError_GRANT_ERROR_UNAVAILABLE:
				unavailable++
			}
		}
		return
	}
	if nf, un := count(ask(names...)); nf != unknownLookupBurst || un != 200-unknownLookupBurst {
		t.Fatalf("first message: %d not found, %d unavailable", nf, un)
	}
	// Same names, same instant: the first 64 from the cache, the rest
	// still over the limit.
	if nf, un := count(ask(names...)); nf != 0 || un != 200 {
		t.Fatalf("second message: %d not found, %d unavailable", nf, un)
	}
	if got := scrapeValue(t, ts, `rgserver_unknown_groups_refused_total{reason="cached"}`); got != unknownLookupBurst {
		t.Errorf("cached = %v", got)
	}
	if got := scrapeValue(t, ts, `rgserver_unknown_groups_refused_total{reason="rate_limited"}`); got != 2*(200-unknownLookupBurst) {
		t.Errorf("rate_limited = %v", got)
	}
	// A second later the stream may read unknownLookupRate more.
	ts.clock.Advance(time.Second)
	if nf, _ := count(ask(names[100:]...)); nf != unknownLookupRate {
		t.Fatalf("a second later: %d read, want %d", nf, unknownLookupRate)
	}
	// Found missing, then created: never NOT_FOUND from the cache.
	ts.clock.Advance(10 * time.Second)
	if nf, _ := count(ask("late")); nf != 1 {
		t.Fatal("late should be missing")
	}
	if _, err := pb.NewResourceGroupServiceClient(ts.conn).CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "late", RuPerSec: 5}}); err != nil {
		t.Fatal(err)
	}
	if g := ask("late")[0]; g.ErrorCode == pb.GrantError_GRANT_ERROR_NOT_FOUND {
		t.Fatalf("a group created a moment ago was refused as missing: %v", g)
	}
	waitFor(t, "the settings watch to serve late", func() bool {
		g := ask("late")[0]
		return g.Error == "" && g.RuPerSec == 5
	})
}
