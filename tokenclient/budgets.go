package tokenclient

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// BudgetVerdict is what a group's budgets do on this proxy, as the
// rgserver leader last said (TokenResponse.budgets): the strongest
// action of the triggers crossed in their current windows.
type BudgetVerdict struct {
	resourcegroup.BudgetVerdict
	// ReportOnly: the group is MODE WARN (or OFF): the action is
	// reported, not applied.
	ReportOnly bool
	// Since is when the proxy got it.
	Since time.Time
}

// budgetLiftGrace is how long past its window's end a verdict holds
// without a word from rgserver (which lifts it when the window rolls
// over): a proxy cut off from rgserver does not refuse forever.
const budgetLiftGrace = 2 * time.Second

// maxBudgetWindowAhead bounds how far in the future a verdict's window
// may end: a MONTH window and clock skew.
const maxBudgetWindowAhead = 32 * 24 * time.Hour

// budgetTable holds the groups' verdicts; apart from the groups' table
// so that a group that falls idle and is forgotten keeps its verdict
// (rgserver sends a verdict only when it changes).
type budgetTable struct {
	mu sync.Mutex
	m  map[string]BudgetVerdict
	// n is len(m), read without the lock on every statement.
	n atomic.Int64
}

// apply takes a response's verdicts at now; a malformed one is logged and
// left out. It returns the groups whose action changed.
func (t *budgetTable) apply(now time.Time, bs []*tokenpb.GroupBudget, log *slog.Logger) (changed []string) {
	if len(bs) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]BudgetVerdict{}
	}
	for _, b := range bs {
		v, err := budgetFromPB(b, now)
		name := resourcegroup.NormalizeName(b.GetGroup())
		if err != "" {
			log.Warn("rgserver sent a malformed budget verdict: ignored", "resource_group", name, "err", err)
			continue
		}
		old, had := t.m[name]
		if v.Action == 0 {
			if had {
				log.Info("budget action lifted", "resource_group", name, "was", old.BudgetVerdict.String())
				delete(t.m, name)
				changed = append(changed, name)
			}
			continue
		}
		if !had || !old.BudgetVerdict.Same(v.BudgetVerdict) || old.ReportOnly != v.ReportOnly {
			log.Warn("budget action in force", "resource_group", name, "budget", v.BudgetVerdict.String(),
				"spent_ru", v.Spent, "budget_ru", v.Budget, "window_end", v.End.UTC().Format(time.RFC3339), "report_only", v.ReportOnly)
		}
		if had && old.Action == v.Action && old.ThrottleRUPerSec == v.ThrottleRUPerSec && old.ReportOnly == v.ReportOnly {
			v.Since = old.Since
		} else {
			changed = append(changed, name)
		}
		t.m[name] = v
	}
	t.n.Store(int64(len(t.m)))
	return changed
}

// throttle is group's enforced THROTTLE rate at now, 0 for none.
func (t *budgetTable) throttle(group string, now time.Time) uint64 {
	if v, ok := t.get(group, now); ok && v.Action == resourcegroup.BudgetThrottle && !v.ReportOnly {
		return v.ThrottleRUPerSec
	}
	return 0
}

// budgetsChanged brings the groups in use to their new verdicts at once,
// rather than at their next grant: an enforced THROTTLE ends the running
// trickle and holds the local bucket to this proxy's part of the rate
// (RU_PER_SEC / proxies) until rgserver's next grant, which comes at the
// throttled rate; any change asks rgserver for a grant now.
func (t *groupTable) budgetsChanged(now time.Time, names []string, budgets *budgetTable) {
	if len(names) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, name := range names {
		gs, ok := t.byName[name]
		if !ok {
			continue
		}
		if r := budgets.throttle(name, now); r > 0 {
			share := float64(r) / float64(max(gs.proxies, 1))
			gs.bucket.SetUnlimited(false)
			left := gs.bucket.Tokens(now)
			gs.bucket.Reconfigure(now, 0, share, share, gs.threshold(now))
			if left > share {
				gs.bucket.Take(now, left-share)
			}
			gs.trickleUntil, gs.trickleRate = time.Time{}, 0
		}
		gs.want = true
		gs.nextAsk = time.Time{}
		gs.wake()
	}
	t.kickLocked()
}

