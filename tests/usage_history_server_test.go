package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// TestUsageHistorySurvivesRgserverRestart: what a proxy's consumption
// reports carried is in rgserver's usage history at once, per second and
// per minute, and again after rgserver is stopped (SIGTERM: it writes
// what it has) and started over the same data directory; so is the
// chargeback the reports carried (by tag and by account).
func TestUsageHistorySurvivesRgserverRestart(t *testing.T) {
	dir := t.TempDir()
	addr, statusAddr := freeAddr(t), freeAddr(t)
	ts := &tokenServer{Addr: addr, StatusAddr: statusAddr}
	start := func() {
		ts.process = startProcess(t, "rgserver", "--addr", addr, "--status-addr", statusAddr, "--data-dir", dir, "--persist-interval", "1s")
		waitReady(t, "http://"+statusAddr+"/readyz", ts.process)
	}
	start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pb.NewResourceGroupServiceClient(dialRaw(t, addr)).CreateGroup(ctx,
		&pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "rg_usage_hist", RuPerSec: 100000}}); err != nil {
		t.Fatal(err)
	}
	stream, err := pb.NewTokenServiceClient(dialRaw(t, addr)).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := stream.Send(&pb.TokenRequest{ProxyId: "usage-hist", RequestId: uint64(i + 1), Groups: []*pb.GroupTokenRequest{{
			Group: "rg_usage_hist", TokensWanted: 10, Consumption: &pb.Consumption{Rru: 10, Wru: 2, Statements: 5, Throttled: 1,
				Refused: 1, WaitedRu: 2, DeniedRu: 3, IntervalMs: 1000, Chargeback: []*pb.ChargebackEntry{
					{TagKey: "application", TagValue: "app01", Rru: 6, Wru: 2, Statements: 3},
					{TagKey: "application", Other: true, Rru: 4, Statements: 2},
					{Account: "u1@%", Rru: 10, Wru: 2, Statements: 5}}}}}}); err != nil {
			t.Fatal(err)
		}
		if resp, err := stream.Recv(); err != nil || resp.GetGrants()[0].GetError() != "" {
			t.Fatalf("grant: %v, %v", resp, err)
		}
		time.Sleep(time.Second)
	}
	stream.CloseSend()
	from := time.Now().Add(-time.Minute).UnixMilli()
	totals := func(k uint32) (string, error) {
		resp, err := pb.NewUsageServiceClient(dialRaw(t, addr)).UsageHistory(ctx, &pb.UsageHistoryRequest{
			Groups: []string{"rg_usage_hist"}, FromUnixMs: from - time.Hour.Milliseconds(), GranularityS: k})
		if err != nil {
			return "", err
		}
		if resp.GetNotLeader() != nil {
			return "", errors.New("not the leader yet")
		}
		var rru, wru, waited, denied float64
		var stmts, thr, ref uint64
		for _, r := range resp.GetRows() {
			rru, wru, waited, denied = rru+r.GetRru(), wru+r.GetWru(), waited+r.GetWaitedRu(), denied+r.GetDeniedRu()
			stmts, thr, ref = stmts+r.GetStatements(), thr+r.GetThrottled(), ref+r.GetRefused()
		}
		out := fmt.Sprintf("rru %g wru %g statements %d throttled %d refused %d waited %g denied %g", rru, wru, stmts, thr, ref, waited, denied)
		for _, accounts := range []bool{false, true} {
			cb, err := pb.NewUsageServiceClient(dialRaw(t, addr)).Chargeback(ctx, &pb.ChargebackRequest{Accounts: accounts,
				Range: &pb.UsageHistoryRequest{Groups: []string{"rg_usage_hist"}, FromUnixMs: from - time.Hour.Milliseconds(), GranularityS: k}})
			if err != nil {
				return "", err
			}
			sums := map[string]float64{}
			for _, r := range cb.GetRows() {
				name := r.GetTagKey() + "=" + r.GetTagValue() + r.GetAccount()
				if r.GetOther() {
					name += "*"
				}
				sums[name] += r.GetUsage().GetRru() + r.GetUsage().GetWru()
			}
			out += fmt.Sprint(" ", sums)
		}
		return out, nil
	}
	want := "rru 30 wru 6 statements 15 throttled 3 refused 3 waited 6 denied 9 map[application=*:12 application=app01:24] map[=u1@%:36]"
	for _, k := range []uint32{1, 60, 3600} {
		if got, err := totals(k); err != nil || got != want {
			t.Fatalf("granularity %d: %s, %v; want %s", k, got, err, want)
		}
	}
	if err := ts.stop(10 * time.Second); err != nil {
		t.Logf("rgserver stop: %v", err)
	}
	restarted := time.Now()
	start()
	for _, k := range []uint32{1, 60, 3600} {
		for {
			got, err := totals(k)
			if err == nil && got == want {
				break
			}
			if c := status.Code(err); err != nil && c != codes.Unavailable && err.Error() != "not the leader yet" {
				t.Fatalf("granularity %d after the restart: %v", k, err)
			}
			if time.Since(restarted) > 20*time.Second {
				t.Fatalf("granularity %d after the restart: %s, %v; want %s", k, got, err, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Logf("the usage history was back %v after rgserver started again", time.Since(restarted).Round(time.Millisecond))
}
