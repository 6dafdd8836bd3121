package resourcegroup

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

func notify(p uint32) BudgetTrigger { return BudgetTrigger{Percent: p, Action: BudgetNotify} }
func refuse(p uint32) BudgetTrigger { return BudgetTrigger{Percent: p, Action: BudgetRefuse} }
func throttle(p uint32, r uint64) BudgetTrigger {
	return BudgetTrigger{Percent: p, Action: BudgetThrottle, ThrottleRUPerSec: r}
}

// CREATE with BUDGET clauses parses to budgets in period order; a budget
// without a trigger gets ON 100 PERCENT NOTIFY; the rendering is canonical
// and parses back to the same group.
func TestBudgetParseRender(t *testing.T) {
	tests := []struct {
		sql     string
		budgets []Budget
		render  string // the BUDGET clauses of SHOW CREATE
	}{
		{"CREATE RESOURCE GROUP b RU_PER_SEC = 500 BUDGET = (RU = 2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT THROTTLE (RU_PER_SEC = 50))",
			[]Budget{{Period: PeriodDay, RU: 2000000, Triggers: []BudgetTrigger{notify(80), throttle(100, 50)}}},
			"BUDGET=(RU=2000000 PER DAY, ON 80 PERCENT NOTIFY, ON 100 PERCENT THROTTLE(RU_PER_SEC=50))"},
		{"create resource group b ru_per_sec = 500 budget = (ru = 50000000 per month, on 100 percent refuse), budget (RU 10 PER hour)",
			[]Budget{{Period: PeriodHour, RU: 10, Triggers: []BudgetTrigger{notify(100)}},
				{Period: PeriodMonth, RU: 50000000, Triggers: []BudgetTrigger{refuse(100)}}},
			"BUDGET=(RU=10 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=50000000 PER MONTH, ON 100 PERCENT REFUSE)"},
		{"CREATE RESOURCE GROUP b RU_PER_SEC = UNLIMITED BUDGET=(RU=1 PER WEEK ON 1 PERCENT NOTIFY ON 50 PERCENT THROTTLE(RU_PER_SEC=999999) ON 100 PERCENT THROTTLE(RU_PER_SEC=1), ON 1000 PERCENT REFUSE)",
			[]Budget{{Period: PeriodWeek, RU: 1, Triggers: []BudgetTrigger{notify(1), throttle(50, 999999), throttle(100, 1), refuse(1000)}}},
			"BUDGET=(RU=1 PER WEEK, ON 1 PERCENT NOTIFY, ON 50 PERCENT THROTTLE(RU_PER_SEC=999999), ON 100 PERCENT THROTTLE(RU_PER_SEC=1), ON 1000 PERCENT REFUSE)"},
		{"CREATE RESOURCE GROUP b RU_PER_SEC = 5 BUDGET = (RU = 1000000000000000 PER MONTH) BUDGET = (RU = 3 PER WEEK) BUDGET = (RU = 2 PER DAY) BUDGET = (RU = 1 PER HOUR)",
			[]Budget{{Period: PeriodHour, RU: 1, Triggers: []BudgetTrigger{notify(100)}}, {Period: PeriodDay, RU: 2, Triggers: []BudgetTrigger{notify(100)}},
				{Period: PeriodWeek, RU: 3, Triggers: []BudgetTrigger{notify(100)}}, {Period: PeriodMonth, RU: MaxRU, Triggers: []BudgetTrigger{notify(100)}}},
			"BUDGET=(RU=1 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2 PER DAY, ON 100 PERCENT NOTIFY) BUDGET=(RU=3 PER WEEK, ON 100 PERCENT NOTIFY) BUDGET=(RU=1000000000000000 PER MONTH, ON 100 PERCENT NOTIFY)"},
		{"CREATE RESOURCE GROUP b RU_PER_SEC = 5 BUDGET = NULL", nil, ""},
	}
	for _, tt := range tests {
		st, err := Parse(tt.sql, sqltext.Mode{})
		if err != nil {
			t.Errorf("%s: %v", tt.sql, err)
			continue
		}
		g := st.(*CreateGroup).Group
		if !reflect.DeepEqual(g.Budgets, tt.budgets) {
			t.Errorf("%s:\n got  %+v\n want %+v", tt.sql, g.Budgets, tt.budgets)
		}
		if got := BudgetsSQL(g.Budgets); got != tt.render {
			t.Errorf("%s: rendered\n got  %s\n want %s", tt.sql, got, tt.render)
		}
		if tt.render != "" && !strings.HasSuffix(g.SQL(), " "+tt.render) {
			t.Errorf("SHOW CREATE %s does not end with the budgets", g.SQL())
		}
		if col := InfoSchemaRow(g)[8]; (col == nil) != (tt.render == "") || col != nil && *col != tt.render {
			t.Errorf("%s: BUDGETS column %v", tt.sql, deref([]*string{col}))
		}
		st2, err := Parse(g.SQL(), sqltext.Mode{ANSIQuotes: true})
		if err != nil {
			t.Errorf("reparse of %s: %v", g.SQL(), err)
			continue
		}
		if g2 := st2.(*CreateGroup).Group; !reflect.DeepEqual(g2, g) {
			t.Errorf("round trip of %s:\n got  %+v\n want %+v", g.SQL(), g2, g)
		}
	}
}

