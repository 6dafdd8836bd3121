package rgpolicy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// fakeUsage answers UsageHistory with the rows of the granularity asked,
// every group's (the caller filters, as it must with a hostile or older
// rgserver), or err, and records what it was asked.
type fakeUsage struct {
	rows      []tokenclient.UsageRowHistory
	truncated map[uint32]bool // by granularity in seconds
	err       error
	asked     []string
	// budgets and unseeded answer Budgets.
	budgets          []tokenclient.BudgetRow
	unseeded         bool
	budgetsTruncated bool
	// calendar answers BudgetCalendar.
	calendar resourcegroup.BudgetCalendar
}

func (f *fakeUsage) BudgetCalendar(context.Context) (resourcegroup.BudgetCalendar, error) {
	if f.err != nil {
		return resourcegroup.BudgetCalendar{}, f.err
	}
	return f.calendar, nil
}

func (f *fakeUsage) Budgets(_ context.Context, req *tokenpb.BudgetsRequest) ([]tokenclient.BudgetRow, bool, bool, error) {
	f.asked = append(f.asked, fmt.Sprintf("budgets all=%v groups=%v", req.GetAllGroups(), req.GetGroups()))
	if f.err != nil {
		return nil, false, false, f.err
	}
	return f.budgets, !f.unseeded, f.budgetsTruncated, nil
}

func (f *fakeUsage) UsageHistory(_ context.Context, req *tokenpb.UsageHistoryRequest) ([]tokenclient.UsageRowHistory, bool, error) {
	f.asked = append(f.asked, fmt.Sprintf("all=%v groups=%v from=%d g=%d limit=%d", req.GetAllGroups(), req.GetGroups(),
		req.GetFromUnixMs(), req.GetGranularityS(), req.GetLimit()))
	if f.err != nil {
		return nil, false, f.err
	}
	var out []tokenclient.UsageRowHistory
	for _, r := range f.rows {
		if uint32(r.Granularity/time.Second) == req.GetGranularityS() {
			out = append(out, r)
		}
	}
	return out, f.truncated[req.GetGranularityS()], nil
}

func newUsagePolicy(tok Tokens, u UsageHistory, clk clock.Clock) *Policy {
	p, err := New(Config{Tokens: tok, Usage: u, Settings: Settings{Strict: true, MaxWait: 30 * time.Second},
		CPU: CPUWall, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clk})
	if err != nil {
		panic(err)
	}
	return p
}

