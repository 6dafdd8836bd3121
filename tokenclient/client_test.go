package tokenclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// build builds and registers the next request, as the stream's send
// loop does.
func build(c *Client, force bool) *tokenpb.TokenRequest {
	c.groups.mu.Lock()
	req, sent := c.groups.buildRequestLocked(c.clk.Now(), force, false)
	c.groups.mu.Unlock()
	if req != nil {
		c.stream.register(req, sent)
	}
	return req
}

func setGroups(c *Client, groups ...resourcegroup.Group) {
	snap := newSnapshot()
	for _, g := range groups {
		snap.Groups[g.Name] = g
	}
	c.cache.install(snap, true)
	c.groups.mu.Lock()
	c.groups.cacheInstalledLocked()
	c.groups.mu.Unlock()
	c.cache.wake()
	c.groups.notifyForgotten()
}

// putGroup puts g in the settings cache only, as a test's setup: no
// group in use hears of it.
func putGroup(c *Client, g resourcegroup.Group) {
	c.cache.mu.Lock()
	c.cache.snap.Groups[g.Name] = g
	c.cache.mu.Unlock()
}

func tokensOf(c *Client, group string) float64 {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	return c.groups.byName[group].bucket.Tokens(c.clk.Now())
}

// wantTokens puts group in use on c and makes it ask for tokens in the
// next request.
func wantTokens(c *Client, group string) {
	c.Charge(group, rruOf(0))
	c.groups.mu.Lock()
	c.groups.byName[group].want = true
	c.groups.mu.Unlock()
}

func rruOf(x float64) ru.Consumption { return ru.Consumption{RRU: x, Statements: 1} }

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// grantAll answers req granting every ask in full at once.
func grantAll(req *tokenpb.TokenRequest, fillRate float64) *tokenpb.TokenResponse {
	resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
	for _, g := range req.GetGroups() {
		resp.Grants = append(resp.Grants, &tokenpb.GroupGrant{Group: g.GetGroup(), Tokens: g.GetTokensWanted(),
			FillRate: fillRate, Proxies: 1, RuPerSec: 100})
	}
	return resp
}

func TestConfigDefaults(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no servers: %v, want ErrConfig", err)
	}
	if _, err := New(Config{Servers: []string{"a"}, TargetPeriod: -1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("negative period: %v, want ErrConfig", err)
	}
	c, err := New(Config{Servers: []string{" a ", ""}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.cfg
	if len(cfg.Servers) != 1 || cfg.Servers[0] != "a" || cfg.TargetPeriod != 5*time.Second ||
		cfg.DegradedAfter != 5*time.Second || cfg.ReportPeriod != 5*time.Second || cfg.ProxyID == "" {
		t.Fatalf("defaults: %+v", cfg)
	}
}

// Several groups that need tokens at once go in one message; a group with
// a request in flight is not asked for again until its answer.
func TestBatchingAndOneInFlight(t *testing.T) {
	c, _ := newTestClient(t, nil)
	c.Charge("a", rruOf(5))
	c.Charge("B", rruOf(3)) // names are case-insensitive
	req := build(c, false)
	if req == nil || len(req.GetGroups()) != 2 {
		t.Fatalf("want one request with 2 groups, got %v", req)
	}
	for _, name := range []string{"a", "b"} {
		g := groupEntry(req, name)
		if g == nil || g.GetReportOnly() || g.GetTokensWanted() <= 0 {
			t.Fatalf("group %s: %v", name, g)
		}
	}
	c.Charge("a", rruOf(50))
	if again := build(c, false); again != nil {
		t.Fatalf("second request while in flight: %v", again)
	}
	if err := c.applyResponse(grantAll(req, 100)); err != nil {
		t.Fatal(err)
	}
	// Answered, but the minimum ask interval has not passed.
	if again := build(c, false); again != nil {
		t.Fatalf("request within minAskInterval: %v", again)
	}
}

// The request size is demand × TargetPeriod × 1.1 − tokens left, demand
// being the EWMA of consumed RU/s plus what waiting statements want.
func TestRequestSizeAndEWMA(t *testing.T) {
	c, clk := newTestClient(t, nil)
	c.Charge("a", rruOf(100)) // tokens -100
	clk.Advance(time.Second)
	req := build(c, false)
	g := groupEntry(req, "a")
	// The first 1 s sample of 100 RU/s sets the EWMA.
	if !near(g.GetDemandRuPerSec(), 100) {
		t.Fatalf("demand %v, want 100", g.GetDemandRuPerSec())
	}
	if want := 100*5*1.1 + 100; !near(g.GetTokensWanted(), want) {
		t.Fatalf("wanted %v, want %v", g.GetTokensWanted(), want)
	}
	if c := g.GetConsumption(); !near(c.GetRru(), 100) || c.GetStatements() != 1 {
		t.Fatalf("consumption %v", c)
	}
	if err := c.applyResponse(grantAll(req, 100)); err != nil {
		t.Fatal(err)
	}
	// A second sample of 0 RU/s halves the EWMA.
	clk.Advance(time.Second)
	c.groups.mu.Lock()
	gs := c.groups.byName["a"]
	gs.updateEWMA(clk.Now())
	ewma := gs.ewma
	c.groups.mu.Unlock()
	if !near(ewma, 50) {
		t.Fatalf("ewma %v, want 50", ewma)
	}
}

// A waiting statement adds its RU to the demand and the request size.
func TestDemandIncludesWaiters(t *testing.T) {
	c, clk := newTestClient(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := acquireAll(context.Background(), c, "a", rruOf(40), 10*time.Second)
		done <- err
	}()
	waitFor(t, "the statement to wait", func() bool { return clk.Pending() == 1 }, nil)
	req := build(c, false)
	g := groupEntry(req, "a")
	// 40 RU wanted within waitLead (20 ms): 2,000 RU/s of demand.
	if g == nil || !near(g.GetWaitingTokens(), 40) || !near(g.GetDemandRuPerSec(), 2000) {
		t.Fatalf("entry %v, want waiting 40 and demand 2000", g)
	}
	if want := 2000 * 5 * 1.1; !near(g.GetTokensWanted(), want) {
		t.Fatalf("wanted %v, want %v", g.GetTokensWanted(), want)
	}
	if err := c.applyResponse(grantAll(req, 100)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("AcquireShare after grant: %v", err)
	}
	if got := tokensOf(c, "a"); !near(got, 11000-40) {
		t.Fatalf("tokens %v, want 10960", got)
	}
	c.groups.mu.Lock()
	waiting, waiters := c.groups.byName["a"].waiting, len(c.groups.byName["a"].queue)
	c.groups.mu.Unlock()
	if waiting != 0 || waiters != 0 {
		t.Fatalf("waiters left: %v %v", waiting, waiters)
	}
}

// A refused statement's held demand counts like a waiting statement's
// and ends at ReleaseDemand or, when its session goes quiet, after
// holdFor: an idle refused session does not keep its proxy's share up.
func TestHeldDemandEndsAfterSilence(t *testing.T) {
	c, clk := newTestClient(t, nil)
	var h DemandHold
	c.HoldDemand(&h, "a", 10)
	req := build(c, false)
	// 10 RU wanted within waitLead (20 ms): 500 RU/s of demand.
	if g := groupEntry(req, "a"); g == nil || !near(g.GetDemandRuPerSec(), 500) {
		t.Fatalf("entry %v, want demand 500", g)
	}
	if err := c.applyResponse(grantAll(req, 100)); err != nil {
		t.Fatal(err)
	}
	// The session says nothing more: after holdFor the hold is over, and
	// the next report's demand averages it only over the time it lasted.
	clk.Advance(holdFor)
	c.groups.mu.Lock()
	c.groups.refreshLocked(clk.Now())
	waiting := c.groups.byName["a"].waiting
	c.groups.mu.Unlock()
	if waiting != 0 {
		t.Fatalf("waiting %v after holdFor, want 0", waiting)
	}
	clk.Advance(holdFor)
	c.groups.mu.Lock()
	d := c.groups.byName["a"].demand(clk.Now())
	c.groups.mu.Unlock()
	if !near(d, 250) { // held 2 s of the 4 s since the report
		t.Fatalf("demand %v, want the held 500 RU/s averaged over half the window: 250", d)
	}
	c.groups.mu.Lock()
	c.groups.byName["a"].resetWaiting(clk.Now())
	clk.Advance(time.Second)
	d = c.groups.byName["a"].demand(clk.Now())
	c.groups.mu.Unlock()
	if d != 0 {
		t.Fatalf("demand %v in the next window, want 0", d)
	}
	// Released early, and released again after it expired: no harm.
	c.HoldDemand(&h, "a", 10)
	c.ReleaseDemand(&h)
	clk.Advance(holdFor)
	c.ReleaseDemand(&h)
	c.groups.mu.Lock()
	c.groups.refreshLocked(clk.Now())
	waiting, holds := c.groups.byName["a"].waiting, len(c.groups.holds)
	c.groups.mu.Unlock()
	if waiting != 0 || holds != 0 {
		t.Fatalf("waiting %v, %d holds listed; want none", waiting, holds)
	}
}

func TestAcquireFailFastTimeoutAndRefund(t *testing.T) {
	c, clk := newTestClient(t, nil)
	ctx := context.Background()
	// A grant of 10 tokens; this proxy's share of the rate is 10 RU/s.
	wantTokens(c, "a")
	req := build(c, false)
	resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "a", Tokens: 10, FillRate: 10, Proxies: 1, RuPerSec: 10}}}
	if err := c.applyResponse(resp); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		n        float64
		maxWait  time.Duration
		wantErr  bool
		timers   bool // it must wait before the outcome
		tokensAf float64
	}{
		{"enough tokens", 4, time.Second, false, false, 6},
		{"fail fast: 10 s at 10 RU/s", 106, time.Second, true, false, 6},
		{"zero max wait", 7, 0, true, false, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			waited, err := acquireAll(ctx, c, "a", rruOf(tc.n), tc.maxWait)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrThrottled)) {
				t.Fatalf("err %v", err)
			}
			if waited != 0 {
				t.Fatalf("waited %v", waited)
			}
			if got := tokensOf(c, "a"); !near(got, tc.tokensAf) {
				t.Fatalf("tokens %v, want %v", got, tc.tokensAf)
			}
		})
	}
	// 8 RU at 10 RU/s: 0.2 s short, within the 1 s max wait: it waits for
	// a grant, which does not come; after 1 s it is refused, nothing taken.
	done := make(chan error, 1)
	go func() {
		_, err := acquireAll(ctx, c, "a", rruOf(8), time.Second)
		done <- err
	}()
	waitFor(t, "the statement to wait", func() bool { return clk.Pending() == 1 }, nil)
	clk.Advance(time.Second)
	if err := <-done; !errors.Is(err, ErrThrottled) {
		t.Fatalf("timeout: %v", err)
	}
	if got := tokensOf(c, "a"); !near(got, 6) {
		t.Fatalf("tokens after timeout %v, want 6", got)
	}
	usage := c.Usage(clk.Now())
	if len(usage) != 1 || usage[0].Throttled != 3 {
		t.Fatalf("usage %+v, want 3 throttled", usage)
	}
}