// Every wrong BUDGET clause is refused with its code and a message naming
// the part at fault.
func TestBudgetErrors(t *testing.T) {
	const c = "CREATE RESOURCE GROUP b RU_PER_SEC = 100 "
	tests := []struct {
		sql  string
		code uint16
		msg  string
	}{
		{c + "BUDGET = (RU = 0 PER DAY)", 1105, "BUDGET RU = 0 is out of range; BUDGET RU is 1 to 1000000000000000"},
		{c + "BUDGET = (RU = 1000000000000001 PER DAY)", 1105, "BUDGET RU = 1000000000000001 is out of range"},
		{c + "BUDGET = (RU = -5 PER DAY)", 1105, "BUDGET RU = -5 is out of range"},
		{c + "BUDGET = (RU = 99999999999999999999999 PER DAY)", 1105, "out of range"},
		{c + "BUDGET = (RU = '5' PER DAY)", 1064, "BUDGET RU is a whole number without quotes"},
		{c + "BUDGET = (RU = 5 PER YEAR)", 1064, "a budget's period is PER HOUR, DAY, WEEK or MONTH, not 'YEAR'"},
		{c + "BUDGET = (RU = 5 DAY)", 1064, "expected PER HOUR|DAY|WEEK|MONTH after BUDGET's RU = 5, not 'DAY'"},
		{c + "BUDGET = (PER DAY RU = 5)", 1064, "a BUDGET begins with RU = n PER HOUR|DAY|WEEK|MONTH, not 'PER'"},
		{c + "BUDGET = RU = 5 PER DAY", 1064, "expected BUDGET = (RU = n PER"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 0 PERCENT NOTIFY)", 1105, "BUDGET PER DAY: ON 0 PERCENT is out of range; a trigger's percent is 1 to 1000"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 1001 PERCENT NOTIFY)", 1105, "BUDGET PER DAY: ON 1001 PERCENT is out of range"},
		{c + "BUDGET = (RU = 5 PER DAY, ON -1 PERCENT NOTIFY)", 1105, "ON -1 PERCENT is out of range"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 99999999999 PERCENT NOTIFY)", 1105, "ON 99999999999 PERCENT is out of range"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50.5 PERCENT NOTIFY)", 1064, "a trigger's percent is a whole number from 1 to 1000"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50 PERCENT PANIC)", 1064, "a trigger's action is NOTIFY, THROTTLE(RU_PER_SEC = r) or REFUSE, not 'PANIC'"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50 NOTIFY)", 1064, "expected PERCENT, not 'NOTIFY'"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50 PERCENT THROTTLE)", 1064, "THROTTLE takes its rate: THROTTLE(RU_PER_SEC = r)"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50 PERCENT THROTTLE(RU_PER_SEC = 0))", 1105, "THROTTLE RU_PER_SEC = 0 is out of range"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 50 PERCENT THROTTLE(RU_PER_SEC = 100))", 1105,
			"BUDGET PER DAY: ON 50 PERCENT THROTTLE(RU_PER_SEC = 100) is not below the group's RU_PER_SEC = 100, so it would not slow the group"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 100 PERCENT NOTIFY, ON 80 PERCENT REFUSE)", 1105,
			"BUDGET PER DAY: ON 80 PERCENT comes after ON 100 PERCENT; a budget's triggers are in strictly increasing percent"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 80 PERCENT NOTIFY, ON 80 PERCENT REFUSE)", 1105, "ON 80 PERCENT comes after ON 80 PERCENT"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 1 PERCENT NOTIFY, ON 2 PERCENT NOTIFY, ON 3 PERCENT NOTIFY, ON 4 PERCENT NOTIFY, ON 5 PERCENT NOTIFY)", 1105,
			"BUDGET PER DAY has more than 4 triggers; a budget has at most 4"},
		{c + "BUDGET = (RU = 5 PER DAY, ON 1 PERCENT NOTIFY", 1064, "BUDGET PER DAY's ( is not closed"},
		{c + "BUDGET = (RU = 5 PER DAY, )", 1064, "expected ON p PERCENT NOTIFY|THROTTLE(RU_PER_SEC = r)|REFUSE in BUDGET PER DAY, not ')'"},
		{c + "BUDGET = (RU = 5 PER DAY) BUDGET = (RU = 6 PER DAY)", 1064, "near 'BUDGET = (RU = 6 PER DAY)' at line 1: BUDGET PER DAY is given twice"},
		{c + "BUDGET = (RU = 5 PER DAY) BUDGET PER DAY = NULL", 1064, "BUDGET PER DAY is given twice"},
		{c + "BUDGET = (RU = 5 PER DAY) BUDGET = NULL", 1064, "BUDGET = NULL removes every budget; it cannot go with another BUDGET clause"},
		{c + "BUDGET = NULL BUDGET = (RU = 5 PER DAY)", 1064, "BUDGET = NULL removes every budget"},
		{c + "BUDGET PER DAY = (RU = 5)", 1064, "BUDGET PER DAY = NULL removes the group's DAY budget; to set one write BUDGET = (RU = n PER DAY ...)"},
		{c + "BUDGET PER DAY NULL", 1064, "expected '=', not 'NULL'"},
		{"CREATE RESOURCE GROUP b RU_PER_SEC = 100 BUDGETS = (RU = 5 PER DAY)", 1064, "unknown option 'BUDGETS'; the options are RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, MODE, MAX_CONCURRENCY, BUDGET"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.sql, sqltext.Mode{})
		var e *Error
		if !errors.As(err, &e) || e.Code != tt.code || !strings.Contains(e.Message, tt.msg) {
			t.Errorf("%s:\n got  %v\n want %d ...%s...", tt.sql, err, tt.code, tt.msg)
		}
	}
}

