package tokenserver

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/ru"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// A slot's rates follow what each message reports over the time since
// the proxy's previous one: steady reports read steady whatever their
// spacing, a slot's first message counts over a report period, and a
// proxy silent beyond a report period fades out.
func TestSlotRates(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	rate := func(s *slot, now float64) float64 { return s.reported(at(now), rateRU) }
	near := func(a, b float64) bool { return math.Abs(a-b) <= 0.01*math.Max(1, math.Abs(b)) }

	// 20 RU/s reported every 5 s (report-only), or every 0.1 s (asking).
	for _, every := range []float64{5, 0.1} {
		var s slot
		for tm := 0.0; tm <= 30; tm += every {
			s.report(at(tm), [numRates]float64{20 * every, 2 * every, 0})
		}
		if r := rate(&s, 30); !near(r, 20) || !near(s.reported(at(30), rateStatements), 2) {
			t.Errorf("every %vs: %v RU/s, want 20", every, r)
		}
	}
	// A first message counts over a report period.
	var s slot
	s.report(at(0), [numRates]float64{50, 0, 5})
	if r := rate(&s, 0); r != 10 || s.reported(at(0), rateThrottled) != 1 {
		t.Fatalf("first report: %v RU/s, want 10", r)
	}
	// A load that stops: the next report covers less, then silence.
	for tm := 5.0; tm <= 20; tm += 5 {
		s.report(at(tm), [numRates]float64{50, 0, 0})
	}
	s.report(at(25), [numRates]float64{10, 0, 0}) // 1 s of load in the last 5 s
	if r := rate(&s, 25); !(r < 10 && r > 2) {
		t.Fatalf("after the load stopped: %v RU/s", r)
	}
	if r := rate(&s, 31); r != rate(&s, 25) {
		t.Fatalf("within a report period and a second: %v, want %v", r, rate(&s, 25))
	}
	if r := rate(&s, 41); !(r < 0.01*rate(&s, 25)) {
		t.Fatalf("after 16 s of silence: %v RU/s", r)
	}
	// Many small reports add up to what one report of their sum reads.
	var a, b slot
	a.report(at(0), [numRates]float64{})
	b.report(at(0), [numRates]float64{})
	for i := 1; i <= 100; i++ {
		a.report(at(float64(i)*0.001), [numRates]float64{1, 0, 0})
	}
	b.report(at(0.1), [numRates]float64{100, 0, 0})
	if ra, rb := rate(&a, 0.1), rate(&b, 0.1); !near(ra, rb) {
		t.Fatalf("100 reports of 1 RU read %v RU/s, one of 100 RU %v", ra, rb)
	}
}

// Overview lists groups in use first, busiest first, then the others by
// name, within the limit; its rates follow what proxies report, its
// totals add it up; a follower names the leader.
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
	// A slot's first message counts over a report period (5 s).
	busy := o.Groups[0]
	if !busy.Limited || busy.Tokens != 70 || busy.Capacity != 100 || busy.Proxies != 1 ||
		busy.RUPerSec != 100 || busy.StatementsPerSec != 8 || busy.ThrottledPerSec != 1 ||
		busy.RU != 500 || busy.Statements != 40 || busy.Throttled != 5 {
		t.Fatalf("busy: %+v", busy)
	}
	if w := o.Groups[1]; w.Limited || w.Proxies != 1 || w.RUPerSec != 20 {
		t.Fatalf("warned (MODE WARN is never throttled): %+v", w)
	}
	if l := o.Groups[2]; l.Capacity != 100 || l.Tokens != 100 || l.StatementsPerSec != 2 {
		t.Fatalf("light (BURSTABLE: 10 s of its rate): %+v", l)
	}
	// A proxy silent for 30 s consumed nothing: the rates are gone, the
	// totals stay, and the groups are in use while it holds its slots.
	a.clock.Advance(30 * time.Second)
	o = a.srv.Overview(2)
	if len(o.Groups) != 2 || o.Groups[0].RUPerSec > 0.01 || o.Groups[0].Name != "busy" || o.Groups[0].RU != 500 || o.InUse != 3 {
		t.Fatalf("30 s later, limit 2: %+v", o.Groups)
	}
	// Once the slots expire, nothing is in use.
	a.clock.Advance(time.Minute)
	a.srv.mu.Lock()
	a.srv.alloc.Expire(a.clock.Now())
	a.srv.mu.Unlock()
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

// With many groups Overview walks them all (a chunk per hold of the grant
// lock) and lists only the limit: the busiest in use, then by name.
func TestOverviewManyGroups(t *testing.T) {
	ts := startServer(t, startEtcd(t), "")
	waitFor(t, "leadership", ts.srv.IsLeader) // a new term starts a fresh allocator
	now := ts.clock.Now()
	const n = 20000
	ts.srv.mu.Lock()
	for i := range n {
		ts.srv.alloc.SetGroup(fmt.Sprintf("g%05d", i), Settings{RUPerSec: 10}, now)
	}
	for i, g := range []string{"g00100", "g19999"} {
		if _, err := ts.srv.alloc.Acquire(g, Request{ProxyID: "p", ReportOnly: true}, now); err != nil {
			t.Fatal(err)
		}
		ts.srv.alloc.Report(g, "p", ru.Consumption{RRU: float64(10 * (i + 1))}, 0, 0, 0, now)
	}
	ts.srv.mu.Unlock()
	o := ts.srv.Overview(5)
	var names []string
	for _, g := range o.Groups {
		names = append(names, g.Name)
	}
	if want := "[g19999 g00100 default g00000 g00001]"; o.Total != n+1 || o.InUse != 2 || fmt.Sprint(names) != want {
		t.Fatalf("%d groups, %d in use, listed %v; want %d, 2, %s", o.Total, o.InUse, names, n+1, want)
	}
}
