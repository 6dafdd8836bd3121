package rgpolicy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// TestExplainGroup: EXPLAIN RESOURCE GROUP reads the group's history at
// the finest granularity that covers the window and answers the current
// definition's replay and the proposal's; the same privileges as SHOW
// CREATE RESOURCE GROUP.
func TestExplainGroup(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake()
	now := clk.Now()
	// A minute of 200 RU/s in "bound" (RU_PER_SEC 100, BURSTABLE OFF),
	// the last minute of the hour; another group's rows are not its own.
	var rows []tokenclient.UsageRowHistory
	for i := 1; i <= 60; i++ {
		rows = append(rows, tokenclient.UsageRowHistory{Group: "bound", Start: now.Truncate(time.Second).Add(-time.Duration(i) * time.Second),
			Granularity: time.Second, RRU: 150, WRU: 30, DeniedRU: 20, Statements: 90, Throttled: 10})
	}
	rows = append(rows, tokenclient.UsageRowHistory{Group: "other", Start: now.Add(-time.Second), Granularity: time.Second, RRU: 1e6, Statements: 1})
	fu := &fakeUsage{rows: rows}
	s := newUsagePolicy(testGroups(), fu, clk).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	explain := func(q string) *mysqlproto.Reply {
		t.Helper()
		v := s.Before(ctx, query(q), plainGrants)
		if v.Reply == nil {
			t.Fatalf("%s: no reply (rewrite %q)", q, v.Rewrite)
		}
		return v.Reply
	}
	r := explain("EXPLAIN RESOURCE GROUP bound WITH (RU_PER_SEC = 400)")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := fmt.Sprint(r.Columns); got != fmt.Sprint(whatIfColumns) {
		t.Fatalf("columns %s", got)
	}
	var first14 [][]*string
	for _, row := range r.Rows {
		first14 = append(first14, row[:14])
	}
	got := rowTexts(first14)
	// 12,000 RU in a minute of 2 RU statements: the current 100 RU/s
	// bucket runs 9,097 RU of it (its 100, the minute's 6,000 and 3,000
	// owed at the end), all but the first 197 after a wait of up to
	// --max-wait (30 s), and refuses 2,903 RU (1,452 statements); 400 RU/s
	// serves it all at once.
	want := []string{
		"current 100 OFF 2023-11-14 21:13:20 2023-11-14 22:13:20 1 12000.000 200.000 60.000 8900.000 4450 2903.125 1452 30.000",
		"proposed 400 OFF 2023-11-14 21:13:20 2023-11-14 22:13:20 1 12000.000 200.000 0.000 0.000 0 0.000 0 0.000",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answer\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if basis := cell(r.Rows[0][15]); !strings.Contains(basis, "recorded at 1 s") || !strings.Contains(basis, "was limited meanwhile") {
		t.Errorf("basis %q", basis)
	}
	if !strings.Contains(fu.asked[0], "groups=[bound]") || !strings.Contains(fu.asked[0], " g=1 ") {
		t.Errorf("asked %v", fu.asked)
	}
	// A proposed budget: the day's 3,000 RU are spent 15 s into the
	// minute at the proposed 400 RU/s (200 RU/s of demand), then refused.
	r = explain("EXPLAIN RESOURCE GROUP bound WITH (RU_PER_SEC = 400, BUDGET = (RU = 3000 PER DAY, ON 100 PERCENT REFUSE))")
	if r.Err != nil || len(r.Rows) != 2 {
		t.Fatalf("with a budget: %+v", r)
	}
	if ev := cell(r.Rows[1][14]); !strings.HasPrefix(ev, "DAY 100% REFUSE at ") || cell(r.Rows[0][14]) != "" {
		t.Errorf("budget events: current %q, proposed %q", cell(r.Rows[0][14]), ev)
	}
	if refused := cell(r.Rows[1][11]); refused != "9000.000" {
		t.Errorf("the budget refused %s RU, want the 9,000 after its 3,000", refused)
	}
	// A proposal that is not a valid group is refused as ALTER would be.
	if r := explain("EXPLAIN RESOURCE GROUP bound WITH (BUDGET = (RU = 10 PER DAY, ON 100 PERCENT THROTTLE (RU_PER_SEC = 500)))"); r.Err == nil || r.Err.Code != 1105 {
		t.Errorf("an invalid proposal: %+v", r.Err)
	}
	// Seven days: hours.
	fu.asked = nil
	if r := explain("EXPLAIN RESOURCE GROUP bound FOR LAST 7 DAYS"); r.Err != nil || !strings.Contains(fu.asked[0], " g=3600 ") {
		t.Errorf("7 days: %+v asked %v", r.Err, fu.asked)
	}
	// Another group's history is not the session's to read; an unknown
	// group is 8249.
	if r := explain("EXPLAIN RESOURCE GROUP other"); r.Err == nil || r.Err.Code != 1227 {
		t.Errorf("other's: %+v", r.Err)
	}
	s2 := newUsagePolicy(testGroups(), fu, clk).Open(mysqlproto.SessionInfo{User: "root"}).(*session)
	if v := s2.Before(ctx, query("EXPLAIN RESOURCE GROUP nosuch"), superGrants); v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 8249 {
		t.Errorf("unknown group: %+v", v.Reply)
	}
}
