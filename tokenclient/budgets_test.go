package tokenclient

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The proxy's budget verdicts: taken as rgserver sends them, lifted when
// it says so or (cut off from it) past the window's end; malformed ones
// are left out whatever they say.
func TestBudgetTable(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	end := now.Add(time.Hour)
	refuse := &tokenpb.GroupBudget{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1000, SpentRu: 1200, Percent: 100, WindowEndUnixMs: end.UnixMilli()}
	var tb budgetTable
	log := slog.New(slog.DiscardHandler)
	if ch := tb.apply(now, []*tokenpb.GroupBudget{refuse}, log); len(ch) != 1 || ch[0] != "rep" {
		t.Errorf("changed %v", ch)
	}
	v, ok := tb.get("rep", now)
	if !ok || v.Action != resourcegroup.BudgetRefuse || v.Period != resourcegroup.PeriodDay || v.Spent != 1200 || !v.End.Equal(end) {
		t.Fatalf("verdict %+v %v", v, ok)
	}
	// The same verdict again (a new spending figure) changes nothing.
	again := proto.Clone(refuse).(*tokenpb.GroupBudget)
	again.SpentRu = 1300
	if ch := tb.apply(now, []*tokenpb.GroupBudget{again}, log); len(ch) != 0 {
		t.Errorf("changed %v", ch)
	}
	// Malformed verdicts are left out; the one held stays.
	bad := []*tokenpb.GroupBudget{
		{Group: "rep", Action: "EXPLODE", Period: "DAY", BudgetRu: 1, Percent: 100, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "YEAR", BudgetRu: 1, Percent: 100, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "THROTTLE", Period: "DAY", BudgetRu: 1, Percent: 100, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1, Percent: 100, ThrottleRuPerSec: 5, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1, Percent: 5000, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 0, Percent: 100, WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1, Percent: 100, SpentRu: math.NaN(), WindowEndUnixMs: end.UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1, Percent: 100, WindowEndUnixMs: now.Add(400 * 24 * time.Hour).UnixMilli()},
		{Group: "rep", Action: "REFUSE", Period: "DAY", BudgetRu: 1, Percent: 100},
		{Group: "", Action: ""},
		{Group: "a name far longer than thirty-two characters", Action: ""},
	}
	for i, b := range bad {
		if _, err := budgetFromPB(b, now); err == "" {
			t.Errorf("bad[%d] taken: %v", i, b)
		}
	}
	tb.apply(now, bad, log)
	if v, ok := tb.get("rep", now); !ok || v.Action != resourcegroup.BudgetRefuse {
		t.Errorf("after malformed verdicts: %+v %v", v, ok)
	}
	// A THROTTLE: its rate, unless the group only reports.
	thr := &tokenpb.GroupBudget{Group: "slow", Action: "THROTTLE", ThrottleRuPerSec: 50, Period: "HOUR", BudgetRu: 10, Percent: 80, WindowEndUnixMs: end.UnixMilli()}
	warn := &tokenpb.GroupBudget{Group: "warned", Action: "THROTTLE", ThrottleRuPerSec: 50, Period: "HOUR", BudgetRu: 10, Percent: 80, WindowEndUnixMs: end.UnixMilli(), ReportOnly: true}
	tb.apply(now, []*tokenpb.GroupBudget{thr, warn}, log)
	if r := tb.throttle("slow", now); r != 50 {
		t.Errorf("throttle %d", r)
	}
	if r := tb.throttle("warned", now); r != 0 {
		t.Errorf("a report-only THROTTLE applies: %d", r)
	}
	// rgserver lifts it.
	if ch := tb.apply(now, []*tokenpb.GroupBudget{{Group: "slow"}}, log); len(ch) != 1 {
		t.Errorf("lift changed %v", ch)
	}
	if _, ok := tb.get("slow", now); ok {
		t.Error("a lifted THROTTLE holds")
	}
	// Cut off from rgserver: the REFUSE holds to its window's end and a
	// little more, not forever.
	if _, ok := tb.get("rep", end.Add(budgetLiftGrace/2)); !ok {
		t.Error("REFUSE lifted before its window's end and grace")
	}
	if _, ok := tb.get("rep", end.Add(budgetLiftGrace+time.Millisecond)); ok {
		t.Error("REFUSE held past its window's end")
	}
}
