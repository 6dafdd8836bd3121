package tests

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// A proxy credential speaks only for itself (issue 29, item 4): a raw
// gRPC client holding only a proxy token plays the attacker against a
// real rgserver with a proxy token file; another credential plays the
// honest proxy, speaking the protocol as rgproxy does.

// createGroup creates a group with the admin token.
func (s *authedServer) createGroup(t *testing.T, name string, ruPerSec uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pb.NewResourceGroupServiceClient(dialRaw(t, s.Addr)).CreateGroup(as(ctx, s.adminToken),
		&pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: name, RuPerSec: ruPerSec}})
	if err != nil {
		t.Fatalf("create group %s: %v", name, err)
	}
}

// digestN is the n-th made-up 16-hex-digit digest.
func digestN(n int) string { return fmt.Sprintf("%016x", n) }

// TestMadeUpRunawayEventsLeaveRealRows: 10,000 made-up runaway events of
// one credential in a group leave another proxy's 5 real rows, events of
// a group that does not exist are not kept, and the attacker cannot
// record as the honest proxy's instance.
func TestMadeUpRunawayEventsLeaveRealRows(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1", "evil evil-token-0123456789abc 1")
	s.createGroup(t, "cred_hist", 100)
	conn := dialRaw(t, s.Addr)
	rw := pb.NewRunawayServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	event := func(group string, n int) *pb.RunawayEvent {
		return &pb.RunawayEvent{ResourceGroup: group, TimeUnixMs: time.Now().UnixMilli(), Account: "app@%",
			SqlDigest: digestN(n), SampleSql: "SELECT SLEEP(?)", MatchType: "IDENTIFY", Action: "DRYRUN", Rule: "ELAPSED = 1s"}
	}
	var real []*pb.RunawayEvent
	for i := range 5 {
		real = append(real, event("cred_hist", i))
	}
	if r, err := rw.RecordRunaways(as(ctx, s.proxyTokens["honest"]), &pb.RecordRunawaysRequest{Instance: "honest:4000", Events: real}); err != nil || r.GetAccepted() != 5 {
		t.Fatalf("the honest proxy's 5 events: %v, %v", r, err)
	}
	evil := as(ctx, s.proxyTokens["evil"])
	start := time.Now()
	accepted := 0
	for b := range 10 {
		var batch []*pb.RunawayEvent
		for i := range 1000 {
			batch = append(batch, event("cred_hist", 1000+b*1000+i))
		}
		r, err := rw.RecordRunaways(evil, &pb.RecordRunawaysRequest{Instance: "evil:4000", Events: batch})
		if err != nil {
			t.Fatalf("made-up events, batch %d: %v", b, err)
		}
		accepted += int(r.GetAccepted())
	}
	flood := time.Since(start)
	var ghost []*pb.RunawayEvent
	for i := range 100 {
		ghost = append(ghost, event("cred_no_such_group", i))
	}
	time.Sleep(200 * time.Millisecond) // the event rate refills (200 events at 1,000/s)
	r, err := rw.RecordRunaways(evil, &pb.RecordRunawaysRequest{Instance: "evil:4000", Events: ghost})
	if err != nil {
		t.Fatal(err)
	}
	ghostKept := r.GetAccepted()
	_, spoofErr := rw.RecordRunaways(evil, &pb.RecordRunawaysRequest{Instance: "honest:4000", Events: []*pb.RunawayEvent{event("cred_hist", 99)}})

	list, err := rw.ListRunaways(as(ctx, s.adminToken), &pb.ListRunawaysRequest{Groups: []string{"cred_hist"}})
	if err != nil {
		t.Fatal(err)
	}
	realRows, fake := 0, 0
	for _, row := range list.GetRows() {
		if row.GetInstance() == "honest:4000" {
			realRows++
		} else {
			fake++
		}
	}
	refused := metricSum(t, s.StatusAddr, "rgserver_credential_refused_total", `credential="evil"`)
	t.Logf("10,000 made-up events in %v: %d accepted; the group holds %d real rows of 5 and %d made-up; "+
		"events of a group that does not exist kept: %d of 100; recording as the honest instance: %v; refused for evil: %.0f",
		flood, accepted, realRows, fake, ghostKept, status.Code(spoofErr), refused)
	if realRows != 5 {
		t.Errorf("the flood left %d of the group's 5 real rows", realRows)
	}
	if ghostKept != 0 {
		t.Errorf("%d events of a group that does not exist were kept", ghostKept)
	}
	if status.Code(spoofErr) != codes.PermissionDenied {
		t.Errorf("recording as another credential's instance: %v, want PermissionDenied", spoofErr)
	}
	if accepted >= 10_000 || refused == 0 {
		t.Errorf("the credential's event rate did not hold: %d of 10,000 accepted, %.0f refused", accepted, refused)
	}
}

