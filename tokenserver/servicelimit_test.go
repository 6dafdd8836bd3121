package tokenserver

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// svcGroup is one group of a service-limit story: its settings, the
// demand its proxies have (RU/s, split evenly between them) and the
// ceiling (or, in the simulation, the RU/s) it should get.
type svcGroup struct {
	name     string
	settings Settings
	demand   float64
	proxies  int
	want     float64
}

var (
	high = resourcegroup.PriorityHigh
	med  = resourcegroup.PriorityMedium
	low  = resourcegroup.PriorityLow
	unl  = resourcegroup.Unlimited
	bOff = resourcegroup.BurstOff
	bMod = resourcegroup.BurstModerated
	bUnl = resourcegroup.BurstUnlimited
)

func limited(rate uint64, burst resourcegroup.BurstMode, p resourcegroup.Priority) Settings {
	return Settings{RUPerSec: rate, Burst: burst, Priority: p}
}

// background is a background group's settings: RU_PER_SEC rate (its
// floor) and UTILIZATION_LIMIT pct.
func background(rate uint64, pct uint8) Settings {
	return Settings{RUPerSec: rate, Burst: bOff, Priority: med, Background: pct}
}

// svcStories are the sharing rules, each story a limit and its groups
// with what each should get.
var svcStories = []struct {
	name  string
	limit float64
	gs    []svcGroup
}{
	{
		name:  "priorities: HIGH's rate first, MEDIUM's rates fill the rest, LOW gets nothing",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(300, bOff, high), demand: 2000, want: 300},
			{name: "b", settings: limited(500, bUnl, med), demand: 2000, want: 500},
			{name: "c", settings: limited(200, bUnl, med), demand: 600, want: 200},
			{name: "d", settings: limited(unl, bOff, low), demand: 1000, want: 0},
		},
	},
	{
		name:  "burst in proportion to burst demand, after the rates",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(200, bOff, high), demand: 2000, want: 200},
			// fills 100 + 100; bursts 800 and 400 share the 600 left.
			{name: "b", settings: limited(100, bUnl, med), demand: 900, want: 100 + 400},
			{name: "c", settings: limited(100, bUnl, med), demand: 500, want: 100 + 200},
			{name: "d", settings: limited(500, bOff, low), demand: 500, want: 0},
		},
	},
	{
		name:  "fill rates of one level beyond the limit: in proportion to them",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(800, bMod, high), demand: 5000, want: 1000 * 800.0 / 1400},
			{name: "b", settings: limited(600, bOff, high), demand: 5000, want: 1000 * 600.0 / 1400},
			{name: "c", settings: limited(400, bOff, med), demand: 400, want: 0},
		},
	},
	{
		name:  "a high level's burst comes before a lower level's rate; RU_PER_SEC UNLIMITED is all burst",
		limit: 1000,
		gs: []svcGroup{
			{name: "default", settings: limited(unl, bUnl, high), demand: 700, want: 700},
			{name: "b", settings: limited(500, bOff, med), demand: 900, want: 300},
		},
	},
	{
		name:  "what HIGH does not want goes to LOW",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(200, bOff, high), demand: 100, want: 100},
			{name: "b", settings: limited(unl, bUnl, low), demand: 2000, want: 900},
		},
	},
	{
		name:  "below the limit: every group its demand, the spare in proportion to demand",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(300, bOff, low), demand: 200, want: 200 + 500*200.0/500},
			{name: "b", settings: limited(unl, bUnl, med), demand: 300, want: 300 + 500*300.0/500},
		},
	},
	{
		name:  "background under foreground saturation: its RU_PER_SEC (its floor), nothing beyond",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(600, bOff, high), demand: 2000, want: 600},
			{name: "b", settings: limited(unl, bUnl, med), demand: 2000, want: 300},
			{name: "bg", settings: background(100, 30), demand: 2000, want: 100},
		},
	},
	{
		name:  "background beside idle foreground: up to its UTILIZATION_LIMIT, the rest the foreground's spare",
		limit: 1000,
		gs: []svcGroup{
			// floor 100, then 200 more (30% of 1000); a's 100 and the
			// 600 nobody took, in proportion to its demand.
			{name: "a", settings: limited(600, bOff, high), demand: 100, want: 100 + 600},
			{name: "bg", settings: background(100, 30), demand: 2000, want: 300},
		},
	},
	{
		// The foreground has stopped and the background's demand is still
		// its proxies' slow estimate: the ceiling is its UTILIZATION_LIMIT
		// at once, not its demand, so that it ramps within one
		// rebalance (held at its demand, it spent 133, 174, 234 of 240 RU
		// in the seconds after the foreground stopped, with both cores
		// busy: TestLimitTreeAndBackgroundAcrossThreeProxies).
		name:  "background alone, its demand below its UTILIZATION_LIMIT: up to the limit's room",
		limit: 400,
		gs: []svcGroup{
			{name: "bg", settings: background(20, 60), demand: 170, want: 240},
		},
	},
	{
		// What nobody asks for, 170, goes 60:170 by demand; the
		// background's part is cut to the 70 its room has left and the
		// rest is the foreground's.
		name:  "background beside a foreground winding down: what nobody asks for by demand, the background's part within its room",
		limit: 400,
		gs: []svcGroup{
			{name: "a", settings: limited(400, bOff, low), demand: 60, want: 60 + 100},
			{name: "bg", settings: background(20, 60), demand: 170, want: 240},
		},
	},
	{
		// Two background groups with room: what nobody asks for, 600,
		// by demand (150:450), bg2's part cut to the 300 its room has
		// left (and the 150 it could not take left unused: a background
		// group never gets the foreground's spare).
		name:  "two background groups alone: what nobody asks for by demand, each within its UTILIZATION_LIMIT",
		limit: 1000,
		gs: []svcGroup{
			{name: "bg1", settings: background(unl, 50), demand: 100, want: 100 + 150},
			{name: "bg2", settings: background(unl, 60), demand: 300, want: 300 + 300},
		},
	},
	{
		name:  "two background groups share what LOW leaves in proportion, each within its UTILIZATION_LIMIT",
		limit: 1000,
		gs: []svcGroup{
			{name: "a", settings: limited(400, bOff, low), demand: 400, want: 400},
			// floors 0 and 50; bursts 500 (cap 50%) and 150 (cap 20%:
			// 200 - 50) share the 550 left as 500:150.
			{name: "bg1", settings: background(unl, 50), demand: 5000, want: 550 * 500.0 / 650},
			{name: "bg2", settings: background(50, 20), demand: 5000, want: 50 + 550*150.0/650},
		},
	},
	{
		name:  "MODE WARN and OFF groups are neither throttled nor counted",
		limit: 1000,
		gs: []svcGroup{
			{name: "w", settings: Settings{RUPerSec: 100, Mode: resourcegroup.ModeWarn, Priority: high}, demand: 5000, want: math.Inf(1)},
			{name: "a", settings: limited(unl, bUnl, med), demand: 5000, want: 1000},
		},
	},
}

