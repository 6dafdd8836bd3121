package tokenclient

import (
	"context"
	"errors"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// perGroupFamilies are the client's per-group metric families.
var perGroupFamilies = []string{"rgproxy_token_requests_total", "rgproxy_throttled_total",
	"rgproxy_tokens_granted_total", "rgproxy_throttle_wait_seconds", "rgproxy_group_tokens", "rgproxy_group_ru_per_sec"}

// seriesOf returns, for group, the per-group families that have a series
// and the value of each counter (a histogram's sample count).
func seriesOf(t *testing.T, reg *prometheus.Registry, group string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for name, ms := range gather(t, reg) {
		for _, m := range ms {
			if label(m) != group {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				out[name] = float64(m.GetHistogram().GetSampleCount())
			default:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// forgottenLog records the OnGroupForgotten calls.
type forgottenLog struct {
	mu    sync.Mutex
	names []string
}

func (f *forgottenLog) add(g string) { f.mu.Lock(); f.names = append(f.names, g); f.mu.Unlock() }
func (f *forgottenLog) get() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.names)
	sort.Strings(out)
	return out
}

func hasState(c *Client, group string) bool {
	c.groups.mu.Lock()
	defer c.groups.mu.Unlock()
	_, ok := c.groups.byName[group]
	return ok
}

// Right after Start, default's series exist at 0; a group's appear, at 0,
// at its first use, and not before; groups this proxy never served have
// none, whatever the settings cache holds.
func TestSeriesFromBirth(t *testing.T) {
	s := startServer(t)
	for _, g := range []string{"a", "never"} {
		if _, err := s.rg.CreateGroup(context.Background(), &tokenpb.CreateGroupRequest{Group: &tokenpb.ResourceGroup{Name: g, RuPerSec: 50}}); err != nil {
			t.Fatal(err)
		}
	}
	s.tok.setGrant(func(g *tokenpb.GroupTokenRequest) *tokenpb.GroupGrant {
		if g.GetGroup() == resourcegroup.DefaultGroup { // as rgserver answers for default
			return &tokenpb.GroupGrant{Unlimited: true, Proxies: 1}
		}
		return &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), Proxies: 1, RuPerSec: 50}
	})
	reg := prometheus.NewRegistry()
	c, _ := startClient(t, func(cfg *Config) { cfg.Registerer = reg }, s.addr)

	d := seriesOf(t, reg, "default")
	for _, name := range []string{"rgproxy_token_requests_total", "rgproxy_throttled_total", "rgproxy_tokens_granted_total", "rgproxy_throttle_wait_seconds"} {
		if v, ok := d[name]; !ok || (name != "rgproxy_token_requests_total" && v != 0) {
			t.Errorf("default: %s = %v, %v; want present at 0", name, v, ok)
		}
	}
	if _, ok := d["rgproxy_group_ru_per_sec"]; !ok {
		t.Error("default: rgproxy_group_ru_per_sec missing")
	}
	if _, ok := d["rgproxy_group_tokens"]; ok {
		t.Error("default is unlimited: rgproxy_group_tokens exported")
	}
	for _, g := range []string{"a", "never"} {
		if got := seriesOf(t, reg, g); len(got) != 0 {
			t.Fatalf("%s before its first use: %v", g, got)
		}
	}

	c.Charge("a", rruOf(0))
	a := seriesOf(t, reg, "a")
	for _, name := range perGroupFamilies {
		v, ok := a[name]
		if !ok {
			t.Errorf("a after its first use: %s missing", name)
		}
		if name == "rgproxy_group_ru_per_sec" && v != 50 {
			t.Errorf("a: %s = %v, want 50", name, v)
		} else if name != "rgproxy_group_ru_per_sec" && name != "rgproxy_token_requests_total" && v != 0 {
			t.Errorf("a: %s = %v, want 0", name, v)
		}
	}
	if got := seriesOf(t, reg, "never"); len(got) != 0 {
		t.Fatalf("a group never used got series: %v", got)
	}
}

// A group dropped from the settings cache loses its state and series at once,
// the hook is told (once), a statement waiting on it gets ErrUnknownGroup,
// and default is never dropped. A NOT_FOUND grant does the same.
func TestDroppedGroupForgotten(t *testing.T) {
	s := startServer(t)
	for _, g := range []string{"gone", "notfound", "kept"} {
		if _, err := s.rg.CreateGroup(context.Background(), &tokenpb.CreateGroupRequest{Group: &tokenpb.ResourceGroup{Name: g, RuPerSec: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	var log forgottenLog
	c, clk := startClient(t, func(cfg *Config) { cfg.Registerer = reg }, s.addr)
	c.OnGroupForgotten(log.add)
	// rgserver grants nothing for "gone": its statement waits.
	s.tok.setGrant(func(g *tokenpb.GroupTokenRequest) *tokenpb.GroupGrant {
		switch g.GetGroup() {
		case "notfound":
			return &tokenpb.GroupGrant{Error: `resource group "notfound" not found`, ErrorCode: tokenpb.GrantError_GRANT_ERROR_NOT_FOUND}
		case "gone":
			return &tokenpb.GroupGrant{Tokens: 0, FillRate: 0.001, TrickleMs: 1000000, Proxies: 1, RuPerSec: 1}
		}
		return &tokenpb.GroupGrant{Tokens: g.GetTokensWanted(), FillRate: 1, Proxies: 1, RuPerSec: 1}
	})
	c.Charge("kept", rruOf(0))
	waiting := acquire(c, "gone", 5, time.Hour)
	waitFor(t, "gone's statement to wait", func() bool {
		c.groups.mu.Lock()
		defer c.groups.mu.Unlock()
		gs := c.groups.byName["gone"]
		return gs != nil && len(gs.queue) == 1
	}, nil)
	if len(seriesOf(t, reg, "gone")) == 0 {
		t.Fatal("gone has no series while used")
	}

	if _, err := s.rg.DropGroup(context.Background(), &tokenpb.DropGroupRequest{Name: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := result(t, waiting, nil); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("the waiting statement of a dropped group: %v, want ErrUnknownGroup", err)
	}
	waitFor(t, "the hook", func() bool { return slices.Equal(log.get(), []string{"gone"}) }, nil)
	if hasState(c, "gone") || len(seriesOf(t, reg, "gone")) != 0 {
		t.Fatalf("dropped group kept state %v or series %v", hasState(c, "gone"), seriesOf(t, reg, "gone"))
	}
	// A statement that settles after the DROP does not bring them back.
	c.Charge("gone", rruOf(3))
	var hold DemandHold
	c.HoldDemand(&hold, "gone", 5)
	c.ReleaseDemand(&hold)
	c.CountThrottled("gone", 0)
	if hasState(c, "gone") || len(seriesOf(t, reg, "gone")) != 0 {
		t.Fatalf("a late settlement revived the dropped group: state %v, series %v", hasState(c, "gone"), seriesOf(t, reg, "gone"))
	}

	// NOT_FOUND from rgserver (the Watch has not told yet).
	c.Charge("notfound", rruOf(1))
	waitFor(t, "NOT_FOUND to forget the group", func() bool { return !hasState(c, "notfound") },
		func() { clk.Advance(tick) })
	waitFor(t, "the hook", func() bool { return slices.Equal(log.get(), []string{"gone", "notfound"}) }, nil)
	if got := seriesOf(t, reg, "notfound"); len(got) != 0 {
		t.Fatalf("NOT_FOUND group kept series %v", got)
	}
	if !hasState(c, "kept") || len(seriesOf(t, reg, "kept")) == 0 || !hasState(c, resourcegroup.DefaultGroup) {
		t.Fatal("a group still there lost its state or series")
	}

	// A group dropped while no statement used it here has nothing to forget.
	if _, err := s.rg.DropGroup(context.Background(), &tokenpb.DropGroupRequest{Name: "kept"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "kept dropped", func() bool { return !hasState(c, "kept") }, nil)
	waitFor(t, "the hook", func() bool { return len(log.get()) == 3 }, nil)
}

// A snapshot (a Watch reconnect) without a group in use drops it too.
func TestSnapshotWithoutGroupDropsIt(t *testing.T) {
	c, _ := newTestClient(t, nil)
	var log forgottenLog
	c.OnGroupForgotten(log.add)
	setGroups(c, resourcegroup.Group{Name: "x", RUPerSec: 10}, resourcegroup.Group{Name: "y", RUPerSec: 10})
	c.Charge("x", rruOf(1))
	c.Charge("y", rruOf(1))
	c.Charge("default", rruOf(1))
	snap := newSnapshot()
	snap.Groups["y"] = resourcegroup.Group{Name: "y", RUPerSec: 10}
	c.installSnapshot(snap)
	if hasState(c, "x") || !hasState(c, "y") || !hasState(c, "default") {
		t.Fatalf("after the snapshot: x %v y %v default %v", hasState(c, "x"), hasState(c, "y"), hasState(c, "default"))
	}
	if got := log.get(); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("hook got %v", got)
	}
}

// A group unused for IdleExpiry is forgotten — state, series, hook — but
// only once nothing about it is owed: consumption still to report (it is
// reported first), a bucket in debt (repaid first), a statement waiting,
// a request in flight. default never expires. Its next use brings it back
// at 0.
func TestIdleExpiry(t *testing.T) {
	const idle = time.Hour
	reg := prometheus.NewRegistry()
	c, clk := newTestClient(t, func(cfg *Config) { cfg.Registerer = reg; cfg.IdleExpiry = idle })
	var log forgottenLog
	c.OnGroupForgotten(log.add)
	setGroups(c, resourcegroup.Group{Name: "quiet", RUPerSec: 100}, resourcegroup.Group{Name: "owes", RUPerSec: 100},
		resourcegroup.Group{Name: "busy", RUPerSec: 100}, resourcegroup.DefaultGroupDefinition())
	for _, g := range []string{"quiet", "owes", "busy", "default"} {
		c.Charge(g, rruOf(0))
	}
	// Everything reported and granted, so quiet and busy owe nothing.
	c.Charge("quiet", rruOf(3))
	c.Charge("busy", rruOf(3))
	c.Charge("owes", rruOf(3))
	if err := c.applyResponse(grantAll(build(c, true), 0)); err != nil {
		t.Fatal(err)
	}
	// owes: 50 RU of debt and unreported consumption (rgserver unreachable).
	c.Charge("owes", rruOf(50))

	clk.Advance(idle - time.Minute)
	c.Charge("busy", rruOf(0)) // used: its clock starts again
	clk.Advance(time.Minute)
	c.expireIdle(clk.Now())
	if hasState(c, "quiet") || len(seriesOf(t, reg, "quiet")) != 0 {
		t.Fatal("quiet not forgotten after an hour unused")
	}
	if !hasState(c, "owes") || !hasState(c, "busy") || !hasState(c, "default") {
		t.Fatalf("forgotten too early: owes %v busy %v default %v", hasState(c, "owes"), hasState(c, "busy"), hasState(c, "default"))
	}
	if got := log.get(); !slices.Equal(got, []string{"quiet"}) {
		t.Fatalf("hook got %v", got)
	}

	// owes reports its consumption first; while the report is in flight
	// and while its bucket is in debt it stays.
	req := build(c, false)
	g := groupEntry(req, "owes")
	if g == nil || !near(g.GetConsumption().GetRru(), 50) {
		t.Fatalf("owes' consumption not reported before expiry: %v", req)
	}
	c.expireIdle(clk.Now())
	if !hasState(c, "owes") {
		t.Fatal("owes forgotten with a request in flight")
	}
	// The answer repays the debt only in part.
	resp := grantAll(req, 0)
	for _, gr := range resp.Grants {
		if gr.GetGroup() == "owes" {
			gr.Tokens = 10
		}
	}
	if err := c.applyResponse(resp); err != nil {
		t.Fatal(err)
	}
	c.expireIdle(clk.Now())
	if tokensOf(c, "owes") >= 0 || !hasState(c, "owes") {
		t.Fatalf("owes forgotten in debt (%v)", tokensOf(c, "owes"))
	}
	// Its low bucket asks again; the grant clears the debt; then it goes.
	clk.Advance(time.Second)
	req = build(c, false)
	if g := groupEntry(req, "owes"); g == nil || g.GetReportOnly() {
		t.Fatalf("owes in debt does not ask: %v", req)
	}
	if err := c.applyResponse(grantAll(req, 0)); err != nil {
		t.Fatal(err)
	}
	c.expireIdle(clk.Now())
	if hasState(c, "owes") {
		t.Fatalf("owes kept with %v tokens and nothing to report", tokensOf(c, "owes"))
	}
	if got := log.get(); !slices.Equal(got, []string{"owes", "quiet"}) {
		t.Fatalf("hook got %v", got)
	}

	// default never expires; busy does once idle.
	clk.Advance(10 * idle)
	c.expireIdle(clk.Now())
	if !hasState(c, "default") || len(seriesOf(t, reg, "default")) == 0 || hasState(c, "busy") {
		t.Fatalf("after 10 h: default %v busy %v", hasState(c, "default"), hasState(c, "busy"))
	}

	// Used again: back at 0.
	c.CountThrottled("quiet", 0)
	if got := seriesOf(t, reg, "quiet"); got["rgproxy_throttled_total"] != 1 || got["rgproxy_tokens_granted_total"] != 0 {
		t.Fatalf("quiet used again: %v", got)
	}
}

// A statement waiting on an idle-looking group keeps it.
func TestIdleExpiryKeepsWaiters(t *testing.T) {
	c, clk := newTestClient(t, func(cfg *Config) { cfg.IdleExpiry = time.Minute })
	setGroups(c, resourcegroup.Group{Name: "w", RUPerSec: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := acquireAll(ctx, c, "w", rruOf(5), 10*time.Hour); done <- err }()
	waitFor(t, "the statement to wait", func() bool {
		c.groups.mu.Lock()
		defer c.groups.mu.Unlock()
		return c.groups.byName["w"] != nil && len(c.groups.byName["w"].queue) == 1
	}, nil)
	// Its request went and was answered with nothing.
	req := build(c, false)
	if err := c.applyResponse(&tokenpb.TokenResponse{RequestId: req.GetRequestId(), Grants: []*tokenpb.GroupGrant{
		{Group: "w", Proxies: 1, RuPerSec: 1}}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	c.expireIdle(clk.Now())
	if !hasState(c, "w") {
		t.Fatal("a group with a waiting statement was forgotten")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting statement: %v", err)
	}
}

// Started, the client sweeps idle groups by itself on its clock.
func TestIdleExpiryLoop(t *testing.T) {
	s := startServer(t)
	if _, err := s.rg.CreateGroup(context.Background(), &tokenpb.CreateGroupRequest{Group: &tokenpb.ResourceGroup{Name: "a", RuPerSec: 1000}}); err != nil {
		t.Fatal(err)
	}
	var log forgottenLog
	c, clk := startClient(t, func(cfg *Config) { cfg.IdleExpiry = 4 * time.Second }, s.addr)
	c.OnGroupForgotten(log.add)
	c.Charge("a", rruOf(1))
	waitFor(t, "a to expire", func() bool { return slices.Equal(log.get(), []string{"a"}) },
		func() { clk.Advance(100 * time.Millisecond) })
	if hasState(c, "a") {
		t.Fatal("a still has state")
	}
}