// ALTER with BUDGET replaces that period's budget and keeps the others;
// BUDGET PER p = NULL removes one, BUDGET = NULL all; the THROTTLE rate is
// judged against the group's RU_PER_SEC after the change.
func TestAlterBudgets(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	run := func(sql string) error {
		t.Helper()
		st, err := Parse(sql, sqltext.Mode{})
		if err != nil {
			return err
		}
		_, err = Execute(ctx, st, s)
		return err
	}
	budgets := func() string {
		t.Helper()
		g, err := s.GetGroup(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		return BudgetsSQL(g.Budgets)
	}
	steps := []struct {
		sql  string
		code uint16
		want string // the budgets after it
	}{
		{"CREATE RESOURCE GROUP b RU_PER_SEC = 100 BUDGET = (RU = 1000 PER DAY, ON 80 PERCENT NOTIFY) BUDGET = (RU = 9000 PER MONTH, ON 100 PERCENT REFUSE)", 0,
			"BUDGET=(RU=1000 PER DAY, ON 80 PERCENT NOTIFY) BUDGET=(RU=9000 PER MONTH, ON 100 PERCENT REFUSE)"},
		{"ALTER RESOURCE GROUP b BUDGET = (RU = 2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC = 10))", 0,
			"BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10)) BUDGET=(RU=9000 PER MONTH, ON 100 PERCENT REFUSE)"},
		{"ALTER RESOURCE GROUP b PRIORITY = HIGH", 0,
			"BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10)) BUDGET=(RU=9000 PER MONTH, ON 100 PERCENT REFUSE)"},
		{"ALTER RESOURCE GROUP b BUDGET = (RU = 50 PER HOUR), BUDGET PER MONTH = NULL", 0,
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10))"},
		{"ALTER RESOURCE GROUP b BUDGET PER WEEK = NULL", 0, // nothing to remove: no error
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10))"},
		// The group's rate may not fall to the throttle's, nor the throttle rise to it.
		{"ALTER RESOURCE GROUP b RU_PER_SEC = 10", 1105,
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10))"},
		{"ALTER RESOURCE GROUP b BUDGET = (RU = 1 PER WEEK, ON 5 PERCENT THROTTLE(RU_PER_SEC = 100))", 1105,
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10))"},
		{"ALTER RESOURCE GROUP b RU_PER_SEC = 11", 0,
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10))"},
		{"ALTER RESOURCE GROUP b RU_PER_SEC = UNLIMITED BUDGET = (RU = 1 PER WEEK, ON 5 PERCENT THROTTLE(RU_PER_SEC = 100000))", 0,
			"BUDGET=(RU=50 PER HOUR, ON 100 PERCENT NOTIFY) BUDGET=(RU=2000 PER DAY, ON 100 PERCENT THROTTLE(RU_PER_SEC=10)) BUDGET=(RU=1 PER WEEK, ON 5 PERCENT THROTTLE(RU_PER_SEC=100000))"},
		{"ALTER RESOURCE GROUP b BUDGET = NULL", 0, ""},
		{"ALTER RESOURCE GROUP b BUDGET = (RU = 7 PER MONTH)", 0, "BUDGET=(RU=7 PER MONTH, ON 100 PERCENT NOTIFY)"},
	}
	for _, st := range steps {
		err := run(st.sql)
		var e *Error
		switch {
		case st.code == 0 && err != nil:
			t.Fatalf("%s: %v", st.sql, err)
		case st.code != 0 && (!errors.As(err, &e) || e.Code != st.code):
			t.Fatalf("%s: %v, want %d", st.sql, err, st.code)
		}
		if st.code != 0 {
			t.Logf("%s: %v", st.sql, err)
		}
		if got := budgets(); got != st.want {
			t.Fatalf("%s: budgets\n got  %s\n want %s", st.sql, got, st.want)
		}
	}
	g, _ := s.GetGroup(ctx, "b")
	if g.Budgets[0].Triggers[0].Percent = 1; budgets() != "BUDGET=(RU=7 PER MONTH, ON 100 PERCENT NOTIFY)" {
		t.Error("GetGroup shares a budget's triggers with the store")
	}
}