// TestServiceLimitCeilings tells each story to an allocator: every
// group's proxies ask for their demand, and each group's ceiling after
// the rebalance is what the story says.
func TestServiceLimitCeilings(t *testing.T) {
	for _, st := range svcStories {
		t.Run(st.name, func(t *testing.T) {
			a := NewAllocator(AllocConfig{})
			for _, g := range st.gs {
				a.SetGroup(g.name, g.settings, t0)
			}
			a.SetServiceLimit(st.limit, t0)
			now := at(1)
			for _, g := range st.gs {
				if _, err := a.Acquire(g.name, Request{ProxyID: "p", Wanted: g.demand * 5.5, Demand: g.demand}, now); err != nil {
					t.Fatal(err)
				}
			}
			a.svc.rebalance(now)
			sum := 0.0
			for _, g := range st.gs {
				c, ok := a.Ceiling(g.name)
				if !ok {
					t.Fatalf("group %s not held", g.name)
				}
				if !closeTo(c, g.want) {
					t.Errorf("%s: ceiling %.2f RU/s, want %.2f\n%s", g.name, c, g.want, a.ServiceLimit())
				}
				if !math.IsInf(c, 1) {
					sum += c
				}
			}
			if sum > st.limit*(1+1e-9) {
				t.Errorf("ceilings add up to %.2f, over the limit %.0f", sum, st.limit)
			}
		})
	}
}

