package tokenserver

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// under is a MEDIUM group of rate and burst whose parent is parent.
func under(parent string, rate uint64, burst resourcegroup.BurstMode) Settings {
	return Settings{RUPerSec: rate, Burst: burst, Priority: med, Parent: parent}
}

// parentStories are the parents' sharing rules: each story a service
// limit (0: none) and its groups with the ceiling each should get (+Inf:
// none).
var parentStories = []struct {
	name  string
	limit float64
	gs    []svcGroup
}{
	{
		name: "two children: each its own rate first, the rest of the parent's by burst demand",
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), want: math.Inf(1)},
			// fills 300 + 200; bursts 1700 and 400 share the 500 left.
			{name: "a", settings: under("team", 300, bUnl), demand: 2000, want: 300 + 1700*500.0/2100},
			{name: "b", settings: under("team", 200, bUnl), demand: 600, want: 200 + 400*500.0/2100},
		},
	},
	{
		name: "children's rates adding up above the parent's: in proportion to them",
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), want: math.Inf(1)},
			{name: "a", settings: under("team", 800, bOff), demand: 5000, want: 1000 * 800.0 / 1400},
			{name: "b", settings: under("team", 600, bMod), demand: 5000, want: 1000 * 600.0 / 1400},
			// a group outside the team keeps its own rate.
			{name: "solo", settings: limited(700, bOff, med), demand: 5000, want: math.Inf(1)},
		},
	},
	{
		name: "a parent's own statements come after its children's rates",
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), demand: 1000, want: 400},
			{name: "a", settings: under("team", 600, bOff), demand: 2000, want: 600},
		},
	},
	{
		name: "a child below its rate: the spare goes by demand",
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), want: math.Inf(1)},
			{name: "a", settings: under("team", 500, bOff), demand: 200, want: 200 + 600*200.0/400},
			{name: "b", settings: under("team", 500, bOff), demand: 200, want: 200 + 600*200.0/400},
		},
	},
	{
		name:  "with a service limit: the lower of the two ceilings",
		limit: 2000,
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), want: math.Inf(1)},
			// the team gives a and b 500 each, and the service limit
			// counts their demands only up to that: the rates fill
			// 500 + 500 + 500, the 500 left is spread by demand
			// (500, 500, 2000), so c's ceiling is 500 + 2000×500/3000
			// (it runs at its own 500). Before, the limit counted a's
			// and b's demand in full and c's ceiling was 2000×500/2100,
			// below its rate, with 500 of the limit given to nobody.
			{name: "a", settings: under("team", 800, bUnl), demand: 2000, want: 500},
			{name: "b", settings: under("team", 800, bUnl), demand: 2000, want: 500},
			{name: "c", settings: limited(500, bOff, med), demand: 2000, want: 500 + 2000*500.0/3000},
		},
	},
	{
		name:  "what a parent holds back of its HIGH children goes to the limit's LOW group",
		limit: 400,
		gs: []svcGroup{
			{name: "team", settings: limited(150, bOff, med), want: math.Inf(1)},
			{name: "a", settings: Settings{RUPerSec: 100, Burst: bUnl, Priority: high, Parent: "team"}, demand: 2000, want: 100},
			{name: "b", settings: Settings{RUPerSec: 50, Burst: bUnl, Priority: high, Parent: "team"}, demand: 2000, want: 50},
			// 400 − the background's floor 20 − the team's 150.
			{name: "low", settings: limited(400, bOff, low), demand: 2000, want: 230},
			{name: "bg", settings: background(20, 60), demand: 2000, want: 20},
		},
	},
	{
		name:  "with a service limit below the parent's rate: the service limit's ceilings",
		limit: 600,
		gs: []svcGroup{
			{name: "team", settings: limited(1000, bOff, med), want: math.Inf(1)},
			{name: "a", settings: under("team", 500, bUnl), demand: 2000, want: 300},
			{name: "b", settings: under("team", 500, bUnl), demand: 2000, want: 300},
		},
	},
	{
		name: "two levels: a parent's share, capped by its own rate, shared again",
		gs: []svcGroup{
			{name: "org", settings: limited(1000, bOff, med), want: math.Inf(1)},
			// at org: dev's subtree fills 600 (its rate), c 300; the 100
			// left goes by demand (4000 and 2000): dev 666.7, capped by
			// its 600, which a and b share at 300 each.
			{name: "dev", settings: under("org", 600, bOff), want: math.Inf(1)},
			{name: "a", settings: under("dev", 400, bUnl), demand: 2000, want: 300},
			{name: "b", settings: under("dev", 400, bUnl), demand: 2000, want: 300},
			{name: "c", settings: under("org", 300, bOff), demand: 2000, want: 300 + 100*2000.0/6000},
		},
	},
	{
		name: "a parent never throttled limits nothing",
		gs: []svcGroup{
			{name: "team", settings: limited(unl, bOff, med), want: math.Inf(1)},
			{name: "a", settings: under("team", 300, bOff), demand: 2000, want: math.Inf(1)},
		},
	},
}

