package tokenclient

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// usageDouble is rgserver's UsageService for the client's tests.
type usageDouble struct {
	tokenpb.UnimplementedUsageServiceServer
	notLeader string // non-empty: a follower naming this leader
	rows      []*tokenpb.UsageHistoryRow
	truncated bool
	fail      error

	mu   sync.Mutex
	reqs []*tokenpb.UsageHistoryRequest
}

func (d *usageDouble) UsageHistory(_ context.Context, req *tokenpb.UsageHistoryRequest) (*tokenpb.UsageHistoryResponse, error) {
	d.mu.Lock()
	d.reqs = append(d.reqs, req)
	d.mu.Unlock()
	if d.notLeader != "" {
		return &tokenpb.UsageHistoryResponse{NotLeader: &tokenpb.NotLeader{LeaderAddr: d.notLeader}}, nil
	}
	if d.fail != nil {
		return nil, d.fail
	}
	return &tokenpb.UsageHistoryResponse{Rows: d.rows, Truncated: d.truncated}, nil
}

func (d *usageDouble) asked() []*tokenpb.UsageHistoryRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*tokenpb.UsageHistoryRequest(nil), d.reqs...)
}

// startUsageServer serves d on a local port.
func startUsageServer(t *testing.T, d *usageDouble) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	tokenpb.RegisterUsageServiceServer(g, d)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestUsageHistoryFollowsLeader: UsageHistory follows NOT_LEADER to the
// leader, passes the request on, and keeps only rows it can show: of the
// groups asked, of a known granularity, with finite figures, within the
// limit (truncated then).
func TestUsageHistoryFollowsLeader(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	leader := &usageDouble{rows: []*tokenpb.UsageHistoryRow{
		{ResourceGroup: "g1", StartUnixMs: start.UnixMilli(), GranularityS: 1, Rru: 1.5, Wru: 2, Statements: 3,
			Throttled: 4, Refused: 5, WaitedRu: 6, DeniedRu: 7},
		{ResourceGroup: "other", StartUnixMs: start.UnixMilli(), GranularityS: 1, Rru: 1}, // not asked
		{ResourceGroup: "g1", StartUnixMs: start.UnixMilli(), GranularityS: 7, Rru: 1},    // no such granularity
		{ResourceGroup: "g1", StartUnixMs: 4, GranularityS: 1, Rru: 1},                    // before the range asked
		{ResourceGroup: "g1", StartUnixMs: start.Add(-time.Minute).UnixMilli(), GranularityS: 60, Rru: math.NaN(), Wru: math.Inf(1), DeniedRu: -1},
		{ResourceGroup: "g1", StartUnixMs: start.Add(-time.Hour).UnixMilli(), GranularityS: 3600, Rru: 1},
	}}
	leaderAddr := startUsageServer(t, leader)
	follower := &usageDouble{notLeader: leaderAddr}
	followerAddr := startUsageServer(t, follower)
	c, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{followerAddr} })
	defer c.Close()

	req := &tokenpb.UsageHistoryRequest{Groups: []string{"g1"}, FromUnixMs: 5, Limit: 2}
	rows, truncated, err := c.UsageHistory(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(follower.asked()) != 1 || len(leader.asked()) != 1 || leader.asked()[0].GetFromUnixMs() != 5 ||
		leader.asked()[0].GetGroups()[0] != "g1" || leader.asked()[0].GetLimit() != 2 {
		t.Fatalf("asked the follower %v, the leader %v", follower.asked(), leader.asked())
	}
	want := []UsageRowHistory{
		{Group: "g1", Start: start, Granularity: time.Second, RRU: 1.5, WRU: 2, Statements: 3, Throttled: 4, Refused: 5, WaitedRU: 6, DeniedRU: 7},
		{Group: "g1", Start: start.Add(-time.Minute), Granularity: time.Minute},
	}
	if !truncated || len(rows) != len(want) {
		t.Fatalf("rows %+v truncated %v, want %+v truncated", rows, truncated, want)
	}
	for i := range want {
		if rows[i] != want[i] || !rows[i].Start.Equal(want[i].Start) {
			t.Errorf("row %d: %+v, want %+v", i, rows[i], want[i])
		}
	}

	// A granularity asked for: the others' rows are dropped.
	rows, _, err = c.UsageHistory(context.Background(), &tokenpb.UsageHistoryRequest{AllGroups: true, GranularityS: 3600})
	if err != nil || len(rows) != 1 || rows[0].Granularity != time.Hour {
		t.Fatalf("hourly rows: %+v, %v", rows, err)
	}
	// rgserver's own truncation is passed on.
	leader.truncated = true
	if _, truncated, err := c.UsageHistory(context.Background(), &tokenpb.UsageHistoryRequest{AllGroups: true}); err != nil || !truncated {
		t.Fatalf("rgserver truncated: %v %v", truncated, err)
	}
	if _, _, err := c.UsageHistory(context.Background(), &tokenpb.UsageHistoryRequest{Groups: make([]string, 1001)}); err == nil {
		t.Fatal("1001 groups asked")
	}
}

