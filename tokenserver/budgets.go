package tokenserver

import (
	"slices"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// Budgets over time windows (docs/budgets.md): the budgetBook keeps a
// resourcegroup.BudgetState for every group with a BUDGET — what the
// current window of each of its budgets has spent and the triggers that
// crossed — in --budget-time-zone. The leader feeds it the same bounded
// consumption the usage history records, so a budget spends exactly what
// the history shows. Not safe for concurrent use: the Server's lock
// guards it.
type budgetBook struct {
	loc    *time.Location
	groups map[string]*resourcegroup.BudgetState
}

func newBudgetBook(loc *time.Location) *budgetBook {
	if loc == nil {
		loc = time.UTC
	}
	return &budgetBook{loc: loc, groups: map[string]*resourcegroup.BudgetState{}}
}

// set follows a group's definition at now; a group without budgets
// leaves the book.
func (b *budgetBook) set(g resourcegroup.Group, now time.Time) {
	if len(g.Budgets) == 0 {
		delete(b.groups, g.Name)
		return
	}
	b.groups[g.Name] = resourcegroup.NewBudgetState(g.Budgets, b.loc, now, b.groups[g.Name])
}

// drop forgets a dropped group.
func (b *budgetBook) drop(group string) { delete(b.groups, group) }

// has reports whether group has budgets.
func (b *budgetBook) has(group string) bool { return b.groups[group] != nil }

// spend adds ru spent by group at now and reports whether the group's
// verdict changed.
func (b *budgetBook) spend(group string, ru float64, now time.Time) bool {
	if s := b.groups[group]; s != nil {
		return s.Spend(ru, now)
	}
	return false
}

// seed is BudgetState.Seed for group.
func (b *budgetBook) seed(group string, p resourcegroup.BudgetPeriod, start time.Time, spent float64) {
	if s := b.groups[group]; s != nil {
		s.Seed(p, start, spent)
	}
}

// roll rolls over the windows that ended by now and returns the groups
// whose verdict changed, sorted.
func (b *budgetBook) roll(now time.Time) []string {
	var changed []string
	for g, s := range b.groups {
		if s.Roll(now) {
			changed = append(changed, g)
		}
	}
	slices.Sort(changed)
	return changed
}

// verdict is what group's budgets do at now.
func (b *budgetBook) verdict(group string, now time.Time) resourcegroup.BudgetVerdict {
	if s := b.groups[group]; s != nil {
		return s.Verdict(now)
	}
	return resourcegroup.BudgetVerdict{}
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
		sb.WriteString(g + ": " + b.groups[g].String(now))
	}
	return sb.String()
}
