package resourcegroup

// A group's budgets: the RU it may spend in each calendar window of a
// period, and what happens as a window's spending crosses a percentage of
// it (docs/budgets.md). This file holds their definition, validation,
// rendering and the windows themselves; spending them is rgserver's.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// BudgetPeriod is the calendar window a budget counts over; it also names
// the budget: a group has at most one budget per period.
type BudgetPeriod uint8

// Periods, shortest first: the order of Group.Budgets. The zero value is
// no period (invalid), so that a budget read from the wire with an unknown
// period fails validation.
const (
	PeriodHour BudgetPeriod = iota + 1
	PeriodDay
	PeriodWeek
	PeriodMonth
)

// NumBudgetPeriods is how many periods there are, so the most budgets a
// group can have.
const NumBudgetPeriods = 4

// BudgetAction is what a budget's trigger does once spending reaches its
// percent.
type BudgetAction uint8

// Budget actions. The zero value is no action (invalid).
const (
	// BudgetNotify reports the crossing (metrics, the budgets table).
	BudgetNotify BudgetAction = iota + 1
	// BudgetThrottle holds the group to the trigger's RU_PER_SEC.
	BudgetThrottle
	// BudgetRefuse refuses the group's statements with an error.
	BudgetRefuse
)

// Bounds of a budget's definition.
const (
	// MaxBudgetTriggers bounds the triggers of one budget.
	MaxBudgetTriggers = 4
	// MaxBudgetPercent bounds a trigger's percent: up to ten times the
	// budget, for a last resort well past it.
	MaxBudgetPercent = 1000
	// DefaultBudgetPercent is the percent of the trigger a budget gets
	// when it is written with none: ON 100 PERCENT NOTIFY.
	DefaultBudgetPercent = 100
)

// BudgetTrigger is one ON <percent> PERCENT <action> of a budget.
type BudgetTrigger struct {
	// Percent of the budget's RU, 1 to MaxBudgetPercent. uint32 as on
	// the wire, so that no value from there wraps into range.
	Percent uint32
	// Action is NOTIFY, THROTTLE or REFUSE.
	Action BudgetAction
	// ThrottleRUPerSec is THROTTLE's rate; 0 for the other actions.
	ThrottleRUPerSec uint64
}

// Budget is a group's budget for one period: RU per window and its
// triggers, in strictly increasing percent (at least one: the parser
// gives a budget written without any ON 100 PERCENT NOTIFY).
type Budget struct {
	Period   BudgetPeriod
	RU       uint64
	Triggers []BudgetTrigger
}

// String names a period as SQL does.
func (p BudgetPeriod) String() string {
	switch p {
	case PeriodHour:
		return "HOUR"
	case PeriodDay:
		return "DAY"
	case PeriodWeek:
		return "WEEK"
	case PeriodMonth:
		return "MONTH"
	}
	return "BudgetPeriod(" + strconv.Itoa(int(p)) + ")"
}

// ParseBudgetPeriod reads a period's name (any case); ok is false for
// anything else.
func ParseBudgetPeriod(s string) (BudgetPeriod, bool) {
	for p := PeriodHour; p <= PeriodMonth; p++ {
		if eqFold(s, p.String()) {
			return p, true
		}
	}
	return 0, false
}

// String names an action as SQL does (without THROTTLE's rate).
func (a BudgetAction) String() string {
	switch a {
	case BudgetNotify:
		return "NOTIFY"
	case BudgetThrottle:
		return "THROTTLE"
	case BudgetRefuse:
		return "REFUSE"
	}
	return "BudgetAction(" + strconv.Itoa(int(a)) + ")"
}

// ParseBudgetAction reads an action's name (any case); ok is false for
// anything else.
func ParseBudgetAction(s string) (BudgetAction, bool) {
	for a := BudgetNotify; a <= BudgetRefuse; a++ {
		if eqFold(s, a.String()) {
			return a, true
		}
	}
	return 0, false
}

// SQL renders a trigger as written in a BUDGET clause:
// "ON 100 PERCENT THROTTLE(RU_PER_SEC=50)".
func (t BudgetTrigger) SQL() string {
	s := "ON " + strconv.FormatUint(uint64(t.Percent), 10) + " PERCENT " + t.Action.String()
	if t.Action == BudgetThrottle {
		s += "(RU_PER_SEC=" + strconv.FormatUint(t.ThrottleRUPerSec, 10) + ")"
	}
	return s
}

// SQL renders the inside of the budget's BUDGET=(...):
// "RU=2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT REFUSE".
func (b Budget) SQL() string {
	var s strings.Builder
	s.WriteString("RU=")
	s.WriteString(strconv.FormatUint(b.RU, 10))
	s.WriteString(" PER ")
	s.WriteString(b.Period.String())
	for _, t := range b.Triggers {
		s.WriteString(", ")
		s.WriteString(t.SQL())
	}
	return s.String()
}

// BudgetsSQL renders budgets as SHOW CREATE RESOURCE GROUP writes them,
// one BUDGET=(...) clause per period separated by spaces, "" for none:
// the text information_schema.resource_groups' BUDGETS column shows, which
// also replays after ALTER RESOURCE GROUP name.
func BudgetsSQL(bs []Budget) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = "BUDGET=(" + b.SQL() + ")"
	}
	return strings.Join(parts, " ")
}