// TestUsageHistoryErrors: an unreachable rgserver, or a leader that names
// nobody, is ErrUnavailable; one without the service ErrNoUsageHistory;
// another error carries rgserver's message.
func TestUsageHistoryErrors(t *testing.T) {
	lost := &usageDouble{notLeader: deadAddr(t)}
	c, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{startUsageServer(t, lost)} })
	defer c.Close()
	ctx := context.Background()
	if _, _, err := c.UsageHistory(ctx, &tokenpb.UsageHistoryRequest{AllGroups: true}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("leader away: %v, want ErrUnavailable", err)
	}
	bad := &usageDouble{fail: status.Error(codes.InvalidArgument, "granularity_s 7: want 1, 60 or 3600")}
	c2, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{startUsageServer(t, bad)} })
	defer c2.Close()
	if _, _, err := c2.UsageHistory(ctx, &tokenpb.UsageHistoryRequest{AllGroups: true}); err == nil || errors.Is(err, ErrUnavailable) ||
		status.Code(errors.Unwrap(err)) != codes.InvalidArgument {
		t.Fatalf("refused: %v", err)
	}
	old := &usageDouble{fail: status.Error(codes.Unimplemented, "unknown service rgproxy.token.v1.UsageService")}
	c3, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{startUsageServer(t, old)} })
	defer c3.Close()
	if _, _, err := c3.UsageHistory(ctx, &tokenpb.UsageHistoryRequest{AllGroups: true}); !errors.Is(err, ErrNoUsageHistory) {
		t.Fatalf("an older rgserver: %v, want ErrNoUsageHistory", err)
	}
}

// calendarDouble is rgserver's Budgets answering with a calendar.
type calendarDouble struct {
	tokenpb.UnimplementedUsageServiceServer
	zone string
	day  int64 // ms
}

func (d *calendarDouble) Budgets(context.Context, *tokenpb.BudgetsRequest) (*tokenpb.BudgetsResponse, error) {
	return &tokenpb.BudgetsResponse{Seeded: true, TimeZone: d.zone, DayLengthMs: d.day}, nil
}

// TestBudgetCalendar: the calendar rgserver names is loaded and checked;
// an rgserver that names none follows UTC's days; a zone this proxy
// cannot load, the host's "Local", an overlong name or a day out of range
// is an error rather than a wrong window.
func TestBudgetCalendar(t *testing.T) {
	for _, tc := range []struct {
		zone    string
		day     int64
		want    string // zone/day, "" for an error
		errText string
	}{
		{"", 0, "UTC/0s", ""},
		{"Asia/Tokyo", 0, "Asia/Tokyo/0s", ""},
		{"UTC", 30_000, "UTC/30s", ""},
		{"Mars/Olympus", 0, "", "unknown time zone"},
		{"Local", 0, "", "not an IANA name"},
		{strings.Repeat("A", 65), 0, "", "not an IANA name"},
		{"UTC", 999, "", "want 1 s to 24 h"},
		{"UTC", -5, "", "want 1 s to 24 h"},
		{"UTC", 25 * 3600 * 1000, "", "want 1 s to 24 h"},
	} {
		s := grpc.NewServer()
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		tokenpb.RegisterUsageServiceServer(s, &calendarDouble{zone: tc.zone, day: tc.day})
		go func() { _ = s.Serve(lis) }()
		c, _ := newTestClient(t, func(cfg *Config) { cfg.Servers = []string{lis.Addr().String()} })
		cal, err := c.BudgetCalendar(context.Background())
		c.Close()
		s.Stop()
		switch {
		case tc.want == "" && (err == nil || !strings.Contains(err.Error(), tc.errText)):
			t.Errorf("zone %.20q, day %d ms: %v, want an error saying %q", tc.zone, tc.day, err, tc.errText)
		case tc.want != "" && (err != nil || cal.Loc.String()+"/"+cal.DayLength.String() != tc.want):
			t.Errorf("zone %q, day %d ms: %v/%v, %v; want %s", tc.zone, tc.day, cal.Loc, cal.DayLength, err, tc.want)
		}
	}
}
