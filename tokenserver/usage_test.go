package tokenserver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// usageFigs builds a report's figures: RRU, WRU, statements.
func usageFigs(rru, wru, stmts float64) usageFigures {
	var f usageFigures
	f[figRRU], f[figWRU], f[figStatements] = rru, wru, stmts
	return f
}

// loadedHistory is a history of a term begun at start whose load is done.
func loadedHistory(start time.Time) *usageHistory {
	h := newUsageHistory()
	h.newTerm(start)
	h.wm = [numUsageTiers]int64{h.horizon, h.horizon / 60, h.horizon / 3600}
	h.loaded = true
	return h
}

// rowsOf is a query's rows as "group@offset:rru/wru/stmts" from base.
func rowsOf(h *usageHistory, k int, from, to time.Time, base time.Time) string {
	g := usageTierSeconds(k)
	rows, _ := h.query(nil, k, from.Unix()/g, to.Unix()/g, maxUsageRows)
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%s@%d:%g/%g/%g ", r.group, r.p.idx*g-base.Unix(), r.p.v[figRRU], r.p.v[figWRU], r.p.v[figStatements])
	}
	return strings.TrimSpace(b.String())
}

// TestUsageSpreadStopsAtIdle: a report whose group fell idle 3 s before
// it (idle_ms) is spread over the 2 s before that, not over all 5.
func TestUsageSpreadStopsAtIdle(t *testing.T) {
	base := t0.Add(time.Hour)
	h := loadedHistory(t0)
	h.addUntil("g", usageFigs(10, 0, 4), 2*time.Second, base.Add(-3*time.Second), base)
	if got, want := rowsOf(h, usageSec, base.Add(-time.Minute), base.Add(time.Minute), base), "g@-4:5/0/2 g@-5:5/0/2"; got != want {
		t.Errorf("seconds: got %s, want %s", got, want)
	}
}

// TestUsageSpread: a report is spread uniformly over the seconds it
// covers, squeezed into the open ones; counts are split whole and add up;
// minutes and hours get the same.
func TestUsageSpread(t *testing.T) {
	base := t0.Add(time.Hour)
	for _, tc := range []struct {
		name     string
		interval time.Duration
		f        usageFigures
		want     string // seconds, newest first
	}{
		{"five seconds", 5 * time.Second, usageFigs(10, 5, 5), "g@-1:2/1/1 g@-2:2/1/1 g@-3:2/1/1 g@-4:2/1/1 g@-5:2/1/1"},
		{"counts split whole", 5 * time.Second, usageFigs(0, 0, 3), "g@-1:0/0/1 g@-3:0/0/1 g@-5:0/0/1"},
		{"a minute squeezed into the open seconds", time.Minute, usageFigs(50, 0, 0), "g@-1:10/0/0 g@-2:10/0/0 g@-3:10/0/0 g@-4:10/0/0 g@-5:10/0/0"},
		{"half seconds", 1500 * time.Millisecond, usageFigs(3, 0, 0), "g@-1:1/0/0 g@-2:2/0/0"},
		{"no interval: the second before now", 0, usageFigs(7, 0, 2), "g@-1:7/0/2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := loadedHistory(t0)
			now := base
			if tc.interval == 1500*time.Millisecond {
				now = base.Add(-500 * time.Millisecond)
			}
			h.add("g", tc.f, tc.interval, now)
			if got := rowsOf(h, usageSec, base.Add(-time.Minute), base.Add(time.Minute), base); got != tc.want {
				t.Errorf("seconds:\n got %s\nwant %s", got, tc.want)
			}
			// The minute and the hour hold the whole report.
			rows, _ := h.query(nil, usageMin, 0, math.MaxInt32, 10)
			var rru, stmts float64
			for _, r := range rows {
				rru += r.p.v[figRRU]
				stmts += r.p.v[figStatements]
			}
			if rru != tc.f[figRRU] || stmts != tc.f[figStatements] {
				t.Errorf("minutes hold %g RRU, %g statements; want %g, %g", rru, stmts, tc.f[figRRU], tc.f[figStatements])
			}
			if rows, _ := h.query(nil, usageHour, 0, math.MaxInt32, 10); len(rows) != 1 || rows[0].p.v[figRRU] != tc.f[figRRU] {
				t.Errorf("hours: %v", rows)
			}
		})
	}
}

