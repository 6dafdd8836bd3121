package resourcegroup

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// BudgetState is one group's budgets in their current windows: what each
// window has spent and which of its triggers that crossed. It is plain
// state, every method taking now: rgserver's leader keeps one per
// budgeted group and feeds it what the group spends, and the what-if
// (EXPLAIN RESOURCE GROUP) replays recorded demand through one.
type BudgetState struct {
	cal     BudgetCalendar
	windows []budgetWindow
}

// BudgetCalendar is how budgets' windows are cut: the calendar of Loc
// (BudgetWindow), or, with a DayLength other than 0 and 24 h, compressed
// time for tests and soak runs: a DAY lasts DayLength, an HOUR 1/24 of
// it, a WEEK 7 and a MONTH 30 DayLengths, each window aligned to the
// Unix epoch.
type BudgetCalendar struct {
	Loc       *time.Location
	DayLength time.Duration
}

// Compressed reports whether c's days are not real days.
func (c BudgetCalendar) Compressed() bool {
	return c.DayLength > 0 && c.DayLength != 24*time.Hour
}

// Window is the window of period p that holds t: [start, end).
func (c BudgetCalendar) Window(p BudgetPeriod, t time.Time) (start, end time.Time) {
	if !c.Compressed() {
		return BudgetWindow(p, t, c.Loc)
	}
	n := int64(c.DayLength)
	switch p {
	case PeriodHour:
		n /= 24
	case PeriodWeek:
		n *= 7
	case PeriodMonth:
		n *= 30
	}
	n = max(n, int64(time.Millisecond))
	ns := t.UnixNano()
	k := ns / n
	if ns < 0 && ns%n != 0 {
		k--
	}
	start = time.Unix(0, k*n)
	return start, start.Add(time.Duration(n))
}

// budgetWindow is one budget's current window.
type budgetWindow struct {
	budget     Budget
	start, end time.Time
	spent      float64
	// crossed is how many of the budget's triggers (in increasing
	// percent) the window's spending has reached.
	crossed int
	// exhausted is when the window's spending reached its RU as seen
	// here (Spend's or Seed's now); zero while it has not.
	exhausted time.Time
}

// BudgetVerdict is what a group's budgets do to it at an instant: the
// strongest action any of them has reached (REFUSE, then THROTTLE at the
// lowest rate, then NOTIFY), with the budget that reached it.
type BudgetVerdict struct {
	// Action is 0 when no trigger has been crossed.
	Action BudgetAction
	// ThrottleRUPerSec is THROTTLE's rate.
	ThrottleRUPerSec uint64
	// Period names the budget; Budget is its RU per window, Spent what
	// its window has spent, Percent the trigger crossed, End when the
	// window rolls over and lifts the action.
	Period  BudgetPeriod
	Budget  uint64
	Spent   float64
	Percent uint32
	End     time.Time
}

// stronger reports whether v overrides w: REFUSE over everything, then
// THROTTLE (the lower rate first), then NOTIFY; between equals the window
// that ends later, which holds the action longer.
func (v BudgetVerdict) stronger(w BudgetVerdict) bool {
	rank := func(a BudgetAction) int {
		switch a {
		case BudgetRefuse:
			return 3
		case BudgetThrottle:
			return 2
		case BudgetNotify:
			return 1
		}
		return 0
	}
	if rank(v.Action) != rank(w.Action) {
		return rank(v.Action) > rank(w.Action)
	}
	if v.Action == BudgetThrottle && v.ThrottleRUPerSec != w.ThrottleRUPerSec {
		return v.ThrottleRUPerSec < w.ThrottleRUPerSec
	}
	return v.End.After(w.End)
}

// Same reports whether v and w take the same action for the same
// trigger of the same window: they differ at most in what was spent.
func (v BudgetVerdict) Same(w BudgetVerdict) bool {
	v.Spent, w.Spent = 0, 0
	return v == w
}

// String says what the verdict does, e.g. "DAY 100% THROTTLE(50)".
func (v BudgetVerdict) String() string {
	if v.Action == 0 {
		return "none"
	}
	s := fmt.Sprintf("%s %d%% %s", v.Period, v.Percent, v.Action)
	if v.Action == BudgetThrottle {
		s += fmt.Sprintf("(%d)", v.ThrottleRUPerSec)
	}
	return s
}

// NewBudgetState starts budgets' windows at now, their calendars in loc
// (nil: UTC). prev, when not nil, is the group's state before its
// definition changed: a period it already had goes on with what its
// window spent (redefining a budget mid-window does not forgive it).
func NewBudgetState(budgets []Budget, loc *time.Location, now time.Time, prev *BudgetState) *BudgetState {
	return NewBudgetStateIn(budgets, BudgetCalendar{Loc: loc}, now, prev)
}

// NewBudgetStateIn is NewBudgetState with windows cut by cal.
func NewBudgetStateIn(budgets []Budget, cal BudgetCalendar, now time.Time, prev *BudgetState) *BudgetState {
	if cal.Loc == nil {
		cal.Loc = time.UTC
	}
	s := &BudgetState{cal: cal, windows: make([]budgetWindow, 0, len(budgets))}
	for _, b := range budgets {
		start, end := cal.Window(b.Period, now)
		w := budgetWindow{budget: b, start: start, end: end}
		if prev != nil {
			if i := slices.IndexFunc(prev.windows, func(o budgetWindow) bool { return o.budget.Period == b.Period }); i >= 0 && prev.windows[i].start.Equal(start) {
				w.spent = prev.windows[i].spent
				if w.spent >= float64(b.RU) {
					w.exhausted = prev.windows[i].exhausted // still spent: when it ran out
				}
			}
		}
		w.cross(now)
		s.windows = append(s.windows, w)
	}
	return s
}

