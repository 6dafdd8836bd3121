package tokenserver

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func TestSettingsCapacity(t *testing.T) {
	tests := []struct {
		s    Settings
		want float64
	}{
		{Settings{RUPerSec: 100}, 100},
		{Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, 1000},
		{Settings{RUPerSec: 100, Burst: resourcegroup.BurstUnlimited}, math.Inf(1)},
		{Settings{RUPerSec: resourcegroup.Unlimited}, math.Inf(1)},
	}
	for _, tc := range tests {
		if got := tc.s.Capacity(); got != tc.want {
			t.Errorf("%+v: capacity %v, want %v", tc.s, got, tc.want)
		}
	}
}

// step is one request in a story told to the allocator.
type step struct {
	at      float64 // seconds since t0
	proxy   string
	wanted  float64
	demand  float64
	report  bool
	tokens  float64 // expected grant
	now     float64 // expected immediate tokens (besides tokens)
	trickle time.Duration
	rate    float64 // expected FillRate
	proxies int
	held    float64 // what the proxy says it holds
}

func TestAllocatorStories(t *testing.T) {
	tests := []struct {
		name     string
		settings Settings
		steps    []step
	}{
		{
			name:     "bucket holds enough: immediate grant",
			settings: Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated, Version: 7},
			steps: []step{
				{at: 0, proxy: "a", wanted: 300, demand: 50, tokens: 300, rate: 100, proxies: 1},
				{at: 1, proxy: "a", wanted: 500, demand: 50, tokens: 500, rate: 100, proxies: 1},
			},
		},
		{
			name:     "bucket short: trickle of the fill rate plus what is left",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				// Capacity 100, asks 600 with demand 120 (> RU_PER_SEC).
				// A proxy's first grant: its share of the bucket (all
				// 100) at once, and the fill, 100 RU/s, as a trickle; a
				// new proxy's first trickle lasts 1 s.
				{at: 0, proxy: "a", wanted: 600, demand: 120, now: 100, tokens: 100, trickle: time.Second, rate: 100, proxies: 1},
				// At 1 s it says it holds 50 of those: the bucket refills
				// to the capacity less them, by 2 s: 100 + 50/5 = 110
				// RU/s for 5 s, and nothing at once any more.
				{at: 1, proxy: "a", report: true, held: 50, rate: 100, proxies: 1},
				{at: 2, proxy: "a", wanted: 1000, demand: 120, held: 50, tokens: 550, trickle: 5 * time.Second, rate: 100, proxies: 1},
				// 2 s later 20 more went; the new trickle replaces the old:
				// 100 + 30/5 = 106 RU/s.
				{at: 4, proxy: "a", wanted: 1000, demand: 120, held: 50, tokens: 530, trickle: 5 * time.Second, rate: 100, proxies: 1},
			},
		},
		{
			// A statement waiting for a fresh proxy's first tokens
			// (demand 50 RU/s = 1 RU ÷ 20 ms) in a 10 RU/s group.
			name:     "first grant: a share of the bucket at once, never more than it holds",
			settings: Settings{RUPerSec: 10},
			steps: []step{
				// The bucket's 10 at once; the fill, 10 RU/s, less than
				// asked per period (45 ÷ 5 = 9), over the first 1 s.
				{at: 0, proxy: "a", wanted: 55, demand: 50, now: 10, tokens: 9, trickle: time.Second, rate: 10, proxies: 1},
				// b's first grant finds the bucket empty: nothing at
				// once, and only the fill a's trickle leaves.
				{at: 0, proxy: "b", wanted: 55, demand: 50, tokens: 1, trickle: time.Second, rate: 5, proxies: 2},
				// a's second grant is a trickle only: the bucket saved
				// the 10 less the 10 a says it holds (nothing), and a's
				// share is 26 ÷ (26 + 10) of the fill (its weight is
				// twice what it asks and holds per period, b's RU_PER_SEC).
				{at: 10, proxy: "a", wanted: 55, demand: 50, held: 10, tokens: 325.0 / 9, trickle: 5 * time.Second, rate: 65.0 / 9, proxies: 2},
			},
		},
		{
			name:     "trickle is capped by what was asked",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, demand: 200, rate: 100, proxies: 1},
				// The bucket's 100 at once (a first grant), the rest of
				// the 150 over the trickle.
				{at: 0, proxy: "a", wanted: 150, demand: 200, now: 100, tokens: 50, trickle: 5 * time.Second, rate: 100, proxies: 1},
			},
		},
		{
			name:     "oversubscribed: shares follow demand",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, demand: 300, rate: 100, proxies: 1},
				// a's 300 counts as RU_PER_SEC until it asks for tokens.
				{at: 0, proxy: "b", report: true, demand: 100, rate: 50, proxies: 2},
				// a: 3/4 of the 100 in the bucket at once (its first
				// grant), 3/4 of the fill and of the 25 left over 5 s:
				// 75 + 3.75 = 78.75 RU/s.
				{at: 0, proxy: "a", wanted: 1000, demand: 300, now: 75, tokens: 393.75, trickle: 5 * time.Second, rate: 75, proxies: 2},
				// b: 1/4 of the 25 left at once; its trickle gets what a's
				// leaves of the fill plus the bucket's 18.75 over 5 s:
				// 100 − 78.75 + 3.75 = 25 RU/s.
				{at: 0, proxy: "b", wanted: 1000, demand: 100, now: 6.25, tokens: 125, trickle: 5 * time.Second, rate: 25, proxies: 2},
				// 5 s on both trickles have ended; the bucket lost
				// (103.75 − 100) × 5: empty. a's share is 3/4 of the fill.
				{at: 5, proxy: "a", wanted: 1000, demand: 300, tokens: 375, trickle: 5 * time.Second, rate: 75, proxies: 2},
			},
		},
		{
			name:     "a demand that changes moves the split",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, demand: 25, rate: 100, proxies: 1},
				{at: 0, proxy: "b", report: true, demand: 25, rate: 50, proxies: 2},
				{at: 1, proxy: "b", report: true, demand: 75, rate: 75, proxies: 2},
				{at: 1, proxy: "a", report: true, demand: 25, rate: 25, proxies: 2},
			},
		},
		{
			name:     "report only: no tokens, shares still reported",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, demand: 30, rate: 100, proxies: 1},
				{at: 0, proxy: "b", report: true, demand: 10, rate: 25, proxies: 2},
			},
		},
		{
			// ... and none takes a place of MAX_CONCURRENCY from another:
			// each counts only itself.
			name:     "no demand at all: equal shares",
			settings: Settings{RUPerSec: 90},
			steps: []step{
				{at: 0, proxy: "a", report: true, rate: 90, proxies: 1},
				{at: 0, proxy: "b", report: true, rate: 45, proxies: 1},
				{at: 0, proxy: "c", report: true, rate: 30, proxies: 1},
			},
		},
		{
			name:     "unlimited group grants whatever is asked",
			settings: SettingsOf(resourcegroup.DefaultGroupDefinition()),
			steps: []step{
				{at: 0, proxy: "a", wanted: 1e9, demand: 1e6, tokens: 1e9, rate: 2e8, proxies: 1},
				{at: 0, proxy: "b", wanted: 5, tokens: 5, rate: 1, proxies: 2},
			},
		},
		{
			// A proxy that saved its capacity while the group was idle
			// holds the burst: the bucket saves only the rest, so the
			// group never has more than its capacity saved in all.
			name:     "tokens a proxy holds count against the capacity",
			settings: Settings{RUPerSec: 100}, // capacity 100
			steps: []step{
				{at: 0, proxy: "a", wanted: 100, demand: 20, tokens: 100, rate: 100, proxies: 1},
				{at: 0, proxy: "a", report: true, held: 100, rate: 100, proxies: 1},
				// 10 s idle: the bucket stayed empty. a spent its 100 and
				// asks for 100 more: no burst on top, a trickle of the fill.
				{at: 10, proxy: "a", wanted: 100, demand: 20, tokens: 100, trickle: 5 * time.Second, rate: 100, proxies: 1},
			},
		},
		{
			// held_tokens counts only for what this leader granted the
			// proxy: a claim of 1e15 from one it never granted anything
			// does not stop the bucket saving the group's burst.
			name:     "held tokens never granted do not erase the burst",
			settings: Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, // capacity 1000
			steps: []step{
				{at: 0, proxy: "x", report: true, held: 1e15, rate: 100, proxies: 1},
				// x, without demand, takes no place of MAX_CONCURRENCY.
				{at: 30, proxy: "b", wanted: 800, demand: 5, tokens: 800, rate: 100, proxies: 1},
			},
		},
		{
			name:     "the bucket saves what a proxy does not hold",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, held: 40, rate: 100, proxies: 1},
				// 60 saved: 60 at once, then the proxy holds them.
				{at: 10, proxy: "a", wanted: 60, demand: 5, tokens: 60, rate: 100, proxies: 1},
				// It said it holds none (it spent them); 1 s refilled 100,
				// but the 60 granted at once count until its next report.
				{at: 11, proxy: "a", report: true, rate: 100, proxies: 1},
				{at: 11, proxy: "a", wanted: 40, demand: 5, tokens: 40, rate: 100, proxies: 1},
				{at: 11, proxy: "a", wanted: 1, demand: 5, tokens: 1, trickle: 5 * time.Second, rate: 100, proxies: 1},
			},
		},
		{
			name:     "vanished proxy's slot expires and its share returns",
			settings: Settings{RUPerSec: 100},
			steps: []step{
				{at: 0, proxy: "a", report: true, demand: 50, rate: 100, proxies: 1},
				{at: 30, proxy: "b", report: true, demand: 50, rate: 50, proxies: 2},
				{at: 61, proxy: "b", report: true, demand: 50, rate: 100, proxies: 1},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
			a.SetGroup("g", tc.settings, t0)
			for i, st := range tc.steps {
				now := at(st.at)
				a.Expire(now)
				g, err := a.Acquire("g", Request{ProxyID: st.proxy, Wanted: st.wanted, Demand: st.demand, ReportOnly: st.report, Held: st.held}, now)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if math.Abs(g.Tokens-st.tokens) > 1e-6 || math.Abs(g.Immediate-st.now) > 1e-6 || g.Trickle != st.trickle || math.Abs(g.FillRate-st.rate) > 1e-6 || g.Proxies != st.proxies {
					t.Fatalf("step %d (%s at %vs): got %.3f at once, %.3f tokens over %v, fill %.3f, %d proxies; want %.3f at once, %.3f over %v, fill %.3f, %d proxies\n%s",
						i, st.proxy, st.at, g.Immediate, g.Tokens, g.Trickle, g.FillRate, g.Proxies, st.now, st.tokens, st.trickle, st.rate, st.proxies,
						a.Group("g").String(now))
				}
				if g.Version != tc.settings.Version || g.Unlimited != tc.settings.Unlimited() {
					t.Fatalf("step %d: version %d unlimited %v, want %d %v", i, g.Version, g.Unlimited, tc.settings.Version, tc.settings.Unlimited())
				}
			}
		})
	}
}

