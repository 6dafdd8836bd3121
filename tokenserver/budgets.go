package tokenserver

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Budgets over time windows (docs/budgets.md): the budgetBook keeps, for
// every group with a BUDGET, what the current window of each of its
// budgets has spent and which of its triggers that crossed, and says which
// action is in force. It is plain state, every method taking now, as the
// allocator is: the leader feeds it the same bounded consumption the usage
// history records, so a budget spends exactly what the history shows.

// BudgetVerdict is what a group's budgets do to it at an instant: the
// strongest action any of them has reached (REFUSE, then THROTTLE at the
// lowest rate, then NOTIFY), with the budget that reached it.
type BudgetVerdict struct {
	// Action is 0 when no trigger has been crossed.
	Action resourcegroup.BudgetAction
	// ThrottleRUPerSec is THROTTLE's rate.
	ThrottleRUPerSec uint64
	// Period names the budget; Budget is its RU per window, Spent what its
	// window has spent, Percent the trigger crossed, End when the window
	// rolls over and lifts the action.
	Period  resourcegroup.BudgetPeriod
	Budget  uint64
	Spent   float64
	Percent uint32
	End     time.Time
}

// stronger reports whether v overrides w: REFUSE over everything, then
// THROTTLE (the lower rate first), then NOTIFY; between equals the window
// that ends later, which holds the action longer.
func (v BudgetVerdict) stronger(w BudgetVerdict) bool {
	rank := func(a resourcegroup.BudgetAction) int {
		switch a {
		case resourcegroup.BudgetRefuse:
			return 3
		case resourcegroup.BudgetThrottle:
			return 2
		case resourcegroup.BudgetNotify:
			return 1
		}
		return 0
	}
	if rank(v.Action) != rank(w.Action) {
		return rank(v.Action) > rank(w.Action)
	}
	if v.Action == resourcegroup.BudgetThrottle && v.ThrottleRUPerSec != w.ThrottleRUPerSec {
		return v.ThrottleRUPerSec < w.ThrottleRUPerSec
	}
	return v.End.After(w.End)
}

// budgetWindow is one budget's current window.
type budgetWindow struct {
	budget     resourcegroup.Budget
	start, end time.Time
	spent      float64
	// crossed is how many of the budget's triggers the window's spending
	// has reached (they are in increasing percent).
	crossed int
}

// verdict is what the window's crossed triggers do.
func (w *budgetWindow) verdict() BudgetVerdict {
	if w.crossed == 0 {
		return BudgetVerdict{}
	}
	// A later trigger does not lift an earlier one's stronger action
	// (NOTIFY at 120% after REFUSE at 100%): the strongest crossed holds.
	var v BudgetVerdict
	for _, t := range w.budget.Triggers[:w.crossed] {
		c := BudgetVerdict{Action: t.Action, ThrottleRUPerSec: t.ThrottleRUPerSec, Period: w.budget.Period,
			Budget: w.budget.RU, Spent: w.spent, Percent: t.Percent, End: w.end}
		if v.Action == 0 || c.stronger(v) || (c.Action == v.Action && c.ThrottleRUPerSec == v.ThrottleRUPerSec) {
			v = c
		}
	}
	return v
}

// cross moves crossed up to the triggers the window's spending reached.
func (w *budgetWindow) cross() {
	for w.crossed < len(w.budget.Triggers) &&
		w.spent >= float64(w.budget.RU)*float64(w.budget.Triggers[w.crossed].Percent)/100 {
		w.crossed++
	}
}

// budgetBook is the budgets of every group that has some. Not safe for
// concurrent use: the Server's lock guards it.
type budgetBook struct {
	loc    *time.Location
	groups map[string][]budgetWindow
}

func newBudgetBook(loc *time.Location) *budgetBook {
	if loc == nil {
		loc = time.UTC
	}
	return &budgetBook{loc: loc, groups: map[string][]budgetWindow{}}
}

// set follows a group's definition at now: its budgets' windows start (or
// go on, for a period it already had, with what they spent: redefining a
// budget mid-window does not forgive what was spent), and those it no
// longer has go. A group without budgets leaves the book.
func (b *budgetBook) set(g resourcegroup.Group, now time.Time) {
	if len(g.Budgets) == 0 {
		delete(b.groups, g.Name)
		return
	}
	old := b.groups[g.Name]
	ws := make([]budgetWindow, 0, len(g.Budgets))
	for _, bg := range g.Budgets {
		start, end := resourcegroup.BudgetWindow(bg.Period, now, b.loc)
		w := budgetWindow{budget: bg, start: start, end: end}
		if i := slices.IndexFunc(old, func(o budgetWindow) bool { return o.budget.Period == bg.Period }); i >= 0 && old[i].start.Equal(start) {
			w.spent = old[i].spent
		}
		w.cross()
		ws = append(ws, w)
	}
	b.groups[g.Name] = ws
}