// TestUsageHistoryTable: the table renders each row (times as
// runaway_queries does, GRANULARITY in seconds, RU = RRU + WRU), asks
// for each granularity over its span within the row bound, and, without
// SUPER, asks only for the groups the session may read and keeps only
// those; a granularity rgserver cut gets its row of NULLs saying so.
func TestUsageHistoryTable(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake()
	now := clk.Now()
	base := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC) // the rows' times
	fu := &fakeUsage{truncated: map[uint32]bool{3600: true}, rows: []tokenclient.UsageRowHistory{
		{Group: "bound", Start: base.Add(-time.Second), Granularity: time.Second, RRU: 1.5, WRU: 0.25, Statements: 3,
			Throttled: 1, Refused: 2, WaitedRU: 0.5, DeniedRU: 4},
		{Group: "other", Start: base.Add(-time.Second), Granularity: time.Second, RRU: 9, Statements: 9},
		{Group: "bound", Start: base.Add(-time.Minute), Granularity: time.Minute, RRU: 100, Statements: 60},
		{Group: "bound", Start: base.Add(-time.Hour), Granularity: time.Hour, RRU: 1000, Statements: 600},
	}}
	read := func(g grants) (*fakeUsage, []string) {
		t.Helper()
		fu.asked = nil
		s := newUsagePolicy(testGroups(), fu, clk).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		s.learnAccount(ctx, g)
		vt, err := s.virtualTable(ctx, vtUsageHistory, g)
		if err != nil {
			t.Fatal(err)
		}
		return fu, rowTexts(vt.rows)
	}
	fu, rows := read(plainGrants)
	want := []string{
		"bound 2026-11-28 06:59:59 1 1.500000 0.250000 1.750000 3 1 2 0.500000 4.000000",
		"bound 2026-11-28 06:59:00 60 100.000000 0.000000 100.000000 60 0 0 0.000000 0.000000",
		"bound 2026-11-28 06:00:00 3600 1000.000000 0.000000 1000.000000 600 0 0 0.000000 0.000000",
		"NULL 2026-11-28 06:00:00 3600 NULL NULL NULL NULL NULL NULL NULL NULL",
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("without SUPER:\n%v\nwant\n%v", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	ms := func(d time.Duration) int64 { return now.Add(-d).UnixMilli() }
	wantAsked := []string{
		fmt.Sprintf("all=false groups=[bound] from=%d g=1 limit=10000", ms(time.Hour)),
		fmt.Sprintf("all=false groups=[bound] from=%d g=60 limit=10000", ms(48*time.Hour)),
		fmt.Sprintf("all=false groups=[bound] from=%d g=3600 limit=10000", ms(400*24*time.Hour)),
	}
	if fmt.Sprint(fu.asked) != fmt.Sprint(wantAsked) {
		t.Errorf("asked\n%v\nwant\n%v", strings.Join(fu.asked, "\n"), strings.Join(wantAsked, "\n"))
	}
	fu, rows = read(superGrants)
	if len(rows) != 5 || !strings.HasPrefix(rows[1], "other ") || !strings.HasPrefix(fu.asked[0], "all=true groups=[] ") {
		t.Errorf("with SUPER: %v, asked %v", rows, fu.asked)
	}
	// Nothing shown at a cut granularity: START_TIME is NULL too.
	fu.rows = nil
	if _, rows = read(superGrants); fmt.Sprint(rows) != "[NULL NULL 3600 NULL NULL NULL NULL NULL NULL NULL NULL]" {
		t.Errorf("empty and cut: %v", rows)
	}
}

// TestUsageHistoryThroughBefore: any query shape is rewritten with the
// table as a derived table of hex literals; a prepared statement naming
// it is refused (1295), as for every virtual table.
func TestUsageHistoryThroughBefore(t *testing.T) {
	ctx := context.Background()
	fu := &fakeUsage{rows: []tokenclient.UsageRowHistory{
		{Group: "bound", Start: time.Unix(1_800_000_000, 0), Granularity: time.Second, RRU: 2, Statements: 1}}}
	s := newUsagePolicy(testGroups(), fu, clock.Real{}).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	q := query("SELECT NAME, SUM(RU) FROM information_schema.resource_group_usage_history h WHERE GRANULARITY = 1 AND NAME IN " +
		"(SELECT NAME FROM information_schema.resource_groups) GROUP BY NAME")
	v := s.Before(ctx, q, plainGrants)
	if v.Reply != nil || !strings.Contains(v.Rewrite, sqlText("bound")) || strings.Contains(v.Rewrite, "information_schema.resource_group_usage_history") ||
		!strings.Contains(v.Rewrite, "AS `RU`") || !strings.Contains(v.Rewrite, ") h WHERE GRANULARITY = 1") {
		t.Fatalf("rewrite %.400q (reply %v)", v.Rewrite, v.Reply)
	}
	s.After(q, &mysqlproto.Outcome{})
	prep := query("SELECT * FROM information_schema.resource_group_usage_history")
	prep.Command = mysql.COM_STMT_PREPARE
	if v := s.Before(ctx, prep, plainGrants); v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1295 {
		t.Errorf("prepared: %+v", v)
	}
}

// TestUsageHistoryErrors: a history that cannot be read is a readable
// 1105, never gRPC's text, and the session goes on.
func TestUsageHistoryErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		u    UsageHistory
		want string
	}{
		{&fakeUsage{err: fmt.Errorf("%w: rgserver 127.0.0.1:1: connection error: desc = \"transport: dial\"", tokenclient.ErrUnavailable)}, "could not be reached"},
		{&fakeUsage{err: context.DeadlineExceeded}, "could not be reached"},
		{&fakeUsage{err: errors.New("tokenclient: rgserver 127.0.0.1:1: unknown service")}, "rgproxy: usage history: tokenclient: rgserver"},
		{&fakeUsage{err: fmt.Errorf("%w: rpc error: code = Unimplemented desc = unknown service", tokenclient.ErrNoUsageHistory)}, "older than this proxy"},
		{nil, "no token client"},
	}
	for _, tc := range tests {
		s := newUsagePolicy(testGroups(), tc.u, clock.Real{}).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		v := s.Before(ctx, query("SELECT * FROM information_schema.resource_group_usage_history"), superGrants)
		if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1105 || !strings.Contains(v.Reply.Err.Message, tc.want) ||
			strings.Contains(v.Reply.Err.Message, "desc =") {
			t.Errorf("with %v: %+v, want 1105 saying %q", tc.u, v.Reply, tc.want)
		}
		if v := s.Before(ctx, query("SELECT 1"), superGrants); v.Reply != nil {
			t.Errorf("the next statement: %+v", v.Reply)
		}
	}
}

// TestLedgerCountsDeniedAndWaited: a statement refused with 8252 counts
// its prepaid cost as denied in its group; one that waited for its tokens
// counts its prepaid as waited once it settles; one that did not wait
// counts nothing.
func TestLedgerCountsDeniedAndWaited(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	q := query("SELECT 1")
	run := func() *mysqlproto.Reply {
		v := s.Before(ctx, q, plainGrants)
		if v.Reply == nil {
			s.After(q, &mysqlproto.Outcome{})
		}
		return v.Reply
	}
	if r := run(); r != nil || tok.waitedIn != nil || tok.denied != 0 {
		t.Fatalf("a statement that did not wait: %v, waited in %v, denied %v", r, tok.waitedIn, tok.denied)
	}
	tok.wait = 10 * time.Millisecond
	if r := run(); r != nil || fmt.Sprint(tok.waitedIn) != "[bound]" || !(tok.waitedRU > 0) {
		t.Fatalf("a statement that waited: %v, waited in %v, %v RU", r, tok.waitedIn, tok.waitedRU)
	}
	prepaid := s.cur.prepaid.RU()
	tok.refuse, tok.failFast = true, true
	if r := run(); r == nil || r.Err == nil || r.Err.Code != resourcegroup.CodeThrottled {
		t.Fatalf("refused: %+v", r)
	}
	if fmt.Sprint(tok.throttled) != "[bound]" || tok.denied != prepaid || tok.refusedOther != nil || len(tok.waitedIn) != 1 {
		t.Errorf("throttled %v denied %v (want %v) refused %v waited in %v", tok.throttled, tok.denied, prepaid, tok.refusedOther, tok.waitedIn)
	}
	// A refusal other than 8252 (a budget's) is the ledger's to count.
	s.led.denied("bound", &s.cur, false)
	if fmt.Sprint(tok.refusedOther) != "[bound]" || tok.denied != 2*prepaid {
		t.Errorf("refused %v denied %v", tok.refusedOther, tok.denied)
	}
}