// budgetsRule says what BUDGET clauses a group may have, for the errors.
const budgetsRule = "a group has at most one BUDGET per period (HOUR, DAY, WEEK, MONTH)"

// validateBudgets checks a group's budgets: at most one per period, in
// period order, each valid; rate is the group's RU_PER_SEC (Unlimited
// when it has none, or when it is not known, as in an ALTER's clauses).
func validateBudgets(bs []Budget, rate uint64) error {
	if len(bs) > NumBudgetPeriods {
		return NewInvalid(fmt.Sprintf("%s: %d budgets; %s", msgInvalidSetting, len(bs), budgetsRule))
	}
	for i, b := range bs {
		if b.Period < PeriodHour || b.Period > PeriodMonth {
			return NewInvalid(fmt.Sprintf("%s: a BUDGET has an unknown period (%d); the periods are HOUR, DAY, WEEK and MONTH",
				msgInvalidSetting, b.Period))
		}
		if i > 0 && b.Period == bs[i-1].Period {
			return NewInvalid(fmt.Sprintf("%s: BUDGET PER %s is given twice; %s", msgInvalidSetting, b.Period, budgetsRule))
		}
		if i > 0 && b.Period < bs[i-1].Period {
			return NewInvalid(fmt.Sprintf("%s: BUDGET PER %s comes after BUDGET PER %s; budgets are kept in period order (HOUR, DAY, WEEK, MONTH)",
				msgInvalidSetting, b.Period, bs[i-1].Period))
		}
		if err := b.validate(rate); err != nil {
			return err
		}
	}
	return nil
}

// validate checks one budget whose period is known; rate is the group's
// RU_PER_SEC or Unlimited (see validateBudgets).
func (b *Budget) validate(rate uint64) error {
	name := "BUDGET PER " + b.Period.String()
	if b.RU == 0 || b.RU > MaxRU {
		return NewInvalid(fmt.Sprintf("%s: %s: RU = %d is out of range; a budget's RU is 1 to %d per window",
			msgInvalidSetting, name, b.RU, MaxRU))
	}
	switch n := len(b.Triggers); {
	case n == 0:
		return NewInvalid(fmt.Sprintf("%s: %s has no trigger; a budget has 1 to %d (written without any, it gets ON %d PERCENT NOTIFY)",
			msgInvalidSetting, name, MaxBudgetTriggers, DefaultBudgetPercent))
	case n > MaxBudgetTriggers:
		return NewInvalid(fmt.Sprintf("%s: %s has %d triggers; a budget has at most %d (ON p PERCENT NOTIFY | THROTTLE(RU_PER_SEC = r) | REFUSE)",
			msgInvalidSetting, name, n, MaxBudgetTriggers))
	}
	for i, t := range b.Triggers {
		on := fmt.Sprintf("ON %d PERCENT", t.Percent)
		if t.Percent == 0 || t.Percent > MaxBudgetPercent {
			return NewInvalid(fmt.Sprintf("%s: %s: %s is out of range; a trigger's percent is 1 to %d",
				msgInvalidSetting, name, on, MaxBudgetPercent))
		}
		if i > 0 && t.Percent <= b.Triggers[i-1].Percent {
			return NewInvalid(fmt.Sprintf("%s: %s: %s comes after ON %d PERCENT; a budget's triggers are in strictly increasing percent",
				msgInvalidSetting, name, on, b.Triggers[i-1].Percent))
		}
		switch t.Action {
		case BudgetNotify, BudgetRefuse:
			if t.ThrottleRUPerSec != 0 {
				return NewInvalid(fmt.Sprintf("%s: %s: %s %s takes no RU_PER_SEC; only THROTTLE has a rate",
					msgInvalidSetting, name, on, t.Action))
			}
		case BudgetThrottle:
			r := t.ThrottleRUPerSec
			if r == 0 || r > MaxRU {
				return NewInvalid(fmt.Sprintf("%s: %s: %s THROTTLE(RU_PER_SEC = %d) is out of range; THROTTLE's RU_PER_SEC is 1 to %d",
					msgInvalidSetting, name, on, r, MaxRU))
			}
			if rate != Unlimited && r >= rate {
				return NewInvalid(fmt.Sprintf("%s: %s: %s THROTTLE(RU_PER_SEC = %d) is not below the group's RU_PER_SEC = %d, "+
					"so it would not slow the group; lower the THROTTLE rate, raise RU_PER_SEC, or use REFUSE or NOTIFY",
					msgInvalidSetting, name, on, r, rate))
			}
		default:
			return NewInvalid(fmt.Sprintf("%s: %s: %s has an unknown action (%d); the actions are NOTIFY, THROTTLE(RU_PER_SEC = r) and REFUSE",
				msgInvalidSetting, name, on, t.Action))
		}
	}
	return nil
}

