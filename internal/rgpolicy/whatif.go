package rgpolicy

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// EXPLAIN RESOURCE GROUP g [WITH (RU_PER_SEC = n, BURSTABLE = m)] [FOR
// LAST n unit]: the what-if. The group's recorded demand over the window —
// from the usage history, at the finest granularity it keeps for all of
// it — is replayed through the bucket and budgets its definition gives it
// and through those the proposal gives it (tokenclient.ReplayDemand), and
// the answer is one row for each: how long it would have been over its
// limit, the RU that would have waited and been refused, the worst delay,
// the peak and what its budgets would have done.

// whatIfColumns are the answer's columns.
var whatIfColumns = []string{"SCENARIO", "RU_PER_SEC", "BURSTABLE", "WINDOW_START", "WINDOW_END", "GRANULARITY",
	"DEMAND_RU", "PEAK_RU_PER_SEC", "OVER_LIMIT_SECONDS", "WAITED_RU", "WAITED_STATEMENTS", "REFUSED_RU", "REFUSED_STATEMENTS", "WORST_DELAY_SECONDS", "BUDGET_EVENTS", "BASIS"}

// whatIfRows bounds the history one what-if reads: 400 days of hours
// (9,600) and two days of minutes (2,880) fit, as does an hour of seconds.
const whatIfRows = 10_000

// whatIfGranularity is the finest granularity the usage history keeps
// over all of a window of length last (usageSpans).
func whatIfGranularity(last time.Duration) time.Duration {
	for _, sp := range usageSpans {
		if last <= sp.span {
			return sp.granularity
		}
	}
	return usageSpans[len(usageSpans)-1].granularity
}

// explainGroup answers EXPLAIN RESOURCE GROUP.
func (s *session) explainGroup(ctx context.Context, a *resourcegroup.ExplainGroup, be mysqlproto.Backend) mysqlproto.Verdict {
	name := resourcegroup.NormalizeName(a.Name)
	readable, err := s.readableGroups(ctx, be)
	if err != nil {
		return errReply(err)
	}
	if readable != nil && !readable(name) {
		return errReply(s.deniedRead(name))
	}
	g, ok := s.p.tokens.Group(name)
	if !ok {
		return errReply(resourcegroup.NewNotFound(name))
	}
	if s.p.usage == nil {
		return errReply(errUsageOff)
	}
	pg := a.Proposed(g)
	if err := pg.Validate(); err != nil {
		return errReply(err)
	}
	maxWait := s.p.settings.Load().MaxWait
	current := tokenclient.WhatIfProposal{RUPerSec: g.RUPerSec, Burst: g.Burst, MaxWait: maxWait, Budgets: g.Budgets}
	proposed := tokenclient.WhatIfProposal{RUPerSec: pg.RUPerSec, Burst: pg.Burst, MaxWait: maxWait, Budgets: pg.Budgets}
	now := s.p.clk.Now()
	gran := whatIfGranularity(a.Last)
	from := now.Add(-a.Last).Truncate(gran)
	rows, truncated, err := s.p.usage.UsageHistory(ctx, &tokenpb.UsageHistoryRequest{
		Groups: []string{name}, FromUnixMs: from.UnixMilli(), ToUnixMs: now.UnixMilli(),
		GranularityS: uint32(gran / time.Second), Limit: whatIfRows,
	})
	if err != nil {
		return errReply(usageError(err))
	}
	demand := make([]tokenclient.DemandInterval, 0, len(rows))
	for i := range rows {
		r := &rows[i]
		if r.Group != name || r.Granularity != gran {
			continue
		}
		demand = append(demand, tokenclient.DemandInterval{Start: r.Start, Length: gran,
			RU: r.RRU + r.WRU + r.DeniedRU, Statements: r.Statements + r.Throttled + r.Refused})
	}
	slices.SortFunc(demand, func(x, y tokenclient.DemandInterval) int { return x.Start.Compare(y.Start) })
	basis := "the demand recorded at " + strconv.Itoa(int(gran/time.Second)) + " s, replayed as it arrived"
	if g.Mode == resourcegroup.ModeEnforce && g.RUPerSec != resourcegroup.Unlimited && g.Burst != resourcegroup.BurstUnlimited {
		basis += "; the group was limited meanwhile, so its recorded demand is what its limit let through and the refused statements' retries"
	}
	if truncated {
		basis += "; the history was cut to its newest rows"
	}
	if len(g.Budgets) > 0 || len(pg.Budgets) > 0 {
		// The budgets' windows follow rgserver's calendar, as the
		// leader's own budgets do.
		cal, err := s.p.usage.BudgetCalendar(ctx)
		if err != nil {
			return errReply(usageError(err))
		}
		current.Calendar, proposed.Calendar = cal, cal
		follow := cal.Loc.String()
		if cal.Compressed() {
			follow = "days of " + cal.DayLength.String() + " (rgserver's --budget-day-length)"
		}
		basis += "; budget windows start with the window replayed (nothing spent before it counts) and follow " + follow
	}
	out := make([][]string, 0, 2)
	for _, sc := range []struct {
		name string
		p    tokenclient.WhatIfProposal
	}{{"current", current}, {"proposed", proposed}} {
		w, err := tokenclient.ReplayDemand(demand, sc.p)
		if err != nil {
			return errReply(rgproxyError("rgproxy: EXPLAIN RESOURCE GROUP: " + err.Error()))
		}
		out = append(out, whatIfRow(sc.name, sc.p, from, now, gran, w, basis))
	}
	return resultReply(whatIfColumns, out)
}

// whatIfRow is one scenario's row of the answer.
func whatIfRow(scenario string, p tokenclient.WhatIfProposal, from, to time.Time, gran time.Duration, w tokenclient.WhatIf, basis string) []string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	rate := "UNLIMITED"
	if p.RUPerSec != resourcegroup.Unlimited {
		rate = strconv.FormatUint(p.RUPerSec, 10)
	}
	return []string{scenario, rate, p.Burst.String(), summaryTime(from), summaryTime(to), strconv.Itoa(int(gran / time.Second)),
		f(w.DemandRU), f(w.PeakRUPerSec), f(w.OverSeconds), f(w.WaitedRU), strconv.FormatUint(w.Waited, 10), f(w.RefusedRU),
		strconv.FormatUint(w.Refused, 10), f(w.WorstDelay.Seconds()), strings.Join(w.BudgetEvents, "; "), basis}
}
