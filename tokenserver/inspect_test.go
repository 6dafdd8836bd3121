package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/internal/clock"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// fakeProxy plays one proxy of the hub: it answers each request from its
// queue with rows unless it is silent; it counts what it answered. It
// stops, and the test waits for it, when the test ends.
func fakeProxy(t *testing.T, c *inspectConn, silent bool, rows int) *atomic.Int32 {
	t.Helper()
	var answered atomic.Int32
	stop, done := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			var req *pb.InspectRequest
			select {
			case <-stop:
				return
			case req = <-c.queue:
			}
			if silent {
				continue
			}
			r := &pb.InspectReply{RequestId: req.GetRequestId()}
			for i := range rows {
				r.Usage = append(r.Usage, &pb.GroupUsageRow{ResourceGroup: fmt.Sprintf("g%d", i), RuPerSecLast_10S: float64(i)})
				r.Statements = append(r.Statements, &pb.StatementSummaryRow{ResourceGroup: fmt.Sprintf("g%d", i), Digest: "00ff", DigestText: "SELECT ?", ExecCount: 1})
			}
			c.deliver(r)
			answered.Add(1)
		}
	}()
	return &answered
}

// runInspect starts hub.inspect in the background.
func runInspect(h *inspectHub, ctx context.Context, req *pb.ClusterInspectRequest) chan inspectResult {
	out := make(chan inspectResult, 1)
	go func() {
		keep, err := validateClusterInspect(req)
		if err != nil {
			out <- inspectResult{err: err}
			return
		}
		resp, err := h.inspect(ctx, req, keep)
		out <- inspectResult{resp, err}
	}()
	return out
}

type inspectResult struct {
	resp *pb.ClusterInspectResponse
	err  error
}

// waitTimers waits until the fake clock holds n timers (the calls wait).
func waitTimers(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d timers", n), func() bool { return clk.Pending() >= n })
}

var usageAll = &pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true}