// cross moves crossed up to the triggers the window's spending reached
// and notes at now when the window was first seen spent.
func (w *budgetWindow) cross(now time.Time) {
	if w.exhausted.IsZero() && w.spent >= float64(w.budget.RU) {
		w.exhausted = now
	}
	for w.crossed < len(w.budget.Triggers) &&
		w.spent >= float64(w.budget.RU)*float64(w.budget.Triggers[w.crossed].Percent)/100 {
		w.crossed++
	}
}

// verdict is what the window's crossed triggers do: the strongest holds
// (a NOTIFY at 120% does not lift a REFUSE at 100%).
func (w *budgetWindow) verdict() BudgetVerdict {
	var v BudgetVerdict
	for _, t := range w.budget.Triggers[:w.crossed] {
		c := BudgetVerdict{Action: t.Action, ThrottleRUPerSec: t.ThrottleRUPerSec, Period: w.budget.Period,
			Budget: w.budget.RU, Spent: w.spent, Percent: t.Percent, End: w.end}
		if v.Action == 0 || !v.stronger(c) {
			v = c
		}
	}
	return v
}

// Roll rolls over the windows that ended by now and reports whether the
// verdict changed.
func (s *BudgetState) Roll(now time.Time) bool {
	before := s.verdict()
	for i := range s.windows {
		w := &s.windows[i]
		if !now.Before(w.end) {
			w.start, w.end = s.cal.Window(w.budget.Period, now)
			w.spent, w.crossed, w.exhausted = 0, 0, time.Time{}
		}
	}
	return s.verdict() != before
}

// Spend adds ru spent at now to each window (rolling over those that
// ended first) and reports whether the verdict changed. Only a finite
// positive ru counts.
func (s *BudgetState) Spend(ru float64, now time.Time) bool {
	before := s.verdict()
	s.Roll(now)
	if ru > 0 && !math.IsInf(ru, 1) {
		for i := range s.windows {
			s.windows[i].spent += ru
			s.windows[i].cross(now)
		}
	}
	return s.verdict() != before
}

// Seed raises what period p's window starting at start has spent to
// spent (the usage history's figure, when a new rgserver term starts) at
// now; a window it does not name is left alone. A window the figure
// shows spent counts as run out at now: the history does not say when
// within the window it did.
func (s *BudgetState) Seed(p BudgetPeriod, start time.Time, spent float64, now time.Time) {
	for i := range s.windows {
		w := &s.windows[i]
		if w.budget.Period == p && w.start.Equal(start) && spent > w.spent && !math.IsInf(spent, 1) {
			w.spent = spent
			w.cross(now)
		}
	}
}

// Verdict is what the budgets do at now.
func (s *BudgetState) Verdict(now time.Time) BudgetVerdict {
	s.Roll(now)
	return s.verdict()
}

func (s *BudgetState) verdict() BudgetVerdict {
	var v BudgetVerdict
	for i := range s.windows {
		if c := s.windows[i].verdict(); c.Action != 0 && (v.Action == 0 || c.stronger(v)) {
			v = c
		}
	}
	return v
}

// String shows the windows at now on one line, e.g.
// "DAY 1200/1000 [100%] THROTTLE(50) until 2026-11-29T00:00Z".
func (s *BudgetState) String(now time.Time) string {
	s.Roll(now)
	var sb strings.Builder
	for i, w := range s.windows {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s %.0f/%d", w.budget.Period, w.spent, w.budget.RU)
		if v := w.verdict(); v.Action != 0 {
			fmt.Fprintf(&sb, " [%d%%] %s", v.Percent, v.Action)
			if v.Action == BudgetThrottle {
				fmt.Fprintf(&sb, "(%d)", v.ThrottleRUPerSec)
			}
		}
		fmt.Fprintf(&sb, " until %s", w.end.UTC().Format("2006-01-02T15:04Z"))
	}
	return sb.String()
}

// BudgetWindowState is one budget's current window as the budgets table
// shows it.
type BudgetWindowState struct {
	Budget     Budget
	Start, End time.Time
	Spent      float64
	// Exhausted is when the window's spending reached its RU (as Spend
	// and Seed saw it); zero while it has not.
	Exhausted time.Time
	// Verdict is what the window's crossed triggers do (Action 0: none).
	Verdict BudgetVerdict
}

// Windows returns the budgets' current windows at now, in period order.
func (s *BudgetState) Windows(now time.Time) []BudgetWindowState {
	s.Roll(now)
	out := make([]BudgetWindowState, len(s.windows))
	for i := range s.windows {
		w := &s.windows[i]
		out[i] = BudgetWindowState{Budget: w.budget, Start: w.start, End: w.end, Spent: w.spent, Exhausted: w.exhausted, Verdict: w.verdict()}
	}
	return out
}

// Reset forgets what the windows spent (a new rgserver term, which seeds
// them again from the usage history), starting them at now.
func (s *BudgetState) Reset(now time.Time) {
	for i := range s.windows {
		w := &s.windows[i]
		w.start, w.end = s.cal.Window(w.budget.Period, now)
		w.spent, w.crossed, w.exhausted = 0, 0, time.Time{}
	}
}