// Statements waiting for a group's tokens take them in arrival order: a
// statement that arrives while another waits does not take the tokens
// the first one waits for, even when they would pay for it.
func TestAcquireServesWaitersInArrivalOrder(t *testing.T) {
	c, clk := newTestClient(t, nil)
	ctx := context.Background()
	wantTokens(c, "a")
	grant := func(n float64) {
		t.Helper()
		req := build(c, false)
		rid := uint64(0)
		if req != nil {
			rid = req.GetRequestId()
		}
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: rid, Grants: []*tokenpb.GroupGrant{
			{Group: "a", Tokens: n, FillRate: 10, Proxies: 1, RuPerSec: 10}}}); err != nil {
			t.Fatal(err)
		}
	}
	grant(0)
	first := make(chan error, 1)
	go func() {
		_, err := acquireAll(ctx, c, "a", rruOf(5), 10*time.Second)
		first <- err
	}()
	waitFor(t, "the first statement to wait", func() bool { return clk.Pending() == 1 }, nil)
	grant(4) // not enough for the first
	if _, err := acquireAll(ctx, c, "a", rruOf(3), 0); !errors.Is(err, ErrThrottled) {
		t.Fatalf("a later statement took the tokens a waiting one is owed: %v (tokens left %.1f)", err, tokensOf(c, "a"))
	}
	grant(1)
	if err := <-first; err != nil {
		t.Fatalf("the first statement: %v", err)
	}
	if got := tokensOf(c, "a"); !near(got, 0) {
		t.Fatalf("tokens %v after the first statement took 5, want 0", got)
	}
}

// A reservation that must wait for a trickle is refunded when ctx ends.
func TestAcquireCancelRefunds(t *testing.T) {
	c, clk := newTestClient(t, nil)
	wantTokens(c, "a")
	req := build(c, false)
	// 100 tokens over 10 s: 10 RU/s.
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "a", Tokens: 100, TrickleMs: 10000, FillRate: 10, Proxies: 1}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := acquireAll(ctx, c, "a", rruOf(5), time.Second)
		done <- err
	}()
	waitFor(t, "the statement to sleep", func() bool { return clk.Pending() == 1 }, nil)
	if got := tokensOf(c, "a"); !near(got, -5) {
		t.Fatalf("tokens while reserved %v, want -5", got)
	}
	cancel()
	err := <-done
	// The client left: its statement is not a throttled one.
	if errors.Is(err, ErrThrottled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled and not ErrThrottled", err)
	}
	if n := c.Usage(clk.Now())[0].Throttled; n != 0 {
		t.Fatalf("a cancelled wait counted as throttled (%d)", n)
	}
	if got := tokensOf(c, "a"); !near(got, 0) {
		t.Fatalf("tokens after refund %v, want 0", got)
	}
	// The same reservation completes when its 0.5 s passes.
	done2 := make(chan time.Duration, 1)
	go func() {
		w, err := acquireAll(context.Background(), c, "a", rruOf(5), time.Second)
		if err != nil {
			t.Error(err)
		}
		done2 <- w
	}()
	waitFor(t, "the statement to sleep", func() bool { return clk.Pending() == 1 }, nil)
	clk.Advance(500 * time.Millisecond)
	if w := <-done2; w != 500*time.Millisecond {
		t.Fatalf("waited %v, want 500ms", w)
	}
}

// Consumption is reported every ReportPeriod while consuming, even when
// no tokens are needed (report_only), and sums AcquireShare and Charge.
func TestReportsEveryPeriod(t *testing.T) {
	c, clk := newTestClient(t, func(cfg *Config) { cfg.ReportPeriod = 2 * time.Second })
	setGroups(c, resourcegroup.Group{Name: "u", RUPerSec: resourcegroup.Unlimited})
	if _, err := acquireAll(context.Background(), c, "u", ru.Consumption{WRU: 2, WriteBytes: 100, Statements: 1}, 0); err != nil {
		t.Fatal(err)
	}
	c.Charge("u", ru.Consumption{RRU: 1.5, ReadBytes: 10, BackendSeconds: 0.25})
	if req := build(c, false); req != nil {
		t.Fatalf("report before the period: %v", req)
	}
	clk.Advance(2 * time.Second)
	req := build(c, false)
	g := groupEntry(req, "u")
	if g == nil || !g.GetReportOnly() || g.GetTokensWanted() != 0 {
		t.Fatalf("want a report-only entry, got %v", req)
	}
	want := &tokenpb.Consumption{Rru: 1.5, Wru: 2, ReadBytes: 10, WriteBytes: 100, BackendSeconds: 0.25, Statements: 1}
	got := g.GetConsumption()
	if got.GetRru() != want.Rru || got.GetWru() != want.Wru || got.GetReadBytes() != want.ReadBytes ||
		got.GetWriteBytes() != want.WriteBytes || got.GetBackendSeconds() != want.BackendSeconds || got.GetStatements() != 1 {
		t.Fatalf("consumption %v, want %v", got, want)
	}
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(),
		Grants: []*tokenpb.GroupGrant{{Group: "u", Unlimited: true}}}); err != nil {
		t.Fatal(err)
	}
	// A refund larger than what is pending waits (rgserver takes no negative numbers).
	c.Charge("u", ru.Consumption{WRU: -1})
	clk.Advance(2 * time.Second)
	if req := build(c, false); req != nil {
		t.Fatalf("nothing positive to report, got %v", req)
	}
	c.Charge("u", ru.Consumption{WRU: 3})
	req = build(c, false)
	if g := groupEntry(req, "u"); g == nil || g.GetConsumption().GetWru() != 2 {
		t.Fatalf("netted report: %v", req)
	}
}