// TestInspectFanOut: every stream is asked; the answer holds the replies
// that came before the deadline, sorted by instance; a silent proxy is
// named unanswered when the deadline passes, and holds nothing after:
// its late reply is dropped. A stream that ends is unanswered at once.
func TestInspectFanOut(t *testing.T) {
	clk := clock.NewFake()
	h := newInspectHub(clk)
	a, b, silent := h.add("px/a", "10.0.0.2:4000"), h.add("px/b", "10.0.0.1:4000"), h.add("px/c", "10.0.0.3:4000")
	na, nb := fakeProxy(t, a, false, 2), fakeProxy(t, b, false, 1)
	fakeProxy(t, silent, true, 0)
	res := runInspect(h, context.Background(), usageAll)
	waitFor(t, "the two replies", func() bool { return na.Load() == 1 && nb.Load() == 1 && silent.pendingLen() == 1 })
	select {
	case r := <-res:
		t.Fatalf("answered before the deadline without the silent proxy: %v", r)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(inspectWait)
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := len(r.resp.GetInstances()); n != 2 || r.resp.Instances[0].GetInstance() != "10.0.0.1:4000" ||
		len(r.resp.Instances[0].GetUsage()) != 1 || len(r.resp.Instances[1].GetUsage()) != 2 || len(r.resp.Instances[1].GetStatements()) != 0 {
		t.Fatalf("instances %v", r.resp.GetInstances())
	}
	if fmt.Sprint(r.resp.GetUnanswered()) != "[10.0.0.3:4000]" {
		t.Fatalf("unanswered %v", r.resp.GetUnanswered())
	}
	if silent.pendingLen() != 0 {
		t.Fatal("the silent proxy's pending request outlived the call")
	}
	silent.deliver(&pb.InspectReply{RequestId: 1, Usage: []*pb.GroupUsageRow{{ResourceGroup: "late"}}}) // dropped
	if got := testutil.ToFloat64(h.unanswered); got != 1 {
		t.Fatalf("rgserver_cluster_inspect_unanswered_total %v", got)
	}

	// A stream that ends while asked: unanswered at once, no deadline.
	res = runInspect(h, context.Background(), usageAll)
	waitFor(t, "the request on the silent stream", func() bool { return silent.pendingLen() == 1 })
	h.remove(silent)
	r = <-res
	if r.err != nil || len(r.resp.GetInstances()) != 2 || fmt.Sprint(r.resp.GetUnanswered()) != "[10.0.0.3:4000]" {
		t.Fatalf("after the silent stream ended: %v, %v", r.resp, r.err)
	}
	// It is gone from the next views.
	r = <-runInspect(h, context.Background(), usageAll)
	if len(r.resp.GetInstances()) != 2 || len(r.resp.GetUnanswered()) != 0 {
		t.Fatalf("after removal: %v", r.resp)
	}
}

func (c *inspectConn) pendingLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// TestInspectBounds: a stream that does not read is not asked once its
// queue is full; calls beyond maxInspectCalls wait for a place until
// their deadline; a newer stream of the same key supersedes the old one.
func TestInspectBounds(t *testing.T) {
	clk := clock.NewFake()
	h := newInspectHub(clk)
	stuck := h.add("px/stuck", "stuck:1") // nobody reads its queue
	quiet := h.add("px/quiet", "quiet:1")
	fakeProxy(t, quiet, true, 0)
	var calls []chan inspectResult
	for i := range maxInspectCalls {
		calls = append(calls, runInspect(h, context.Background(), usageAll))
		waitTimers(t, clk, i+1)
	}
	// The queue held inspectQueue requests; the 5th call is over the
	// limit and waits for a place until its deadline (made to come first).
	h.wait = inspectWait / 2
	extra := runInspect(h, context.Background(), usageAll)
	waitTimers(t, clk, maxInspectCalls+1)
	if len(stuck.queue) != inspectQueue {
		t.Fatalf("stuck queue %d", len(stuck.queue))
	}
	clk.Advance(inspectWait / 2)
	if r := <-extra; !errors.Is(r.err, errInspectBusy) {
		t.Fatalf("a call beyond %d at once: %v", maxInspectCalls, r.err)
	}
	h.wait = inspectWait
	clk.Advance(inspectWait / 2)
	for _, c := range calls {
		r := <-c
		if r.err != nil || fmt.Sprint(r.resp.GetUnanswered()) != "[quiet:1 stuck:1]" {
			t.Fatalf("call: %v, %v", r.resp, r.err)
		}
	}
	// The queue is full: the next call does not wait for stuck.
	res := runInspect(h, context.Background(), usageAll)
	waitTimers(t, clk, 1)
	clk.Advance(inspectWait)
	if r := <-res; r.err != nil || fmt.Sprint(r.resp.GetUnanswered()) != "[quiet:1 stuck:1]" || stuck.pendingLen() != 0 {
		t.Fatalf("with a full queue: %v, %v, %d pending", r.resp, r.err, stuck.pendingLen())
	}

	newer := h.add("px/quiet", "quiet:2")
	select {
	case <-quiet.superseded:
	default:
		t.Fatal("a newer stream of the same key should supersede the old one")
	}
	h.remove(quiet) // the old stream's end does not remove the newer one
	h.mu.Lock()
	cur := h.streams["px/quiet"]
	h.mu.Unlock()
	if cur != newer {
		t.Fatal("the superseded stream's end removed its successor")
	}

	// A caller's deadline shorter than the wait: the wait is cut to it.
	ctx, cancel := context.WithTimeout(context.Background(), inspectMargin/2)
	defer cancel()
	if _, err := h.inspect(ctx, usageAll, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a deadline within the margin: %v", err)
	}
}

// TestInspectTrim: what a proxy sends is cut to the call's budget (in
// its order, truncated set), rows of the other kind, of groups not asked
// for, or with values no proxy sends are dropped.
func TestInspectTrim(t *testing.T) {
	good := func(g string) *pb.StatementSummaryRow {
		return &pb.StatementSummaryRow{ResourceGroup: g, Digest: "0123456789abcdef", DigestText: "SELECT ?", ExecCount: 2, AvgRru: 1, MaxRru: 1}
	}
	bad := []*pb.StatementSummaryRow{
		{ResourceGroup: "", Digest: "00"},
		{ResourceGroup: strings.Repeat("x", 33), Digest: "00"},
		{ResourceGroup: "a", Digest: "0123456789abcdef0"},
		{ResourceGroup: "a", Digest: "zz"},
		{ResourceGroup: "a", Digest: "00", DigestText: strings.Repeat("x", maxDigestTextLen+1)},
		{ResourceGroup: "a", Digest: "00", DigestText: "\xff"},
		{ResourceGroup: "a", Digest: "00", AvgRru: math.NaN()},
		{ResourceGroup: "a", Digest: "00", MaxWru: math.Inf(1)},
		{ResourceGroup: "a", Digest: "00", EstimatedRu: -1},
		{ResourceGroup: "a", Digest: "00", SumLatencyNs: -1},
		{ResourceGroup: "a", Digest: "00", AvgRru: 2, MaxRru: 1},
		{ResourceGroup: "a", Digest: "00", ExecCount: 1e15},
		{ResourceGroup: "a", Digest: "00", MaxWru: 1e13, AvgWru: 1},
		{ResourceGroup: "a", Digest: "00", FirstSeenUnixMs: 2, LastSeenUnixMs: 1},
	}
	for i, r := range bad {
		if validSummaryRow(r) == nil {
			t.Errorf("bad row %d accepted: %v", i, r)
		}
	}
	reply := &pb.InspectReply{RequestId: 1, Usage: []*pb.GroupUsageRow{{ResourceGroup: "a"}}}
	reply.Statements = append(reply.Statements, bad...)
	for i := range 100 {
		reply.Statements = append(reply.Statements, good(fmt.Sprintf("g%d", i%3)))
	}
	one := proto.Size(good("g0")) + 4
	call := &inspectCall{kind: pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, budget: 10 * one}
	out := call.trim("i:1", reply, nil, nil)
	if len(out.GetStatements()) != 10 || !out.GetTruncated() || len(out.GetUsage()) != 0 || out.GetInstance() != "i:1" {
		t.Fatalf("trimmed to %d rows (truncated %v, %d usage)", len(out.GetStatements()), out.GetTruncated(), len(out.GetUsage()))
	}
	call = &inspectCall{kind: pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, budget: 1 << 20, keep: map[string]bool{"g1": true}}
	out = call.trim("i:1", reply, nil, nil)
	for _, r := range out.GetStatements() {
		if r.GetResourceGroup() != "g1" {
			t.Fatalf("a row of %s kept", r.GetResourceGroup())
		}
	}
	if len(out.GetStatements()) != 33 || out.GetTruncated() {
		t.Fatalf("g1 rows %d (truncated %v)", len(out.GetStatements()), out.GetTruncated())
	}
	for _, u := range []*pb.GroupUsageRow{{ResourceGroup: "a", RuPerSecLast_10S: -1}, {ResourceGroup: "a", TokensLeft: math.Inf(-1)},
		{ResourceGroup: "a", CpuSource: "'; DROP"}, {ResourceGroup: ""}} {
		if validUsageRow(u) == nil {
			t.Errorf("bad usage row accepted: %v", u)
		}
	}
	if err := validUsageRow(&pb.GroupUsageRow{ResourceGroup: "a", TokensLeft: -5, CpuSource: "proc"}); err != nil {
		t.Errorf("debt refused: %v", err)
	}
}

func TestValidateClusterInspect(t *testing.T) {
	many := make([]string, maxInspectGroups+1)
	for i := range many {
		many[i] = fmt.Sprintf("g%d", i)
	}
	tests := []struct {
		req *pb.ClusterInspectRequest
		err string
	}{
		{usageAll, ""},
		{&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, Groups: []string{"a", "b"}}, ""},
		{&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY}, ""}, // no group at all
		{&pb.ClusterInspectRequest{AllGroups: true}, "unknown kind"},
		{&pb.ClusterInspectRequest{Kind: 9, AllGroups: true}, "unknown kind"},
		{&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, AllGroups: true, Groups: []string{"a"}}, "all_groups with groups"},
		{&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, Groups: many}, "at most"},
		{&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_USAGE, Groups: []string{""}}, "groups[0]"},
	}
	for _, tc := range tests {
		_, err := validateClusterInspect(tc.req)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%v: %v, want %q", tc.req, err, tc.err)
		}
	}
	for _, h := range []*pb.InspectReply{{}, {Hello: &pb.InspectHello{Instance: "x:1"}}, {Hello: &pb.InspectHello{ProxyId: "p"}},
		{Hello: &pb.InspectHello{ProxyId: "p", Instance: strings.Repeat("x", maxInstanceLen+1)}},
		{Hello: &pb.InspectHello{ProxyId: strings.Repeat("p", maxProxyIDLen+1), Instance: "x:1"}}} {
		if validateHello(h) == nil {
			t.Errorf("hello accepted: %v", h)
		}
	}
}