// cloneBudgets copies bs deeply; nil stays nil. The triggers share one
// new array (each budget's slice capped at its length, so an append
// cannot reach the next budget's): two allocations, however many
// budgets, for Group.Clone, which the settings cache's lookups call.
func cloneBudgets(bs []Budget) []Budget {
	if bs == nil {
		return nil
	}
	out := make([]Budget, len(bs))
	n := 0
	for _, b := range bs {
		n += len(b.Triggers)
	}
	ts := make([]BudgetTrigger, 0, n)
	for i, b := range bs {
		from := len(ts)
		ts = append(ts, b.Triggers...)
		if b.Triggers != nil {
			b.Triggers = ts[from:len(ts):len(ts)]
		}
		out[i] = b
	}
	return out
}

// BudgetFor returns g's budget for period p, if it has one.
func (g *Group) BudgetFor(p BudgetPeriod) (Budget, bool) {
	for _, b := range g.Budgets {
		if b.Period == p {
			return b, true
		}
	}
	return Budget{}, false
}

// BudgetWindow returns the window of period p that holds instant t, its
// calendar aligned to loc: [start, end). A window runs from the first
// instant loc's clock shows its beginning — the hour, midnight, Monday's
// midnight, the first of the month at midnight — or later, to the first
// instant it shows the next window's beginning or later. So across a
// daylight-saving change a DAY has 23 or 25 hours; when the clocks go
// back the repeated hour belongs to one HOUR window of two hours; when
// they go forward past a window's beginning, it begins where the clock
// lands. Windows tile time: BudgetWindow(p, end, loc) starts at end.
// An unknown period is taken as a DAY.
func BudgetWindow(p BudgetPeriod, t time.Time, loc *time.Location) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	// k is the wall-clock beginning of t's window by its clock (in UTC
	// fields); the clocks going back can put t in the next window
	// instead, so step until [start, end) holds t (at most a step or two).
	k := windowBegin(p, lt)
	for range 8 {
		start, end = boundary(k, loc), boundary(nextBegin(p, k), loc)
		switch {
		case t.Before(start):
			k = prevBegin(p, k)
		case !t.Before(end):
			k = nextBegin(p, k)
		default:
			return start, end
		}
	}
	return start, end
}

// windowBegin is the wall-clock beginning (as UTC fields) of the window of
// period p that local time lt's clock reads.
func windowBegin(p BudgetPeriod, lt time.Time) time.Time {
	y, m, d := lt.Date()
	switch p {
	case PeriodHour:
		return time.Date(y, m, d, lt.Hour(), 0, 0, 0, time.UTC)
	case PeriodWeek:
		// Weeks begin on Monday (ISO 8601).
		back := (int(lt.Weekday()) + 6) % 7
		return time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
	case PeriodMonth:
		return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// nextBegin and prevBegin step a wall-clock window beginning by one period.
func nextBegin(p BudgetPeriod, k time.Time) time.Time { return stepBegin(p, k, 1) }
func prevBegin(p BudgetPeriod, k time.Time) time.Time { return stepBegin(p, k, -1) }

func stepBegin(p BudgetPeriod, k time.Time, n int) time.Time {
	switch p {
	case PeriodHour:
		return k.Add(time.Duration(n) * time.Hour) // UTC fields: no DST
	case PeriodWeek:
		return k.AddDate(0, 0, 7*n)
	case PeriodMonth:
		return k.AddDate(0, n, 0) // k is the 1st: no day overflow
	}
	return k.AddDate(0, 0, n)
}

// wall is lt's clock reading as UTC fields.
func wall(lt time.Time) time.Time {
	return time.Date(lt.Year(), lt.Month(), lt.Day(), lt.Hour(), lt.Minute(), lt.Second(), lt.Nanosecond(), time.UTC)
}

// boundary is the first instant at which loc's clock reads w (given as
// UTC fields) or later. time.Date alone does not say which of two
// instants a repeated reading means, nor where a skipped one lands: the
// candidates are w read with the offsets of the zone periods around
// time.Date's answer, the earliest exact one wins, and a reading no
// offset gives (skipped) begins at the change of offset.
func boundary(w time.Time, loc *time.Location) time.Time {
	b := time.Date(w.Year(), w.Month(), w.Day(), w.Hour(), w.Minute(), w.Second(), w.Nanosecond(), loc)
	zs, ze := b.ZoneBounds()
	var buf [3]int
	offsets := buf[:0]
	_, off := b.Zone()
	offsets = append(offsets, off)
	if !zs.IsZero() {
		_, o := zs.Add(-time.Nanosecond).Zone()
		offsets = append(offsets, o)
	}
	if !ze.IsZero() {
		_, o := ze.Zone()
		offsets = append(offsets, o)
	}
	var best time.Time
	for _, o := range offsets {
		s := w.Add(-time.Duration(o) * time.Second).In(loc)
		if wall(s).Equal(w) && (best.IsZero() || s.Before(best)) {
			best = s
		}
	}
	if !best.IsZero() {
		return best
	}
	// w is skipped: the clock jumps over it at the edge of b's zone period.
	if wall(b).Before(w) && !ze.IsZero() {
		return ze.In(loc)
	}
	if !zs.IsZero() {
		return zs.In(loc)
	}
	return b
}
