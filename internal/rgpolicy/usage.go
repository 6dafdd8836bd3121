package rgpolicy

import (
	"context"
	"errors"
	"sort"
	"strconv"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The usage history, information_schema.resource_group_usage_history:
// what every group spent, second by second for the last hour, minute by
// minute for the last two days and hour by hour for the last 400 days,
// kept by rgserver's leader from every proxy's consumption reports
// (docs/design.md §7.10), so the table is cluster-wide already. The
// figures are the statement ledger's (ledger.go): what the reports carry
// is what rgproxy_ru_consumed_total and statements_summary count. The
// proxy reads the rows of the groups the session may read and renders
// them as a virtual table, like runaway_queries.

// vtUsageHistory is the usage history's virtual table.
const vtUsageHistory = "resource_group_usage_history"

// UsageHistory reads the usage history (tokenclient.Client). Safe for
// concurrent use.
type UsageHistory interface {
	// UsageHistory reads the rows req names, newest first, and whether
	// rows were left out.
	UsageHistory(ctx context.Context, req *tokenpb.UsageHistoryRequest) ([]tokenclient.UsageRowHistory, bool, error)
	// Budgets reads the budgets of the groups req names, in their
	// current windows, whether the leader's book is seeded and whether
	// rows were left out.
	Budgets(ctx context.Context, req *tokenpb.BudgetsRequest) (rows []tokenclient.BudgetRow, seeded, truncated bool, err error)
	// BudgetCalendar reads the calendar budgets' windows follow on
	// rgserver (its time zone and the length of its day).
	BudgetCalendar(ctx context.Context) (resourcegroup.BudgetCalendar, error)
}

// Errors of the usage history, as the client sees them.
var (
	errUsageUnavailable = rgproxyError("rgproxy: information_schema.resource_group_usage_history is kept by rgserver, which could not be reached (or named no leader) within 3 s; " +
		"rgproxy_ru_consumed_total on each proxy's /metrics still counts every group's RU")
	errUsageOff = rgproxyError("rgproxy: information_schema.resource_group_usage_history needs rgserver; this proxy has no token client")
	errUsageOld = rgproxyError("rgproxy: information_schema.resource_group_usage_history is kept by rgserver, and this rgserver keeps none: it is older than this proxy")
)

// usageHistoryColumns are resource_group_usage_history's columns.
var usageHistoryColumns = []vcol{
	{name: "NAME"}, {name: "START_TIME"}, {name: "GRANULARITY", numeric: true},
	{name: "RRU", numeric: true}, {name: "WRU", numeric: true}, {name: "RU", numeric: true},
	{name: "STATEMENTS", numeric: true}, {name: "THROTTLED", numeric: true}, {name: "REFUSED", numeric: true},
	{name: "WAITED_RU", numeric: true}, {name: "DENIED_RU", numeric: true},
}

// usageSpans are the history's granularities, each with how far back
// rgserver keeps it: the table asks for each over its whole span.
var usageSpans = []struct {
	granularity time.Duration
	span        time.Duration
}{
	{time.Second, time.Hour},
	{time.Minute, 48 * time.Hour},
	{time.Hour, 400 * 24 * time.Hour},
}

// usageRowsPerGranularity bounds what the table reads of each
// granularity, the newest rows first: the rows become SQL text the
// backend parses (about 150 bytes each), so the three together stay
// within a few MiB and well under max_allowed_packet's 16 MiB default.
// 10,000 rows are a fully busy group's whole span at one second (3,600
// rows) and minute (2,880) granularity, and a year of hours.
const usageRowsPerGranularity = 10_000

// usageHistoryTable builds resource_group_usage_history as the session may see
// it: with SUPER every group's rows, else those of the groups it may
// read (readableSet). Each granularity whose rows were cut (the bound
// above, or rgserver's) gets one more row saying so: NAME and every
// figure NULL, its GRANULARITY, and as START_TIME the start of the
// oldest row shown at that granularity (NULL when none is): what is
// older was left out. SUM and AVG skip it; a NAME = '...' filter drops it.
func (s *session) usageHistoryTable(ctx context.Context, be mysqlproto.Backend) (*vtable, error) {
	if s.p.usage == nil {
		return nil, errUsageOff
	}
	own, err := s.readableSet(ctx, be)
	if err != nil {
		return nil, err
	}
	req := usageRequest(own)
	now := s.p.clk.Now()
	t := &vtable{cols: usageHistoryColumns}
	for _, sp := range usageSpans {
		req.GranularityS = uint32(sp.granularity / time.Second)
		req.FromUnixMs = now.Add(-sp.span).UnixMilli()
		rows, truncated, err := s.p.usage.UsageHistory(ctx, req)
		if err != nil {
			return nil, usageError(err)
		}
		var oldest *time.Time
		for i := range rows {
			r := &rows[i]
			if r.Granularity != sp.granularity || (own != nil && !own[r.Group]) {
				continue
			}
			t.rows = append(t.rows, cellsOf(usageHistoryRow(r)))
			if oldest == nil || r.Start.Before(*oldest) {
				oldest = &r.Start
			}
		}
		if truncated {
			t.rows = append(t.rows, truncatedUsageRow(sp.granularity, oldest))
		}
	}
	return t, nil
}

// usageHistoryRow is one row of the usage history, as text.
func usageHistoryRow(r *tokenclient.UsageRowHistory) []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	return []string{r.Group, summaryTime(r.Start), strconv.FormatInt(int64(r.Granularity/time.Second), 10),
		f(r.RRU), f(r.WRU), f(r.RRU + r.WRU), u(r.Statements), u(r.Throttled), u(r.Refused), f(r.WaitedRU), f(r.DeniedRU)}
}

// truncatedUsageRow is the row that says a granularity's older rows were
// left out: everything NULL but its GRANULARITY and, when a row was
// shown, START_TIME, the start of the oldest one.
func truncatedUsageRow(granularity time.Duration, oldest *time.Time) []*string {
	cells := make([]*string, len(usageHistoryColumns))
	g := strconv.FormatInt(int64(granularity/time.Second), 10)
	cells[2] = &g
	if oldest != nil {
		start := summaryTime(*oldest)
		cells[1] = &start
	}
	return cells
}

// usageError is what a statement answers when the usage history could
// not be read: readable MySQL text, never gRPC's.
func usageError(err error) error {
	switch {
	case errors.Is(err, tokenclient.ErrUnavailable),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errUsageUnavailable
	case errors.Is(err, tokenclient.ErrNoUsageHistory):
		return errUsageOld
	}
	return rgproxyError("rgproxy: usage history: " + err.Error())
}

// usageRequest asks rgserver for every group's rows, or for own's (the
// groups the session may read) when they are few enough to name; the
// caller filters the answer by own either way.
func usageRequest(own map[string]bool) *tokenpb.UsageHistoryRequest {
	req := &tokenpb.UsageHistoryRequest{AllGroups: true, Limit: usageRowsPerGranularity}
	if own != nil && len(own) <= maxPushedGroups {
		req.AllGroups = false
		for g := range own {
			req.Groups = append(req.Groups, g)
		}
		sort.Strings(req.Groups)
	}
	return req
}