// TestAllocatorHostileClaims: numbers beyond what a group can use are
// clamped and flagged, and a claimed demand weighs beyond RU_PER_SEC only
// while the proxy asks for tokens to match.
func TestAllocatorHostileClaims(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 10}, t0) // capacity 10, demand ≤ 500, wanted ≤ 5010
	acquire := func(sec float64, req Request) Grant {
		t.Helper()
		g, err := a.Acquire("g", req, at(sec))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// A report-only claim of 1e308 RU/s and 1e15 held: both clamped, and
	// it weighs like RU_PER_SEC.
	if g := acquire(0, Request{ProxyID: "x", ReportOnly: true, Demand: 1e308, Held: 1e15}); g.Clamped != ClampedDemand|ClampedHeld {
		t.Fatalf("clamped = %b, want demand and held", g.Clamped)
	}
	g := acquire(0, Request{ProxyID: "h", Wanted: 2200, Demand: 400})
	if want := 10 * 400.0 / 410; math.Abs(g.FillRate-want) > 1e-9 || g.Clamped != 0 {
		t.Fatalf("honest share %v (clamped %b), want %v", g.FillRate, g.Clamped, want)
	}
	// An ask backs the claim (demand clamped to 500, wanted to 5010) for
	// one trickle period: 500 of 900.
	g = acquire(1, Request{ProxyID: "x", Wanted: 1e9, Demand: 1e308})
	if want := 10 * 500.0 / 900; math.Abs(g.FillRate-want) > 1e-9 || g.Clamped != ClampedDemand|ClampedWanted {
		t.Fatalf("asking share %v (clamped %b), want %v", g.FillRate, g.Clamped, want)
	}
	// 2 s later the ask has run out: back to RU_PER_SEC's weight.
	g = acquire(3.5, Request{ProxyID: "h", Wanted: 2200, Demand: 400})
	if want := 10 * 400.0 / 410; math.Abs(g.FillRate-want) > 1e-9 {
		t.Fatalf("honest share after the ask ended %v, want %v\n%s", g.FillRate, want, a.Group("g").String(at(3.5)))
	}
	// Non-finite and negative numbers, unvalidated, count as 0.
	for _, v := range []float64{math.NaN(), math.Inf(-1), -5} {
		g := acquire(4, Request{ProxyID: "n", Wanted: v, Demand: v, Held: v})
		if g.Tokens != 0 || math.IsNaN(g.FillRate) {
			t.Fatalf("%v: %+v", v, g)
		}
	}
	// An unlimited group's numbers are bounded too.
	a.SetGroup("u", SettingsOf(resourcegroup.DefaultGroupDefinition()), t0)
	u, _ := a.Acquire("u", Request{ProxyID: "x", Wanted: 1e308, Demand: 1e308}, t0)
	if u.Tokens != unlimitedBound || u.FillRate != unlimitedBound || u.Clamped != ClampedDemand|ClampedWanted {
		t.Fatalf("unlimited: %+v", u)
	}
}