// Group.Validate refuses what no parser writes but a gRPC client may send.
func TestValidateBudgets(t *testing.T) {
	day := func(ru uint64, ts ...BudgetTrigger) Budget { return Budget{Period: PeriodDay, RU: ru, Triggers: ts} }
	tests := []struct {
		name    string
		rate    uint64
		budgets []Budget
		msg     string // "" = valid
	}{
		{"none", 10, nil, ""},
		{"empty", 10, []Budget{}, ""},
		{"four", 10, []Budget{{PeriodHour, 1, []BudgetTrigger{notify(100)}}, {PeriodDay, 1, []BudgetTrigger{notify(100)}},
			{PeriodWeek, 1, []BudgetTrigger{notify(100)}}, {PeriodMonth, 1, []BudgetTrigger{notify(100)}}}, ""},
		{"five", 10, make([]Budget, 5), "5 budgets; a group has at most one BUDGET per period"},
		{"no period", 10, []Budget{{Period: 0, RU: 1, Triggers: []BudgetTrigger{notify(100)}}}, "a BUDGET has an unknown period (0)"},
		{"period 9", 10, []Budget{{Period: 9, RU: 1, Triggers: []BudgetTrigger{notify(100)}}}, "unknown period (9)"},
		{"twice", 10, []Budget{day(1, notify(100)), day(2, notify(100))}, "BUDGET PER DAY is given twice"},
		{"order", 10, []Budget{{PeriodMonth, 1, []BudgetTrigger{notify(100)}}, day(1, notify(100))}, "BUDGET PER DAY comes after BUDGET PER MONTH"},
		{"no trigger", 10, []Budget{day(1)}, "BUDGET PER DAY has no trigger"},
		{"five triggers", 10, []Budget{day(1, notify(1), notify(2), notify(3), notify(4), notify(5))}, "BUDGET PER DAY has 5 triggers; a budget has at most 4"},
		{"ru 0", 10, []Budget{day(0, notify(100))}, "BUDGET PER DAY: RU = 0 is out of range"},
		{"ru max", 10, []Budget{day(MaxRU+1, notify(100))}, "RU = 1000000000000001 is out of range"},
		{"percent", 10, []Budget{day(1, notify(4_000_000_000))}, "ON 4000000000 PERCENT is out of range"},
		{"action 0", 10, []Budget{day(1, BudgetTrigger{Percent: 5})}, "ON 5 PERCENT has an unknown action (0)"},
		{"notify rate", 10, []Budget{day(1, BudgetTrigger{Percent: 5, Action: BudgetNotify, ThrottleRUPerSec: 3})}, "ON 5 PERCENT NOTIFY takes no RU_PER_SEC"},
		{"throttle 0", 10, []Budget{day(1, throttle(5, 0))}, "THROTTLE(RU_PER_SEC = 0) is out of range"},
		{"throttle rate", 10, []Budget{day(1, throttle(5, 10))}, "is not below the group's RU_PER_SEC = 10"},
		{"throttle below", 10, []Budget{day(1, throttle(5, 9))}, ""},
		{"throttle unlimited", Unlimited, []Budget{day(1, throttle(5, MaxRU))}, ""},
		{"throttle max", Unlimited, []Budget{day(1, throttle(5, MaxRU+1))}, "THROTTLE(RU_PER_SEC = 1000000000000001) is out of range"},
	}
	for _, tt := range tests {
		g := Group{Name: "b", RUPerSec: tt.rate, Budgets: tt.budgets}
		err := g.Validate()
		if tt.msg == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeUnknown || !errors.Is(err, ErrInvalid) || !strings.Contains(e.Message, tt.msg) ||
			!strings.HasPrefix(e.Message, msgInvalidSetting+": ") {
			t.Errorf("%s:\n got  %v\n want 1105 %s: ...%s...", tt.name, err, msgInvalidSetting, tt.msg)
		}
	}
}