// TestHugeConsumptionReportBoundedByGrant: a proxy credential that was
// granted a few tokens reports 1e12 RU, 1e10 statements and 1e10
// throttled: rgserver_ru_consumed_total stays within what it was granted
// plus its debt and degraded-mode allowance, and the rest is counted
// dropped for the credential.
func TestHugeConsumptionReportBoundedByGrant(t *testing.T) {
	s := startAuthedServer(t, "evil evil-token-0123456789abc 1")
	const rate = 100
	s.createGroup(t, "cred_cons", rate)
	conn := dialRaw(t, s.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := pb.NewTokenServiceClient(conn).AcquireTokens(as(ctx, s.proxyTokens["evil"]))
	if err != nil {
		t.Fatal(err)
	}
	send := func(req *pb.TokenRequest) *pb.TokenResponse {
		t.Helper()
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	send(&pb.TokenRequest{ProxyId: "e1", RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "cred_cons", TokensWanted: 10}}})
	for i := range 3 {
		send(&pb.TokenRequest{ProxyId: "e1", RequestId: uint64(2 + i), Groups: []*pb.GroupTokenRequest{{Group: "cred_cons", ReportOnly: true,
			Consumption: &pb.Consumption{Rru: 1e12, Wru: 1e12, Statements: 1e10, Throttled: 1e10, ReadBytes: 1e15}}}})
	}
	group := `resource_group="cred_cons"`
	consumed := metricSum(t, s.StatusAddr, "rgserver_ru_consumed_total", group)
	stmts := metricSum(t, s.StatusAddr, "rgserver_statements_total", group)
	throttled := metricSum(t, s.StatusAddr, "rgserver_throttled_total", group)
	granted := metricSum(t, s.StatusAddr, "rgserver_credential_granted_ru_total", `credential="evil"`)
	dropped := metricSum(t, s.StatusAddr, "rgserver_credential_dropped_total", `credential="evil"`, `what="ru"`)
	// Granted, one awayWindow (60 s) of the rate and the capacity for
	// degraded mode, ten seconds of the rate of debt.
	bound := granted + 60*rate + rate + 10*rate
	t.Logf("after 3 reports of 2e12 RU: rgserver_ru_consumed_total %.0f (granted %.1f, bound %.0f), dropped %.3g RU; statements %.0f, throttled %.0f (reported 3e10 each)",
		consumed, granted, bound, dropped, stmts, throttled)
	if consumed > bound+1e-6 {
		t.Errorf("consumed %.0f RU, beyond the granted bound %.0f", consumed, bound)
	}
	if dropped < 5e12 {
		t.Errorf("dropped %.3g RU of 6e12 beyond the bound", dropped)
	}
	// countRate 100,000/s per stream for 60 s at most.
	if stmts > 6.1e6 || throttled > 6.1e6 {
		t.Errorf("statements %.0f, throttled %.0f: beyond the credential's count bound", stmts, throttled)
	}
}