// A trickle refills the bucket at tokens/duration; a new trickle carries
// over what the running one has still to deliver; no ask while a trickle
// has more than trickleLead left.
func TestTrickle(t *testing.T) {
	c, clk := newTestClient(t, nil)
	wantTokens(c, "a")
	req := build(c, false)
	trickle := func(req *tokenpb.TokenRequest, n float64, ms int64) {
		t.Helper()
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
			{Group: "a", Tokens: n, TrickleMs: ms, FillRate: n / float64(ms) * 1000, Proxies: 2}}}); err != nil {
			t.Fatal(err)
		}
	}
	trickle(req, 100, 10000)
	clk.Advance(5 * time.Second)
	if got := tokensOf(c, "a"); !near(got, 50) {
		t.Fatalf("tokens after 5 s of 10 RU/s: %v", got)
	}
	c.Charge("a", rruOf(60)) // low: below 0 now
	if req := build(c, false); req != nil && !groupEntry(req, "a").GetReportOnly() {
		t.Fatalf("asked with 5 s of trickle left: %v", req)
	} else if req != nil {
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(),
			Grants: []*tokenpb.GroupGrant{{Group: "a", FillRate: 10, Proxies: 2}}}); err != nil {
			t.Fatal(err)
		}
		if got := tokensOf(c, "a"); !near(got, -10) {
			t.Fatalf("a report's answer changed the bucket: %v", got)
		}
	}
	clk.Advance(4 * time.Second) // 1 s left
	req = build(c, false)
	g := groupEntry(req, "a")
	if g == nil || g.GetReportOnly() {
		t.Fatalf("want an ask near the trickle's end, got %v", req)
	}
	// The new trickle replaces what was left of the old one (10 RU):
	// rgserver released that reservation when it granted.
	trickle(req, 100, 10000)
	c.groups.mu.Lock()
	rate := c.groups.byName["a"].bucket.FillRate(clk.Now())
	c.groups.mu.Unlock()
	if !near(rate, 10) {
		t.Fatalf("fill rate %v, want 10", rate)
	}
}

// After a burst, a proxy whose group goes idle holds at most its share of
// the group's capacity: trickles stop filling there, and a bucket at its
// capacity does not ask again however busy the group just was. (Without
// the cap, a 100 RU/s group once held 314 RU here after 40 s idle, plus
// rgserver's own 100: four capacities spent at the next burst.)
func TestIdleProxyHoldsAtMostItsCapacity(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 100})
	grant := func(req *tokenpb.TokenRequest, n float64) {
		t.Helper()
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
			{Group: "g", Tokens: n, TrickleMs: 2000, FillRate: 100, RuPerSec: 100, Proxies: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	// A burst: 8 heavy statements charged at once, 200 RU of debt.
	for range 8 {
		c.Charge("g", rruOf(25))
	}
	asks := 0
	for range 40 { // 20 s in steps of 500 ms, answering every ask with a 2 s trickle of 400 RU
		if req := build(c, false); req != nil {
			if g := groupEntry(req, "g"); g != nil && !g.GetReportOnly() {
				asks++
				grant(req, 400)
			}
		}
		clk.Advance(500 * time.Millisecond)
		if got := tokensOf(c, "g"); got > 100+1e-9 {
			t.Fatalf("after %d asks the idle proxy holds %.1f RU, more than the group's capacity (100)", asks, got)
		}
	}
	if asks == 0 {
		t.Fatal("never asked to pay the burst's debt")
	}
	if got := tokensOf(c, "g"); !near(got, 100) {
		t.Fatalf("tokens after 20 s idle: %.1f, want the capacity, 100", got)
	}
	// At its capacity, the bucket asks no more.
	clk.Advance(5 * time.Second)
	if req := build(c, false); req != nil {
		if g := groupEntry(req, "g"); g != nil && !g.GetReportOnly() {
			t.Fatalf("asked for tokens with a full bucket: %v", g)
		}
	}
}

// An idle proxy tells rgserver what its bucket saved, once its trickle is
// over, so that rgserver's bucket saves only the rest of the group's
// capacity; after releaseAfter without a statement it gives the tokens
// back (rgserver forgets a silent proxy's slot after a minute) and asks
// again only when a statement needs tokens.
func TestIdleProxyTellsWhatItHoldsAndGivesItBack(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 100})
	answer := func(req *tokenpb.TokenRequest) {
		t.Helper()
		resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
		for _, g := range req.GetGroups() {
			gr := &tokenpb.GroupGrant{Group: g.GetGroup(), FillRate: 100, RuPerSec: 100, Proxies: 1}
			if !g.GetReportOnly() {
				gr.Tokens, gr.TrickleMs = 250, 2000
			}
			resp.Grants = append(resp.Grants, gr)
		}
		if err := c.applyResponse(resp); err != nil {
			t.Fatal(err)
		}
	}
	c.Charge("g", rruOf(25))
	var held []float64 // held_tokens of every report-only message
	asks := 0
	step := func(n int) {
		for range n {
			if req := build(c, false); req != nil {
				if g := groupEntry(req, "g"); g != nil {
					if g.GetReportOnly() {
						held = append(held, g.GetHeldTokens())
					} else {
						asks++
					}
				}
				answer(req)
			}
			clk.Advance(500 * time.Millisecond)
		}
	}
	step(10) // 5 s: one ask, a 2 s trickle that fills the bucket to its cap
	if asks != 1 || !near(tokensOf(c, "g"), 100) {
		t.Fatalf("%d asks, %.1f tokens; want 1 ask and the capacity, 100", asks, tokensOf(c, "g"))
	}
	if len(held) == 0 || !near(held[len(held)-1], 100) {
		t.Fatalf("reports said it holds %v, want a last report of 100", held)
	}
	n := len(held)
	step(20) // 10 s more idle: nothing changed, nothing sent
	if len(held) != n || asks != 1 {
		t.Fatalf("an idle proxy sent %v more reports and %d asks", held[n:], asks-1)
	}
	step(20) // past releaseAfter: the tokens go back, said once
	if got := tokensOf(c, "g"); got != 0 || asks != 1 {
		t.Fatalf("after 25 s idle: %.1f tokens, %d asks; want 0 and no new ask", got, asks)
	}
	if len(held) != n+1 || held[n] != 0 {
		t.Fatalf("reports after the release: %v, want one saying 0", held[n:])
	}
	// A statement that needs tokens asks for them.
	c.Charge("g", rruOf(1))
	step(1)
	if asks != 2 {
		t.Fatalf("a statement after the release: %d asks, want a new one", asks-1)
	}
}

func TestNotLeaderRestoresConsumption(t *testing.T) {
	c, _ := newTestClient(t, nil)
	c.Charge("a", rruOf(7))
	req := build(c, false)
	err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(),
		NotLeader: &tokenpb.NotLeader{LeaderAddr: "10.0.0.1:3379"}})
	nl, ok := errors.AsType[*notLeaderError](err)
	if !ok || nl.leader != "10.0.0.1:3379" {
		t.Fatalf("err %v", err)
	}
	again := build(c, false)
	if g := groupEntry(again, "a"); g == nil || !near(g.GetConsumption().GetRru(), 7) {
		t.Fatalf("consumption not restored: %v", again)
	}
}

// Refusals (CountThrottled) ride with the consumption as
// Consumption.throttled: a group that only refused reports too, each
// refusal is sent once, and a NOT_LEADER answer puts them back.
func TestThrottledReported(t *testing.T) {
	c, clk := newTestClient(t, func(cfg *Config) { cfg.ReportPeriod = 2 * time.Second })
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 10})
	c.CountThrottled("g", 0)
	c.CountThrottled("g", 0)
	if req := build(c, false); req != nil {
		t.Fatalf("report before the period: %v", req)
	}
	clk.Advance(2 * time.Second)
	req := build(c, false)
	if g := groupEntry(req, "g"); g == nil || g.GetConsumption().GetThrottled() != 2 || !g.GetReportOnly() {
		t.Fatalf("want a report of 2 refusals, got %v", req)
	}
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(),
		NotLeader: &tokenpb.NotLeader{LeaderAddr: "10.0.0.1:3379"}}); err == nil {
		t.Fatal("NOT_LEADER answered without an error")
	}
	c.CountThrottled("g", 0)
	clk.Advance(2 * time.Second)
	req = build(c, false)
	if g := groupEntry(req, "g"); g == nil || g.GetConsumption().GetThrottled() != 3 {
		t.Fatalf("after NOT_LEADER want the 2 refusals back plus 1, got %v", req)
	}
	if err := c.applyResponse(grantAll(req, 10)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if req := build(c, false); groupEntry(req, "g") != nil {
		t.Fatalf("refusals reported twice: %v", req)
	}
	if u := c.Usage(clk.Now()); len(u) != 1 || u[0].Group != "g" || u[0].Throttled != 3 {
		t.Fatalf("usage %+v: THROTTLED counts every refusal since start", u)
	}
}