// TestAllocatorHeldCreditIsWhatWasDelivered: a proxy re-asking every
// 50 ms is granted a whole trickle each time but delivered only its rate:
// what it may claim to hold is what it was delivered.
func TestAllocatorHeldCreditIsWhatWasDelivered(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 10}, t0) // capacity 10
	if _, err := a.Acquire("g", Request{ProxyID: "h", Wanted: 1000, Demand: 300}, t0); err != nil {
		t.Fatal(err)
	}
	granted := 0.0
	for i := range 40 {
		g, _ := a.Acquire("g", Request{ProxyID: "x", Wanted: 1, Demand: 1e308}, at(0.05*float64(i)))
		granted += g.Tokens
	}
	g, _ := a.Acquire("g", Request{ProxyID: "x", ReportOnly: true, Held: 1e15}, at(2))
	held := a.Group("g").slots["x"].held
	t.Logf("granted %.2f in 40 asks, may hold %.2f", granted, held)
	if held >= granted/4 || held > 1 || g.Clamped&ClampedHeld == 0 {
		t.Fatalf("x may claim %v held after being granted %v in replaced trickles", held, granted)
	}
}

// TestAllocatorRemoveSlot: a dropped slot no longer counts, and what was
// left of its trickle counts as spent.
func TestAllocatorRemoveSlot(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 100}, t0)
	for _, id := range []string{"a", "b"} {
		if _, err := a.Acquire("g", Request{ProxyID: id, Wanted: 1000, Demand: 200}, t0); err != nil {
			t.Fatal(err)
		}
	}
	b := a.Group("g")
	before := b.Tokens(at(0.5))
	rate := b.slots["a"].rate
	if !b.removeSlot("a", at(0.5)) || b.removeSlot("a", at(0.5)) {
		t.Fatal("removeSlot should drop a once")
	}
	if a.Proxies("g") != 1 || b.demand != 200 {
		t.Fatalf("after removal: %d proxies, demand %v", a.Proxies("g"), b.demand)
	}
	// a's first trickle lasts 1 s: 0.5 s of it are left.
	if got, want := b.Tokens(at(0.5)), before-rate*0.5; math.Abs(got-want) > 1e-9 {
		t.Fatalf("level %v, want %v (the rest of the trickle spent)", got, want)
	}
}

