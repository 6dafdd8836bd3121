package tokenserver

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/ru"
)

// TestCredBookBoundsReports: a proxy credential's reports in a group are
// bounded by its grants, a debt of debtWindow of the rate and its
// degraded-mode allowance; administrators are not bounded.
func TestCredBookBoundsReports(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	proxy := Principal{Name: "px", Role: RoleProxy, MaxStreams: 1}
	admin := Principal{Name: "admin", Role: RoleAdmin}
	gb := bound{ruPerSec: 100, capacity: 100}
	// A new credential's first account: one awayWindow of the rate plus
	// the capacity, and the debt.
	first := 100*awayWindow.Seconds() + 100 + debtWindow*100
	tests := []struct {
		name    string
		p       Principal
		gb      bound
		granted float64
		// away: the credential's stream is closed this long before the
		// report (after the first report used up the first allowance).
		away    time.Duration
		reports []float64
		want    float64 // RU counted in all
	}{
		{"within the first allowance", proxy, gb, 0, 0, []float64{1000}, 1000},
		{"1e12 is cut to the bound", proxy, gb, 0, 0, []float64{1e12}, first},
		{"grants add to it", proxy, gb, 500, 0, []float64{1e12}, first + 500},
		{"a second report finds nothing left", proxy, gb, 0, 0, []float64{1e12, 1e12}, first},
		{"an absence earns its time at the rate", proxy, gb, 0, 10 * time.Second, []float64{1e12, 1e12}, first + 10*100 + 100},
		{"an absence counts at most awayWindow", proxy, gb, 0, time.Hour, []float64{1e12, 1e12}, first + 100*awayWindow.Seconds() + 100},
		{"an unlimited group is bounded per message only", proxy, bound{unlimited: true}, 0, 0, []float64{1e12}, 1e12},
		{"an administrator is not bounded", admin, gb, 0, 0, []float64{1e12}, 1e12},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newCredBook()
			now := t0
			b.streamOpened(tc.p, now)
			b.grant(tc.p, "g", tc.granted, now)
			total := 0.0
			for i, r := range tc.reports {
				if i == 1 && tc.away > 0 {
					b.streamClosed(tc.p, now)
					now = now.Add(tc.away)
					b.streamOpened(tc.p, now)
				}
				u, _ := b.report(tc.p, "g", tc.gb, ru.Consumption{RRU: r}, 0, now)
				total += u.RU()
			}
			if math.Abs(total-tc.want) > 1e-6 {
				t.Fatalf("counted %.1f RU, want %.1f", total, tc.want)
			}
		})
	}
}

// TestCredBookCounts: statements and throttled statements are bounded by
// countRate per configured stream, burst awayWindow of it.
func TestCredBookCounts(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	p := Principal{Name: "px", Role: RoleProxy, MaxStreams: 2}
	b := newCredBook()
	burst := countRate * 2 * awayWindow.Seconds()
	u, thr := b.report(p, "g", bound{unlimited: true}, ru.Consumption{Statements: 1e10}, 1e10, t0)
	if u.Statements != burst || thr != burst {
		t.Fatalf("statements %v, throttled %v, want the burst %v", u.Statements, thr, burst)
	}
	u, _ = b.report(p, "g", bound{unlimited: true}, ru.Consumption{Statements: 1e10}, 0, t0.Add(time.Second))
	if u.Statements != countRate*2 {
		t.Fatalf("a second later: %v statements, want %v", u.Statements, countRate*2)
	}
	if got := b.statementsOf(p, "g"); got != burst+countRate*2+burst {
		t.Fatalf("statementsOf = %v", got)
	}
}

// TestCredBookInstances: an instance is bound to the credential that
// uses it; another proxy credential may not name it while its stream
// lives nor for instanceHold after; an administrator takes it over; a
// credential holds at most MaxStreams + 1 names.
func TestCredBookInstances(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	a := Principal{Name: "a", Role: RoleProxy, MaxStreams: 1}
	e := Principal{Name: "e", Role: RoleProxy, MaxStreams: 1}
	b := newCredBook()
	release, err := b.holdInstance(a, "a:4000", t0, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.claimInstance(e, "a:4000", t0.Add(time.Hour)); !errors.Is(err, ErrInstanceTaken) {
		t.Fatalf("while a's stream lives: %v", err)
	}
	release(t0.Add(time.Hour))
	if err := b.claimInstance(e, "a:4000", t0.Add(time.Hour+instanceHold/2)); !errors.Is(err, ErrInstanceTaken) {
		t.Fatalf("shortly after: %v", err)
	}
	if err := b.claimInstance(e, "a:4000", t0.Add(time.Hour+instanceHold)); err != nil {
		t.Fatalf("instanceHold after: %v", err)
	}
	if err := b.claimInstance(Principal{Name: "admin", Role: RoleAdmin}, "a:4000", t0.Add(time.Hour+instanceHold)); err != nil {
		t.Fatalf("an administrator: %v", err)
	}
	// e holds at most 2 names: a third frees its least recently used.
	for i, in := range []string{"e:1", "e:2", "e:3"} {
		if err := b.claimInstance(e, in, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.claimInstance(a, "e:1", t0.Add(3*time.Second)); err != nil {
		t.Fatalf("the name e gave up: %v", err)
	}
	if err := b.claimInstance(a, "e:3", t0.Add(3*time.Second)); !errors.Is(err, ErrInstanceTaken) {
		t.Fatalf("e's newest name: %v", err)
	}
	if err := b.claimInstance(Principal{}, "e:3", t0); err != nil {
		t.Fatalf("authentication off: %v", err)
	}
}