// The counts that ride with a group's consumption — refusals (throttled,
// refused), the estimates that waited or were denied — and the report's
// interval: each is sent once, a NOT_LEADER answer puts the counts and
// the interval's start back, and the interval is the time since the last
// report rgserver took, at most a minute.
func TestReportCountsAndInterval(t *testing.T) {
	c, clk := newTestClient(t, func(cfg *Config) { cfg.ReportPeriod = 2 * time.Second })
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 1000})
	c.Charge("g", rruOf(3)) // the group's state starts now
	c.CountWaited("g", 2)
	c.CountThrottled("g", 5)
	c.CountRefused("g", 4)
	c.CountThrottled("g", math.NaN()) // counted, its estimate as 0
	c.CountWaited("g", -1)
	clk.Advance(2 * time.Second)
	req := build(c, false)
	check := func(req *tokenpb.TokenRequest, throttled, refused uint64, waited, denied float64, interval uint32) {
		t.Helper()
		g := groupEntry(req, "g")
		if g == nil {
			t.Fatalf("no report of g: %v", req)
		}
		cons := g.GetConsumption()
		if cons.GetThrottled() != throttled || cons.GetRefused() != refused || !near(cons.GetWaitedRu(), waited) ||
			!near(cons.GetDeniedRu(), denied) || cons.GetIntervalMs() != interval {
			t.Fatalf("report %v, want throttled %d refused %d waited %v denied %v interval %d ms",
				cons, throttled, refused, waited, denied, interval)
		}
	}
	check(req, 2, 1, 2, 9, 2000)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(),
		NotLeader: &tokenpb.NotLeader{LeaderAddr: "10.0.0.1:3379"}}); err == nil {
		t.Fatal("NOT_LEADER answered without an error")
	}
	c.CountWaited("g", 1)
	clk.Advance(2 * time.Second)
	req = build(c, false)
	check(req, 2, 1, 3, 9, 4000) // since the last report rgserver took: none yet
	if err := c.applyResponse(grantAll(req, 10)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	c.Charge("g", rruOf(1)) // after an idle spell the report covers the time from its first figure
	clk.Advance(300 * time.Millisecond)
	c.Charge("g", rruOf(1))
	clk.Advance(200 * time.Millisecond)
	req = build(c, false)
	check(req, 0, 0, 0, 0, 500)
	// ... to its last: the 200 ms since are idle.
	if idle := groupEntry(req, "g").GetConsumption().GetIdleMs(); idle != 200 {
		t.Fatalf("idle_ms %d, want 200", idle)
	}
	if err := c.applyResponse(grantAll(req, 10)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Minute)
	c.CountRefused("g", 1) // a refusal alone is something to report
	clk.Advance(10 * time.Minute)
	req = build(c, false)
	check(req, 0, 1, 0, 1, maxIntervalMs)
}

// Counting a statement's refusal or wait allocates nothing once its
// group's state exists.
func TestCountsAllocateNothing(t *testing.T) {
	c, _ := newTestClient(t, nil)
	run := func() {
		c.CountThrottled(resourcegroup.DefaultGroup, 1)
		c.CountRefused(resourcegroup.DefaultGroup, 1)
		c.CountWaited(resourcegroup.DefaultGroup, 1)
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per count, want 0", n)
	}
}

func TestGrantErrorDropsGroup(t *testing.T) {
	c, clk := newTestClient(t, nil)
	done := make(chan error, 1)
	go func() {
		_, err := acquireAll(context.Background(), c, "gone", rruOf(1), 5*time.Second)
		done <- err
	}()
	waitFor(t, "the statement to wait", func() bool { return clk.Pending() == 1 }, nil)
	req := build(c, false)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "gone", Error: `resource group "gone" not found`}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("err %v", err)
	}
}

// A group rgserver cannot read for now (GRANT_ERROR_UNAVAILABLE, or an
// older server's "unavailable:" text) keeps its limit: its statements wait
// on a local refill at RU_PER_SEC ÷ proxies, it asks again a second later,
// and the next real grant ends the local refill.
func TestGrantUnavailableKeepsGroupLimited(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grant *tokenpb.GroupGrant
	}{
		{"typed", &tokenpb.GroupGrant{Group: "lim", Error: "etcd is away", ErrorCode: tokenpb.GrantError_GRANT_ERROR_UNAVAILABLE}},
		{"older server", &tokenpb.GroupGrant{Group: "lim", Error: "unavailable: etcd is away"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := newTestClient(t, nil)
			setGroups(c, resourcegroup.Group{Name: "lim", RUPerSec: 10})
			done := make(chan error, 1)
			go func() {
				_, err := acquireAll(context.Background(), c, "lim", rruOf(5), 5*time.Second)
				done <- err
			}()
			waitFor(t, "the statement to wait", func() bool { return clk.Pending() == 1 }, nil)
			req := build(c, false)
			if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{tc.grant}}); err != nil {
				t.Fatal(err)
			}
			// 10 RU/s locally: 5 RU after half a second, not at once, not never.
			clk.Advance(400 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("ran after 0.4 s at 10 RU/s: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			if err := result(t, done, func() { clk.Advance(10 * time.Millisecond) }); err != nil {
				t.Fatalf("the group was not kept: %v", err)
			}
			if build(c, false) != nil {
				t.Fatal("asked again before a second passed")
			}
			clk.Advance(time.Second)
			again := build(c, false)
			if g := groupEntry(again, "lim"); g == nil || g.GetReportOnly() {
				t.Fatalf("no new ask a second later: %v", again)
			}
			if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: again.GetRequestId(), Grants: []*tokenpb.GroupGrant{
				{Group: "lim", Tokens: 3, RuPerSec: 10, Proxies: 1, FillRate: 10}}}); err != nil {
				t.Fatal(err)
			}
			before := tokensOf(c, "lim")
			clk.Advance(2 * time.Second)
			if got := tokensOf(c, "lim"); !near(got, before) {
				t.Fatalf("the local refill goes on after a grant: %v → %v", before, got)
			}
		})
	}
}

func TestUnlimitedNeverThrottles(t *testing.T) {
	c, _ := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "u", RUPerSec: 10, Burst: resourcegroup.BurstUnlimited})
	for range 3 {
		if _, err := acquireAll(context.Background(), c, "u", rruOf(1e9), 0); err != nil {
			t.Fatal(err)
		}
	}
	if req := build(c, false); req != nil {
		t.Fatalf("an unlimited group asked for tokens: %v", req)
	}
	// Back to a limit: it asks.
	setGroups(c, resourcegroup.Group{Name: "u", RUPerSec: 10})
	req := build(c, false)
	if g := groupEntry(req, "u"); g == nil || g.GetReportOnly() {
		t.Fatalf("want an ask, got %v", req)
	}
}

