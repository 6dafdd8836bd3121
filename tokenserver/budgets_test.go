package tokenserver

import (
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// A day of a group with a daily budget (NOTIFY at 80%, THROTTLE at 100%,
// REFUSE at 150%) and a monthly one (REFUSE at 100%), in UTC+1: the
// actions come as the spending crosses each trigger, the strongest holds,
// the day's roll-over at local midnight lifts the day's, the month's goes
// on counting.
func TestBudgetBookStory(t *testing.T) {
	loc := time.FixedZone("UTC+1", 3600)
	b := newBudgetBook(resourcegroup.BudgetCalendar{Loc: loc})
	g := resourcegroup.Group{Name: "rep", RUPerSec: 1000, Budgets: []resourcegroup.Budget{
		{Period: resourcegroup.PeriodDay, RU: 1000, Triggers: []resourcegroup.BudgetTrigger{
			{Percent: 80, Action: resourcegroup.BudgetNotify},
			{Percent: 100, Action: resourcegroup.BudgetThrottle, ThrottleRUPerSec: 50},
			{Percent: 150, Action: resourcegroup.BudgetRefuse},
		}},
		{Period: resourcegroup.PeriodMonth, RU: 3000, Triggers: []resourcegroup.BudgetTrigger{
			{Percent: 100, Action: resourcegroup.BudgetRefuse},
		}},
	}}
	now := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC) // 21:00 local
	b.set(g, now)
	steps := []struct {
		spend   float64
		after   time.Duration
		changed bool
		want    string
	}{
		{0, 0, false, "rep: DAY 0/1000 until 2026-11-28T23:00Z MONTH 0/3000 until 2026-11-30T23:00Z"},
		{799, time.Minute, false, "rep: DAY 799/1000 until 2026-11-28T23:00Z MONTH 799/3000 until 2026-11-30T23:00Z"},
		{1, time.Minute, true, "rep: DAY 800/1000 [80%] NOTIFY until 2026-11-28T23:00Z MONTH 800/3000 until 2026-11-30T23:00Z"},
		{300, time.Minute, true, "rep: DAY 1100/1000 [100%] THROTTLE(50) until 2026-11-28T23:00Z MONTH 1100/3000 until 2026-11-30T23:00Z"},
		{400, time.Minute, true, "rep: DAY 1500/1000 [150%] REFUSE until 2026-11-28T23:00Z MONTH 1500/3000 until 2026-11-30T23:00Z"},
		// Local midnight: the day's window rolls over and its actions lift.
		{10, 3 * time.Hour, true, "rep: DAY 10/1000 until 2026-11-29T23:00Z MONTH 1510/3000 until 2026-11-30T23:00Z"},
		{1490, time.Hour, true, "rep: DAY 1500/1000 [150%] REFUSE until 2026-11-29T23:00Z MONTH 3000/3000 [100%] REFUSE until 2026-11-30T23:00Z"},
		// The next day the daily budget would let it run, the month not.
		{0, 24 * time.Hour, false, "rep: DAY 0/1000 until 2026-11-30T23:00Z MONTH 3000/3000 [100%] REFUSE until 2026-11-30T23:00Z"},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		if changed := b.spend("rep", s.spend, now); changed != s.changed {
			t.Errorf("step %d: changed %v, want %v", i, changed, s.changed)
		}
		if got := b.String(now); got != s.want {
			t.Errorf("step %d:\ngot  %s\nwant %s", i, got, s.want)
		}
	}
	v := b.verdict("rep", now)
	if v.Action != resourcegroup.BudgetRefuse || v.Period != resourcegroup.PeriodMonth || v.Spent != 3000 || !v.End.Equal(time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)) {
		t.Errorf("verdict %+v", v)
	}
	// December: everything lifts.
	if changed := b.roll(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); len(changed) != 1 || changed[0] != "rep" {
		t.Errorf("roll into December changed %v", changed)
	}
	if v := b.verdict("rep", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); v.Action != 0 {
		t.Errorf("after the month: %+v", v)
	}
}

// Redefining a budget keeps what its window spent; removing every budget
// leaves the book; a new term's seed from the history raises what a
// window spent and may cross triggers; nonsense spending counts nothing.
func TestBudgetBookSetSeedAndBadInput(t *testing.T) {
	b := newBudgetBook(resourcegroup.BudgetCalendar{})
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	day := func(ru uint64, pct uint32, a resourcegroup.BudgetAction) resourcegroup.Group {
		return resourcegroup.Group{Name: "g", RUPerSec: 100, Budgets: []resourcegroup.Budget{
			{Period: resourcegroup.PeriodDay, RU: ru, Triggers: []resourcegroup.BudgetTrigger{{Percent: pct, Action: a}}}}}
	}
	b.set(day(1000, 100, resourcegroup.BudgetRefuse), now)
	b.spend("g", 600, now)
	b.set(day(500, 100, resourcegroup.BudgetRefuse), now.Add(time.Minute)) // lowered below what was spent
	if v := b.verdict("g", now.Add(time.Minute)); v.Action != resourcegroup.BudgetRefuse || v.Spent != 600 {
		t.Errorf("after lowering the budget: %+v", v)
	}
	b.set(resourcegroup.Group{Name: "g", RUPerSec: 100}, now)
	if b.has("g") {
		t.Error("a group without budgets stayed in the book")
	}
	b.set(day(1000, 50, resourcegroup.BudgetNotify), now)
	start, _ := resourcegroup.BudgetWindow(resourcegroup.PeriodDay, now, time.UTC)
	b.seed("g", resourcegroup.PeriodDay, start, 700, start)
	if v := b.verdict("g", now); v.Action != resourcegroup.BudgetNotify || v.Spent != 700 {
		t.Errorf("after the seed: %+v", v)
	}
	b.seed("g", resourcegroup.PeriodDay, start.Add(-24*time.Hour), 9999, start) // yesterday's: not this window
	for _, bad := range []float64{-5, 0} {
		b.spend("g", bad, now)
	}
	if got := b.String(now); got != "g: DAY 700/1000 [50%] NOTIFY until 2026-11-29T00:00Z" {
		t.Errorf("book %s", got)
	}
	if b.spend("nobudget", 10, now) || b.verdict("nobudget", now).Action != 0 {
		t.Error("a group without budgets has a verdict")
	}
}