// TestAllocatorHeldFromEarlierLeader: after a restore, held_tokens may
// claim what was outside the saved bucket, once.
func TestAllocatorHeldFromEarlierLeader(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	a.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0) // capacity 1000
	a.Restore("g", BucketState{Tokens: 400, At: t0}, t0)                              // 600 outside
	for _, tc := range []struct {
		id          string
		held, want  float64
		wantClamped bool
	}{
		{"p", 500, 500, false},
		{"q", 500, 100, true},
		{"p", 500, 500, false}, // p's claim still stands
		{"r", 50, 0, true},
	} {
		g, _ := a.Acquire("g", Request{ProxyID: tc.id, ReportOnly: true, Held: tc.held}, t0)
		if got := a.Group("g").slots[tc.id].held; got != tc.want || (g.Clamped&ClampedHeld != 0) != tc.wantClamped {
			t.Fatalf("%s holds %v (clamped %b), want %v", tc.id, got, g.Clamped, tc.want)
		}
	}
}

func TestAllocatorUnknownGroup(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	if _, err := a.Acquire("nope", Request{ProxyID: "a", Wanted: 1}, t0); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("err = %v, want ErrUnknownGroup", err)
	}
	a.SetGroup("g", Settings{RUPerSec: 10}, t0)
	a.RemoveGroup("g")
	if _, err := a.Acquire("g", Request{ProxyID: "a", Wanted: 1}, t0); !errors.Is(err, ErrUnknownGroup) {
		t.Fatalf("after remove: err = %v, want ErrUnknownGroup", err)
	}
}

func TestAllocatorAlterClipsAndRefills(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0)
	if got := a.Group("g").Tokens(t0); got != 1000 {
		t.Fatalf("new group holds %v, want 1000", got)
	}
	a.SetGroup("g", Settings{RUPerSec: 50}, at(1))
	if got := a.Group("g").Tokens(at(1)); got != 50 {
		t.Fatalf("after lowering: %v, want 50", got)
	}
	a.SetGroup("g", Settings{RUPerSec: resourcegroup.Unlimited}, at(2))
	g, _ := a.Acquire("g", Request{ProxyID: "p", Wanted: 1e6}, at(2))
	if !g.Unlimited || g.Tokens != 1e6 {
		t.Fatalf("unlimited grant: %+v", g)
	}
	a.SetGroup("g", Settings{RUPerSec: 10}, at(3))
	if got := a.Group("g").Tokens(at(3)); got != 10 {
		t.Fatalf("back to limited: %v, want full bucket 10", got)
	}
}

func TestAllocatorStateRestore(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0)
	if _, err := a.Acquire("g", Request{ProxyID: "p", Wanted: 700, Demand: 10}, t0); err != nil {
		t.Fatal(err)
	}
	st, ok := a.State("g", t0)
	if !ok || st.Tokens != 300 {
		t.Fatalf("state = %+v %v, want 300 tokens", st, ok)
	}
	b := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	b.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, at(2))
	b.Restore("g", st, at(2))
	if got := b.Group("g").Tokens(at(2)); got != 500 {
		t.Fatalf("restored 2 s later: %v, want 300 + 2 s × 100", got)
	}
	// A running trickle counts as spent in the persisted state.
	c := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	c.SetGroup("g", Settings{RUPerSec: 100}, t0)
	if _, err := c.Acquire("g", Request{ProxyID: "p", Demand: 200, ReportOnly: true}, t0); err != nil {
		t.Fatal(err)
	}
	g, _ := c.Acquire("g", Request{ProxyID: "p", Wanted: 1000, Demand: 200}, t0)
	if g.Trickle == 0 {
		t.Fatalf("want a trickle, got %+v", g)
	}
	st, _ = c.State("g", at(1))
	// Bucket: 100 − (120−100)×1 = 80; trickle left 120 × 4 = 480.
	if math.Abs(st.Tokens-(80-480)) > 1e-6 {
		t.Fatalf("state with trickle = %v, want -400\n%s", st.Tokens, c.Group("g").String(at(1)))
	}
	if _, ok := c.State("nope", t0); ok {
		t.Fatal("state of unknown group")
	}
}

// simProxy is a proxy in the simulation: it spends tokens at up to its
// demand and asks for more the way tokenclient does.
type simProxy struct {
	id        string
	demand    func(sec float64) float64
	local     float64
	rate      float64 // running trickle
	end       float64
	sent      float64 // demand sent in the last request
	delivered float64 // tokens it could spend: immediate grants + trickle delivered so far
	expected  float64 // its proportional share, integrated
}