// Without a grant for DegradedAfter the client refills locally at
// RU_PER_SEC ÷ proxies with the BURSTABLE burst; a grant resyncs it.
func TestDegradedRefillAndResync(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "off", RUPerSec: 300}, resourcegroup.Group{Name: "mod", RUPerSec: 300, Burst: resourcegroup.BurstModerated})
	c.Charge("off", rruOf(0))
	c.Charge("mod", rruOf(0))
	c.groups.mu.Lock()
	c.groups.byName["off"].want, c.groups.byName["mod"].want = true, true
	c.groups.mu.Unlock()
	req := build(c, false)
	resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
	for _, name := range []string{"off", "mod"} {
		resp.Grants = append(resp.Grants, &tokenpb.GroupGrant{Group: name, Tokens: 10, FillRate: 100, Proxies: 3, RuPerSec: 300})
	}
	if err := c.applyResponse(resp); err != nil {
		t.Fatal(err)
	}
	c.streamEnded() // the stream breaks
	clk.Advance(4 * time.Second)
	if c.Degraded() {
		t.Fatal("degraded before DegradedAfter")
	}
	clk.Advance(time.Second)
	if !c.Degraded() {
		t.Fatal("not degraded after DegradedAfter")
	}
	clk.Advance(time.Hour)
	for _, tc := range []struct {
		name         string
		rate, tokens float64
	}{{"off", 100, 100}, {"mod", 100, 1000}} {
		c.groups.mu.Lock()
		b := &c.groups.byName[tc.name].bucket
		rate, tokens := b.FillRate(clk.Now()), b.Tokens(clk.Now())
		c.groups.mu.Unlock()
		if !near(rate, tc.rate) || !near(tokens, tc.tokens) {
			t.Fatalf("%s: rate %v tokens %v, want %v %v", tc.name, rate, tokens, tc.rate, tc.tokens)
		}
	}
	// Statements keep being served at the local rate.
	if _, err := acquireAll(context.Background(), c, "off", rruOf(100), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := acquireAll(context.Background(), c, "off", rruOf(100), 500*time.Millisecond); !errors.Is(err, ErrThrottled) {
		t.Fatalf("over the local rate: %v", err)
	}
	// A new stream's first request resyncs every group.
	req = build(c, true)
	if groupEntry(req, "off") == nil || groupEntry(req, "mod") == nil {
		t.Fatalf("resync request %v", req)
	}
	if err := c.applyResponse(grantAll(req, 100)); err != nil {
		t.Fatal(err)
	}
	if c.Degraded() {
		t.Fatal("still degraded after a grant")
	}
	c.groups.mu.Lock()
	rate := c.groups.byName["off"].bucket.FillRate(clk.Now())
	c.groups.mu.Unlock()
	if rate != 0 {
		t.Fatalf("local refill still on: %v", rate)
	}
}

// A request unanswered for DegradedAfter also means degraded mode.
func TestDegradedWhenUnanswered(t *testing.T) {
	c, clk := newTestClient(t, nil)
	c.Charge("a", rruOf(1))
	req := build(c, true)
	if err := c.applyResponse(grantAll(req, 1)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	c.Charge("a", rruOf(100))
	if build(c, false) == nil {
		t.Fatal("no request")
	}
	clk.Advance(5 * time.Second)
	if !c.Degraded() {
		t.Fatal("not degraded with a request unanswered")
	}
}

func TestUsageWindow(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "u", RUPerSec: resourcegroup.Unlimited}, resourcegroup.Group{Name: "idle", RUPerSec: 5})
	for range 10 {
		c.Charge("u", rruOf(30))
		clk.Advance(time.Second)
	}
	u := c.Usage(clk.Now())
	if len(u) != 2 || u[0].Group != "idle" || u[1].Group != "u" {
		t.Fatalf("usage %+v", u)
	}
	if !near(u[1].RUPerSec, 27) || !u[1].Unlimited { // the oldest second left the window
		t.Fatalf("rate %v", u[1].RUPerSec)
	}
	clk.Advance(20 * time.Second)
	if u := c.Usage(clk.Now()); u[1].RUPerSec != 0 {
		t.Fatalf("rate after idle %v", u[1].RUPerSec)
	}
}

// What the old trickle delivers while a renewal is on its way was already
// released by rgserver when it granted: it is taken back, so slow round
// trips do not add up to more than the group's rate.
func TestRenewalRoundTripNotCountedTwice(t *testing.T) {
	c, clk := newTestClient(t, nil)
	wantTokens(c, "a")
	apply := func(req *tokenpb.TokenRequest, n float64, ms int64) {
		t.Helper()
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
			{Group: "a", Tokens: n, TrickleMs: ms, FillRate: n / float64(ms) * 1000, Proxies: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	apply(build(c, false), 100, 10000) // 10 RU/s for 10 s
	clk.Advance(9500 * time.Millisecond)
	c.groups.mu.Lock()
	c.groups.byName["a"].nextAsk = time.Time{}
	c.groups.byName["a"].want = true
	c.groups.mu.Unlock()
	req := build(c, false)
	if g := groupEntry(req, "a"); g == nil || g.GetReportOnly() {
		t.Fatalf("want an ask near the trickle's end, got %v", req)
	}
	clk.Advance(300 * time.Millisecond) // the round trip: 3 RU more trickled here
	apply(req, 50, 5000)
	// 95 delivered before the request left; the 3 that came during the
	// round trip are taken back; the new trickle has delivered nothing yet.
	if got := tokensOf(c, "a"); !near(got, 95) {
		t.Fatalf("tokens after the renewal: %v, want 95", got)
	}
	clk.Advance(5 * time.Second)
	if got := tokensOf(c, "a"); !near(got, 145) {
		t.Fatalf("tokens after the new trickle: %v, want 145", got)
	}
}

// An estimate larger than the wait can pay never refuses a statement its
// required cost alone would run: it waits what the wait can pay (or until
// the fill has paid its debt) and the rest stays as debt.
func TestAcquireShareEstimate(t *testing.T) {
	setup := func(t *testing.T) (*Client, *fakeClock) {
		c, clk := newTestClient(t, nil)
		wantTokens(c, "a")
		req := build(c, false)
		// 10 tokens now, then 10 RU/s for 100 s.
		if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
			{Group: "a", Tokens: 10, FillRate: 10, Proxies: 1, RuPerSec: 10}}}); err != nil {
			t.Fatal(err)
		}
		c.groups.mu.Lock()
		c.groups.byName["a"].bucket.Reconfigure(clk.Now(), 0, 10, 0, 0)
		c.groups.mu.Unlock()
		return c, clk
	}
	tests := []struct {
		name      string
		estimate  float64
		required  float64
		maxWait   time.Duration
		wantErr   bool
		wantSleep time.Duration // 0: no wait
		tokensAf  float64
	}{
		{"estimate paid at once", 8, 1, time.Second, false, 0, 2},
		{"estimate paid within the wait", 15, 1, time.Second, false, 500 * time.Millisecond, -5},
		{"estimate beyond the wait: wait it all, the rest is debt", 60, 1, 2 * time.Second, false, 2 * time.Second, -50},
		{"required alone beyond the wait: refused as before", 60, 40, 2 * time.Second, true, 0, 10},
		{"no estimate: all required", 60, 60, 2 * time.Second, true, 0, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := setup(t)
			done := make(chan error, 1)
			var waited time.Duration
			go func() {
				var err error
				_, waited, err = c.AcquireShare(context.Background(), nil, "a", rruOf(tc.estimate), tc.required, tc.maxWait)
				done <- err
			}()
			if tc.wantSleep > 0 {
				waitFor(t, "the statement to sleep", func() bool { return clk.Pending() == 1 }, nil)
				clk.Advance(tc.wantSleep)
			}
			err := <-done
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrThrottled)) {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			if err == nil && waited != tc.wantSleep {
				t.Fatalf("waited %v, want %v", waited, tc.wantSleep)
			}
			if got := tokensOf(c, "a") - 10*tc.wantSleep.Seconds(); !near(got, tc.tokensAf) {
				t.Fatalf("tokens %v (before the fill of the wait), want %v", got, tc.tokensAf)
			}
		})
	}
}

func TestBucketCanReserve(t *testing.T) {
	now := time.Unix(100, 0)
	var b Bucket
	b.Reconfigure(now, 5, 10, 0, 0)
	tests := []struct {
		n       float64
		maxWait time.Duration
		want    bool
	}{
		{5, 0, true},
		{6, 0, false},
		{6, 100 * time.Millisecond, true},
		{15, time.Second, true},
		{15, 999 * time.Millisecond, false},
	}
	for _, tc := range tests {
		if got := b.CanReserve(now, tc.n, tc.maxWait); got != tc.want {
			t.Errorf("%s: CanReserve(%v, %v) = %v, want %v", b.String(now), tc.n, tc.maxWait, got, tc.want)
		}
	}
	if got := b.Tokens(now); got != 5 {
		t.Fatalf("CanReserve took tokens: %v", got)
	}
	// A trickle that ends before the wait would pay cannot reserve.
	b.Trickle(now, 10, time.Second, 0, 0)
	if b.CanReserve(now, 20, 5*time.Second) {
		t.Fatal("reserved past the end of the trickle")
	}
	b.SetUnlimited(true)
	if !b.CanReserve(now, 1e9, 0) {
		t.Fatal("unlimited bucket refused")
	}
}