// TestParentCeilings tells each story to an allocator: every group's
// proxies ask for their demand, and each group's ceiling after the
// rebalance is what the story says; no parent's children together get
// more than its rate.
func TestParentCeilings(t *testing.T) {
	for _, st := range parentStories {
		t.Run(st.name, func(t *testing.T) {
			a := NewAllocator(AllocConfig{})
			for _, g := range st.gs {
				a.SetGroup(g.name, g.settings, t0)
			}
			a.SetServiceLimit(st.limit, t0)
			now := at(1)
			for _, g := range st.gs {
				if g.demand == 0 {
					continue
				}
				if _, err := a.Acquire(g.name, Request{ProxyID: "p", Wanted: g.demand * 5.5, Demand: g.demand}, now); err != nil {
					t.Fatal(err)
				}
			}
			a.svc.rebalance(now)
			under := map[string]float64{}
			for _, g := range st.gs {
				c, ok := a.Ceiling(g.name)
				if !ok {
					t.Fatalf("group %s not held", g.name)
				}
				if !closeTo(c, g.want) {
					t.Errorf("%s: ceiling %.2f RU/s, want %.2f", g.name, c, g.want)
				}
				if p := g.settings.Parent; p != "" && g.demand > 0 {
					under[p] += c
				}
			}
			for _, g := range st.gs {
				if s, ok := under[g.name]; ok && !g.settings.Unlimited() && s > float64(g.settings.RUPerSec)*(1+1e-9) {
					t.Errorf("%s's children's ceilings add up to %.2f, over its %d RU/s", g.name, s, g.settings.RUPerSec)
				}
			}
		})
	}
}

// TestParentSimulation runs each story's groups for 30 s of an injected
// clock with three proxies a group asking as tokenclient does: what each
// group spent from 10 s on is within 5% (and 5 RU/s) of its ceiling (or
// its own rate or demand, when lower), and every parent's children with
// its own statements spent at most its rate (+1%).
func TestParentSimulation(t *testing.T) {
	for _, st := range parentStories {
		t.Run(st.name, func(t *testing.T) {
			got := simulateGroups(t, st.gs, st.limit)
			var report strings.Builder
			pool := map[string]float64{}
			for _, g := range st.gs {
				fmt.Fprintf(&report, "%s: %.1f RU/s; ", g.name, got[g.name])
				if p := g.settings.Parent; p != "" {
					pool[p] += got[g.name]
				}
			}
			t.Log(report.String())
			for _, g := range st.gs {
				want := min(g.want, g.demand)
				if !mayBurst(g.settings) {
					want = min(want, float64(g.settings.RUPerSec))
				}
				if math.Abs(got[g.name]-want) > max(0.05*want, 5) {
					t.Errorf("%s spent %.1f RU/s, want %.1f ± 5%%", g.name, got[g.name], want)
				}
			}
			for _, g := range st.gs {
				if s, ok := pool[g.name]; ok && !g.settings.Unlimited() {
					if s += got[g.name]; s > float64(g.settings.RUPerSec)*1.01 {
						t.Errorf("%s and its children spent %.1f RU/s, over its %d", g.name, s, g.settings.RUPerSec)
					}
				}
			}
		})
	}
}

// TestParentDetachAndDrop: PARENT = NULL (the settings without a parent)
// frees a child to its own rate from its next request; dropping the
// parent leaves its children to their own rates; the last nested group
// gone, no ceiling remains.
func TestParentDetachAndDrop(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("team", limited(100, bOff, med), t0)
	a.SetGroup("a", under("team", 100, bOff), t0)
	a.SetGroup("b", under("team", 100, bOff), t0)
	ask := func(group string, sec float64) {
		t.Helper()
		if _, err := a.Acquire(group, Request{ProxyID: "p", Wanted: 550, Demand: 100}, at(sec)); err != nil {
			t.Fatal(err)
		}
	}
	ask("a", 1)
	ask("b", 1)
	a.svc.rebalance(at(1))
	ca, _ := a.Ceiling("a")
	cb, _ := a.Ceiling("b")
	if !closeTo(ca, 50) || !closeTo(cb, 50) {
		t.Fatalf("under a 100 RU/s parent: ceilings a %.1f, b %.1f; want 50 each", ca, cb)
	}
	if fr := a.Group("a").eff.RUPerSec; fr != 50 {
		t.Errorf("a runs at %d RU/s under its ceiling, want 50", fr)
	}
	a.SetGroup("b", limited(100, bOff, med), at(2)) // PARENT = NULL
	ask("a", 2)
	ask("b", 2)
	a.svc.rebalance(at(2))
	ca, _ = a.Ceiling("a")
	cb, _ = a.Ceiling("b")
	if !closeTo(ca, 100) || !math.IsInf(cb, 1) {
		t.Errorf("b detached: ceilings a %.1f, b %.1f; want 100 (the parent's alone) and none", ca, cb)
	}
	a.RemoveGroup("team")
	ask("a", 3)
	a.svc.rebalance(at(3))
	if ca, _ = a.Ceiling("a"); !math.IsInf(ca, 1) {
		t.Errorf("parent dropped: a's ceiling %.1f, want none", ca)
	}
	a.SetGroup("a", limited(100, bOff, med), at(4))
	ask("a", 4)
	if ca, _ = a.Ceiling("a"); !math.IsInf(ca, 1) || a.svc.on() {
		t.Errorf("no nested group left: a's ceiling %.1f (want none), layer on %v", ca, a.svc.on())
	}
	if fr := a.Group("a").eff.RUPerSec; fr != 100 {
		t.Errorf("a runs at %d RU/s, want its own 100", fr)
	}
}