func closeTo(got, want float64) bool {
	if math.IsInf(want, 1) {
		return math.IsInf(got, 1)
	}
	return math.Abs(got-want) <= 1e-6*max(1, want)
}

// svcProxy is one proxy of one group in the simulation.
type svcProxy struct {
	id, group  string
	demand     float64
	local      float64
	rate, end  float64
	unlimited  bool
	spentAfter float64 // RU spent after the warm-up
}

// TestServiceLimitSimulation runs each story's groups for 30 s of an
// injected clock with their proxies asking as tokenclient does, and
// checks what each group spent from 10 s on: within 5% (and 5 RU/s) of
// what the story says, and all of them within the limit.
func TestServiceLimitSimulation(t *testing.T) {
	for _, st := range svcStories {
		t.Run(st.name, func(t *testing.T) {
			got := simulateGroups(t, st.gs, st.limit)
			var report strings.Builder
			sum := 0.0
			for _, g := range st.gs {
				fmt.Fprintf(&report, "%s: %.1f RU/s (want %.1f); ", g.name, got[g.name], g.want)
				if g.settings.Mode == resourcegroup.ModeEnforce {
					sum += got[g.name]
				}
			}
			t.Logf("%s; sum %.1f of %.0f", report.String(), sum, st.limit)
			for _, g := range st.gs {
				want := min(g.want, g.demand) // a ceiling above the demand goes unspent
				if math.Abs(got[g.name]-want) > max(0.05*want, 5) {
					t.Errorf("%s spent %.1f RU/s, want %.1f ± 5%%", g.name, got[g.name], want)
				}
			}
			if sum > st.limit*1.01 {
				t.Errorf("the groups spent %.1f RU/s together, over the limit %.0f", sum, st.limit)
			}
		})
	}
}

// simulateGroups runs groups gs under a service limit (0: none) for 30 s
// of an injected clock with their proxies (at least 3 a group) asking as
// tokenclient does, and returns the RU/s each group spent from 10 s on.
func simulateGroups(t *testing.T, gs []svcGroup, limit float64) map[string]float64 {
	t.Helper()
	a := NewAllocator(AllocConfig{})
	var ps []*svcProxy
	for _, g := range gs {
		a.SetGroup(g.name, g.settings, t0)
		n := max(g.proxies, 3)
		for k := range n {
			ps = append(ps, &svcProxy{id: fmt.Sprintf("%s-p%d", g.name, k), group: g.name, demand: g.demand / float64(n)})
		}
	}
	a.SetServiceLimit(limit, t0)
	const T, warm, dt = 30.0, 10.0, 0.01
	for k := 0; k < int(T/dt); k++ {
		s := float64(k) * dt
		now := at(s)
		if k%100 == 0 {
			a.Expire(now)
		}
		for _, p := range ps {
			left := p.local + p.rate*math.Max(p.end-s, 0)
			if !p.unlimited && left < p.demand {
				g, err := a.Acquire(p.group, Request{ProxyID: p.id, Wanted: max(p.demand*5*1.1-p.local, 1), Demand: p.demand, Held: p.local}, now)
				if err != nil {
					t.Fatal(err)
				}
				p.unlimited = g.Unlimited
				p.rate, p.end = 0, 0
				p.local += g.Immediate
				if g.Trickle > 0 {
					p.rate, p.end = g.Tokens/g.Trickle.Seconds(), s+g.Trickle.Seconds()
				} else {
					p.local += g.Tokens
				}
			}
			if p.end > s {
				p.local += p.rate * math.Min(dt, p.end-s)
			}
			use := p.demand * dt
			if !p.unlimited {
				use = math.Min(p.local, use)
				p.local -= use
			}
			if s >= warm {
				p.spentAfter += use
			}
		}
	}
	got := map[string]float64{}
	for _, p := range ps {
		got[p.group] += p.spentAfter / (T - warm)
	}
	return got
}

