package tokenpb

import (
	"reflect"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

func TestGroupRoundTrip(t *testing.T) {
	tests := []resourcegroup.Group{
		resourcegroup.DefaultGroupDefinition(),
		{Name: "rg1", RUPerSec: 500, Priority: resourcegroup.PriorityHigh, Burst: resourcegroup.BurstModerated, Version: 42},
		{Name: "rg2", RUPerSec: 1, QueryLimit: &resourcegroup.QueryLimit{
			ExecElapsed: 90 * time.Second, Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "rg1",
			Watch: resourcegroup.WatchSimilar, WatchDuration: 10 * time.Minute,
		}},
		{Name: "rg3", RUPerSec: 7, QueryLimit: &resourcegroup.QueryLimit{RU: 1000, Action: resourcegroup.ActionKill}},
		{Name: "rg4", RUPerSec: 500, Budgets: []resourcegroup.Budget{
			{Period: resourcegroup.PeriodHour, RU: 1, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetNotify}}},
			{Period: resourcegroup.PeriodDay, RU: 2_000_000, Triggers: []resourcegroup.BudgetTrigger{
				{Percent: 80, Action: resourcegroup.BudgetNotify},
				{Percent: 100, Action: resourcegroup.BudgetThrottle, ThrottleRUPerSec: 50},
				{Percent: 1000, Action: resourcegroup.BudgetRefuse}}},
			{Period: resourcegroup.PeriodWeek, RU: resourcegroup.MaxRU, Triggers: []resourcegroup.BudgetTrigger{{Percent: 1, Action: resourcegroup.BudgetRefuse}}},
			{Period: resourcegroup.PeriodMonth, RU: 50_000_000, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetRefuse}}},
		}},
	}
	for _, g := range tests {
		p := GroupToPB(g)
		if g.RUPerSec == resourcegroup.Unlimited && (!p.Unlimited || p.RuPerSec != 0) {
			t.Errorf("%s: unlimited sent as %v", g.Name, p)
		}
		if back := GroupFromPB(p); !reflect.DeepEqual(back, g) {
			t.Errorf("round trip: %+v became %+v", g, back)
		}
	}
	if g := GroupFromPB(nil); !reflect.DeepEqual(g, resourcegroup.Group{}) {
		t.Errorf("nil: %+v", g)
	}
	for _, b := range []resourcegroup.Binding{
		{User: "app", Host: "10.%", Group: "rg1"},
		{TagKey: "route", TagValue: "/report", Group: "rg1"},
		{Digest: "00ab34cd56ef7890", Group: "rg1"},
	} {
		if back := BindingFromPB(BindingToPB(b)); back != b {
			t.Errorf("binding round trip: %+v became %+v", b, back)
		}
	}
}

func TestWatchRoundTrip(t *testing.T) {
	created := time.UnixMilli(1_700_000_000_123)
	tests := []resourcegroup.Watch{
		{},
		{ID: 7, Group: "rg1", Action: resourcegroup.ActionKill, Match: resourcegroup.WatchExact,
			Text: "select sleep(5)", Source: resourcegroup.WatchSourceManual, Created: created},
		{ID: 1 << 40, Group: "rg2", Action: resourcegroup.ActionSwitchGroup, SwitchGroup: "rg1",
			Match: resourcegroup.WatchSimilar, Text: "e3b0c442", Source: "proxy-a",
			Created: created, Expires: created.Add(10 * time.Minute)},
	}
	for _, w := range tests {
		p := WatchToPB(w)
		if w.Expires.IsZero() != (p.GetExpiresUnixMs() == 0) {
			t.Errorf("%d: zero expiry sent as %d", w.ID, p.GetExpiresUnixMs())
		}
		back := WatchFromPB(p)
		if !back.Created.Equal(w.Created) || !back.Expires.Equal(w.Expires) {
			t.Errorf("times: %+v became %+v", w, back)
		}
		back.Created, back.Expires, w.Created, w.Expires = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if back != w {
			t.Errorf("round trip: %+v became %+v", w, back)
		}
	}
	if w := WatchFromPB(nil); w != (resourcegroup.Watch{}) {
		t.Errorf("nil: %+v", w)
	}
}

// Budgets travel with their period and actions by name; a name that is
// not one comes back as the zero value, which validation refuses.
func TestBudgetsOnTheWire(t *testing.T) {
	g := resourcegroup.Group{Name: "b", RUPerSec: 500, Budgets: []resourcegroup.Budget{
		{Period: resourcegroup.PeriodDay, RU: 9, Triggers: []resourcegroup.BudgetTrigger{
			{Percent: 80, Action: resourcegroup.BudgetNotify}, {Percent: 100, Action: resourcegroup.BudgetThrottle, ThrottleRUPerSec: 50}}}}}
	p := GroupToPB(g)
	if len(p.GetBudgets()) != 1 || p.GetBudgets()[0].GetPeriod() != "DAY" || p.GetBudgets()[0].GetTriggers()[1].GetAction() != "THROTTLE" ||
		p.GetBudgets()[0].GetTriggers()[1].GetThrottleRuPerSec() != 50 || p.GetBudgets()[0].GetRu() != 9 {
		t.Errorf("on the wire: %v", p.GetBudgets())
	}
	if p := GroupToPB(resourcegroup.Group{Name: "x", RUPerSec: 1}); p.Budgets != nil {
		t.Errorf("no budgets sent as %v", p.Budgets)
	}
	hostile := []*Budget{
		{Ru: 5, Period: "YEAR", Triggers: []*BudgetTrigger{{Percent: 100, Action: "NOTIFY"}}},
		{Ru: 5, Period: "day", Triggers: []*BudgetTrigger{{Percent: 100, Action: "EXPLODE"}}},
		{Ru: 5, Period: "WEEK"},
		nil,
	}
	got := BudgetsFromPB(hostile)
	want := []resourcegroup.Budget{
		{Period: 0, RU: 5, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: resourcegroup.BudgetNotify}}},
		{Period: resourcegroup.PeriodDay, RU: 5, Triggers: []resourcegroup.BudgetTrigger{{Percent: 100, Action: 0}}},
		{Period: resourcegroup.PeriodWeek, RU: 5},
		{},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("BudgetsFromPB(hostile) = %+v, want %+v", got, want)
	}
	for i, b := range got {
		g := resourcegroup.Group{Name: "b", RUPerSec: 10, Budgets: []resourcegroup.Budget{b}}
		if err := g.Validate(); err == nil {
			t.Errorf("hostile budget %d (%+v) validates", i, b)
		}
	}
}