// A grant made under settings older than the cache's does not undo the
// cache's mode. ALTER … MODE = ENFORCE reaches the cache while a report
// made in WARN is on its way: its unlimited answer leaves the group
// limited, and the group asks for tokens; the other way round, a grant
// made in ENFORCE that arrives after MODE = WARN leaves it unlimited.
func TestStaleGrantKeepsTheCachedMode(t *testing.T) {
	c, clk := newTestClient(t, nil)
	warn := resourcegroup.Group{Name: "w", RUPerSec: 10, Burst: resourcegroup.BurstOff, Mode: resourcegroup.ModeWarn, Version: 5}
	setGroups(c, warn)
	c.Charge("w", rruOf(1))
	req := build(c, true)
	if g := groupEntry(req, "w"); g == nil || !g.GetReportOnly() {
		t.Fatalf("WARN: want a report of w, got %v", req)
	}
	enforce := warn
	enforce.Mode, enforce.Version = resourcegroup.ModeEnforce, 7
	setGroups(c, enforce)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "w", Unlimited: true, SettingsVersion: 5, Proxies: 1}}}); err != nil {
		t.Fatal(err)
	}
	if bucketUnlimited(c, "w") {
		t.Fatal("after WARN's answer to a group now in ENFORCE: the bucket is unlimited")
	}
	clk.Advance(minAskInterval)
	req = build(c, false)
	if g := groupEntry(req, "w"); g == nil || g.GetReportOnly() || g.GetTokensWanted() <= 0 {
		t.Fatalf("ENFORCE: want an ask for w's tokens, got %v", req)
	}

	warn.Version = 9
	setGroups(c, warn)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "w", Tokens: 10, FillRate: 10, RuPerSec: 10, SettingsVersion: 7, Proxies: 1}}}); err != nil {
		t.Fatal(err)
	}
	if !bucketUnlimited(c, "w") {
		t.Fatal("after ENFORCE's grant to a group now in WARN: the bucket is limited")
	}

	// A grant newer than the cache (the ALTER has not reached it yet) is
	// applied as it says.
	clk.Advance(minAskInterval)
	c.Charge("w", rruOf(1))
	req = build(c, true)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "w", Tokens: 10, FillRate: 10, RuPerSec: 10, SettingsVersion: 11, Proxies: 1}}}); err != nil {
		t.Fatal(err)
	}
	if bucketUnlimited(c, "w") {
		t.Fatal("after a grant made under newer settings than the cache's: the bucket is unlimited")
	}
}

// bucketUnlimited reports whether group's bucket on c is unlimited.
func bucketUnlimited(c *Client, group string) bool {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	return c.groups.byName[group].bucket.Unlimited()
}

// MODE WARN: the group is never throttled, and WouldAcquire tells what
// ENFORCE would have done, from a shadow bucket at the group's fair share.
func TestWouldAcquireShadowsEnforce(t *testing.T) {
	c, clk := newTestClient(t, nil)
	putGroup(c, resourcegroup.Group{Name: "w", RUPerSec: 10, Mode: resourcegroup.ModeWarn})
	if sh := shareOf(c, "w"); !sh.Unlimited || sh.Mode != resourcegroup.ModeWarn {
		t.Fatalf("a WARN group's share %+v: want unlimited, mode WARN", sh)
	}
	// Never waits for real.
	if w, err := acquireAll(context.Background(), c, "w", rruOf(1000), time.Millisecond); err != nil || w != 0 {
		t.Fatalf("AcquireShare in WARN: %v %v", w, err)
	}
	steps := []struct {
		n, required float64
		maxWait     time.Duration
		wait        time.Duration
		refused     bool
	}{
		{4, 4, time.Second, 0, false},                      // a full bucket of 10: 6 left
		{4, 4, time.Second, 0, false},                      // 2 left
		{4, 4, time.Second, 200 * time.Millisecond, false}, // 2 short at 10 RU/s
		{30, 30, time.Second, 0, true},                     // 32 short: more than a second
		{30, 1, time.Second, time.Second, false},           // the estimate beyond the wait: waits it all
		{1, 1, 100 * time.Millisecond, 0, true},            // 31 in debt now
	}
	for i, st := range steps {
		w, refused := c.WouldAcquire("w", rruOf(st.n), st.required, st.maxWait, false)
		if w != st.wait || refused != st.refused {
			t.Fatalf("step %d: would wait %v refused %v, want %v %v", i, w, refused, st.wait, st.refused)
		}
	}
	clk.Advance(10 * time.Second) // the shadow refills: 100 RU of fill pay the debt, capped at 10
	if w, refused := c.WouldAcquire("w", rruOf(10), 10, 0, false); w != 0 || refused {
		t.Fatalf("after refill: %v %v", w, refused)
	}
	// RU_PER_SEC lowered from 1,000 to 10 while the shadow is full: it
	// keeps no more than the new capacity, so the new limit shows at once.
	putGroup(c, resourcegroup.Group{Name: "w", RUPerSec: 1000, Mode: resourcegroup.ModeWarn})
	c.WouldAcquire("w", rruOf(0), 0, 0, false) // the shadow follows the new rate from here
	clk.Advance(10 * time.Second)
	if w, refused := c.WouldAcquire("w", rruOf(500), 500, 0, false); w != 0 || refused {
		t.Fatalf("at 1,000 RU/s: %v %v", w, refused)
	}
	putGroup(c, resourcegroup.Group{Name: "w", RUPerSec: 10, Mode: resourcegroup.ModeWarn})
	if w, refused := c.WouldAcquire("w", rruOf(15), 15, time.Second, false); w != 500*time.Millisecond || refused {
		t.Fatalf("lowered to 10 RU/s, 15 RU: would wait %v refused %v, want 500ms (10 held, 5 short)", w, refused)
	}
	// An ENFORCE group is not shadowed.
	putGroup(c, resourcegroup.Group{Name: "e", RUPerSec: resourcegroup.Unlimited})
	if w, refused := c.WouldAcquire("e", rruOf(1e6), 1e6, 0, false); w != 0 || refused {
		t.Fatalf("an unlimited group would wait %v refused %v", w, refused)
	}
}

// The shadow bucket takes what ENFORCE's bucket would: a statement's
// measured cost settled after it ran (Charge), a refund, and a statement
// ENFORCE would have run on its session's debt.
func TestWouldAcquireTakesSettledCostAndDebt(t *testing.T) {
	c, _ := newTestClient(t, nil)
	putGroup(c, resourcegroup.Group{Name: "w", RUPerSec: 10, Burst: resourcegroup.BurstOff, Mode: resourcegroup.ModeWarn})
	steps := []struct {
		name    string
		do      func() (time.Duration, bool)
		wait    time.Duration
		refused bool
	}{
		{"a prepaid 1 of a full 10", func() (time.Duration, bool) { return c.WouldAcquire("w", rruOf(1), 1, time.Second, false) }, 0, false},
		{"its measured 11 more leave 2 owed", func() (time.Duration, bool) {
			c.Charge("w", rruOf(11))
			return c.WouldAcquire("w", rruOf(1), 1, time.Second, false)
		}, 300 * time.Millisecond, false}, // 2 owed + 1 at 10 RU/s
		{"a refund of 5", func() (time.Duration, bool) {
			c.Charge("w", rruOf(-5))
			return c.WouldAcquire("w", rruOf(1), 1, time.Second, false)
		}, 0, false}, // 3 owed − 5: 2 left, 1 after
		{"refused outside a transaction: takes nothing", func() (time.Duration, bool) {
			return c.WouldAcquire("w", rruOf(20), 20, time.Second, false)
		}, 0, true},
		{"refused inside one: runs on debt, taken", func() (time.Duration, bool) {
			return c.WouldAcquire("w", rruOf(20), 20, time.Second, true)
		}, 0, true},
		{"after the debt", func() (time.Duration, bool) { return c.WouldAcquire("w", rruOf(1), 1, 10*time.Second, false) }, 2 * time.Second, false}, // 1 − 20 = 19 owed, + 1
	}
	for _, st := range steps {
		w, refused := st.do()
		if w != st.wait || refused != st.refused {
			t.Fatalf("%s: would wait %v refused %v, want %v %v", st.name, w, refused, st.wait, st.refused)
		}
	}
}