// TestServiceLimitSetAndLift: setting a limit holds an unlimited group
// to it from its next request on, lifting it frees the group again, and
// changing it moves the ceilings; an idle system's groups keep no ceiling
// but the unlimited groups' 0.
func TestServiceLimitSetAndLift(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("default", limited(unl, bUnl, med), t0)
	a.SetGroup("g", limited(100, bOff, med), t0)
	ask := func(group string, sec float64) Grant {
		t.Helper()
		g, err := a.Acquire(group, Request{ProxyID: "p", Wanted: 5000, Demand: 1000}, at(sec))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := ask("default", 0); !g.Unlimited || g.Tokens != 5000 {
		t.Fatalf("no limit: default granted %+v, want all it asks", g)
	}
	a.SetServiceLimit(400, at(1))
	if c, _ := a.Ceiling("g"); !math.IsInf(c, 1) {
		t.Errorf("idle limited group: ceiling %v, want none", c)
	}
	g := ask("default", 1.5)
	if g.Unlimited || g.FillRate > 400+1e-9 || g.FillRate < 399 {
		t.Errorf("under a 400 RU/s limit: default granted %+v, want a trickle of 400 RU/s\n%s", g, a.Group("default").String(at(1.5)))
	}
	ask("g", 1.5)
	a.svc.rebalance(at(1.6))
	cd, _ := a.Ceiling("default")
	cg, _ := a.Ceiling("g")
	if !closeTo(cg, 100) || !closeTo(cd, 300) {
		t.Errorf("ceilings default %.1f, g %.1f; want 300 and 100\n%s", cd, cg, a.ServiceLimit())
	}
	a.SetServiceLimit(200, at(2))
	cd, _ = a.Ceiling("default")
	cg, _ = a.Ceiling("g")
	if !closeTo(cg, 100) || !closeTo(cd, 100) {
		t.Errorf("limit 200: ceilings default %.1f, g %.1f; want 100 and 100", cd, cg)
	}
	// Silent for longer than activeFor: no demand for the limit.
	a.svc.rebalance(at(2).Add(activeFor + time.Second))
	if f := a.ServiceLimit(); f.Groups != 0 || f.Allocated != 0 {
		t.Errorf("silent groups still share the limit: %s", f)
	}
	if c, _ := a.Ceiling("default"); c != 0 {
		t.Errorf("silent unlimited group: ceiling %v, want 0 (it must ask)", c)
	}
	a.SetServiceLimit(0, at(10))
	if g := ask("default", 10); !g.Unlimited {
		t.Errorf("limit lifted: default granted %+v, want unlimited", g)
	}
	if f := a.ServiceLimit(); f.Limit != 0 || f.FillRates != 100 {
		t.Errorf("figures after lifting: %+v", f)
	}
}

// TestServiceLimitHostileDemand: a proxy claiming 1e308 RU/s for an
// unlimited group weighs no more than a saturated proxy: the other
// group of its level keeps a share of the burst.
func TestServiceLimitHostileDemand(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("x", limited(unl, bUnl, med), t0)
	a.SetGroup("y", limited(unl, bUnl, med), t0)
	a.SetServiceLimit(1000, t0)
	for _, r := range []struct {
		g string
		d float64
	}{{"x", 1e308}, {"y", 50000}} {
		if _, err := a.Acquire(r.g, Request{ProxyID: "p", Wanted: math.Inf(1), Demand: r.d}, at(1)); err != nil {
			t.Fatal(err)
		}
	}
	a.svc.rebalance(at(1))
	cx, _ := a.Ceiling("x")
	cy, _ := a.Ceiling("y")
	if cy < 1000/2-1e-6 || cx+cy > 1000+1e-6 || math.IsNaN(cx) {
		t.Errorf("ceilings x %.1f, y %.1f: want y at least half of 1000, the sum within it", cx, cy)
	}
}

// BenchmarkAcquireUnderServiceLimit: one grant's cost, rebalances
// included, with n groups asking in turn under a service limit (every
// group has demand: the rebalance walks all of them every 250 ms of the
// injected clock, which advances 10 µs per grant) and without one; with
// parents, the first of every 10 groups is the PARENT of the other 9.
func BenchmarkAcquireUnderServiceLimit(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		for _, c := range []struct {
			limit   float64
			parents bool
		}{{0, false}, {1e6, false}, {1e6, true}} {
			b.Run(fmt.Sprintf("groups=%d/limit=%g/parents=%v", n, c.limit, c.parents), func(b *testing.B) {
				limit := c.limit
				a := NewAllocator(AllocConfig{})
				names := make([]string, n)
				for i := range names {
					names[i] = fmt.Sprintf("g%06d", i)
					st := limited(100, bUnl, resourcegroup.Priority(i%3))
					if c.parents && i%10 != 0 {
						st.Parent = names[i-i%10]
					}
					a.SetGroup(names[i], st, t0)
				}
				a.SetServiceLimit(limit, t0)
				now := t0
				for i := range names { // every group has demand
					if _, err := a.Acquire(names[i], Request{ProxyID: "p", Wanted: 550, Demand: 100}, now); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					now = now.Add(10 * time.Microsecond)
					if _, err := a.Acquire(names[i%n], Request{ProxyID: "p", Wanted: 550, Demand: 100}, now); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// demandAsker returns a function by which proxy asks a for group's
// tokens at sec, with demand RU/s (5.5 s of it wanted); demand 0 only
// reports (tokenclient's quiet report).
func demandAsker(t *testing.T, a *Allocator) func(group, proxy string, demand float64, sec float64) Grant {
	return func(group, proxy string, demand float64, sec float64) Grant {
		t.Helper()
		r := Request{ProxyID: proxy, Wanted: demand * 5.5, Demand: demand}
		if demand == 0 {
			r = Request{ProxyID: proxy, ReportOnly: true}
		}
		g, err := a.Acquire(group, r, at(sec))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
}

// TestServiceLimitReasks: when the foreground group stops (its proxy
// reports demand 0), the next due rebalance runs on the leader's tick,
// with no request, raises the background group's ceiling to its
// UTILIZATION_LIMIT and names the group to each proxy running a trickle
// of it, once; a proxy without a trickle and the stopped group are not
// told. When the foreground comes back the background's proxies are told
// again, to take their lowered rate at once.
func TestServiceLimitReasks(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("fg", limited(250, bOff, high), t0)
	a.SetGroup("bg", background(10, 80), t0)
	a.SetServiceLimit(300, t0)
	ask := demandAsker(t, a)
	told := func() string {
		var s []string
		for _, p := range []string{"f", "b1", "b2", "idle"} {
			s = append(s, fmt.Sprintf("%s%v", p, a.TakeReasks(p)))
		}
		return strings.Join(s, " ")
	}
	ceil := func(group string) float64 { c, _ := a.Ceiling(group); return math.Round(c) }
	ask("fg", "f", 1000, 0)
	ask("bg", "b1", 500, 0)
	ask("bg", "b2", 500, 0)
	ask("bg", "idle", 0, 0)            // a proxy of bg that only reports
	for s := 0.25; s <= 3; s += 0.25 { // the proxies ask as their trickles end
		ask("fg", "f", 1000, s)
		ask("bg", "b1", 500, s)
		ask("bg", "b2", 500, s)
	}
	told()
	if c := ceil("bg"); c != 50 {
		t.Fatalf("bg's ceiling beside a saturated foreground %v, want 50 (its floor 10, and 40 the foreground leaves)", c)
	}
	// The foreground stops: its proxy says demand 0 (tokenclient's quiet
	// report), then nothing more comes. It says so 10 ms after the last
	// rebalance (3 s), within minRebalance: the rebalance it makes due
	// runs on the tick, with no request.
	ask("fg", "f", 0, 3.01)
	if c := ceil("bg"); c != 50 {
		t.Fatalf("bg's ceiling right after the report %v, want still 50", c)
	}
	if !a.RebalanceIfDue(at(3.05)) {
		t.Fatal("no rebalance due after the foreground stopped")
	}
	if c := ceil("bg"); c != 240 {
		t.Fatalf("bg's ceiling once the foreground stopped %v, want 240 (80%% of 300)", c)
	}
	if got, want := told(), "f[] b1[bg] b2[bg] idle[]"; got != want {
		t.Fatalf("told %s, want %s", got, want)
	}
	if a.RebalanceIfDue(at(3.16)) || a.Reasks() {
		t.Fatal("a rebalance ran again at once, or something left to tell")
	}
	// b1 takes its new rate: about half of 240.
	if g := ask("bg", "b1", 500, 3.2); g.Trickle <= 0 || g.Tokens/g.Trickle.Seconds() < 100 {
		t.Fatalf("b1's grant after the raise: %+v, want a trickle at about 120 RU/s", g)
	}
	// The foreground comes back: the background's proxies are told again.
	ask("fg", "f", 1000, 3.5)
	a.RebalanceIfDue(at(3.6))
	if c := ceil("bg"); c != 50 {
		t.Fatalf("bg's ceiling once the foreground is back %v, want 50", c)
	}
	// b1, whose trickle was granted under 240, is told; b2's is still the
	// one granted under 50 (told at 3.05, it never asked) and f's runs at
	// fg's RU_PER_SEC, 250, under the old ceiling and the new alike:
	// their trickles are right as they are.
	if got, want := told(), "f[] b1[bg] b2[] idle[]"; got != want {
		t.Fatalf("told %s, want %s", got, want)
	}
}

// TestServiceLimitReasksAStaleTrickle: the foreground's proxies go quiet
// one by one, so the background's ceiling climbs in steps, some of them
// under reaskChange; a background proxy whose trickle was granted under
// a ceiling that the steps moved by reaskChange or more is told to ask
// again, though no single step moved it that far. (Told only for the step
// that moved the ceiling most, the proxies ran at ~170 of 240 RU/s for up
// to a trickle period: TestLimitTreeAndBackgroundAcrossThreeProxies, with
// both cores busy.)
func TestServiceLimitReasksAStaleTrickle(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("low", limited(400, bOff, low), t0)
	a.SetGroup("bg", background(20, 60), t0)
	a.SetServiceLimit(400, t0)
	ask := demandAsker(t, a)
	bgs := []string{"b1", "b2", "b3"}
	fgs := []string{"l1", "l2", "l3"}
	ceil := func() float64 { c, _ := a.Ceiling("bg"); return math.Round(c) }
	fgDemand := map[string]float64{"l1": 200, "l2": 30, "l3": 200}
	for s := 0.0; s <= 3; s += 0.25 { // every proxy asks as its trickle ends
		for _, p := range fgs {
			ask("low", p, fgDemand[p], s)
		}
		for _, p := range bgs {
			ask("bg", p, 300, s)
		}
	}
	for _, p := range append(bgs, fgs...) {
		a.TakeReasks(p)
	}
	if c := ceil(); c != 20 {
		t.Fatalf("bg's ceiling beside a saturated foreground %v, want its floor 20", c)
	}
	// The foreground's proxies go quiet one at a time, 300 ms apart (a
	// rebalance between each); the background's proxies ask only when
	// told, and at once.
	var steps []float64
	var toldBy []string
	for i, p := range fgs {
		sec := 3.1 + 0.3*float64(i)
		ask("low", p, 0, sec)
		a.RebalanceIfDue(at(sec + 0.26))
		steps = append(steps, ceil())
		var told []string
		for _, b := range bgs {
			if len(a.TakeReasks(b)) > 0 {
				told = append(told, b)
				ask("bg", b, 300, sec+0.27) // it asks at once, as tokenclient does
			}
		}
		toldBy = append(toldBy, fmt.Sprint(told))
	}
	// 20 → 170 tells them all; 170 → 200 is under reaskChange and tells
	// nobody; 200 → 240 is under it too, but their trickles were granted
	// under 170.
	if got, want := fmt.Sprint(steps, toldBy), "[170 200 240] [[b1 b2 b3] [] [b1 b2 b3]]"; got != want {
		t.Fatalf("bg's ceiling by step and who was told: %s, want %s", got, want)
	}
	// Each background proxy's trickle now runs at its share of the last
	// step's ceiling, or of one less than reaskChange away from it.
	if b := a.Group("bg"); b.reserved < (1-reaskChange)*240 {
		t.Fatalf("the background's trickles run at %.1f RU/s under a ceiling of 240:\n%s", b.reserved, b.String(at(3.98)))
	}
}