// TestUsageIdleCostsNothing: reports that moved nothing, or carried only
// NaN, negative or infinite figures, keep nothing.
func TestUsageIdleCostsNothing(t *testing.T) {
	h := loadedHistory(t0)
	now := t0.Add(time.Minute)
	h.add("g", usageFigures{}, time.Second, now)
	h.add("g", usageFigs(math.NaN(), math.Inf(1), -5), time.Second, now)
	if got, want := h.String(now), "open@-5 points 0/0/0"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	if h.bytes != 0 {
		t.Fatalf("bytes = %d", h.bytes)
	}
}

// TestUsageTiersAndRetention: a group busy every second for three hours
// and a group busy once; freezing at each persist tick; what each tier
// keeps, and that it rolls off by time.
func TestUsageTiersAndRetention(t *testing.T) {
	start := t0
	h := loadedHistory(start)
	now := start
	for i := range 3 * 3600 {
		now = now.Add(time.Second)
		h.add("busy", usageFigs(1, 0.5, 2), time.Second, now)
		if i == 10 {
			h.add("once", usageFigs(4, 0, 1), time.Second, now)
		}
		if i%5 == 0 {
			h.mu.Lock()
			h.freeze(now)
			h.expire(now)
			h.mu.Unlock()
		}
	}
	h.mu.Lock()
	h.freeze(now)
	h.expire(now)
	h.mu.Unlock()
	// Seconds: the last hour, and the rest of the oldest chunk (whole
	// chunks roll off); minutes: 180, one open; hours: 2 and the open one.
	// "once" keeps its minute and hour.
	if got, want := h.String(now), "open@-5 points 3602/181/4 busy:3597+5/179+1/2+1 once:0+0/1+0/1+0"; got != want {
		t.Errorf("after 3 h:\n got %s\nwant %s", got, want)
	}
	rows, _ := h.query(map[string]bool{"busy": true}, usageMin, start.Unix()/60, now.Unix()/60, maxUsageRows)
	if len(rows) != 180 || rows[0].p.v[figRRU] != 60 || rows[0].p.v[figStatements] != 120 || rows[0].p.v[figWRU] != 30 {
		t.Fatalf("minutes: %d rows, newest %+v", len(rows), rows[0])
	}
	// A day later only the minutes and hours remain; 3 days later the hours.
	for _, tc := range []struct {
		after time.Duration
		want  string
	}{
		{24 * time.Hour, "open@-5 points 0/181/4 busy:0+0/180+0/3+0 once:0+0/1+0/1+0"},
		{72 * time.Hour, "open@-5 points 0/0/4 busy:0+0/0+0/3+0 once:0+0/0+0/1+0"},
		{401 * 24 * time.Hour, "open@-5 points 0/0/0"},
	} {
		later := now.Add(tc.after)
		h.mu.Lock()
		h.freeze(later)
		h.expire(later)
		h.mu.Unlock()
		if got := h.String(later); got != tc.want {
			t.Errorf("after %v:\n got %s\nwant %s", tc.after, got, tc.want)
		}
	}
	if h.bytes != 0 {
		t.Errorf("an empty history takes %d bytes", h.bytes)
	}
}

// TestUsageHostileReports: huge figures stay finite; 100,000 groups
// reporting stay within the bytes bound, the oldest dropped first and
// groups that no longer exist before others.
func TestUsageHostileReports(t *testing.T) {
	h := loadedHistory(t0)
	now := t0.Add(time.Second)
	for range 1000 {
		h.add("g", usageFigs(1e12, 1e300, 1e12), time.Second, now)
	}
	rows, _ := h.query(nil, usageHour, 0, math.MaxInt32, 1)
	if v := rows[0].p.v; math.IsInf(v[figWRU], 0) || v[figWRU] > usageFigureMax || v[figStatements] > usageFigureMax {
		t.Fatalf("huge figures: %v", v)
	}
	h = loadedHistory(t0)
	h.maxBytes = 8 << 20
	for i := range 100_000 {
		now := t0.Add(time.Duration(i/1000+1) * time.Second)
		h.add(fmt.Sprintf("g%06d", i), usageFigs(1, 1, 1), time.Second, now)
		if i%1000 == 999 {
			h.mu.Lock()
			h.freeze(now.Add(2 * time.Hour)) // hot points are not evicted: close them
			h.mu.Unlock()
			h.evict(func(g string) bool { return g >= "g050000" })
		}
	}
	if h.bytes > h.maxBytes {
		t.Fatalf("bytes %d over the bound %d", h.bytes, h.maxBytes)
	}
	if _, ok := h.series["g099999"]; !ok {
		t.Fatal("the newest group was evicted")
	}
	if got := h.series["g000000"]; got != nil && got.tiers[usageSec].points > 0 {
		t.Fatal("the oldest group that no longer exists kept its seconds")
	}
}