// inspectAnswerer opens an AcquireTokens stream and an Inspect stream as
// instance under token; it answers every request with rows. It returns
// the hello's outcome (nil when the stream was taken) and a stop.
func inspectAnswerer(t *testing.T, addr, token, proxyID, instance string, rows []*pb.StatementSummaryRow) (helloErr error, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(as(context.Background(), token))
	conn := dialRaw(t, addr)
	ts, err := pb.NewTokenServiceClient(conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ts.Send(&pb.TokenRequest{ProxyId: proxyID, RequestId: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Recv(); err != nil {
		t.Fatal(err)
	}
	is, err := pb.NewInspectServiceClient(conn).Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Send(&pb.InspectReply{Hello: &pb.InspectHello{ProxyId: proxyID, Instance: instance}}); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		once := false
		for {
			req, err := is.Recv()
			if !once {
				first <- err
				once = true
			}
			if err != nil {
				return
			}
			if is.Send(&pb.InspectReply{RequestId: req.GetRequestId(), Statements: rows}) != nil {
				return
			}
		}
	}()
	// A refused hello ends the stream at once; a taken one waits for a
	// request: take "no answer within a second" as taken.
	select {
	case helloErr = <-first:
	case <-time.After(time.Second):
	}
	return helloErr, func() { cancel(); <-done }
}

// TestProxyCannotAnswerAsAnotherInstance: a proxy credential's Inspect
// stream may not name an instance another credential's stream answers
// as, and its rows of groups that do not exist or claiming 1e15
// executions are not shown in cluster_statements_summary.
func TestProxyCannotAnswerAsAnotherInstance(t *testing.T) {
	s := startAuthedServer(t, "honest honest-token-0123456789 1", "evil evil-token-0123456789abc 2")
	s.createGroup(t, "cred_view", 100)
	row := func(group string, exec uint64, digest int) *pb.StatementSummaryRow {
		return &pb.StatementSummaryRow{ResourceGroup: group, Digest: digestN(digest), DigestText: "SELECT ?", ExecCount: exec,
			SumLatencyNs: 3000, MaxLatencyNs: 1000, AvgRru: 1, MaxRru: 1, FirstSeenUnixMs: 1, LastSeenUnixMs: 2}
	}
	err, stopHonest := inspectAnswerer(t, s.Addr, s.proxyTokens["honest"], "h1", "honest:4000", []*pb.StatementSummaryRow{row("cred_view", 3, 1)})
	defer stopHonest()
	if err != nil {
		t.Fatalf("the honest proxy's inspect stream: %v", err)
	}
	spoofErr, stopSpoof := inspectAnswerer(t, s.Addr, s.proxyTokens["evil"], "e1", "honest:4000",
		[]*pb.StatementSummaryRow{row("cred_view", 1e15, 2)})
	defer stopSpoof()
	ownErr, stopOwn := inspectAnswerer(t, s.Addr, s.proxyTokens["evil"], "e2", "evil:4000",
		[]*pb.StatementSummaryRow{row("cred_view", 1e15, 3), row("cred_no_such_group", 1, 4), row("cred_view", 1, 5)})
	defer stopOwn()
	if ownErr != nil {
		t.Fatalf("the attacker's stream as its own instance: %v", ownErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := pb.NewInspectServiceClient(dialRaw(t, s.Addr)).ClusterInspect(as(ctx, s.adminToken),
		&pb.ClusterInspectRequest{Kind: pb.InspectKind_INSPECT_KIND_STATEMENTS_SUMMARY, AllGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	var maxExec uint64
	honestRows := 0
	for _, in := range resp.GetInstances() {
		for _, r := range in.GetStatements() {
			seen = append(seen, fmt.Sprintf("%s/%s/%d", in.GetInstance(), r.GetResourceGroup(), r.GetExecCount()))
			maxExec = max(maxExec, r.GetExecCount())
			if in.GetInstance() == "honest:4000" {
				honestRows++
			}
		}
	}
	droppedRows := metricSum(t, s.StatusAddr, "rgserver_credential_dropped_total", `credential="evil"`, `what="cluster_view_rows"`)
	t.Logf("answering as the honest instance: %v; cluster_statements_summary rows: %v (largest EXEC_COUNT %d); evil's rows dropped: %.0f",
		status.Code(spoofErr), seen, maxExec, droppedRows)
	if status.Code(spoofErr) != codes.PermissionDenied {
		t.Errorf("answering as another credential's instance: %v, want PermissionDenied", spoofErr)
	}
	if honestRows != 1 {
		t.Errorf("%d rows under the honest instance, want its 1", honestRows)
	}
	if maxExec >= 1e15 || len(seen) != 2 {
		t.Errorf("rows shown %v: want the honest row and the attacker's one plausible row", seen)
	}
}

// TestRevokeProxyCredentialBySIGHUP: taking a credential out of
// --proxy-token-file and sending SIGHUP ends its running stream with
// PermissionDenied and refuses its token from then on, without a
// restart; the other credentials' streams go on and a credential added
// to the file is taken.
func TestRevokeProxyCredentialBySIGHUP(t *testing.T) {
	s := startAuthedServer(t, "keep keep-token-0123456789abc 1", "leak leak-token-0123456789abc 1")
	s.createGroup(t, "cred_rev", 100)
	conn := dialRaw(t, s.Addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	open := func(token, id string) grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse] {
		st, err := pb.NewTokenServiceClient(conn).AcquireTokens(as(ctx, token))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.TokenRequest{ProxyId: id, RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "cred_rev", TokensWanted: 1}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("%s's first grant: %v", id, err)
		}
		return st
	}
	keep, leak := open(s.proxyTokens["keep"], "k1"), open(s.proxyTokens["leak"], "l1")
	leakEnded := make(chan error, 1)
	go func() {
		_, err := leak.Recv() // the leaked credential's stream sends nothing more
		leakEnded <- err
	}()
	if err := os.WriteFile(s.proxyFile, []byte("keep keep-token-0123456789abc 1\nnew new-token-0123456789abcd 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if err := s.process.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var endErr error
	select {
	case endErr = <-leakEnded:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked credential's stream still runs 10 s after SIGHUP")
	}
	took := time.Since(revoked)
	_, afterErr := pb.NewResourceGroupServiceClient(conn).ListGroups(as(ctx, s.proxyTokens["leak"]), &pb.ListGroupsRequest{})
	if err := keep.Send(&pb.TokenRequest{ProxyId: "k1", RequestId: 2, Groups: []*pb.GroupTokenRequest{{Group: "cred_rev", TokensWanted: 1}}}); err != nil {
		t.Fatal(err)
	}
	_, keepErr := keep.Recv()
	_, newErr := pb.NewResourceGroupServiceClient(conn).ListGroups(as(ctx, "new-token-0123456789abcd"), &pb.ListGroupsRequest{})
	t.Logf("revoked stream ended %v after SIGHUP with %v; its token then: %v; the kept stream: %v; the new credential: %v",
		took.Round(time.Millisecond), endErr, status.Code(afterErr), keepErr, newErr)
	if status.Code(endErr) != codes.PermissionDenied || !strings.Contains(endErr.Error(), "revoked") {
		t.Errorf("the revoked stream ended with %v, want PermissionDenied saying it was revoked", endErr)
	}
	if status.Code(afterErr) != codes.Unauthenticated {
		t.Errorf("the revoked token afterwards: %v, want Unauthenticated", afterErr)
	}
	if keepErr != nil || newErr != nil {
		t.Errorf("the kept credential's stream: %v; the added credential: %v", keepErr, newErr)
	}
	if !strings.Contains(s.process.log.String(), "revoked=leak") {
		t.Errorf("rgserver's log does not name the revoked credential:\n%s", s.process.log.String())
	}
}
