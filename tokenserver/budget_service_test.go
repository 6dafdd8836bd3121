package tokenserver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// leaderBudgetGroup is a group of 1,000 RU/s with a DAY budget of 100 RU:
// THROTTLE(RU_PER_SEC=10) at 50%, REFUSE at 100%.
func leaderBudgetGroup(name string, mode uint32) *pb.ResourceGroup {
	return &pb.ResourceGroup{Name: name, RuPerSec: 1000, Mode: mode, Budgets: []*pb.Budget{{Ru: 100, Period: "DAY", Triggers: []*pb.BudgetTrigger{
		{Percent: 50, Action: "THROTTLE", ThrottleRuPerSec: 10},
		{Percent: 100, Action: "REFUSE"},
	}}}}
}

// budgetsOf is a response's verdicts as "group:action/rate/spent".
func budgetsOf(resp *pb.TokenResponse) string {
	var out []string
	for _, b := range resp.GetBudgets() {
		out = append(out, fmt.Sprintf("%s:%s/%d/%g/%v", b.GetGroup(), b.GetAction(), b.GetThrottleRuPerSec(), b.GetSpentRu(), b.GetReportOnly()))
	}
	return strings.Join(out, " ")
}

// recvWithin waits at most d (real time) for the stream's next message.
func recvWithin(t *testing.T, st grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse], d time.Duration) *pb.TokenResponse {
	t.Helper()
	type res struct {
		r   *pb.TokenResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		r, err := st.Recv()
		ch <- res{r, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("recv: %v", r.err)
		}
		return r.r
	case <-time.After(d):
		t.Fatalf("nothing came on the stream within %v", d)
		return nil
	}
}