// TestUsagePointEncoding: points round-trip, zero figures cost no bytes.
func TestUsagePointEncoding(t *testing.T) {
	pts := []usagePoint{
		{idx: 100, v: usageFigs(1.5, 0, 3)},
		{idx: 101, v: usageFigures{0.001, 2, 0, 1, 1, 3.25, 4}},
		{idx: 5000, v: usageFigs(123456.789, 1e9, 1e6)},
	}
	var b []byte
	prev := int64(90)
	for _, p := range pts {
		b = appendUsagePoint(b, prev, &p)
		prev = p.idx
	}
	var got []usagePoint
	if err := eachUsagePoint(b, 90, func(p usagePoint) bool { got = append(got, p); return true }); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(pts) {
		t.Fatalf("round trip:\n got %v\nwant %v", got, pts)
	}
	if n := len(appendUsagePoint(nil, 0, &usagePoint{idx: 1, v: usageFigs(0, 0, 1)})); n != 3 {
		t.Errorf("a one-statement point takes %d bytes, want 3", n)
	}
	if err := eachUsagePoint([]byte{1, 0xff}, 0, func(usagePoint) bool { return true }); err == nil {
		t.Error("a bad mask decoded")
	}
}

// TestUsageRequestValidation: the RPC's bounds.
func TestUsageRequestValidation(t *testing.T) {
	now := t0.Add(1000 * time.Hour)
	ms := now.UnixMilli()
	many := make([]string, maxUsageGroups+1)
	for i := range many {
		many[i] = fmt.Sprintf("g%d", i)
	}
	for _, tc := range []struct {
		name     string
		req      *pb.UsageHistoryRequest
		wantErr  string
		wantTier int
	}{
		{"all, last minute, finest", &pb.UsageHistoryRequest{AllGroups: true, FromUnixMs: ms - 60_000}, "", usageSec},
		{"a day ago: minutes", &pb.UsageHistoryRequest{AllGroups: true, FromUnixMs: ms - 86_400_000}, "", usageMin},
		{"a week ago: hours", &pb.UsageHistoryRequest{AllGroups: true, FromUnixMs: ms - 7*86_400_000}, "", usageHour},
		{"asked hours", &pb.UsageHistoryRequest{Groups: []string{"G"}, FromUnixMs: ms - 60_000, GranularityS: 3600}, "", usageHour},
		{"bad granularity", &pb.UsageHistoryRequest{AllGroups: true, GranularityS: 30}, "granularity 30", 0},
		{"too many groups", &pb.UsageHistoryRequest{Groups: many}, "1001 groups", 0},
		{"bad name", &pb.UsageHistoryRequest{Groups: []string{"\xff"}}, "groups[0]", 0},
		{"neither all nor names", &pb.UsageHistoryRequest{}, "want all_groups", 0},
		{"reversed range", &pb.UsageHistoryRequest{AllGroups: true, FromUnixMs: ms, ToUnixMs: ms - 1}, "want 0 ≤ from < to", 0},
		{"future", &pb.UsageHistoryRequest{AllGroups: true, FromUnixMs: ms, ToUnixMs: ms + 3_600_000}, "after the leader's now", 0},
		{"from the start: the hours' retention", &pb.UsageHistoryRequest{AllGroups: true}, "", usageHour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := validateUsageRequest(tc.req, now)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			case err == nil && r.tier != tc.wantTier:
				t.Fatalf("tier %d, want %d", r.tier, tc.wantTier)
			case err == nil && r.limit != maxUsageRows:
				t.Fatalf("limit %d", r.limit)
			}
		})
	}
}