// A statement's two visits to the client — AcquireShare before, Charge
// after — allocate nothing once its group's state exists.
func TestAcquireShareAndChargeAllocateNothing(t *testing.T) {
	c, _ := newTestClient(t, nil)
	ctx := context.Background()
	cons := ru.Consumption{RRU: 0.7}
	run := func() {
		if _, _, err := c.AcquireShare(ctx, nil, resourcegroup.DefaultGroup, cons, 0.625, time.Second); err != nil {
			t.Fatal(err)
		}
		c.Charge(resourcegroup.DefaultGroup, ru.Consumption{RRU: 0.05})
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per statement, want 0", n)
	}
}

// Overview lists the groups in use here first, busiest first, then the
// others by name, within the limit; it counts every group, default
// included before rgserver sends it, and walks many groups in chunks.
func TestOverview(t *testing.T) {
	c, clk := newTestClient(t, nil)
	groups := []resourcegroup.Group{
		{Name: "busy", RUPerSec: 100}, {Name: "light", RUPerSec: resourcegroup.Unlimited},
		{Name: "warned", RUPerSec: 5, Mode: resourcegroup.ModeWarn},
	}
	for i := range 3000 {
		groups = append(groups, resourcegroup.Group{Name: fmt.Sprintf("idle%04d", i), RUPerSec: uint64(i + 1)})
	}
	setGroups(c, groups...)
	for range 10 {
		c.Charge("busy", ru.Consumption{RRU: 20, Statements: 2})
		c.Charge("light", rruOf(1))
		clk.Advance(time.Second)
	}
	c.CountThrottled("busy", 0)
	c.Charge("gone", rruOf(1)) // used here, unknown to the cache

	o := c.Overview(clk.Now(), 6)
	// No rgserver answered for 10 s: degraded.
	if o.Total != 3000+4+1 || o.InUse != 3 || len(o.Groups) != 6 || o.Connected || !o.Degraded {
		t.Fatalf("total %d, in use %d, listed %d, connected %v, degraded %v", o.Total, o.InUse, len(o.Groups), o.Connected, o.Degraded)
	}
	var names []string
	for _, g := range o.Groups {
		names = append(names, g.Definition.Name)
	}
	if want := "[busy light gone default idle0000 idle0001]"; fmt.Sprint(names) != want {
		t.Fatalf("order %v, want %s", names, want)
	}
	busy, light, gone, def, idle := o.Groups[0], o.Groups[1], o.Groups[2], o.Groups[3], o.Groups[4]
	if !busy.InUse || !busy.Defined || busy.Definition.RUPerSec != 100 || !near(busy.RUPerSec, 18) ||
		!near(busy.StatementsPerSec, 1.8) || busy.Throttled != 1 || busy.Unlimited {
		t.Fatalf("busy: %+v", busy) // the first second left the window
	}
	if !light.Unlimited || !near(light.RUPerSec, 0.9) {
		t.Fatalf("light: %+v", light)
	}
	if gone.Defined || !gone.InUse || gone.Definition.Name != "gone" {
		t.Fatalf("gone: %+v", gone)
	}
	if def.InUse || !def.Defined || def.Definition.RUPerSec != resourcegroup.Unlimited || !def.Unlimited {
		t.Fatalf("default: %+v", def)
	}
	if idle.InUse || idle.Definition.RUPerSec != 1 || idle.Unlimited || idle.RUPerSec != 0 {
		t.Fatalf("idle0000: %+v", idle)
	}
	if o := c.Overview(clk.Now(), 0); len(o.Groups) != 0 || o.Total != 3005 {
		t.Fatalf("limit 0: %d listed of %d", len(o.Groups), o.Total)
	}
}

// A proxy's first grant in a group carries its share of rgserver's bucket
// at once (immediate_tokens) besides the trickle: the group's first
// statements run without waiting for the trickle (they waited ~19 ms).
// An immediate amount that is negative or NaN counts as none.
func TestFirstGrantImmediateTokens(t *testing.T) {
	tests := []struct {
		name      string
		immediate float64
		want      string // the bucket when the grant has been applied
		runs      bool   // a 1 RU statement runs at once
	}{
		{"share of the bucket at once", 10, "tokens=10.00 rate=9.0/s burst=10 threshold=0 debt=0 trickle=1s", true},
		{"none", 0, "tokens=0.00 rate=9.0/s burst=10 threshold=0 debt=0 trickle=1s", false},
		{"negative", -5, "tokens=0.00 rate=9.0/s burst=10 threshold=0 debt=0 trickle=1s", false},
		{"NaN", math.NaN(), "tokens=0.00 rate=9.0/s burst=10 threshold=0 debt=0 trickle=1s", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := newTestClient(t, nil)
			setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 10})
			wantTokens(c, "g")
			req := build(c, false)
			if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
				{Group: "g", ImmediateTokens: tc.immediate, Tokens: 9, TrickleMs: 1000, FillRate: 10, Proxies: 1, RuPerSec: 10}}}); err != nil {
				t.Fatal(err)
			}
			c.groups.mu.Lock()
			got := c.groups.byName["g"].bucket.String(clk.Now())
			c.groups.mu.Unlock()
			if got != tc.want {
				t.Fatalf("bucket after the grant:\n got  %s\n want %s", got, tc.want)
			}
			_, err := acquireAll(context.Background(), c, "g", rruOf(1), 0)
			if (err == nil) != tc.runs {
				t.Fatalf("a 1 RU statement with no wait allowed: err %v, want it to run %v", err, tc.runs)
			}
		})
	}
}

// TestStreamLossBridgesAtLastShare: when the token stream is lost, a
// group whose granted trickle runs out goes on filling at its last share
// (the grant's fill_rate) up to its share of the capacity, until degraded
// mode takes over or rgserver answers again. Before, it got nothing from
// the trickle's end until DegradedAfter.
func TestStreamLossBridgesAtLastShare(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 20})
	wantTokens(c, "g")
	req := build(c, false)
	// 10 RU/s for 2 s, half of the group's 20 RU/s (2 proxies).
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "g", Tokens: 20, TrickleMs: 2000, FillRate: 10, Proxies: 2, RuPerSec: 20}}}); err != nil {
		t.Fatal(err)
	}
	start := clk.Now()
	state := func(sec float64) string {
		clk.Advance(start.Add(time.Duration(sec * float64(time.Second))).Sub(clk.Now()))
		c.groups.mu.Lock()
		defer c.groups.mu.Unlock()
		c.groups.tickLocked(clk.Now()) // the stream loop's tick
		return c.groups.byName["g"].bucket.String(clk.Now())
	}
	story := []struct {
		at     float64
		charge float64 // RU spent at that time, after the state is read
		lost   bool    // the stream breaks then
		want   string
	}{
		{at: 0.5, lost: true, want: "tokens=5.00 rate=10.0/s burst=10 threshold=0 debt=0 trickle=1.5s"},
		// The granted trickle runs on after the loss.
		{at: 1, charge: 10, want: "tokens=10.00 rate=10.0/s burst=10 threshold=0 debt=0 trickle=1s"},
		// It ended at 2 s; the bridge goes on from there at the share,
		// 10 RU/s, up to the share of the capacity (10).
		{at: 3, charge: 10, want: "tokens=10.00 rate=10.0/s burst=10 threshold=3.33 debt=0"},
		{at: 4, charge: 10, want: "tokens=10.00 rate=10.0/s burst=10 threshold=3.33 debt=0"},
		// Degraded mode at 5.5 s: RU_PER_SEC ÷ proxies, as before.
		{at: 5.6, want: "tokens=10.00 rate=10.0/s burst=10 threshold=5.36 debt=0"},
	}
	for _, st := range story {
		if st.lost {
			c.streamEnded()
		}
		if got := state(st.at); got != st.want {
			t.Fatalf("at %vs:\n got  %s\n want %s", st.at, got, st.want)
		}
		c.Charge("g", rruOf(st.charge))
	}
	if !c.Degraded() {
		t.Fatal("not degraded 5 s after the loss")
	}

	// A loss that rgserver answers before DegradedAfter: the bridge ends
	// at the first answer, and the group asks at once.
	c2, clk2 := newTestClient(t, nil)
	setGroups(c2, resourcegroup.Group{Name: "g", RUPerSec: 20})
	wantTokens(c2, "g")
	req = build(c2, false)
	if err := c2.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "g", Tokens: 5, FillRate: 10, Proxies: 2, RuPerSec: 20}}}); err != nil {
		t.Fatal(err)
	}
	c2.streamEnded()
	clk2.Advance(time.Second)
	c2.groups.mu.Lock()
	c2.groups.tickLocked(clk2.Now())
	bridged := c2.groups.byName["g"].bucket.String(clk2.Now())
	c2.groups.mu.Unlock()
	if want := "tokens=10.00 rate=10.0/s burst=10 threshold=0 debt=0"; bridged != want {
		t.Fatalf("bridge of an at-once grant after 1 s:\n got  %s\n want %s", bridged, want)
	}
	req = build(c2, true)
	if err := c2.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "g", FillRate: 10, Proxies: 2, RuPerSec: 20}}}); err != nil {
		t.Fatal(err)
	}
	c2.groups.mu.Lock()
	gs := c2.groups.byName["g"]
	after, want, bridging := gs.bucket.String(clk2.Now()), gs.want, gs.bridging
	c2.groups.mu.Unlock()
	if after != "tokens=10.00 rate=0.0/s burst=none threshold=0 debt=0" || !want || bridging {
		t.Fatalf("after rgserver answered again: %s, asks %v, bridging %v", after, want, bridging)
	}

	// A group idle for releaseAfter is bridged only once a statement uses
	// it again.
	c3, clk3 := newTestClient(t, nil)
	setGroups(c3, resourcegroup.Group{Name: "g", RUPerSec: 20})
	wantTokens(c3, "g")
	req = build(c3, false)
	if err := c3.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "g", Tokens: 5, FillRate: 10, Proxies: 2, RuPerSec: 20}}}); err != nil {
		t.Fatal(err)
	}
	c3.Charge("g", rruOf(5))
	clk3.Advance(releaseAfter)
	c3.streamEnded()
	tick := func() string {
		clk3.Advance(time.Second)
		c3.groups.mu.Lock()
		defer c3.groups.mu.Unlock()
		c3.groups.tickLocked(clk3.Now())
		return c3.groups.byName["g"].bucket.String(clk3.Now())
	}
	if got := tick(); got != "tokens=0.00 rate=0.0/s burst=none threshold=0 debt=0" {
		t.Fatalf("an idle group bridged: %s", got)
	}
	c3.Charge("g", rruOf(0))
	if got := tick(); got != "tokens=10.00 rate=10.0/s burst=10 threshold=0.23 debt=0" {
		t.Fatalf("an idle group used again during the loss: %s", got)
	}
}

