package rgpolicy

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The chargeback history, information_schema.resource_usage_by_tag and
// resource_usage_by_account: the usage history (usage.go) split by the
// values of the billed SQLCommenter tag keys and by account, kept by
// rgserver's leader from the same reports (billing.go), read and rendered
// as resource_group_usage_history is. A key's (the accounts') values
// beyond the top ones of an hour are summed in one row whose TAG_VALUE
// (ACCOUNT) is NULL and OTHER is 1.

// The chargeback tables.
const (
	vtUsageByTag     = "resource_usage_by_tag"
	vtUsageByAccount = "resource_usage_by_account"
)

// Chargeback reads the chargeback history (tokenclient.Client). Safe for
// concurrent use.
type Chargeback interface {
	// Chargeback reads the rows req names, by account or by tag, newest
	// first, and whether rows were left out.
	Chargeback(ctx context.Context, req *tokenpb.UsageHistoryRequest, accounts bool) ([]tokenclient.ChargebackRow, bool, error)
}

// The chargeback tables' columns.
var (
	usageByTagColumns = []vcol{
		{name: "NAME"}, {name: "TAG_KEY"}, {name: "TAG_VALUE"}, {name: "OTHER", numeric: true},
		{name: "START_TIME"}, {name: "GRANULARITY", numeric: true},
		{name: "RRU", numeric: true}, {name: "WRU", numeric: true}, {name: "RU", numeric: true},
		{name: "STATEMENTS", numeric: true},
	}
	usageByAccountColumns = []vcol{
		{name: "NAME"}, {name: "ACCOUNT"}, {name: "OTHER", numeric: true},
		{name: "START_TIME"}, {name: "GRANULARITY", numeric: true},
		{name: "RRU", numeric: true}, {name: "WRU", numeric: true}, {name: "RU", numeric: true},
		{name: "STATEMENTS", numeric: true},
	}
)

// chargebackTable builds resource_usage_by_tag (resource_usage_by_account
// when accounts) as the session may see it: with SUPER every group's
// rows, else those of the groups it may read (readableSet) and, by
// account, only its own account's rows and the "other" rows — it never
// learns who else spends its groups' RU. A granularity whose rows were cut
// gets one more row as resource_group_usage_history's: NAME and every
// figure NULL.
func (s *session) chargebackTable(ctx context.Context, be mysqlproto.Backend, accounts bool) (*vtable, error) {
	if s.p.charge == nil {
		return nil, errUsageOff
	}
	own, err := s.readableSet(ctx, be)
	if err != nil {
		return nil, err
	}
	req := usageRequest(own)
	cols := usageByTagColumns
	if accounts {
		cols = usageByAccountColumns
	}
	now := s.p.clk.Now()
	t := &vtable{cols: cols}
	for _, sp := range usageSpans {
		req.GranularityS = uint32(sp.granularity / time.Second)
		req.FromUnixMs = now.Add(-sp.span).UnixMilli()
		rows, truncated, err := s.p.charge.Chargeback(ctx, req, accounts)
		if err != nil {
			return nil, usageError(err)
		}
		var oldest *time.Time
		for i := range rows {
			r := &rows[i]
			if r.Granularity != sp.granularity || (own != nil && !own[r.Group]) {
				continue
			}
			if own != nil && accounts && !r.Other && accountUser(r.Account) != s.user {
				continue // another account's row
			}
			t.rows = append(t.rows, chargebackRow(r, accounts))
			if oldest == nil || r.Start.Before(*oldest) {
				oldest = &r.Start
			}
		}
		if truncated {
			t.rows = append(t.rows, truncatedChargebackRow(cols, sp.granularity, oldest))
		}
	}
	return t, nil
}

// accountUser is the user name of a billed account (user@host; a host
// holds no '@').
func accountUser(account string) string {
	if i := strings.LastIndexByte(account, '@'); i >= 0 {
		return account[:i]
	}
	return account
}

// chargebackRow is one row of a chargeback table.
func chargebackRow(r *tokenclient.ChargebackRow, accounts bool) []*string {
	f := func(v float64) *string { x := strconv.FormatFloat(v, 'f', 6, 64); return &x }
	str := func(v string) *string { return &v }
	other := str("0")
	var name *string // NULL for other
	if r.Other {
		other = str("1")
	} else if accounts {
		name = str(r.Account)
	} else {
		name = str(r.TagValue)
	}
	head := []*string{str(r.Group)}
	if accounts {
		head = append(head, name)
	} else {
		head = append(head, str(r.TagKey), name)
	}
	return append(head, other, str(summaryTime(r.Start)), str(strconv.FormatInt(int64(r.Granularity/time.Second), 10)),
		f(r.RRU), f(r.WRU), f(r.RRU+r.WRU), str(strconv.FormatUint(r.Statements, 10)))
}

// truncatedChargebackRow says a granularity's older rows were left out:
// everything NULL but GRANULARITY and, when a row was shown, START_TIME.
func truncatedChargebackRow(cols []vcol, granularity time.Duration, oldest *time.Time) []*string {
	cells := make([]*string, len(cols))
	for i, c := range cols {
		switch c.name {
		case "GRANULARITY":
			g := strconv.FormatInt(int64(granularity/time.Second), 10)
			cells[i] = &g
		case "START_TIME":
			if oldest != nil {
				start := summaryTime(*oldest)
				cells[i] = &start
			}
		}
	}
	return cells
}