// TestBudgetsEnforcedByTheLeader: two proxies' reports spend a group's
// daily budget (a compressed day of an hour, on the injected clock); the
// THROTTLE at 50% clamps the allocator and reaches the other proxy's
// stream unasked, the REFUSE at 100% too; the budgets RPC, the metrics
// and the usage history agree on what was spent; a larger budget lifts
// the REFUSE at once, the window's roll-over lifts the next THROTTLE. A MODE WARN group's verdict comes report-only and leaves
// its allocation alone.
func TestBudgetsEnforcedByTheLeader(t *testing.T) {
	cli := startEtcd(t)
	ts := startServerWith(t, cli, "", func(c *Config) { c.BudgetDayLength = time.Hour })
	waitFor(t, "leader", ts.srv.IsLeader)
	waitFor(t, "seeded", func() bool { ts.srv.mu.Lock(); defer ts.srv.mu.Unlock(); return ts.srv.budgets.seeded })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rg := pb.NewResourceGroupServiceClient(ts.conn)
	for _, g := range []*pb.ResourceGroup{leaderBudgetGroup("b", 0), leaderBudgetGroup("w", 1)} {
		if _, err := rg.CreateGroup(ctx, &pb.CreateGroupRequest{Group: g}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the groups", func() bool {
		ts.srv.mu.Lock()
		defer ts.srv.mu.Unlock()
		return ts.srv.budgets.has("b") && ts.srv.budgets.has("w")
	})
	open := func() grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse] {
		st, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	p1, p2 := open(), open()
	ask := func(st grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse], proxy string, id uint64, group string, ru float64) *pb.TokenResponse {
		t.Helper()
		var c *pb.Consumption
		if ru > 0 {
			c = &pb.Consumption{Rru: ru, Statements: 1, IntervalMs: 1000}
		}
		return acquire(t, st, &pb.TokenRequest{ProxyId: proxy, RequestId: id, Groups: []*pb.GroupTokenRequest{{Group: group, TokensWanted: 10, Consumption: c}}})
	}
	// A stream's first answer for a group says its verdict, none yet.
	if got := budgetsOf(ask(p1, "p1", 1, "b", 0)); got != "b:/0/0/false" {
		t.Errorf("p1's first answer: %s", got)
	}
	if got := budgetsOf(ask(p2, "p2", 1, "b", 0)); got != "b:/0/0/false" {
		t.Errorf("p2's first answer: %s", got)
	}
	// 30 + 25 RU: THROTTLE at 50 RU.
	ts.clock.Advance(time.Second)
	if got := budgetsOf(ask(p1, "p1", 2, "b", 30)); got != "" {
		t.Errorf("below the trigger: %s", got)
	}
	ts.clock.Advance(time.Second)
	r := ask(p1, "p1", 3, "b", 25)
	if got := budgetsOf(r); got != "b:THROTTLE/10/55/false" {
		t.Errorf("the crossing's answer: %s", got)
	}
	if got := budgetsOf(recvWithin(t, p2, time.Second)); got != "b:THROTTLE/10/55/false" {
		t.Errorf("p2 told unasked: %s", got)
	}
	// The grant in the crossing's answer was cut before the report
	// spent; the next is the throttled rate's (the proxy ends the old
	// trickle itself when the verdict comes).
	if g := ask(p2, "p2", 2, "b", 0).GetGrants()[0]; g.GetRuPerSec() != 10 || g.GetUnlimited() || g.GetFillRate() > 10 {
		t.Errorf("a throttled group's grant: %v", g)
	}
	// p2 spends the rest: REFUSE at 100 RU, pushed to p1.
	ts.clock.Advance(time.Second)
	if got := budgetsOf(ask(p2, "p2", 3, "b", 50)); got != "b:REFUSE/0/105/false" {
		t.Errorf("p2's crossing: %s", got)
	}
	if got := budgetsOf(recvWithin(t, p1, time.Second)); got != "b:REFUSE/0/105/false" {
		t.Errorf("p1 told unasked: %s", got)
	}
	ts.srv.mu.Lock()
	rate := ts.srv.alloc.Group("b").settings.RUPerSec
	ts.srv.mu.Unlock()
	if rate != 1000 {
		t.Errorf("under REFUSE the allocator runs b at %d RU/s, its own rate", rate)
	}
	// The budgets RPC, the metrics and the history agree; a spent
	// budget's exhaustion is when it ran out, not the time of asking.
	ranOut := ts.clock.Now()
	ts.clock.Advance(3 * time.Second)
	br, err := pb.NewUsageServiceClient(ts.conn).Budgets(ctx, &pb.BudgetsRequest{Groups: []string{"B"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(br.GetRows()) != 1 || !br.GetSeeded() {
		t.Fatalf("budgets: %v", br)
	}
	// The calendar the windows follow, for the proxies' what-if.
	if br.GetTimeZone() != "UTC" || br.GetDayLengthMs() != time.Hour.Milliseconds() {
		t.Errorf("budgets' calendar: zone %q, day %d ms; want UTC, 3600000", br.GetTimeZone(), br.GetDayLengthMs())
	}
	row := br.GetRows()[0]
	dayStart := ts.clock.Now().Truncate(time.Hour)
	if row.GetSpentRu() != 105 || row.GetBudgetRu() != 100 || row.GetAction() != "ON 100 PERCENT REFUSE" || !row.GetEnforced() ||
		row.GetWindowStartUnixMs() != dayStart.UnixMilli() || row.GetWindowEndUnixMs() != dayStart.Add(time.Hour).UnixMilli() ||
		row.GetProjectedExhaustionUnixMs() != ranOut.UnixMilli() {
		t.Errorf("budget row: %v", row)
	}
	if v := gaugeValue(t, ts, "rgserver_budget_spent_ru", "b"); v != 105 {
		t.Errorf("rgserver_budget_spent_ru %g", v)
	}
	for _, a := range []string{"throttle", "refuse"} {
		if v := testutil.ToFloat64(ts.srv.budgetActions.WithLabelValues("b", "day", a)); v != 1 {
			t.Errorf("rgserver_budget_actions_total{action=%q} = %g", a, v)
		}
	}
	hist, err := pb.NewUsageServiceClient(ts.conn).UsageHistory(ctx, &pb.UsageHistoryRequest{Groups: []string{"b"}, FromUnixMs: dayStart.UnixMilli(), GranularityS: 1})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, r := range hist.GetRows() {
		sum += r.GetRru() + r.GetWru()
	}
	if sum < 104.99 || sum > 105.01 {
		t.Errorf("the history's RU %g, the budget's 105", sum)
	}
	// A larger budget lifts the REFUSE at once on both proxies; spending
	// on reaches its THROTTLE again.
	bigger := leaderBudgetGroup("b", 0)
	bigger.Budgets[0].Ru = 1000
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: bigger}); err != nil {
		t.Fatal(err)
	}
	for i, st := range []grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse]{p1, p2} {
		if got := budgetsOf(recvWithin(t, st, 5*time.Second)); got != "b:/0/0/false" {
			t.Errorf("proxy %d after the budget grew: %s", i+1, got)
		}
	}
	ts.clock.Advance(time.Second)
	if got := budgetsOf(ask(p1, "p1", 4, "b", 400)); got != "b:THROTTLE/10/505/false" {
		t.Errorf("the larger budget's THROTTLE: %s", got)
	}
	if got := budgetsOf(recvWithin(t, p2, time.Second)); got != "b:THROTTLE/10/505/false" {
		t.Errorf("p2 told of the larger budget's THROTTLE: %s", got)
	}
	// The window rolls over: both proxies hear the action lift.
	ts.clock.Advance(dayStart.Add(time.Hour).Sub(ts.clock.Now()))
	for i, st := range []grpc.BidiStreamingClient[pb.TokenRequest, pb.TokenResponse]{p1, p2} {
		if got := budgetsOf(recvWithin(t, st, time.Second)); got != "b:/0/0/false" {
			t.Errorf("proxy %d at the roll-over: %s", i+1, got)
		}
	}
	// A WARN group: the verdict comes report-only; nothing is clamped.
	if got := budgetsOf(ask(p1, "p1", 5, "w", 60)); got != "w:THROTTLE/10/60/true" {
		t.Errorf("WARN group: %s", got)
	}
	ts.srv.mu.Lock()
	st := ts.srv.alloc.Group("w").settings
	ts.srv.mu.Unlock()
	if st.RUPerSec != 1000 || !st.Unlimited() {
		t.Errorf("a WARN group's allocation: %+v", st)
	}
	// Switched to ENFORCE, the same THROTTLE applies: its proxy hears it
	// again, and the allocator throttles.
	if _, err := rg.AlterGroup(ctx, &pb.AlterGroupRequest{Group: leaderBudgetGroup("w", 0)}); err != nil {
		t.Fatal(err)
	}
	if got := budgetsOf(recvWithin(t, p1, 5*time.Second)); got != "w:THROTTLE/10/60/false" {
		t.Errorf("the WARN group switched to ENFORCE: %s", got)
	}
	ts.srv.mu.Lock()
	st = ts.srv.alloc.Group("w").settings
	ts.srv.mu.Unlock()
	if st.RUPerSec != 10 || st.Unlimited() {
		t.Errorf("the enforced group's allocation: %+v", st)
	}
}