// drop forgets a dropped group.
func (b *budgetBook) drop(group string) { delete(b.groups, group) }

// has reports whether group has budgets.
func (b *budgetBook) has(group string) bool { return len(b.groups[group]) > 0 }

// spend adds ru spent by group at now to each of its budgets' windows
// (rolling over those that ended first) and reports whether the group's
// verdict changed. Only a finite positive ru counts.
func (b *budgetBook) spend(group string, ru float64, now time.Time) bool {
	ws := b.groups[group]
	if len(ws) == 0 {
		return false
	}
	before := verdictOf(ws)
	b.rollWindows(ws, now)
	if ru > 0 && !math.IsInf(ru, 1) {
		for i := range ws {
			ws[i].spent += ru
			ws[i].cross()
		}
	}
	return verdictOf(ws) != before
}

// seed sets what a period's current window has spent so far, as the
// usage history says, when a new term starts; a window it does not hold
// (another period, or already over) is left alone.
func (b *budgetBook) seed(group string, p resourcegroup.BudgetPeriod, start time.Time, spent float64) {
	ws := b.groups[group]
	for i := range ws {
		if ws[i].budget.Period == p && ws[i].start.Equal(start) && spent > ws[i].spent && !math.IsInf(spent, 1) {
			ws[i].spent = spent
			ws[i].cross()
		}
	}
}

// roll rolls over the windows that ended by now and returns the groups
// whose verdict changed, sorted.
func (b *budgetBook) roll(now time.Time) []string {
	var changed []string
	for g, ws := range b.groups {
		before := verdictOf(ws)
		b.rollWindows(ws, now)
		if verdictOf(ws) != before {
			changed = append(changed, g)
		}
	}
	slices.Sort(changed)
	return changed
}

func (b *budgetBook) rollWindows(ws []budgetWindow, now time.Time) {
	for i := range ws {
		if !now.Before(ws[i].end) {
			ws[i].start, ws[i].end = resourcegroup.BudgetWindow(ws[i].budget.Period, now, b.loc)
			ws[i].spent, ws[i].crossed = 0, 0
			ws[i].cross() // a trigger at 0%: none (percent is at least 1)
		}
	}
}

// verdict is what group's budgets do at now.
func (b *budgetBook) verdict(group string, now time.Time) BudgetVerdict {
	ws := b.groups[group]
	b.rollWindows(ws, now)
	return verdictOf(ws)
}

// verdictOf is the strongest verdict of windows.
func verdictOf(ws []budgetWindow) BudgetVerdict {
	var v BudgetVerdict
	for i := range ws {
		if c := ws[i].verdict(); c.Action != 0 && (v.Action == 0 || c.stronger(v)) {
			v = c
		}
	}
	return v
}

// String shows the book at now on one line, a group at a time:
// "g: DAY 1200/1000 [100%] THROTTLE(50) until 2026-11-29T00:00Z".
func (b *budgetBook) String(now time.Time) string {
	names := make([]string, 0, len(b.groups))
	for g := range b.groups {
		names = append(names, g)
	}
	slices.Sort(names)
	var sb strings.Builder
	for i, g := range names {
		if i > 0 {
			sb.WriteString("; ")
		}
		ws := b.groups[g]
		b.rollWindows(ws, now)
		sb.WriteString(g + ":")
		for _, w := range ws {
			fmt.Fprintf(&sb, " %s %.0f/%d", w.budget.Period, w.spent, w.budget.RU)
			if v := w.verdict(); v.Action != 0 {
				fmt.Fprintf(&sb, " [%d%%] %s", v.Percent, v.Action)
				if v.Action == resourcegroup.BudgetThrottle {
					fmt.Fprintf(&sb, "(%d)", v.ThrottleRUPerSec)
				}
			}
			fmt.Fprintf(&sb, " until %s", w.end.UTC().Format("2006-01-02T15:04Z"))
		}
	}
	return sb.String()
}