func TestAllocatorSimulation(t *testing.T) {
	phase := func(vals ...float64) func(float64) float64 {
		return func(s float64) float64 {
			i := int(s / 40)
			if i >= len(vals) {
				i = len(vals) - 1
			}
			return vals[i]
		}
	}
	// twenty proxies whose demands are redrawn every 40 s (seeded, so the
	// story is the same every run), adding up to more than R.
	twenty := func() []*simProxy {
		rng := rand.New(rand.NewPCG(1, 2))
		var ps []*simProxy
		for i := range 20 {
			vals := make([]float64, 3)
			for j := range vals {
				vals[j] = float64(20 + rng.IntN(200))
			}
			ps = append(ps, &simProxy{id: fmt.Sprintf("q%02d", i), demand: phase(vals...)})
		}
		return ps
	}
	type scenario struct {
		name    string
		burst   resourcegroup.BurstMode
		proxies func() []*simProxy
	}
	five := func() []*simProxy {
		return []*simProxy{
			{id: "p1", demand: phase(300, 1000, 100)},
			{id: "p2", demand: phase(300, 200, 900)},
			{id: "p3", demand: phase(600, 200, 500)},
			{id: "p4", demand: phase(800, 600, 500)},
			{id: "p5", demand: phase(0, 500, 500)}, // joins at 40 s
		}
	}
	for _, sc := range []scenario{
		{"5 proxies, burst off", resourcegroup.BurstOff, five},
		{"5 proxies, moderated", resourcegroup.BurstModerated, five},
		{"20 proxies, random demand", resourcegroup.BurstOff, twenty},
	} {
		t.Run(sc.name, func(t *testing.T) {
			const R = 1000.0
			const T = 120.0
			const dt = 0.01
			settings := Settings{RUPerSec: R, Burst: sc.burst}
			a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
			a.SetGroup("g", settings, t0)
			proxies := sc.proxies()
			capacity := settings.Capacity()
			totalAt := func(s float64) float64 {
				d := 0.0
				for _, p := range proxies {
					d += p.demand(s)
				}
				return d
			}
			// The start-up burst is shared in proportion to initial demand.
			for _, p := range proxies {
				p.expected = capacity * p.demand(0) / totalAt(0)
			}
			// Every proxy first reports its demand, as proxies already
			// connected would have: the story is about sharing, not about
			// who asked first for the full start-up bucket.
			for _, p := range proxies {
				if d := p.demand(0); d > 0 {
					if _, err := a.Acquire("g", Request{ProxyID: p.id, Demand: d, ReportOnly: true}, t0); err != nil {
						t.Fatal(err)
					}
				}
			}
			steps := int(T / dt)
			for k := 0; k < steps; k++ {
				s := float64(k) * dt
				now := at(s)
				a.Expire(now)
				total := totalAt(s)
				for _, p := range proxies {
					d := p.demand(s)
					p.expected += R * d / total * dt
					if d == 0 {
						continue
					}
					// Ask when local tokens plus the rest of the trickle fall
					// under 1 s of demand, or when demand moved by more than
					// 25% since the last request (as tokenpb asks), for
					// 5 s × 1.1 of demand.
					left := p.local + p.rate*math.Max(p.end-s, 0)
					if left < d || math.Abs(d-p.sent) > 0.25*p.sent {
						p.sent = d
						g, err := a.Acquire("g", Request{ProxyID: p.id, Wanted: d*5*1.1 - p.local, Demand: d, Held: p.local}, now)
						if err != nil {
							t.Fatal(err)
						}
						p.rate, p.end = 0, 0
						p.local += g.Immediate
						p.delivered += g.Immediate
						if g.Trickle > 0 {
							p.rate = g.Tokens / g.Trickle.Seconds()
							p.end = s + g.Trickle.Seconds()
						} else {
							p.local += g.Tokens
							p.delivered += g.Tokens
						}
					}
					if p.end > s {
						got := p.rate * math.Min(dt, p.end-s)
						p.local += got
						p.delivered += got
					}
					p.local -= math.Min(p.local, d*dt)

				}
			}
			sum := 0.0
			for _, p := range proxies {
				sum += p.delivered
				if dev := math.Abs(p.delivered-p.expected) / p.expected; dev > 0.05 {
					t.Errorf("%s got %.0f RU, its proportional share is %.0f (%.1f%% off)", p.id, p.delivered, p.expected, 100*dev)
				} else {
					t.Logf("%s got %.0f RU, share %.0f (%.2f%% off)", p.id, p.delivered, p.expected, 100*(p.delivered-p.expected)/p.expected)
				}
			}
			bound := R*T + capacity
			t.Logf("total %.0f RU, bound %.0f (%.2f%%)\n%s", sum, bound, 100*sum/bound, a.Group("g").String(at(T)))
			if sum > bound*1.01 {
				t.Errorf("total granted %.0f exceeds RU_PER_SEC × T + capacity = %.0f by more than 1%%", sum, bound)
			}
			// Demand exceeds the rate throughout: the group must not be starved either.
			if sum < bound*0.97 {
				t.Errorf("total granted %.0f is under 97%% of %.0f: throttled harder than RU_PER_SEC", sum, bound)
			}
		})
	}
}

