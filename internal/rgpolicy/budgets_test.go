package rgpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// TestBudgetRefuses: an enforced REFUSE refuses the group's statements
// before they take tokens with 8255 naming the budget, what its window
// spent and when it ends, counted as refused (not throttled) with the RU
// they would have cost; a transaction still ends; a report-only REFUSE
// (MODE WARN) and a THROTTLE let statements through.
func TestBudgetRefuses(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newUsagePolicy(tok, &fakeUsage{}, clock.Real{}).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	run := func(q *mysqlproto.Statement) *mysqlproto.Reply {
		v := s.Before(ctx, q, plainGrants)
		if v.Reply == nil {
			s.After(q, &mysqlproto.Outcome{})
		}
		return v.Reply
	}
	sel := query("SELECT c FROM t WHERE id = 1")
	if r := run(sel); r != nil {
		t.Fatalf("no budget: %+v", r)
	}
	end := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	v := tokenclient.BudgetVerdict{BudgetVerdict: resourcegroup.BudgetVerdict{Action: resourcegroup.BudgetRefuse,
		Period: resourcegroup.PeriodDay, Budget: 1000, Spent: 1234.4, Percent: 120, End: end}}
	tok.budgets = map[string]tokenclient.BudgetVerdict{"bound": v}
	acquired := len(tok.acquired)
	r := run(sel)
	if r == nil || r.Err == nil || r.Err.Code != resourcegroup.CodeBudgetRefused {
		t.Fatalf("under REFUSE: %+v", r)
	}
	want := "Resource group bound refused the statement: its budget RU=1000 PER DAY is spent (1234 RU in the window, 123% of it: ON 120 PERCENT REFUSE) until the window ends at 2026-11-29 00:00:00 UTC"
	if r.Err.Message != want {
		t.Errorf("message\n%s\nwant\n%s", r.Err.Message, want)
	}
	if len(tok.acquired) != acquired || fmt.Sprint(tok.refusedOther) != "[bound]" || tok.throttled != nil || !(tok.denied > 0) {
		t.Errorf("acquired %d (before %d), refused %v, throttled %v, denied %v", len(tok.acquired), acquired, tok.refusedOther, tok.throttled, tok.denied)
	}
	if s.last.errCode != resourcegroup.CodeBudgetRefused {
		t.Errorf("last statement's error %d", s.last.errCode)
	}
	// A refused user can read why.
	if r := run(query("SELECT * FROM information_schema.resource_group_budgets")); r != nil {
		t.Errorf("resource_group_budgets refused: %+v", r.Err)
	}
	commit := query("COMMIT")
	commit.InTransaction = true
	if r := run(commit); r != nil {
		t.Errorf("COMMIT under REFUSE: %+v", r)
	}
	v.ReportOnly = true
	tok.budgets["bound"] = v
	if r := run(sel); r != nil {
		t.Errorf("a report-only REFUSE refused: %+v", r)
	}
	if s.last.would != "8255" {
		t.Errorf("a report-only REFUSE's WOULD: %q", s.last.would)
	}
	tok.budgets["bound"] = tokenclient.BudgetVerdict{BudgetVerdict: resourcegroup.BudgetVerdict{Action: resourcegroup.BudgetThrottle,
		ThrottleRUPerSec: 5, Period: resourcegroup.PeriodDay, Budget: 1000, Spent: 600, Percent: 50, End: end}}
	if r := run(sel); r != nil {
		t.Errorf("THROTTLE refused: %+v", r)
	}
}

// TestBudgetsTable: resource_group_budgets' rows (NULL projection and
// action when there are none); without SUPER only the session's groups
// are asked for and kept; an unseeded leader's answer is an error.
func TestBudgetsTable(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	fu := &fakeUsage{budgets: []tokenclient.BudgetRow{
		{Group: "bound", Period: resourcegroup.PeriodDay, BudgetRU: 1000, SpentRU: 250, Start: start, End: start.Add(24 * time.Hour),
			RUPerSec: 0.5, Exhaustion: start.Add(12 * time.Hour), Enforced: true},
		{Group: "bound", Period: resourcegroup.PeriodMonth, BudgetRU: 100, SpentRU: 150, Start: start.AddDate(0, 0, -27), End: start.AddDate(0, 0, 3),
			Action: "ON 100 PERCENT REFUSE", Enforced: true},
		{Group: "other", Period: resourcegroup.PeriodHour, BudgetRU: 10, SpentRU: 1, Start: start, End: start.Add(time.Hour)},
	}}
	read := func(g grants) []string {
		t.Helper()
		fu.asked = nil
		s := newUsagePolicy(testGroups(), fu, clock.NewFake()).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		s.learnAccount(ctx, g)
		vt, err := s.virtualTable(ctx, vtBudgets, g)
		if err != nil {
			t.Fatal(err)
		}
		return rowTexts(vt.rows)
	}
	rows := read(plainGrants)
	want := []string{
		"bound DAY 1000 250.000000 750.000000 25.000000 2026-11-28 00:00:00.000 2026-11-29 00:00:00.000 0.500000 2026-11-28 12:00:00.000 NULL 1",
		"bound MONTH 100 150.000000 0.000000 150.000000 2026-11-01 00:00:00.000 2026-12-01 00:00:00.000 0.000000 NULL ON 100 PERCENT REFUSE 1",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("without SUPER:\n%s\nwant\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if fmt.Sprint(fu.asked) != "[budgets all=false groups=[bound]]" {
		t.Errorf("asked %v", fu.asked)
	}
	if rows = read(superGrants); len(rows) != 3 || fmt.Sprint(fu.asked) != "[budgets all=true groups=[]]" {
		t.Errorf("with SUPER: %v, asked %v", rows, fu.asked)
	}
	// An answer cut to its bound ends in a row of NULLs.
	fu.budgetsTruncated = true
	if rows = read(superGrants); len(rows) != 4 || rows[3] != strings.TrimSpace(strings.Repeat("NULL ", len(budgetColumns))) {
		t.Errorf("truncated: %q", rows)
	}
	fu.budgetsTruncated = false
	fu.unseeded = true
	s := newUsagePolicy(testGroups(), fu, clock.NewFake()).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	if _, err := s.virtualTable(ctx, vtBudgets, superGrants); err != errBudgetsUnseeded {
		t.Errorf("unseeded: %v", err)
	}
	for _, c := range []struct {
		err, want error
	}{{tokenclient.ErrUnavailable, errBudgetsUnavailable}, {fmt.Errorf("x: %w", tokenclient.ErrNoUsageHistory), errBudgetsOld}} {
		fu.err = c.err
		if _, err := s.virtualTable(ctx, vtBudgets, superGrants); err != c.want {
			t.Errorf("%v: %v", c.err, err)
		}
	}
}
