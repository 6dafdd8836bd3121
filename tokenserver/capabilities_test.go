package tokenserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

func killGroup(name string, elapsedMs int64) *pb.ResourceGroup {
	return &pb.ResourceGroup{Name: name, RuPerSec: 100,
		QueryLimit: &pb.QueryLimit{ExecElapsedMs: elapsedMs, Action: pb.Action_ACTION_KILL}}
}

// TestKillRuleNeedsEveryLiveProxy: a QUERY_LIMIT ACTION = KILL is refused
// with FailedPrecondition, naming the proxies, while a live token stream
// says (or does not say) it cannot kill; accepted once they are gone. A
// new leader judges only after its capability window.
func TestKillRuleNeedsEveryLiveProxy(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leadership", ts.srv.IsLeader)
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Within the window the leader waits (here: until the call's deadline).
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := rg.CreateGroup(short, &pb.CreateGroupRequest{Group: killGroup("early", 1000)})
	cancelShort()
	if c := codeOf(err); c != codes.DeadlineExceeded && c != codes.Canceled {
		t.Fatalf("KILL rule within the new leader's window: %v", err)
	}
	// A rule that does not kill is not judged.
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "dry", RuPerSec: 1,
		QueryLimit: &pb.QueryLimit{ExecElapsedMs: 1000, Action: pb.Action_ACTION_DRYRUN}}}); err != nil {
		t.Fatal(err)
	}
	ts.clock.Advance(DefaultCapabilityWindow)

	tc := pb.NewTokenServiceClient(ts.conn)
	open := func(id string, caps *pb.ProxyCapabilities) context.CancelFunc {
		sctx, scancel := context.WithCancel(ctx)
		s, err := tc.AcquireTokens(sctx)
		if err != nil {
			t.Fatal(err)
		}
		acquire(t, s, &pb.TokenRequest{ProxyId: id, RequestId: 1, Capabilities: caps})
		return scancel
	}
	closeA := open("host-a:4000", &pb.ProxyCapabilities{CanKill: false, Instance: "10.0.0.1:4000\x00\n", Version: "v1"})
	closeB := open("host-b:4000", &pb.ProxyCapabilities{CanKill: true, Instance: "10.0.0.2:4000"})
	closeC := open("host-c:4000", nil)
	waitFor(t, "three streams", func() bool { _, _, live := ts.srv.caps.withoutKill(); return live == 3 })
	if got := gaugeOf(t, ts, "rgserver_proxies_without_kill").value(); got != 2 {
		t.Fatalf("rgserver_proxies_without_kill = %v, want 2", got)
	}

	_, err = rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: killGroup("k", 1000)})
	msg := status.Convert(err).Message()
	if codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("KILL rule with proxies that cannot kill: %v", err)
	}
	for _, want := range []string{"'k'", "2 of 3 live", "10.0.0.1:4000 (proxy id host-a:4000)", "host-c:4000", "did not say", "--admin-user"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal lacks %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "host-b") || strings.ContainsAny(msg, "\x00\n") {
		t.Errorf("refusal names a capable proxy or carries control bytes: %q", msg)
	}
	t.Logf("refusal: %s", msg)

	closeA()
	closeC()
	waitFor(t, "streams ended", func() bool { _, _, live := ts.srv.caps.withoutKill(); return live == 1 })
	if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: killGroup("k", 1000)}); err != nil {
		t.Fatalf("KILL rule with every proxy able to kill: %v", err)
	}

	// An incapable proxy joins: an ALTER that keeps the rule passes, one
	// that changes it is judged again.
	defer open("host-d:4000", &pb.ProxyCapabilities{Instance: "10.0.0.4:4000"})()
	waitFor(t, "a new stream", func() bool { _, _, live := ts.srv.caps.withoutKill(); return live == 2 })
	g := killGroup("k", 1000)
	g.RuPerSec = 200
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: g}); err != nil {
		t.Fatalf("ALTER keeping the KILL rule: %v", err)
	}
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: killGroup("k", 2000)}); codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("ALTER changing the KILL rule: %v", err)
	}
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: killGroup("dry", 1000)}); codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("ALTER making a rule KILL: %v", err)
	}
	closeB()
}

// gaugeOf reads an unlabelled gauge of the test server's registry.
func gaugeOf(t *testing.T, ts *testServer, name string) *gaugeReader {
	t.Helper()
	return &gaugeReader{t: t, ts: ts, name: name}
}

// gaugeReader reads one gauge when asked.
type gaugeReader struct {
	t    *testing.T
	ts   *testServer
	name string
}

func (g *gaugeReader) value() float64 {
	mfs, err := g.ts.reg.Gather()
	if err != nil {
		g.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == g.name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	g.t.Fatalf("no gauge %s", g.name)
	return 0
}

func TestCapsRegistryBoundedAndValidated(t *testing.T) {
	r := newCapsRegistry()
	var removes []func()
	for i := range maxCapEntries + 2 {
		_, rm := r.add(proxyCaps{slot: fmt.Sprint("p", i), canKill: true})
		removes = append(removes, rm)
	}
	if got := r.countWithoutKill(); got != 2 {
		t.Fatalf("streams beyond the bound count as unable to kill: %v, want 2", got)
	}
	for _, rm := range removes {
		rm()
	}
	if got := r.countWithoutKill(); got != 0 || len(r.entries) != 0 {
		t.Fatalf("after every stream ended: %v, %d entries", got, len(r.entries))
	}
	// A proxy that restarted with --admin-user under the same id while
	// its old stream lingers counts as able to kill.
	_, rm1 := r.add(proxyCaps{slot: "same"})
	update, rm2 := r.add(proxyCaps{slot: "same"})
	if got := r.countWithoutKill(); got != 1 {
		t.Fatalf("two streams of one proxy: %v, want 1", got)
	}
	update(proxyCaps{slot: "same", canKill: true})
	if got := r.countWithoutKill(); got != 0 {
		t.Fatalf("after the newer stream said it can kill: %v", got)
	}
	rm1()
	rm2()

	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"10.0.0.1:4000", 256, "10.0.0.1:4000"},
		{"a\x00b\nc\x1b[31m", 256, "abc[31m"},
		{strings.Repeat("é", 200), 256, strings.Repeat("é", 128)},
	}
	for _, tc := range tests {
		if got := printable(tc.in, tc.max); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	c := capsFromPB(Principal{Name: "cred"}, "id", &pb.ProxyCapabilities{Instance: strings.Repeat("x", 1000), Version: strings.Repeat("v", 1000)})
	if len(c.instance) != maxInstanceLen || len(c.version) != maxVersionLen || c.slot != "cred/id" || !c.declared {
		t.Fatalf("capsFromPB: %+v", c)
	}
}