// get is group's verdict at now; ok is false when none holds.
func (t *budgetTable) get(group string, now time.Time) (BudgetVerdict, bool) {
	if t.n.Load() == 0 {
		return BudgetVerdict{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[group]
	if !ok {
		return v, false
	}
	if now.After(v.End.Add(budgetLiftGrace)) {
		delete(t.m, group)
		t.n.Store(int64(len(t.m)))
		return BudgetVerdict{}, false
	}
	return v, true
}

// budgetFromPB validates one verdict from the wire; err says what is
// wrong with it.
func budgetFromPB(b *tokenpb.GroupBudget, now time.Time) (BudgetVerdict, string) {
	var v BudgetVerdict
	if resourcegroup.ValidateName(b.GetGroup()) != nil {
		return v, "bad group name"
	}
	if b.GetAction() == "" {
		return v, ""
	}
	a, ok := resourcegroup.ParseBudgetAction(b.GetAction())
	if !ok {
		return v, "unknown action " + truncate(b.GetAction(), 32)
	}
	p, ok := resourcegroup.ParseBudgetPeriod(b.GetPeriod())
	if !ok {
		return v, "unknown period " + truncate(b.GetPeriod(), 32)
	}
	switch {
	case a == resourcegroup.BudgetThrottle && (b.GetThrottleRuPerSec() == 0 || b.GetThrottleRuPerSec() > resourcegroup.MaxRU):
		return v, "THROTTLE without a valid rate"
	case a != resourcegroup.BudgetThrottle && b.GetThrottleRuPerSec() != 0:
		return v, "a rate without THROTTLE"
	case b.GetPercent() == 0 || b.GetPercent() > resourcegroup.MaxBudgetPercent:
		return v, "percent out of range"
	case b.GetBudgetRu() == 0 || b.GetBudgetRu() > resourcegroup.MaxRU:
		return v, "budget RU out of range"
	case math.IsNaN(b.GetSpentRu()) || math.IsInf(b.GetSpentRu(), 0) || b.GetSpentRu() < 0:
		return v, "spent RU not a finite number ≥ 0"
	}
	end := time.UnixMilli(b.GetWindowEndUnixMs())
	if b.GetWindowEndUnixMs() <= 0 || end.After(now.Add(maxBudgetWindowAhead)) {
		return v, "window end out of range"
	}
	v.Action, v.ThrottleRUPerSec, v.Period = a, b.GetThrottleRuPerSec(), p
	v.Budget, v.Spent, v.Percent, v.End = b.GetBudgetRu(), min(b.GetSpentRu(), 1e18), b.GetPercent(), end
	v.ReportOnly, v.Since = b.GetReportOnly(), now
	return v, ""
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Budget returns group's budget verdict now, as rgserver last said; ok
// is false when none of its budgets' triggers is crossed.
func (c *Client) Budget(group string) (BudgetVerdict, bool) {
	if c.budgets.n.Load() == 0 {
		return BudgetVerdict{}, false // every statement asks: no clock read, no name folding
	}
	return c.budgets.get(resourcegroup.NormalizeName(group), c.clk.Now())
}

// BudgetRow is one budget of a group in its current window, as rgserver's
// leader keeps it (information_schema.resource_group_budgets).
type BudgetRow struct {
	Group      string
	Period     resourcegroup.BudgetPeriod
	BudgetRU   uint64
	SpentRU    float64
	Start, End time.Time
	RUPerSec   float64
	// Exhaustion is when the budget runs out at RUPerSec; zero when not
	// within the window.
	Exhaustion time.Time
	// Action is the strongest crossed trigger, as SQL writes it; "" for
	// none. Enforced is false for a MODE WARN or OFF group.
	Action   string
	Enforced bool
}

// maxBudgetRows bounds the rows one Budgets answer yields: every group
// with all four periods, for 25,000 groups.
const maxBudgetRows = 100_000

// Budgets reads the budgets of the groups req names from rgserver's
// leader, by group and period; seeded is false while a new leader's usage
// history loads (SpentRU may lack earlier terms'); truncated says rows
// were left out to keep the answer bounded (rgserver's 3 MiB, or
// maxBudgetRows here). A row that does not make sense is left out.
func (c *Client) Budgets(ctx context.Context, req *tokenpb.BudgetsRequest) (rows []BudgetRow, seeded, truncated bool, err error) {
	if !req.GetAllGroups() && len(req.GetGroups()) > usageGroupsMax {
		return nil, false, false, fmt.Errorf("tokenclient: budgets of %d groups: at most %d", len(req.GetGroups()), usageGroupsMax)
	}
	resp, err := askUsage(ctx, c, func(ctx context.Context, us tokenpb.UsageServiceClient) (*tokenpb.BudgetsResponse, error) {
		return us.Budgets(ctx, req)
	})
	if err != nil {
		return nil, false, false, err
	}
	truncated = resp.GetTruncated()
	asked := askedGroups(req.GetAllGroups(), req.GetGroups())
	now := c.clk.Now()
	for _, r := range resp.GetRows() {
		g := r.GetResourceGroup()
		if (asked != nil && !asked[g]) || resourcegroup.ValidateName(g) != nil {
			continue
		}
		p, ok := resourcegroup.ParseBudgetPeriod(r.GetPeriod())
		start, end := time.UnixMilli(r.GetWindowStartUnixMs()), time.UnixMilli(r.GetWindowEndUnixMs())
		if !ok || r.GetBudgetRu() == 0 || r.GetBudgetRu() > resourcegroup.MaxRU || r.GetWindowStartUnixMs() <= 0 ||
			!start.Before(end) || end.After(now.Add(maxBudgetWindowAhead)) {
			continue
		}
		if len(rows) == maxBudgetRows {
			truncated = true
			break
		}
		row := BudgetRow{Group: g, Period: p, BudgetRU: r.GetBudgetRu(), SpentRU: min(figure(r.GetSpentRu()), 1e18),
			Start: start, End: end, RUPerSec: min(figure(r.GetRuPerSec()), 1e18), Enforced: r.GetEnforced()}
		if x := r.GetProjectedExhaustionUnixMs(); x > 0 && x <= r.GetWindowEndUnixMs() {
			row.Exhaustion = time.UnixMilli(x)
		}
		if a := r.GetAction(); a != "" {
			row.Action = truncate(strings.ToValidUTF8(a, "?"), 64)
		}
		rows = append(rows, row)
	}
	return rows, resp.GetSeeded(), truncated, nil
}

// budgetReportPeriod is how often a group with budgets reports its
// consumption while it consumes: rgserver's leader sees a trigger crossed
// within about this (plus a round trip) of the spending that crossed it,
// and every proxy hears of it at once.
const budgetReportPeriod = 250 * time.Millisecond

// reportPeriodLocked is how often gs reports while it consumes:
// Config.ReportPeriod, at most budgetReportPeriod for a group with
// budgets. Called with t.mu held.
func (t *groupTable) reportPeriodLocked(gs *groupState) time.Duration {
	if g, ok := t.cache.group(gs.name); ok && len(g.Budgets) > 0 {
		return min(t.cfg.ReportPeriod, budgetReportPeriod)
	}
	return t.cfg.ReportPeriod
}

// Bounds of the calendar rgserver names.
const (
	// maxTimeZoneBytes bounds a zone's name (IANA names are under 40).
	maxTimeZoneBytes = 64
	// maxBudgetDay is the longest day --budget-day-length allows.
	maxBudgetDay = 24 * time.Hour
)

// BudgetCalendar asks rgserver's leader which calendar budgets' windows
// follow: its --budget-time-zone and --budget-day-length. An rgserver
// that does not say (older than budgets' calendar) follows UTC's real
// days; a zone this proxy cannot load, or a day out of range, is an error.
func (c *Client) BudgetCalendar(ctx context.Context) (resourcegroup.BudgetCalendar, error) {
	resp, err := askUsage(ctx, c, func(ctx context.Context, us tokenpb.UsageServiceClient) (*tokenpb.BudgetsResponse, error) {
		// One group's rows are the smallest answer that carries it.
		return us.Budgets(ctx, &tokenpb.BudgetsRequest{Groups: []string{resourcegroup.DefaultGroup}})
	})
	if err != nil {
		return resourcegroup.BudgetCalendar{}, err
	}
	cal := resourcegroup.BudgetCalendar{Loc: time.UTC}
	if z := resp.GetTimeZone(); z != "" {
		if len(z) > maxTimeZoneBytes || z == "Local" {
			return cal, fmt.Errorf("tokenclient: rgserver's budget time zone %.64q is not an IANA name", z)
		}
		loc, err := time.LoadLocation(z)
		if err != nil {
			return cal, fmt.Errorf("tokenclient: rgserver's budget time zone: %w", err)
		}
		cal.Loc = loc
	}
	if ms := resp.GetDayLengthMs(); ms != 0 {
		d := time.Duration(ms) * time.Millisecond
		if ms < 0 || d < time.Second || d > maxBudgetDay {
			return cal, fmt.Errorf("tokenclient: rgserver's budget day of %d ms: want 1 s to 24 h", ms)
		}
		cal.DayLength = d
	}
	return cal, nil
}