// BenchmarkAcquire is one grant in a group shared by 200 proxies.
func BenchmarkAcquire(b *testing.B) {
	a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	a.SetGroup("g", Settings{RUPerSec: 1e6, Burst: resourcegroup.BurstModerated}, t0)
	ids := make([]string, 200)
	for i := range ids {
		ids[i] = fmt.Sprintf("proxy-%03d", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now := t0.Add(time.Duration(i) * time.Microsecond)
		if _, err := a.Acquire("g", Request{ProxyID: ids[i%len(ids)], Wanted: 100, Demand: 20}, now); err != nil {
			b.Fatal(err)
		}
	}
}

// saveRound is one persistence round at a time: the groups the allocator
// lists as dirty and, of those, the ones ToSave wants written (which are
// then counted as saved).
func saveRound(a *Allocator, now time.Time, handover bool) (dirty, saved []string) {
	for _, b := range a.TakeDirty() {
		dirty = append(dirty, b.Name())
		if st, ok := b.ToSave(now, handover); ok {
			b.Saved(st)
			saved = append(saved, b.Name())
		}
	}
	return dirty, saved
}

// Only changed buckets are looked at, and only meaningful changes are
// written: an idle group, refilling as its saved state predicts, is never
// written again, whatever the number of groups.
func TestAllocatorSavesOnlyMeaningfulChanges(t *testing.T) {
	a := NewAllocator(AllocConfig{})
	for i := range 1000 {
		a.SetGroup(fmt.Sprintf("idle%d", i), Settings{RUPerSec: 100}, t0)
	}
	a.SetGroup("busy", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0) // capacity 1000
	a.SetGroup("free", Settings{RUPerSec: resourcegroup.Unlimited}, t0)
	type round struct {
		at       float64
		take     float64 // tokens busy asks for before the round
		handover bool
		dirty    int
		saved    []string
	}
	tests := []round{
		{at: 1, dirty: 0},          // new groups start full: nothing to save
		{at: 2, take: 5, dirty: 1}, // 5 of 1000 < 1% of capacity: not written
		{at: 3, take: 300, dirty: 1, saved: []string{"busy"}}, // written
		{at: 5, dirty: 0},           // refilling as predicted
		{at: 30, dirty: 0},          // full again, as predicted
		{at: 31, take: 8, dirty: 1}, // small change
		{at: 32, take: 8, handover: true, dirty: 1, saved: []string{"busy"}},
		{at: 60, dirty: 0},
	}
	for _, r := range tests {
		if r.take > 0 {
			if _, err := a.Acquire("busy", Request{ProxyID: "p", Wanted: r.take, Demand: 1}, at(r.at)); err != nil {
				t.Fatal(err)
			}
			// The proxy spends them at once and says so: it holds none
			// (what it holds would count against the bucket's capacity).
			if _, err := a.Acquire("busy", Request{ProxyID: "p", ReportOnly: true, Demand: 1}, at(r.at)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Acquire("free", Request{ProxyID: "p", Wanted: 1e6}, at(r.at)); err != nil {
			t.Fatal(err)
		}
		dirty, saved := saveRound(a, at(r.at), r.handover)
		dirtyLimited := 0
		for _, d := range dirty {
			if d != "free" {
				dirtyLimited++
			}
		}
		if dirtyLimited != r.dirty || fmt.Sprint(saved) != fmt.Sprint(r.saved) {
			t.Errorf("at %vs: dirty %v, saved %v; want %d dirty, saved %v", r.at, dirty, saved, r.dirty, r.saved)
		}
	}
	// A new leader restores the saved state: the level matches, and it
	// counts as saved (nothing to write).
	st, _ := a.State("busy", at(60))
	b := NewAllocator(AllocConfig{})
	b.SetGroup("busy", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, at(60))
	b.Restore("busy", a.Group("busy").saved, at(60))
	if got := b.Group("busy").Tokens(at(60)); math.Abs(got-st.Tokens) > 1e-9 {
		t.Fatalf("restored %v, want %v", got, st.Tokens)
	}
	b.markDirty(b.Group("busy"))
	if _, saved := saveRound(b, at(61), false); len(saved) != 0 {
		t.Fatalf("a restored idle bucket was written again: %v", saved)
	}
	// A dropped group's list entry is no longer held.
	a.Acquire("busy", Request{ProxyID: "p", Wanted: 500}, at(61))
	list := a.TakeDirty()
	a.RemoveGroup("busy")
	if len(list) != 1 || a.Held(list[0]) {
		t.Fatalf("dropped group still held: %v", list)
	}
	// Altering a group's settings makes it dirty.
	a.SetGroup("idle1", Settings{RUPerSec: 10}, at(62))
	if dirty, saved := saveRound(a, at(62), false); fmt.Sprint(dirty) != "[idle1]" || len(saved) != 0 {
		t.Fatalf("after ALTER: dirty %v saved %v", dirty, saved)
	}
}

// On a follower nobody takes the dirty list: group churn must not grow it
// for ever (it keeps only the buckets still held once it outgrows them).
func TestDirtyListBoundedWithoutPersist(t *testing.T) {
	a := NewAllocator(AllocConfig{TricklePeriod: 5 * time.Second})
	now := time.Unix(1000, 0)
	a.SetGroup("kept", Settings{RUPerSec: 100}, now)
	a.SetGroup("kept", Settings{RUPerSec: 150}, now)
	for i := range 10000 {
		name := fmt.Sprintf("g%d", i)
		a.SetGroup(name, Settings{RUPerSec: 100, Version: 1}, now)
		a.SetGroup(name, Settings{RUPerSec: 200, Version: 2}, now)
		a.RemoveGroup(name)
	}
	if n := len(a.dirty); n > 2*a.Len()+64+1 {
		t.Fatalf("dirty list holds %d buckets for %d groups", n, a.Len())
	}
	if d := a.TakeDirty(); !slices.ContainsFunc(d, func(b *Bucket) bool { return b.Name() == "kept" }) {
		t.Fatal("the held group's bucket left the dirty list")
	}
}

// credStep is one request in a story of credentials told to the
// allocator: the proxy id of a credential asks or reports, then reports
// what it spent (as the server does: Acquire, then Report).
type credStep struct {
	at         float64 // seconds since t0
	cred, id   string
	wanted     float64
	demand     float64
	report     bool
	spent      float64 // RU reported spent with the request (1 statement per RU)
	rate       float64 // expected FillRate
	proxies    int     // expected MAX_CONCURRENCY divisor
	checkShare bool    // compare rate (else only proxies)
}

// TestAllocatorCredentialStories: a credential's proxy ids share one
// weight, and one place of MAX_CONCURRENCY split among those that run
// statements.
func TestAllocatorCredentialStories(t *testing.T) {
	tests := []struct {
		name     string
		settings Settings
		steps    []credStep
	}{
		{
			// Three ids of px each claim 1e308 RU/s without asking: each
			// would weigh RU_PER_SEC alone; together they weigh it once,
			// so o, asking for its 100 RU/s, gets half the fill, not a
			// quarter.
			name:     "a credential's idle ids weigh like one proxy",
			settings: Settings{RUPerSec: 100},
			steps: []credStep{
				{at: 0, cred: "px", id: "a", report: true, demand: 1e308, rate: 100, proxies: 1, checkShare: true},
				{at: 0, cred: "px", id: "b", report: true, demand: 1e308, rate: 50, proxies: 1, checkShare: true},
				{at: 0, cred: "px", id: "c", report: true, demand: 1e308, rate: 100.0 / 3, proxies: 1, checkShare: true},
				// o: 100 of 200; px's credential and o's, one place each.
				{at: 0, cred: "o", id: "o", wanted: 500, demand: 100, rate: 50, proxies: 2, checkShare: true},
			},
		},
		{
			// h is a real proxy spending the whole rate; x holds the same
			// token, claims 1e308 RU/s and asks for all it may, spending
			// nothing. Within px's share x weighs like an idle proxy
			// (RU_PER_SEC = 20) against what h's spending backs (50 × its
			// 4 RU/s reported rate: 200 of its 400).
			name:     "an id that spends nothing gets an idle proxy's part of its credential's share",
			settings: Settings{RUPerSec: 20},
			steps: []credStep{
				{at: 0, cred: "px", id: "h", wanted: 2200, demand: 400, spent: 20, rate: 20, proxies: 1, checkShare: true},
				// x: 20 of 220; its place of MAX_CONCURRENCY beside h, who
				// runs statements, is its own only.
				{at: 1, cred: "px", id: "x", wanted: 1e9, demand: 1e308, rate: 20 * 20.0 / 220, proxies: 2, checkShare: true},
				// h: 200 of 220, and the whole of MAX_CONCURRENCY.
				{at: 1, cred: "px", id: "h", wanted: 2200, demand: 400, spent: 20, rate: 20 * 200.0 / 220, proxies: 1, checkShare: true},
				// x starts spending what it gets: its part grows with it.
				{at: 2, cred: "px", id: "x", wanted: 1e9, demand: 1e308, spent: 20, proxies: 2},
				{at: 3, cred: "px", id: "x", wanted: 1e9, demand: 1e308, spent: 20, proxies: 2},
			},
		},
		{
			// o asks for all one proxy may (500 RU/s on a 10 RU/s group);
			// x1 and x2 of px each too: px weighs 500, as with one id,
			// and o keeps half the fill (with the two ids weighing 1000,
			// a third).
			name:     "a credential's ids together weigh at most what one proxy may claim",
			settings: Settings{RUPerSec: 10},
			steps: []credStep{
				{at: 0, cred: "o", id: "o", wanted: 5000, demand: 500, rate: 10, proxies: 1, checkShare: true},
				{at: 0, cred: "px", id: "x1", wanted: 1e9, demand: 1e308, rate: 5, proxies: 2, checkShare: true},
				{at: 0, cred: "px", id: "x2", wanted: 1e9, demand: 1e308, rate: 2.5, proxies: 2, checkShare: true},
				{at: 0, cred: "o", id: "o", wanted: 5000, demand: 500, rate: 5, proxies: 2, checkShare: true},
			},
		},
		{
			// Without authentication each id is a credential of its own.
			name:     "an id without demand takes no place of MAX_CONCURRENCY",
			settings: Settings{RUPerSec: 100},
			steps: []credStep{
				{at: 0, id: "a", wanted: 100, demand: 50, proxies: 1},
				// b, idle, counts itself only, and is not counted by a.
				{at: 0, id: "b", report: true, proxies: 2},
				{at: 1, id: "a", wanted: 100, demand: 50, proxies: 1},
				// Once b has demand, each counts the other.
				{at: 2, id: "b", wanted: 100, demand: 50, proxies: 2},
				{at: 2, id: "a", wanted: 100, demand: 50, proxies: 2},
			},
		},
		{
			// Two real proxies of one credential that both run
			// statements split its place.
			name:     "a credential's running ids split its place",
			settings: Settings{RUPerSec: 100},
			steps: []credStep{
				{at: 0, cred: "px", id: "a", wanted: 100, demand: 50, spent: 10, proxies: 1},
				{at: 0, cred: "px", id: "b", wanted: 100, demand: 50, spent: 10, proxies: 2},
				{at: 0, cred: "o", id: "o", wanted: 100, demand: 50, spent: 10, proxies: 2},
				{at: 1, cred: "px", id: "a", wanted: 100, demand: 50, spent: 10, proxies: 4},
				// b without demand: a has px's place alone.
				{at: 2, cred: "px", id: "b", report: true, proxies: 4},
				{at: 2, cred: "px", id: "a", wanted: 100, demand: 50, spent: 10, proxies: 2},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
			a.SetGroup("g", tc.settings, t0)
			for i, st := range tc.steps {
				now := at(st.at)
				slot := st.id
				if st.cred != "" {
					slot = st.cred + "/" + st.id
				}
				g, err := a.Acquire("g", Request{ProxyID: slot, Credential: st.cred, Wanted: st.wanted, Demand: st.demand, ReportOnly: st.report}, now)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				a.Report("g", slot, ru.Consumption{RRU: st.spent, Statements: st.spent}, 0, 0, 0, now)
				if g.Proxies != st.proxies || (st.checkShare && math.Abs(g.FillRate-st.rate) > 1e-6) {
					t.Fatalf("step %d (%s at %vs): fill %.3f, divisor %d; want fill %.3f, divisor %d\n%s",
						i, slot, st.at, g.FillRate, g.Proxies, st.rate, st.proxies, a.Group("g").String(now))
				}
			}
		})
	}
}

// TestAllocatorSecondIDGrowsByWhatItSpends: a credential's second real
// proxy, arriving beside a first that takes the whole rate, reaches an
// even split within seconds by spending what it gets; one that spends
// nothing stays at an idle proxy's part.
func TestAllocatorSecondIDGrowsByWhatItSpends(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spends bool
		lo, hi float64 // bounds of the second id's part of the fill after 20 s
	}{
		{"spends what it gets", true, 0.4, 0.6},
		// An idle proxy's part: RU_PER_SEC against a's 800.
		{"spends nothing", false, 0.1, 0.12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
			a.SetGroup("g", Settings{RUPerSec: 100}, t0)
			var share float64
			for i := range 200 { // every 100 ms for 20 s
				now := at(0.1 * float64(i))
				for _, id := range []string{"a", "b"} {
					if id == "b" && i < 20 {
						continue // b arrives after 2 s
					}
					g, _ := a.Acquire("g", Request{ProxyID: "px/" + id, Credential: "px", Wanted: 2000, Demand: 2000}, now)
					if id == "a" || tc.spends {
						spent := g.FillRate * 0.1
						a.Report("g", "px/"+id, ru.Consumption{RRU: spent, Statements: 1}, 0, 0, 0, now)
					}
					if id == "b" {
						share = g.FillRate / 100
					}
				}
			}
			t.Logf("%s: b's part of the fill after 18 s beside a: %.3f\n%s", tc.name, share, a.Group("g").String(at(20)))
			if share < tc.lo || share > tc.hi {
				t.Fatalf("b's part %.3f, want %.2f to %.2f", share, tc.lo, tc.hi)
			}
		})
	}
}

// TestAllocatorHeldClaimsAgeOut: x takes a BURSTABLE group's saved burst
// at once and claims to hold it every second; the claim keeps the bucket
// from saving the burst again only as long as an honest proxy would keep
// it (heldWindowSlots), and a claim left standing by a silent slot ages too.
func TestAllocatorHeldClaimsAgeOut(t *testing.T) {
	for _, silent := range []bool{false, true} {
		t.Run(fmt.Sprintf("silent=%v", silent), func(t *testing.T) {
			a := NewAllocator(AllocConfig{TricklePeriod: 2 * time.Second})
			a.SetGroup("g", Settings{RUPerSec: 100, Burst: resourcegroup.BurstModerated}, t0) // capacity 1000
			g, _ := a.Acquire("g", Request{ProxyID: "px/x", Credential: "px", Wanted: 1e9, Demand: 1e308}, t0)
			if g.Immediate != 1000 {
				t.Fatalf("x's first grant took %v at once, want the whole burst", g.Immediate)
			}
			b := a.Group("g")
			for sec := 1; sec <= 40; sec++ {
				now := at(float64(sec))
				a.Expire(now)
				if !silent || sec == 1 {
					a.Acquire("g", Request{ProxyID: "px/x", Credential: "px", ReportOnly: true, Held: 1e15}, now)
				}
				held, level := b.slots["px/x"].held, b.Tokens(now)
				switch {
				case sec <= 20 && held < 1000:
					t.Fatalf("at %ds x may hold only %v of the 1100 delivered within 20 s\n%s", sec, held, b.String(now))
				case sec <= 20 && level > 100+1e-6:
					t.Fatalf("at %ds the bucket saved %v beside x's 1000 held\n%s", sec, level, b.String(now))
				case sec >= 25 && held != 0:
					t.Fatalf("at %ds x still holds %v delivered 25 s ago\n%s", sec, held, b.String(now))
				}
			}
			if level := b.Tokens(at(40)); level != 1000 {
				t.Fatalf("at 40 s the bucket saved %v, want its capacity\n%s", level, b.String(at(40)))
			}
		})
	}
}