func TestBudgetNames(t *testing.T) {
	for p := PeriodHour; p <= PeriodMonth; p++ {
		if got, ok := ParseBudgetPeriod(strings.ToLower(p.String())); !ok || got != p {
			t.Errorf("ParseBudgetPeriod(%s) = %v %v", p, got, ok)
		}
	}
	for a := BudgetNotify; a <= BudgetRefuse; a++ {
		if got, ok := ParseBudgetAction(a.String()); !ok || got != a {
			t.Errorf("ParseBudgetAction(%s) = %v %v", a, got, ok)
		}
	}
	for _, s := range []string{"", "YEAR", "BudgetPeriod(0)", "DAYS"} {
		if _, ok := ParseBudgetPeriod(s); ok {
			t.Errorf("ParseBudgetPeriod(%q) accepted", s)
		}
	}
	if _, ok := ParseBudgetAction("KILL"); ok {
		t.Error("ParseBudgetAction(KILL) accepted")
	}
}

// Clone copies budgets deeply, in two allocations, and an append to one
// budget's triggers does not reach another's.
func TestCloneBudgets(t *testing.T) {
	g := Group{Name: "b", RUPerSec: 10, Budgets: []Budget{
		{Period: PeriodHour, RU: 1, Triggers: []BudgetTrigger{notify(50), refuse(100)}},
		{Period: PeriodDay, RU: 2, Triggers: []BudgetTrigger{throttle(100, 5)}},
		{Period: PeriodWeek, RU: 3},
	}}
	c := g.Clone()
	if !reflect.DeepEqual(c, g) {
		t.Fatalf("clone %+v of %+v", c, g)
	}
	c.Budgets[0].Triggers[0].Percent = 7
	c.Budgets[0].Triggers = append(c.Budgets[0].Triggers, refuse(200))
	if g.Budgets[0].Triggers[0].Percent != 50 || c.Budgets[1].Triggers[0] != throttle(100, 5) {
		t.Errorf("clone shares triggers: %+v / %+v", g.Budgets, c.Budgets)
	}
	if n := testing.AllocsPerRun(100, func() { _ = g.Clone() }); n > 2 {
		t.Errorf("Clone of 3 budgets: %v allocations, want 2", n)
	}
	if (Group{}).Clone().Budgets != nil {
		t.Error("Clone of no budgets is not nil")
	}
}