// TestUsageHistoryPersistsAcrossLeaders: a leader records, writes its
// segments and hands over; the next leader loads them (rebuilding the
// open minute and hour from the seconds) and answers the same; a
// follower names the leader; a deposed leader writes nothing.
func TestUsageHistoryPersistsAcrossLeaders(t *testing.T) {
	cli := startEtcd(t)
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	waitFor(t, "a's load", func() bool { a.srv.usage.mu.Lock(); defer a.srv.usage.mu.Unlock(); return a.srv.usage.loaded })
	b := startServer(t, cli, "")
	waitFor(t, "b knows the leader", func() bool { return b.srv.LeaderAddr() == a.addr })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 200 s of a busy group (and a second group now and then), with a
	// persist round every 5 s.
	for i := range 200 {
		a.clock.Advance(time.Second)
		now := a.clock.Now()
		a.srv.mu.Lock()
		a.srv.usage.add("g", usageFigs(2, 1, 3), time.Second, now)
		if i%50 == 0 {
			a.srv.usage.add("h", usageFigs(1, 0, 1), 5*time.Second, now)
		}
		a.srv.mu.Unlock()
		if i%5 == 4 {
			if err := a.srv.persistUsage(ctx, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	ask := func(ts *testServer, k uint32) *pb.UsageHistoryResponse {
		t.Helper()
		resp, err := pb.NewUsageServiceClient(ts.conn).UsageHistory(ctx, &pb.UsageHistoryRequest{AllGroups: true,
			FromUnixMs: t0.UnixMilli(), ToUnixMs: ts.clock.Now().UnixMilli(), GranularityS: k})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	before := map[uint32]string{}
	for _, k := range []uint32{1, 60, 3600} {
		before[k] = fmt.Sprint(ask(a, k).GetRows())
	}
	if n := len(ask(a, 1).GetRows()); n < 200 {
		t.Fatalf("%d second rows, want 200 of g and some of h", n)
	}
	if resp := ask(b, 1); resp.GetNotLeader().GetLeaderAddr() != a.addr {
		t.Fatalf("follower: %v", resp)
	}
	var stored int
	resp, err := cli.Get(ctx, keyUsage, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		stored += len(kv.Value)
		if !strings.HasPrefix(string(kv.Key), keyUsage) {
			t.Fatalf("key %q", kv.Key)
		}
	}
	t.Logf("%d segments, %d bytes in etcd", len(resp.Kvs), stored)
	// b's clock is a's, then a hands over.
	b.clock.Advance(a.clock.Now().Sub(b.clock.Now()))
	a.srv.mu.Lock()
	oldKey, oldRev := a.srv.leaderKey, a.srv.leaderRev
	a.srv.mu.Unlock()
	a.stop()
	waitFor(t, "b leads", b.srv.IsLeader)
	waitFor(t, "b's load", func() bool { b.srv.usage.mu.Lock(); defer b.srv.usage.mu.Unlock(); return b.srv.usage.loaded })
	for _, k := range []uint32{1, 60, 3600} {
		if got := fmt.Sprint(ask(b, k).GetRows()); got != before[k] {
			t.Errorf("granularity %d after the leader change:\n got %s\nwant %s", k, got, before[k])
		}
	}
	// b records on; its minute completes what a started.
	for range 120 {
		b.clock.Advance(time.Second)
		b.srv.mu.Lock()
		b.srv.usage.add("g", usageFigs(2, 1, 3), time.Second, b.clock.Now())
		b.srv.mu.Unlock()
	}
	if err := b.srv.persistUsage(ctx, false); err != nil {
		t.Fatal(err)
	}
	rows := ask(b, 60).GetRows()
	var stmts uint64
	for _, r := range rows {
		if r.GetResourceGroup() == "g" {
			stmts += r.GetStatements()
		}
	}
	if want := uint64(3 * 320); stmts > want || stmts < want-3*usageSettle {
		t.Errorf("g's statements over the minutes: %d, want about %d", stmts, want)
	}
	// a, deposed, writes nothing.
	a.srv.mu.Lock()
	a.srv.leaderKey, a.srv.leaderRev = oldKey, oldRev
	a.clock.Advance(10 * time.Second)
	a.srv.usage.add("g", usageFigs(1, 0, 1), time.Second, a.clock.Now())
	a.srv.mu.Unlock()
	a.clock.Advance(10 * time.Second)
	if err := a.srv.persistUsage(ctx, false); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed leader's write: %v", err)
	}
}

// TestUsageFedByReports: the consumption of AcquireTokens messages, after
// the credential book, reaches the history with its new fields, spread
// over the interval the message says (or the time since the proxy's
// previous message of the group); a NaN in the new fields is malformed.
func TestUsageFedByReports(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "")
	waitFor(t, "leader", ts.srv.IsLeader)
	waitFor(t, "load", func() bool { ts.srv.usage.mu.Lock(); defer ts.srv.usage.mu.Unlock(); return ts.srv.usage.loaded })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := pb.NewResourceGroupServiceClient(ts.conn).CreateGroup(ctx, &pb.CreateGroupRequest{Group: &pb.ResourceGroup{Name: "g", RuPerSec: 1000, Burst: pb.BurstMode_BURST_MODERATED}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the group", func() bool { ts.srv.mu.Lock(); defer ts.srv.mu.Unlock(); return ts.srv.alloc.Group("g") != nil })
	st, err := pb.NewTokenServiceClient(ts.conn).AcquireTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id uint64, c *pb.Consumption) {
		t.Helper()
		acquire(t, st, &pb.TokenRequest{ProxyId: "p", RequestId: id, Groups: []*pb.GroupTokenRequest{{Group: "g", TokensWanted: 100, Consumption: c}}})
	}
	send(1, nil)
	ts.clock.Advance(2 * time.Second)
	send(2, &pb.Consumption{Rru: 20, Wru: 4, Statements: 4, Throttled: 2, Refused: 2, WaitedRu: 6, DeniedRu: 8, IntervalMs: 2000})
	ts.clock.Advance(4 * time.Second)
	// No interval: the 4 s since the previous message.
	send(3, &pb.Consumption{Rru: 40, Statements: 4})
	resp, err := pb.NewUsageServiceClient(ts.conn).UsageHistory(ctx, &pb.UsageHistoryRequest{Groups: []string{"G"}, FromUnixMs: t0.UnixMilli(), GranularityS: 1})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range resp.GetRows() {
		got = append(got, fmt.Sprintf("%d:%g/%g/%d/%d/%d/%g/%g", (r.GetStartUnixMs()-t0.UnixMilli())/1000, r.GetRru(), r.GetWru(),
			r.GetStatements(), r.GetThrottled(), r.GetRefused(), r.GetWaitedRu(), r.GetDeniedRu()))
	}
	want := "[5:10/0/1/0/0/0/0 4:10/0/1/0/0/0/0 3:10/0/1/0/0/0/0 2:10/0/1/0/0/0/0 1:10/2/2/1/1/3/4 0:10/2/2/1/1/3/4]"
	if fmt.Sprint(got) != want {
		t.Errorf("rows:\n got %v\nwant %s", got, want)
	}
	c := &pb.Consumption{WaitedRu: math.NaN()}
	_, err = func() (*pb.TokenResponse, error) {
		if err := st.Send(&pb.TokenRequest{ProxyId: "p", RequestId: 4, Groups: []*pb.GroupTokenRequest{{Group: "g", Consumption: c}}}); err != nil {
			return nil, err
		}
		return st.Recv()
	}()
	if codeOf(err) != codes.InvalidArgument {
		t.Errorf("a NaN waited_ru: %v", err)
	}
}

// TestUsageMetricsHelpIsDocumented: the history's metrics have rows in
// docs/metrics.md with their HELP text.
func TestUsageMetricsHelpIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := newUsageHistory().register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 5 {
		t.Fatalf("%d metrics", len(mfs))
	}
	for _, mf := range mfs {
		row := regexp.MustCompile("(?m)^\\| `" + mf.GetName() + "` \\| " + strings.ToLower(mf.GetType().String()) + " \\|[^|]*\\| (.+) \\|$").FindSubmatch(b)
		if row == nil || string(row[1]) != mf.GetHelp() {
			t.Errorf("%s: docs/metrics.md's row %q, HELP %q", mf.GetName(), row, mf.GetHelp())
		}
	}
}

// TestUsageHistoryRPC: open to proxy and administrator credentials, not
// to strangers; a malformed request is InvalidArgument; during the term's
// load the answer is Unavailable with its progress.
func TestUsageHistoryRPC(t *testing.T) {
	cli := startEtcd(t)
	ts := startServer(t, cli, "admin-secret")
	waitFor(t, "leader", ts.srv.IsLeader)
	waitFor(t, "load", func() bool { ts.srv.usage.mu.Lock(); defer ts.srv.usage.mu.Unlock(); return ts.srv.usage.loaded })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl := pb.NewUsageServiceClient(ts.conn)
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	ok := &pb.UsageHistoryRequest{AllGroups: true}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		req  *pb.UsageHistoryRequest
		want codes.Code
	}{
		{"administrator", as("admin-secret"), ok, codes.OK},
		{"proxy", as(testProxyToken), ok, codes.OK},
		{"stranger", as("nobody"), ok, codes.Unauthenticated},
		{"no credential", ctx, ok, codes.Unauthenticated},
		{"bad granularity", as(testProxyToken), &pb.UsageHistoryRequest{AllGroups: true, GranularityS: 2}, codes.InvalidArgument},
		{"future", as(testProxyToken), &pb.UsageHistoryRequest{AllGroups: true, ToUnixMs: ts.clock.Now().Add(time.Hour).UnixMilli()}, codes.InvalidArgument},
	} {
		if _, err := cl.UsageHistory(tc.ctx, tc.req); codeOf(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	ts.srv.usage.mu.Lock()
	ts.srv.usage.loaded, ts.srv.usage.read, ts.srv.usage.total = false, 1, 4
	ts.srv.usage.mu.Unlock()
	if _, err := cl.UsageHistory(as(testProxyToken), ok); codeOf(err) != codes.Unavailable || !strings.Contains(err.Error(), "25% read") {
		t.Errorf("while loading: %v", err)
	}
}

// TestUsageHostileProxyBounded: a proxy credential's report reaches the
// history only as far as the credential book lets it (RU by its grants
// and allowance, refused by its count bucket), the rest per message, and
// its interval capped at a minute.
func TestUsageHostileProxyBounded(t *testing.T) {
	now := t0.Add(time.Hour)
	s, err := New(nil, Config{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s.usage.newTerm(t0)
	s.usage.loaded = true
	proxy := Principal{Name: "px", Role: RoleProxy, MaxStreams: 1}
	s.creds.streamOpened(proxy, now)
	s.mu.Lock()
	s.alloc.SetGroup("g", Settings{RUPerSec: 100}, now)
	s.report(proxy, "g", "px/p", Grant{}, &pb.Consumption{Rru: 1e12, Statements: 1e12, Refused: math.MaxUint64,
		WaitedRu: 1e300, DeniedRu: 5, IntervalMs: math.MaxUint32}, now)
	s.mu.Unlock()
	rows, _ := s.usage.query(nil, usageHour, 0, math.MaxInt32, 10)
	if len(rows) != 1 {
		t.Fatalf("rows %v", rows)
	}
	v := rows[0].p.v
	first := 100*awayWindow.Seconds() + float64(s.alloc.Group("g").settings.Capacity()) + debtWindow*100
	burst := countRate * awayWindow.Seconds()
	if v[figRRU] > first+1e-3 || v[figStatements] > burst || v[figRefused] > burst || v[figWaited] > maxReportRU || v[figDenied] != 5 {
		t.Errorf("kept %v; want RU ≤ %g, counts ≤ %g, waited ≤ %g", v, first, burst, float64(maxReportRU))
	}
	if got := s.usage.String(now); !strings.Contains(got, "g:5+0/1+0/1+0") && !strings.Contains(got, "g:0+5/0+1/0+1") {
		t.Errorf("a minute's interval squeezed into the 5 open seconds: %s", got)
	}
}

// TestUsageRestoreAfterCrashAndExpiry: a term that ends without a
// hand-over loses only its unwritten seconds; the next load rebuilds the
// minutes and hours not yet stored from the stored seconds, so that every
// tier holds the same totals; expired segments leave etcd.
func TestUsageRestoreAfterCrashAndExpiry(t *testing.T) {
	cli := startEtcd(t)
	a := startServer(t, cli, "")
	waitFor(t, "a leads", a.srv.IsLeader)
	waitFor(t, "a's load", func() bool { a.srv.usage.mu.Lock(); defer a.srv.usage.mu.Unlock(); return a.srv.usage.loaded })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 150 s of one statement a second, from 30 s into a minute.
	a.clock.Advance(30 * time.Second)
	for i := range 150 {
		a.clock.Advance(time.Second)
		a.srv.mu.Lock()
		a.srv.usage.add("g", usageFigs(1, 0, 1), time.Second, a.clock.Now())
		a.srv.mu.Unlock()
		if i%5 == 4 {
			if err := a.srv.persistUsage(ctx, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A crash: nothing more is written. The next term loads.
	b, err := New(cli, Config{Now: a.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	b.usage.newTerm(a.clock.Now())
	if err := b.loadUsage(ctx); err != nil {
		t.Fatal(err)
	}
	sum := func(k int) (n float64) {
		rows, _ := b.usage.query(nil, k, 0, math.MaxInt32, maxUsageRows)
		for _, r := range rows {
			n += r.p.v[figStatements]
		}
		return n
	}
	sec, mins, hours := sum(usageSec), sum(usageMin), sum(usageHour)
	if sec < 150-2*usageSettle || sec > 150 || mins != sec || hours != sec {
		t.Fatalf("statements after the load: seconds %g, minutes %g, hours %g; want the same, about 150", sec, mins, hours)
	}
	// Two hours later the seconds' segments are deleted; the minutes'
	// and hours' stay.
	a.clock.Advance(2 * time.Hour)
	if err := a.srv.persistUsage(ctx, false); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tier string
		some bool
	}{{"1s", false}, {"1m", true}, {"1h", true}} {
		resp, err := cli.Get(ctx, keyUsage+tc.tier+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if (resp.Count > 0) != tc.some {
			t.Errorf("%s: %d segments in etcd two hours later", tc.tier, resp.Count)
		}
	}
	// Beyond a tier's bytes in etcd, its oldest segments go.
	a.srv.usage.mu.Lock()
	a.srv.usage.storeMax[usageSec] = 1000
	a.srv.usage.mu.Unlock()
	for range 60 {
		a.clock.Advance(time.Second)
		a.srv.mu.Lock()
		for g := range 20 {
			a.srv.usage.add(fmt.Sprintf("g%d", g), usageFigs(1, 0, 1), time.Second, a.clock.Now())
		}
		a.srv.mu.Unlock()
		if err := a.srv.persistUsage(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, keyUsage+"1s/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var bytes int
	for _, kv := range resp.Kvs {
		bytes += len(kv.Value)
	}
	if bytes == 0 || bytes > 1000+1000 {
		t.Errorf("%d bytes of seconds in etcd, bounded at 1,000 (and a segment)", bytes)
	}
	a.clock.Advance(time.Hour)
	if err := a.srv.persistUsage(ctx, false); err != nil {
		t.Fatal(err)
	}
	// An idle history writes nothing, however long.
	rev, _ := etcdStatus(t, cli)
	for range 3 {
		a.clock.Advance(10 * time.Minute)
		if err := a.srv.persistUsage(ctx, false); err != nil {
			t.Fatal(err)
		}
	}
	if after, _ := etcdStatus(t, cli); after != rev {
		t.Errorf("etcd's revision moved from %d to %d while the history was idle", rev, after)
	}
}

// TestUsageLoadMergesWithTheNewTerm: what an earlier term stored (its
// seconds; its minutes up to the last closed one) and what the new term
// recorded while loading add up in every tier, the open minute and hour
// rebuilt from the stored seconds and summed with the new term's.
func TestUsageLoadMergesWithTheNewTerm(t *testing.T) {
	start := t0.Add(10 * time.Minute)
	old := loadedHistory(start)
	now := start
	for range 150 { // 2.5 min: two minutes close, the third is open
		now = now.Add(time.Second)
		old.add("g", usageFigs(1, 0, 1), time.Second, now)
	}
	old.tidy(now, true) // a hand-over
	ld := &usageLoad{series: map[string]*usageSeries{}, extra: map[string][]usageLoadPoint{}, ends: [numUsageTiers]int64{-1, -1, -1}}
	all := old.seriesList(false)
	for k := range usageHour { // seconds and the closed minutes, as written
		g := usageTierSeconds(k)
		seg, err := old.segment(all, k, start.Unix()/g, old.horizon/g)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range seg.parts {
			if err := ld.add(usageKey(k, seg.start, seg.end, i), p, old.horizon, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The new term records 100 s while the load runs, then merges.
	h := loadedHistory(now)
	h.loaded, h.wm = false, [numUsageTiers]int64{h.horizon, -1, -1}
	for range 100 {
		now = now.Add(time.Second)
		h.add("g", usageFigs(1, 0, 1), time.Second, now)
		if now.Unix()%5 == 0 {
			h.mu.Lock()
			h.freeze(now)
			h.mu.Unlock()
		}
	}
	if err := h.merge(h.term, ld, ld.rebuild(h.horizon)); err != nil {
		t.Fatal(err)
	}
	for k := range numUsageTiers {
		rows, _ := h.query(nil, k, 0, math.MaxInt32, maxUsageRows)
		var n float64
		for i, r := range rows {
			n += r.p.v[figStatements]
			if i > 0 && r.p.idx >= rows[i-1].p.idx {
				t.Fatalf("tier %d: rows out of order: %v", k, rows)
			}
		}
		if n != 250 {
			t.Errorf("tier %d: %g statements, want 250 (150 stored, 100 new)", k, n)
		}
	}
	if h.wm[usageMin] != (start.Unix()+120)/60 || !h.loaded {
		t.Errorf("minutes' watermark %d, want the end of the stored ones %d", h.wm[usageMin], (start.Unix()+120)/60)
	}
}

// FuzzUsageSegment feeds arbitrary stored values to a load: bad ones are
// refused, never a panic, and what is taken is finite, within its tier's
// segment and bounded.
func FuzzUsageSegment(f *testing.F) {
	h := loadedHistory(t0)
	h.add("g", usageFigs(1.5, 2, 3), 5*time.Second, t0.Add(time.Minute))
	h.mu.Lock()
	h.freeze(t0.Add(2 * time.Minute))
	h.mu.Unlock()
	seg, err := h.segment(h.seriesList(false), usageSec, t0.Unix(), t0.Unix()+120)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seg.parts[0])
	f.Add([]byte{0x08, 0x01, 0x22, 0x05, 0x0a, 0x01, 'g', 0x12, 0x00})
	f.Fuzz(func(t *testing.T, val []byte) {
		ld := &usageLoad{series: map[string]*usageSeries{}, extra: map[string][]usageLoadPoint{}, ends: [numUsageTiers]int64{-1, -1, -1}}
		if ld.add(usageKey(usageSec, t0.Unix(), t0.Unix()+120, 0), val, t0.Unix()+3600, t0.Add(time.Minute)) != nil {
			return
		}
		for _, s := range ld.series {
			s.tiers[usageSec].eachPoint(0, math.MaxInt64, func(p usagePoint) {
				if p.idx < t0.Unix() || p.idx >= t0.Unix()+120 {
					t.Fatalf("point %d outside its segment", p.idx)
				}
				for _, v := range p.v {
					if math.IsNaN(v) || v < 0 || v > usageFigureMax {
						t.Fatalf("figure %v", v)
					}
				}
			})
		}
		ld.rebuild(t0.Unix() + 3600)
	})
}

// TestUsageSpentRU: a budget window's spending from the history: whole
// hours from the hours, the ends from the minutes.
func TestUsageSpentRU(t *testing.T) {
	h := loadedHistory(t0)
	now := t0
	for range 3 * 3600 { // 3 h at 1 RRU + 0.5 WRU a second
		now = now.Add(time.Second)
		h.add("g", usageFigs(1, 0.5, 1), time.Second, now)
	}
	for _, tc := range []struct {
		name     string
		from, to time.Duration // after t0
		want     float64
	}{
		{"whole hours", 0, 2 * time.Hour, 2 * 3600 * 1.5},
		{"from half past", 30 * time.Minute, 2 * time.Hour, 1.5 * 3600 * 1.5},
		{"within an hour", 90 * time.Minute, 100 * time.Minute, 600 * 1.5},
		{"an empty window", time.Hour, time.Hour, 0},
	} {
		got, ok := h.spentRU("g", t0.Add(tc.from), t0.Add(tc.to))
		if !ok || math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("%s: %v (%v), want %v", tc.name, got, ok, tc.want)
		}
	}
	h.loaded = false
	if _, ok := h.spentRU("g", t0, now); ok {
		t.Error("a sum while loading")
	}
}