// TestInspectService: the gRPC services over a real server: a follower
// says NOT_LEADER on both; the leader serves a proxy's stream (its id
// bound by an AcquireTokens stream first) and its view; the stream's end
// removes the proxy from the view.
func TestInspectService(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "admin-token-0123456789")
	waitFor(t, "leadership", ts.srv.IsLeader)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	px := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+testProxyToken)
	insp := pb.NewInspectServiceClient(ts.conn)

	hello := func(st pb.InspectService_InspectClient, id string) {
		t.Helper()
		if err := st.Send(&pb.InspectReply{Hello: &pb.InspectHello{ProxyId: id, Instance: id + ":4000"}}); err != nil {
			t.Fatal(err)
		}
	}
	// No token stream for the id yet: refused.
	st, err := insp.Inspect(px)
	if err != nil {
		t.Fatal(err)
	}
	hello(st, "p1")
	if _, err := st.Recv(); codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("inspect without a token stream: %v", err)
	}
	tok, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(px)
	if err != nil {
		t.Fatal(err)
	}
	if err := tok.Send(&pb.TokenRequest{ProxyId: "p1", Groups: []*pb.GroupTokenRequest{{Group: "default", ReportOnly: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Recv(); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(px)
	st, err = insp.Inspect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	hello(st, "p1")
	go func() { // the proxy: answer every request
		for {
			req, err := st.Recv()
			if err != nil {
				return
			}
			_ = st.Send(&pb.InspectReply{RequestId: req.GetRequestId(), Usage: []*pb.GroupUsageRow{{ResourceGroup: "default", Throttled: 7}}})
		}
	}()
	var resp *pb.ClusterInspectResponse
	waitFor(t, "the proxy in the view", func() bool {
		resp, err = insp.ClusterInspect(px, usageAll)
		return err == nil && len(resp.GetInstances()) == 1
	})
	if u := resp.Instances[0]; u.GetInstance() != "p1:4000" || len(u.GetUsage()) != 1 || u.Usage[0].GetThrottled() != 7 {
		t.Fatalf("view %v", resp)
	}
	gauge := func() string {
		mfs, err := ts.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "rgserver_inspect_streams" {
				return fmt.Sprint(mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
		return "absent"
	}
	if g := gauge(); g != "1" {
		t.Fatalf("rgserver_inspect_streams = %s while one proxy streams", g)
	}
	if n, err := testutil.GatherAndCount(ts.reg, "rgserver_cluster_inspect_duration_seconds", "rgserver_cluster_inspect_unanswered_total"); err != nil || n != 2 {
		t.Fatalf("cluster inspect metrics: %d, %v", n, err)
	}
	scancel()
	waitFor(t, "the stream's end", func() bool {
		resp, err = insp.ClusterInspect(px, usageAll)
		return err == nil && len(resp.GetInstances()) == 0 && len(resp.GetUnanswered()) == 0
	})
	if g := gauge(); g != "0" {
		t.Fatalf("rgserver_inspect_streams = %s after the stream ended", g)
	}

	// A follower: NOT_LEADER on both RPCs, naming the leader it knows.
	// The election's observer still runs and may report this server's own
	// key (still in etcd) after the store below: either address is right.
	ts.srv.stepDown()
	addr := "leader:3379"
	ts.srv.leaderAddr.Store(&addr)
	known := func(got string) bool { return got == addr || got == ts.srv.cfg.AdvertiseAddr }
	resp, err = insp.ClusterInspect(px, usageAll)
	if err != nil || !known(resp.GetNotLeader().GetLeaderAddr()) {
		t.Fatalf("ClusterInspect on a follower: %v, %v", resp, err)
	}
	st, err = insp.Inspect(px)
	if err != nil {
		t.Fatal(err)
	}
	req, err := st.Recv()
	if err != nil || !known(req.GetNotLeader().GetLeaderAddr()) {
		t.Fatalf("Inspect on a follower: %v, %v", req, err)
	}
}

// TestRegistryStreams: an Inspect stream may speak for a proxy id only
// while it streams tokens under the same credential; unbounded callers
// (administrators, no authentication) for any.
func TestRegistryStreams(t *testing.T) {
	r := newProxyRegistry(time.Minute)
	px := Principal{Name: "px", Role: RoleProxy, MaxStreams: 2}
	other := Principal{Name: "other", Role: RoleProxy, MaxStreams: 2}
	if r.streams(px, "a") {
		t.Fatal("an id with no token stream")
	}
	_, _, release, err := r.bind(px, "a", at(0))
	if err != nil {
		t.Fatal(err)
	}
	if !r.streams(px, "a") || r.streams(other, "a") || r.streams(px, "b") {
		t.Fatal("only px's own streaming id")
	}
	release(at(1))
	if r.streams(px, "a") {
		t.Fatal("an id whose token stream ended")
	}
	if !r.streams(Principal{Role: RoleAdmin}, "anything") {
		t.Fatal("an unbounded caller")
	}
}