// gaugeValue reads one budget series of group (period day) from the
// server's registry.
func gaugeValue(t *testing.T, ts *testServer, name, group string) float64 {
	t.Helper()
	mfs, err := ts.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var g, p string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "resource_group":
					g = l.GetValue()
				case "period":
					p = l.GetValue()
				}
			}
			if g == group && p == "day" {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{resource_group=%q,period=\"day\"}", name, group)
	return 0
}

// TestBudgetsSeededAtANewTerm: a new leader starts its budgets from the
// usage history the last one left: what the window spent, and the
// verdict that follows, which the first answer to a proxy carries.
func TestBudgetsSeededAtANewTerm(t *testing.T) {
	cli := startEtcd(t)
	clock := &fakeClock{now: t0.Add(30 * time.Minute)}
	cfg := func(c *Config) { c.BudgetDayLength, c.Now = time.Hour, clock.Now }
	a := startServerWith(t, cli, "", cfg)
	waitFor(t, "a leads", a.srv.IsLeader)
	waitFor(t, "a seeded", func() bool { a.srv.mu.Lock(); defer a.srv.mu.Unlock(); return a.srv.budgets.seeded })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pb.NewResourceGroupServiceClient(a.conn).CreateGroup(ctx, &pb.CreateGroupRequest{Group: leaderBudgetGroup("b", 0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the group", func() bool { a.srv.mu.Lock(); defer a.srv.mu.Unlock(); return a.srv.budgets.has("b") })
	st, err := pb.NewTokenServiceClient(a.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		clock.Advance(time.Second)
		acquire(t, st, &pb.TokenRequest{ProxyId: "p", RequestId: uint64(i + 1), Groups: []*pb.GroupTokenRequest{{Group: "b", TokensWanted: 10,
			Consumption: &pb.Consumption{Rru: 10, Statements: 1, IntervalMs: 1000}}}})
	}
	clock.Advance(2 * time.Second)
	a.stop() // hands over: the history is saved
	b := startServerWith(t, cli, "", cfg)
	waitFor(t, "b leads", b.srv.IsLeader)
	waitFor(t, "b seeded", func() bool { b.srv.mu.Lock(); defer b.srv.mu.Unlock(); return b.srv.budgets.seeded })
	br, err := pb.NewUsageServiceClient(b.conn).Budgets(ctx, &pb.BudgetsRequest{AllGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(br.GetRows()) != 1 || br.GetRows()[0].GetSpentRu() != 60 || br.GetRows()[0].GetAction() != "ON 50 PERCENT THROTTLE(RU_PER_SEC=10)" {
		t.Fatalf("the new term's budgets: %v", br)
	}
	st2, err := pb.NewTokenServiceClient(b.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp := acquire(t, st2, &pb.TokenRequest{ProxyId: "p", RequestId: 1, Groups: []*pb.GroupTokenRequest{{Group: "b", TokensWanted: 10}}})
	if got := budgetsOf(resp); got != "b:THROTTLE/10/60/false" {
		t.Errorf("the new term's first answer: %s", got)
	}
}