// A refusal's Share carries the group's bucket as it stood: negative is
// what the group owes, which the policy's 8252 names.
func TestAcquireRefusalCarriesTheDebt(t *testing.T) {
	c, _ := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "a", RUPerSec: 10})
	wantTokens(c, "a")
	req := build(c, false)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "a", Tokens: 10, FillRate: 10, Proxies: 1, RuPerSec: 10}}}); err != nil {
		t.Fatal(err)
	}
	c.Charge("a", rruOf(500)) // a statement that cost far more than it prepaid
	sh, waited, err := c.AcquireShare(context.Background(), nil, "a", rruOf(1), 1, time.Second)
	if !errors.Is(err, ErrThrottled) || waited != 0 {
		t.Fatalf("a statement behind a 490 RU debt at 10 RU/s with 1 s to wait: waited %v, %v; want refused at once", waited, err)
	}
	if !near(sh.Tokens, tokensOf(c, "a")) || !near(sh.Tokens, -490) {
		t.Fatalf("the refusal's share holds %v tokens, want the bucket's -490", sh.Tokens)
	}
}

// Under a service limit (or a PARENT), a group that stops says so within
// quietAfter: one report-only message with demand 0, not its EWMA a
// report period later, so that rgserver gives its part to the groups
// still running. Then nothing more; without a limit, nothing changes.
func TestQuietGroupReportsNoDemandAtOnce(t *testing.T) {
	for _, limited := range []bool{true, false} {
		t.Run(fmt.Sprintf("service limit %v", limited), func(t *testing.T) {
			c, clk := newTestClient(t, nil)
			answer := func(req *tokenpb.TokenRequest) {
				t.Helper()
				resp := grantAll(req, 100)
				resp.ServiceLimited = limited
				if err := c.applyResponse(resp); err != nil {
					t.Fatal(err)
				}
			}
			for range 10 {
				c.Charge("a", rruOf(10))
				clk.Advance(100 * time.Millisecond)
			}
			req := build(c, false) // in debt: an ask, its demand the rate it ran at
			g := groupEntry(req, "a")
			if g == nil || g.GetReportOnly() || !(g.GetDemandRuPerSec() > 50) {
				t.Fatalf("entry %v, want an ask with demand about 100", g)
			}
			answer(req)
			quiet := "report 0"
			if !limited {
				quiet = ""
			}
			steps := []struct {
				advance time.Duration
				want    string // "" = no message
			}{
				// What it holds moved (the grant); 200 ms since its last
				// statement: not quiet yet.
				{100 * time.Millisecond, "report 100"},
				{150 * time.Millisecond, quiet}, // 350 ms: quiet
				{100 * time.Millisecond, ""},    // said once
				{3 * time.Second, ""},           // and nothing more while quiet
			}
			for i, st := range steps {
				clk.Advance(st.advance)
				got := ""
				if req := build(c, false); req != nil {
					g := groupEntry(req, "a")
					got = fmt.Sprintf("report %v", g.GetDemandRuPerSec())
					if !g.GetReportOnly() {
						got = fmt.Sprintf("ask %v", g.GetDemandRuPerSec())
					}
					answer(req)
				}
				if got != st.want {
					t.Fatalf("step %d (+%v): %q, want %q", i, st.advance, got, st.want)
				}
			}
			// It runs again: its next ask carries its demand again.
			c.Charge("a", rruOf(500))
			clk.Advance(200 * time.Millisecond)
			if g := groupEntry(build(c, false), "a"); g == nil || g.GetReportOnly() || !(g.GetDemandRuPerSec() > 0) {
				t.Fatalf("after it ran again: %v, want an ask with demand", g)
			}
		})
	}
}

// ask_again: a group fed by a trickle asks again at once when rgserver
// names it (its rate moved at a rebalance), rather than when the trickle
// nears its end; a named group that needs nothing, and a name this proxy
// does not run, send nothing.
func TestAskAgainReplacesTheTrickleAtOnce(t *testing.T) {
	c, clk := newTestClient(t, nil)
	setGroups(c, resourcegroup.Group{Name: "g", RUPerSec: 100}, resourcegroup.Group{Name: "h", RUPerSec: 100})
	for _, name := range []string{"g", "h"} {
		wantTokens(c, name)
	}
	req := build(c, false)
	resp := &tokenpb.TokenResponse{RequestId: req.GetRequestId()}
	for _, name := range []string{"g", "h"} {
		resp.Grants = append(resp.Grants, &tokenpb.GroupGrant{Group: name, Tokens: 100, TrickleMs: 2000, FillRate: 50, Proxies: 2, RuPerSec: 100})
	}
	if err := c.applyResponse(resp); err != nil {
		t.Fatal(err)
	}
	clk.Advance(200 * time.Millisecond)
	c.Charge("g", rruOf(60)) // g runs short: it wants tokens, its trickle has 1.8 s left
	if req := build(c, false); req != nil {
		t.Fatalf("asked with 1.8 s of trickle left: %v", req)
	}
	if err := c.applyResponse(&tokenpb.TokenResponse{AskAgain: []string{"g", "h", "nosuch"}}); err != nil {
		t.Fatal(err)
	}
	req = build(c, false)
	if g := groupEntry(req, "g"); g == nil || g.GetReportOnly() || !(g.GetTokensWanted() > 0) {
		t.Fatalf("after ask_again: %v, want g to ask", req)
	}
	if h := groupEntry(req, "h"); h != nil {
		t.Fatalf("h, which needs nothing, sent %v", h)
	}
	c.groups.mu.Lock()
	askNow := c.groups.byName["h"].askNow || c.groups.byName["g"].askNow
	c.groups.mu.Unlock()
	if askNow {
		t.Fatal("ask_again still pending after the ask (g) or after nothing was needed (h)")
	}
}
