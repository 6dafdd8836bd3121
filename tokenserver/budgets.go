package tokenserver

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Budgets over time windows (docs/budgets.md): the budgetBook keeps a
// resourcegroup.BudgetState for every group with a BUDGET — what the
// current window of each of its budgets has spent and the triggers that
// crossed — in --budget-time-zone (or --budget-day-length's compressed
// calendar). The leader feeds it the same bounded consumption the usage
// history records, so a budget spends exactly what the history shows.
// Not safe for concurrent use: the Server's lock guards it.
type budgetBook struct {
	// gen numbers the verdicts' changes (budgetEntry.gen).
	gen    uint64
	cal    resourcegroup.BudgetCalendar
	groups map[string]*budgetEntry
	// seeded: this term's book has taken the usage history's figures.
	seeded bool
}

// budgetEntry is one budgeted group.
type budgetEntry struct {
	state *resourcegroup.BudgetState
	// base is the group's settings as defined; the allocator gets them
	// with a THROTTLE's rate applied (effective).
	base Settings
	// verdict is the verdict last applied (allocator, proxies, metrics).
	verdict resourcegroup.BudgetVerdict
	// gen counts the verdict's changes, so that streams send a group's
	// verdict only when it moved.
	gen  uint64
	rate spendRate
}

func newBudgetBook(cal resourcegroup.BudgetCalendar) *budgetBook {
	if cal.Loc == nil {
		cal.Loc = time.UTC
	}
	return &budgetBook{cal: cal, groups: map[string]*budgetEntry{}}
}

// set follows a group's definition at now; a group without budgets
// leaves the book.
func (b *budgetBook) set(g resourcegroup.Group, now time.Time) {
	if len(g.Budgets) == 0 {
		delete(b.groups, g.Name)
		return
	}
	e := b.groups[g.Name]
	if e == nil {
		e = &budgetEntry{}
		b.groups[g.Name] = e
	}
	e.state = resourcegroup.NewBudgetStateIn(g.Budgets, b.cal, now, e.state)
	e.base = SettingsOf(g)
}

// drop forgets a dropped group.
func (b *budgetBook) drop(group string) { delete(b.groups, group) }

// has reports whether group has budgets.
func (b *budgetBook) has(group string) bool { return b.groups[group] != nil }

// spend adds ru spent by group at now and reports whether the group's
// verdict changed.
func (b *budgetBook) spend(group string, ru float64, now time.Time) bool {
	if e := b.groups[group]; e != nil {
		e.rate.add(ru, now)
		return e.state.Spend(ru, now)
	}
	return false
}

// seed is BudgetState.Seed for group.
func (b *budgetBook) seed(group string, p resourcegroup.BudgetPeriod, start time.Time, spent float64, now time.Time) {
	if e := b.groups[group]; e != nil {
		e.state.Seed(p, start, spent, now)
	}
}

// reset starts a new term: every window spent nothing yet (the usage
// history seeds them once loaded).
func (b *budgetBook) reset(now time.Time) {
	for _, e := range b.groups {
		e.state.Reset(now)
		e.rate = spendRate{}
	}
	b.seeded = false
}

// roll rolls over the windows that ended by now and returns the groups
// whose verdict changed, sorted.
func (b *budgetBook) roll(now time.Time) []string {
	var changed []string
	for g, e := range b.groups {
		if e.state.Roll(now) {
			changed = append(changed, g)
		}
	}
	slices.Sort(changed)
	return changed
}

// verdict is what group's budgets do at now.
func (b *budgetBook) verdict(group string, now time.Time) resourcegroup.BudgetVerdict {
	if e := b.groups[group]; e != nil {
		return e.state.Verdict(now)
	}
	return resourcegroup.BudgetVerdict{}
}

// effective is the settings the allocator runs group with: s with a
// THROTTLE's rate when its verdict throttles and it is enforced (MODE
// WARN and OFF only report).
func effective(s Settings, v resourcegroup.BudgetVerdict) Settings {
	if v.Action != resourcegroup.BudgetThrottle || s.Mode != resourcegroup.ModeEnforce || v.ThrottleRUPerSec == 0 {
		return s
	}
	if s.RUPerSec == resourcegroup.Unlimited || s.RUPerSec > v.ThrottleRUPerSec || s.Burst == resourcegroup.BurstUnlimited {
		s.RUPerSec = v.ThrottleRUPerSec
		if s.Burst == resourcegroup.BurstUnlimited {
			s.Burst = resourcegroup.BurstOff
		}
	}
	return s
}

// String shows the book at now on one line, a group at a time.
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
		sb.WriteString(g + ": " + b.groups[g].state.String(now))
	}
	return sb.String()
}

// spendRateSeconds is the span of a group's current rate of spending,
// which projects when its budgets run out.
const spendRateSeconds = 30

// spendRate is what a group spent in each of the last spendRateSeconds
// seconds.
type spendRate struct {
	sec [spendRateSeconds]int64
	ru  [spendRateSeconds]float64
}

func (r *spendRate) add(ru float64, now time.Time) {
	if !(ru > 0) || math.IsInf(ru, 1) {
		return
	}
	t := now.Unix()
	i := int(t % spendRateSeconds)
	if i < 0 {
		i += spendRateSeconds
	}
	if r.sec[i] != t {
		r.sec[i], r.ru[i] = t, 0
	}
	r.ru[i] += ru
}

// perSec is the rate over the spendRateSeconds seconds before now.
func (r *spendRate) perSec(now time.Time) float64 {
	t := now.Unix()
	var sum float64
	for i := range r.sec {
		if r.sec[i] > t-spendRateSeconds && r.sec[i] <= t {
			sum += r.ru[i]
		}
	}
	return sum / spendRateSeconds
}

// projectExhaustion is when a window with left RU to spend runs out at
// rate RU/s from now, zero when not before end (or never); for a window
// already spent, when it ran out (exhausted, BudgetWindowState's).
func projectExhaustion(left, rate float64, now, end, exhausted time.Time) time.Time {
	if left <= 0 {
		if exhausted.IsZero() || exhausted.After(now) {
			return now
		}
		return exhausted
	}
	if !(rate > 0) {
		return time.Time{}
	}
	d := left / rate
	if d >= end.Sub(now).Seconds() {
		return time.Time{}
	}
	return now.Add(time.Duration(d * float64(time.Second)))
}
