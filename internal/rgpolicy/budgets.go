package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Budgets over time windows (docs/budgets.md): rgserver's leader spends
// each group's budgets and tells every proxy what they do (the token
// stream's verdicts, tokenclient.Client.Budget). Here a REFUSE refuses a
// statement of the group before it runs (8255, naming the budget, what
// its window spent and when it ends); a THROTTLE is the token client's
// (the group's rate); a NOTIFY, and anything a MODE WARN or OFF group's
// budget would do, is only reported. information_schema.
// resource_group_budgets reads the leader's book.

// vtBudgets is the budgets' virtual table.
const vtBudgets = "resource_group_budgets"

// budgetRefusedError is 8255 for a statement of group refused by v.
func budgetRefusedError(group string, v tokenclient.BudgetVerdict) *mysqlproto.Error {
	return &mysqlproto.Error{Code: resourcegroup.CodeBudgetRefused, State: "HY000", Message: fmt.Sprintf(
		"Resource group %s refused the statement: its budget RU=%d PER %s is spent (%.0f RU in the window, %d%% of it: ON %d PERCENT REFUSE) until the window ends at %s UTC",
		group, v.Budget, v.Period, v.Spent, uint64(v.Spent*100/float64(max(v.Budget, 1))), v.Percent,
		v.End.UTC().Format("2006-01-02 15:04:05"))}
}

// budgetRefuse refuses the statement when a leg's group is held by an
// enforced budget REFUSE: counted as refused (Consumption.refused, the
// usage history's REFUSED) with the RU it would have cost, recorded as
// the session's last statement. nil lets it on. A statement that reads
// rgproxy's information_schema tables, or one of rgproxy's own, is let
// through.
func (s *session) budgetRefuse() *mysqlproto.Reply {
	cur := &s.cur
	if cur.ownSQL || cur.virtual {
		return nil // rgproxy's own tables and statements: what a refused user reads to learn why
	}
	for i := range cur.nlegs {
		g := cur.legs[i].group
		v, ok := s.p.tokens.Budget(g)
		if !ok || v.Action != resourcegroup.BudgetRefuse {
			continue
		}
		if v.ReportOnly {
			// MODE WARN: what ENFORCE would have done, in SHOW LAST
			// STATEMENT RU's WOULD; the statement runs.
			if cur.would == "" {
				cur.would = "8255"
			}
			continue
		}
		s.led.denied(g, cur, false)
		s.led.recordRefused(cur, resourcegroup.CodeBudgetRefused)
		return &mysqlproto.Reply{Err: budgetRefusedError(g, v)}
	}
	return nil
}

// budgetColumns are resource_group_budgets' columns.
var budgetColumns = []vcol{
	{name: "NAME"}, {name: "PERIOD"}, {name: "BUDGET_RU", numeric: true}, {name: "SPENT_RU", numeric: true},
	{name: "REMAINING_RU", numeric: true}, {name: "PERCENT_SPENT", numeric: true},
	{name: "WINDOW_START"}, {name: "WINDOW_END"}, {name: "RU_PER_SEC", numeric: true},
	{name: "PROJECTED_EXHAUSTION"}, {name: "ACTION"}, {name: "ENFORCED", numeric: true},
}

// Errors of the budgets table, as the client sees them.
var (
	errBudgetsUnavailable = rgproxyError("rgproxy: information_schema.resource_group_budgets is kept by rgserver, which could not be reached (or named no leader) within 3 s")
	errBudgetsOld         = rgproxyError("rgproxy: information_schema.resource_group_budgets is kept by rgserver, and this rgserver keeps none: it is older than this proxy")
)

// errBudgetsUnseeded answers while a new leader's usage history loads.
var errBudgetsUnseeded = rgproxyError("rgproxy: information_schema.resource_group_budgets: rgserver's new leader is still loading the usage history its budgets start from; ask again in a moment")

// budgetsTable builds resource_group_budgets as the session may see it:
// with SUPER every group's budgets, else those of the groups it may read
// (readableSet). Times are UTC, as in the other tables.
func (s *session) budgetsTable(ctx context.Context, be mysqlproto.Backend) (*vtable, error) {
	if s.p.usage == nil {
		return nil, errUsageOff
	}
	own, err := s.readableSet(ctx, be)
	if err != nil {
		return nil, err
	}
	req := &tokenpb.BudgetsRequest{AllGroups: true}
	if own != nil && len(own) <= maxPushedGroups {
		req.AllGroups = false
		for g := range own {
			req.Groups = append(req.Groups, g)
		}
		sort.Strings(req.Groups)
	}
	rows, seeded, truncated, err := s.p.usage.Budgets(ctx, req)
	switch {
	case errors.Is(err, tokenclient.ErrNoUsageHistory):
		return nil, errBudgetsOld
	case errors.Is(err, tokenclient.ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, errBudgetsUnavailable
	case err != nil:
		return nil, rgproxyError("rgproxy: budgets: " + err.Error())
	}
	if !seeded {
		return nil, errBudgetsUnseeded
	}
	t := &vtable{cols: budgetColumns}
	for i := range rows {
		r := &rows[i]
		if own != nil && !own[r.Group] {
			continue
		}
		t.rows = append(t.rows, budgetRow(r))
	}
	if truncated {
		// As the usage history's: a row of NULLs says rows were left
		// out (an answer is bounded), so the table is not taken whole.
		t.rows = append(t.rows, make([]*string, len(budgetColumns)))
	}
	return t, nil
}

// budgetRow is one budget's row: PROJECTED_EXHAUSTION and ACTION NULL
// when there are none.
func budgetRow(r *tokenclient.BudgetRow) []*string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	enforced := "0"
	if r.Enforced {
		enforced = "1"
	}
	pct := 100 * r.SpentRU / float64(r.BudgetRU)
	text := []string{r.Group, r.Period.String(), u(r.BudgetRU), f(r.SpentRU), f(max(float64(r.BudgetRU)-r.SpentRU, 0)), f(pct),
		budgetTime(r.Start), budgetTime(r.End), f(r.RUPerSec), budgetTime(r.Exhaustion), r.Action, enforced}
	cells := cellsOf(text)
	if r.Exhaustion.IsZero() {
		cells[9] = nil
	}
	if r.Action == "" {
		cells[10] = nil
	}
	return cells
}

// budgetTime is a window's time in UTC, to the millisecond (compressed
// windows last seconds).
func budgetTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") }
