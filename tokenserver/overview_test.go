package tokenserver

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The ring sums reports per second over the last 10 s: a report counts
// for exactly 10 s, whatever second it came in.
func TestRecentUsageWindow(t *testing.T) {
	var r recentUsage
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	r.add(at(0), 50, 10, 1)
	r.add(at(0.5), 50, 10, 1)
	r.add(at(4), 100, 0, 0)
	for _, tc := range []struct {
		at                  float64
		ru, stmts, throttle float64
		idle                bool
	}{
		{4, 20, 2, 0.2, false},
		{9.99, 20, 2, 0.2, false},
		{10, 10, 0, 0, false}, // the first second left the window
		{13.9, 10, 0, 0, false},
		{14, 0, 0, 0, true},
		{100, 0, 0, 0, true},
	} {
		ru, stmts, thr := r.rates(at(tc.at))
		if ru != tc.ru || stmts != tc.stmts || math.Abs(thr-tc.throttle) > 1e-6 || r.idle(at(tc.at)) != tc.idle {
			t.Errorf("at %vs: %v RU/s, %v statements/s, %v throttled/s, idle %v; want %v, %v, %v, %v",
				tc.at, ru, stmts, thr, r.idle(at(tc.at)), tc.ru, tc.stmts, tc.throttle, tc.idle)
		}
	}
	// A report timed before the newest slot (a clock step back) is not
	// put in the wrong second.
	r.add(at(200), 10, 0, 0)
	r.add(at(150), 1000, 0, 0)
	if ru, _, _ := r.rates(at(200)); ru != 1 {
		t.Errorf("after a step back: %v RU/s, want 1", ru)
	}
}

// Overview lists groups in use first, busiest first, then the others by
// name, within the limit; its rates are what proxies reported over the
// last 10 s, its totals what they reported since; a follower names the
// leader.
func TestOverview(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	rg := pb.NewResourceGroupServiceClient(a.conn)
	for _, g := range []*pb.ResourceGroup{
		{Name: "busy", RuPerSec: 100},
		{Name: "light", RuPerSec: 10, Burst: pb.BurstMode_BURST_MODERATED},
		{Name: "warned", RuPerSec: 5, Mode: 1}, // MODE WARN
		{Name: "idle2", RuPerSec: 7},
		{Name: "idle1", RuPerSec: 8},
	} {
		if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: g}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the groups", func() bool { return a.srv.Overview(100).Total == 6 })

	s, err := pb.NewTokenServiceClient(a.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acquire(t, s, &pb.TokenRequest{ProxyId: "p1", Groups: []*pb.GroupTokenRequest{
		{Group: "busy", TokensWanted: 30, Consumption: &pb.Consumption{Rru: 300, Wru: 200, Statements: 40, Throttled: 5}},
		{Group: "light", ReportOnly: true, Consumption: &pb.Consumption{Rru: 20, Statements: 10}},
		{Group: "warned", ReportOnly: true, Consumption: &pb.Consumption{Rru: 100}},
	}})
	o := a.srv.Overview(100)
	if !o.Leader || o.LeaderAddr != a.addr || o.Total != 6 || o.InUse != 3 || o.TokenStreams != 1 || o.Insecure != true {
		t.Fatalf("overview: leader %v %q, %d groups, %d in use, %d token streams, insecure %v",
			o.Leader, o.LeaderAddr, o.Total, o.InUse, o.TokenStreams, o.Insecure)
	}
	var names []string
	for _, g := range o.Groups {
		names = append(names, g.Name)
	}
	if want := "[busy warned light default idle1 idle2]"; fmt.Sprint(names) != want {
		t.Fatalf("order %v, want %s", names, want)
	}
	busy := o.Groups[0]
	if !busy.Limited || busy.Tokens != 70 || busy.Capacity != 100 || busy.Proxies != 1 ||
		busy.RUPerSec != 50 || busy.StatementsPerSec != 4 || busy.ThrottledPerSec != 0.5 ||
		busy.RU != 500 || busy.Statements != 40 || busy.Throttled != 5 {
		t.Fatalf("busy: %+v", busy)
	}
	if w := o.Groups[1]; w.Limited || w.Proxies != 1 || w.RUPerSec != 10 {
		t.Fatalf("warned (MODE WARN is never throttled): %+v", w)
	}
	if l := o.Groups[2]; l.Capacity != 100 || l.Tokens != 100 || l.StatementsPerSec != 1 {
		t.Fatalf("light (BURSTABLE: 10 s of its rate): %+v", l)
	}
	// Ten seconds later the rates are gone, the totals stay, and the
	// groups are still in use while their proxy holds its slot.
	a.clock.Advance(10 * time.Second)
	o = a.srv.Overview(2)
	if len(o.Groups) != 2 || o.Groups[0].RUPerSec != 0 || o.Groups[0].Name != "busy" || o.Groups[0].RU != 500 || o.InUse != 3 {
		t.Fatalf("10 s later, limit 2: %+v", o.Groups)
	}
	// Once the slots expire and nothing is reported, the group is idle
	// and its ring is given back.
	a.clock.Advance(time.Minute)
	a.srv.mu.Lock()
	a.srv.alloc.Expire(a.clock.Now())
	ring := a.srv.alloc.Group("busy").recent
	a.srv.mu.Unlock()
	if ring != nil {
		t.Fatal("an idle group with no slot kept its ring")
	}
	if o = a.srv.Overview(100); o.InUse != 0 || o.Groups[0].Name != "busy" || o.Groups[0].Throttled != 5 {
		t.Fatalf("after expiry: %d in use, %+v", o.InUse, o.Groups[0])
	}

	// A follower knows the groups and names the leader; it hears no
	// reports.
	b := startServer(t, cli, "")
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })
	waitFor(t, "b's groups", func() bool { return b.srv.Overview(100).Total == 6 })
	if o := b.srv.Overview(100); o.Leader || o.LeaderAddr != a.addr || o.InUse != 0 {
		t.Fatalf("follower: leader %v %q, %d in use", o.Leader, o.LeaderAddr, o.InUse)
	}
}
