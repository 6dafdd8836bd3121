package tokenserver

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rgproxy/rgproxy/resourcegroup"
	pb "github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// The leader's side of budgets (docs/budgets.md, design §7.12): the
// budget book follows the groups' definitions with the allocator, spends
// what the reports bring, rolls its windows on a timer and is seeded
// from the usage history once a new term has loaded it. A verdict that
// changes clamps the allocator (THROTTLE) and is pushed to every token
// stream at once (TokenResponse.budgets), so that it reaches the proxies
// within the time of one message.

// budgetTick is how often the leader rolls the budgets' windows over (and
// seeds them once the usage history has loaded): an action lifts within
// this of its window's end.
const budgetTick = 100 * time.Millisecond

// pushHub wakes the token streams when they have something to push: a
// group's budget verdict changed, or the service limit's layer wants
// their proxies to ask again (Allocator.TakeReasks).
type pushHub struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func newPushHub() *pushHub { return &pushHub{subs: map[chan struct{}]struct{}{}} }

// subscribe returns a channel that receives when there is news, and
// the function that ends the subscription.
func (h *pushHub) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs, ch)
		h.mu.Unlock()
	}
}

// wake tells every stream, without waiting on any.
func (h *pushHub) wake() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// setGroupLocked applies a group's definition to the allocator and the
// budget book. Called with s.mu held.
func (s *Server) setGroupLocked(g resourcegroup.Group, now time.Time) {
	defer s.checkOvercommitLocked()
	had := s.budgets.has(g.Name)
	var oldMode resourcegroup.Mode
	if had {
		oldMode = s.budgets.groups[g.Name].base.Mode
	}
	s.budgets.set(g, now)
	if !s.budgets.has(g.Name) {
		s.alloc.SetGroup(g.Name, SettingsOf(g), now)
		if had {
			s.budgetVerdictGone(g.Name)
		}
		return
	}
	s.applyVerdictLocked(g.Name, now)
	e := s.budgets.groups[g.Name]
	if had && oldMode != e.base.Mode && e.verdict.Action != 0 {
		// The same verdict, now applied or only reported: the proxies
		// hear it again.
		s.budgets.gen++
		e.gen = s.budgets.gen
		s.pushHub.wake()
	}
	s.alloc.SetGroup(g.Name, effective(e.base, e.verdict), now)
}

// removeGroupLocked forgets a dropped group. Called with s.mu held.
func (s *Server) removeGroupLocked(name string) {
	s.alloc.RemoveGroup(name)
	s.checkOvercommitLocked()
	if s.budgets.has(name) {
		s.budgets.drop(name)
		s.budgetVerdictGone(name)
	}
}

// budgetVerdictGone: the group no longer has budgets; whatever they did
// lifts.
func (s *Server) budgetVerdictGone(name string) {
	s.budgets.gen++
	s.pushHub.wake()
	s.log.Info("budget verdict lifted: the group has no budgets now", "resource_group", name)
}

// applyVerdictLocked takes group's verdict at now: when it changed, the
// allocator gets the group's effective settings, the change is counted
// and logged, and the streams are woken. Called with s.mu held.
func (s *Server) applyVerdictLocked(name string, now time.Time) {
	e := s.budgets.groups[name]
	if e == nil {
		return
	}
	v := e.state.Verdict(now)
	if v.Same(e.verdict) {
		return // what was spent moved, not what the budgets do
	}
	old := e.verdict
	e.verdict = v
	s.budgets.gen++
	e.gen = s.budgets.gen
	if s.alloc.Group(name) != nil {
		s.alloc.SetGroup(name, effective(e.base, v), now)
	}
	enforced := e.base.Mode == resourcegroup.ModeEnforce
	if v.Action != 0 && (v.Action != old.Action || v.Period != old.Period || v.Percent != old.Percent) {
		s.budgetActions.WithLabelValues(name, strings.ToLower(v.Period.String()), strings.ToLower(v.Action.String())).Inc()
		s.log.Warn("budget trigger crossed", "resource_group", name, "budget", v.String(),
			"spent_ru", v.Spent, "budget_ru", v.Budget, "window_end", v.End.UTC().Format(time.RFC3339), "enforced", enforced)
	} else if v.Action == 0 {
		s.log.Info("budget action lifted: its window rolled over", "resource_group", name, "was", old.String())
	}
	s.pushHub.wake()
}

// spendBudgetLocked adds ru spent by group (the bounded figures the
// usage history records). Called with s.mu held, by the leader.
func (s *Server) spendBudgetLocked(name string, ru float64, now time.Time) {
	if s.budgets.spend(name, ru, now) {
		s.applyVerdictLocked(name, now)
	}
}

// budgetChores rolls the windows over and, once the term's usage history
// has loaded, seeds the book from it.
func (s *Server) budgetChores(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, name := range s.budgets.roll(now) {
		s.applyVerdictLocked(name, now)
	}
	if s.budgets.seeded {
		return
	}
	s.usage.mu.Lock()
	loaded := s.usage.loaded
	s.usage.mu.Unlock()
	if !loaded {
		return
	}
	for name, e := range s.budgets.groups {
		for _, w := range e.state.Windows(now) {
			if spent, ok := s.usage.spentRU(name, w.Start, now); ok {
				e.state.Seed(w.Budget.Period, w.Start, spent, now)
			}
		}
		s.applyVerdictLocked(name, now)
	}
	s.budgets.seeded = true
	s.pushHub.wake() // the verdicts held back until now
	s.log.Info("budgets seeded from the usage history", "groups", len(s.budgets.groups))
}

// newTermBudgetsLocked starts a term's book: windows at now, nothing
// spent until the usage history seeds them; the allocator gets the
// groups' own settings back. Called with s.mu held.
func (s *Server) newTermBudgetsLocked(now time.Time) {
	s.budgets.reset(now)
	for name, e := range s.budgets.groups {
		e.verdict = resourcegroup.BudgetVerdict{}
		s.budgets.gen++
		e.gen = s.budgets.gen
		if s.alloc.Group(name) != nil {
			s.alloc.SetGroup(name, e.base, now)
		}
	}
	s.pushHub.wake()
}

// budgetSent is what a token stream told its proxy of each group's
// verdict: in gens the book's generation of it (0: the group has no
// budgets), or budgetNotSent for a group the stream named whose verdict
// waits for the term's seed; marked holds the groups whose entry is not
// 0, so that a wake looks at them and the book's groups, never at every
// group the stream named (100,000 groups on every stream).
type budgetSent struct {
	gens   map[string]uint64
	marked map[string]struct{}
}

func newBudgetSent() *budgetSent {
	return &budgetSent{gens: map[string]uint64{}, marked: map[string]struct{}{}}
}

func (b *budgetSent) set(name string, gen uint64) {
	b.gens[name] = gen
	if gen != 0 {
		b.marked[name] = struct{}{}
	} else {
		delete(b.marked, name)
	}
}

// budgetNotSent marks a group whose verdict a stream has not sent yet.
const budgetNotSent = ^uint64(0)

// budgetUpdatesLocked returns the verdicts of names (nil: every group
// the stream named before) that the stream has not sent yet, and notes
// them as sent. Called with s.mu held.
func (s *Server) budgetUpdatesLocked(sent *budgetSent, names []string, now time.Time) []*pb.GroupBudget {
	var out []*pb.GroupBudget
	check := func(name string) {
		var gen uint64
		e := s.budgets.groups[name]
		if e != nil {
			gen = e.gen
		}
		if g, ok := sent.gens[name]; ok && g == gen {
			return
		}
		if e != nil && !s.budgets.seeded {
			// A new term's book counts only what this term saw until the
			// usage history seeds it: the proxy keeps the verdict it has
			// (a REFUSE from the last term holds) until then.
			sent.set(name, budgetNotSent)
			return
		}
		sent.set(name, gen)
		gb := &pb.GroupBudget{Group: name}
		if e != nil && e.verdict.Action != 0 {
			v := e.verdict
			gb.Action = v.Action.String()
			gb.ThrottleRuPerSec = v.ThrottleRUPerSec
			gb.Period = v.Period.String()
			gb.BudgetRu = v.Budget
			gb.SpentRu = v.Spent
			gb.Percent = v.Percent
			gb.WindowEndUnixMs = v.End.UnixMilli()
			gb.ReportOnly = e.base.Mode != resourcegroup.ModeEnforce
		}
		out = append(out, gb)
	}
	if names == nil {
		for name := range s.budgets.groups {
			if _, ok := sent.gens[name]; ok {
				check(name)
			}
		}
		for name := range sent.marked {
			check(name)
		}
	} else {
		for _, name := range names {
			check(name)
		}
	}
	return out
}

// Bounds of a Budgets request and answer.
const (
	// maxBudgetGroups bounds the names of one request.
	maxBudgetGroups = 1000
	// budgetAnswerBytes bounds one answer (encoded rows), well within
	// gRPC's 4 MiB: about 30,000 budgets.
	budgetAnswerBytes = 3 << 20
)

// Budgets implements tokenpb.UsageServiceServer: the groups' budgets in
// their current windows, from the leader's book.
func (us usageService) Budgets(_ context.Context, req *pb.BudgetsRequest) (*pb.BudgetsResponse, error) {
	s := us.s
	if !s.IsLeader() {
		return &pb.BudgetsResponse{NotLeader: &pb.NotLeader{LeaderAddr: s.LeaderAddr()}}, nil
	}
	if req.GetAllGroups() == (len(req.GetGroups()) > 0) {
		return nil, status.Errorf(codes.InvalidArgument, "malformed budgets request: want all_groups or 1 to %d group names", maxBudgetGroups)
	}
	if n := len(req.GetGroups()); n > maxBudgetGroups {
		return nil, status.Errorf(codes.InvalidArgument, "malformed budgets request: %d groups, at most %d", n, maxBudgetGroups)
	}
	var keep map[string]bool
	if !req.GetAllGroups() {
		keep = make(map[string]bool, len(req.GetGroups()))
		for i, g := range req.GetGroups() {
			if err := resourcegroup.ValidateName(g); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "malformed budgets request: groups[%d]: %v", i, err)
			}
			keep[resourcegroup.NormalizeName(g)] = true
		}
	}
	now := s.now()
	rows := s.budgetRows(keep, now)
	s.mu.Lock()
	seeded := s.budgets.seeded
	s.mu.Unlock()
	size, truncated := 0, false
	for i, r := range rows {
		if size += proto.Size(r) + 4; size > budgetAnswerBytes {
			rows, truncated = rows[:i], true
			break
		}
	}
	return &pb.BudgetsResponse{Rows: rows, Seeded: seeded, Truncated: truncated,
		TimeZone: s.cfg.BudgetLocation.String(), DayLengthMs: s.cfg.BudgetDayLength.Milliseconds()}, nil
}

// budgetRows are the book's rows at now for the groups in keep (nil:
// all), by group and period.
func (s *Server) budgetRows(keep map[string]bool, now time.Time) []*pb.BudgetRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rows []*pb.BudgetRow
	for name, e := range s.budgets.groups {
		if keep != nil && !keep[name] {
			continue
		}
		rate := e.rate.perSec(now)
		for _, w := range e.state.Windows(now) {
			r := &pb.BudgetRow{
				ResourceGroup: name, Period: w.Budget.Period.String(), BudgetRu: w.Budget.RU, SpentRu: w.Spent,
				WindowStartUnixMs: w.Start.UnixMilli(), WindowEndUnixMs: w.End.UnixMilli(), RuPerSec: rate,
				Enforced: e.base.Mode == resourcegroup.ModeEnforce,
			}
			if x := projectExhaustion(float64(w.Budget.RU)-w.Spent, rate, now, w.End, w.Exhausted); !x.IsZero() {
				r.ProjectedExhaustionUnixMs = x.UnixMilli()
			}
			if w.Verdict.Action != 0 {
				r.Action = resourcegroup.BudgetTrigger{Percent: w.Verdict.Percent, Action: w.Verdict.Action,
					ThrottleRUPerSec: w.Verdict.ThrottleRUPerSec}.SQL()
			}
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b *pb.BudgetRow) int {
		if c := strings.Compare(a.ResourceGroup, b.ResourceGroup); c != 0 {
			return c
		}
		ap, _ := resourcegroup.ParseBudgetPeriod(a.Period)
		bp, _ := resourcegroup.ParseBudgetPeriod(b.Period)
		return int(ap) - int(bp)
	})
	return rows
}

// budgetCollector writes the budgets' series at each scrape, on the
// leader (a follower's book spends nothing).
type budgetCollector struct {
	s                                *Server
	spent, limit, eta, inForce, rate *prometheus.Desc
}

func newBudgetCollector(s *Server) *budgetCollector {
	l := []string{"resource_group", "period"}
	return &budgetCollector{
		s: s,
		spent: prometheus.NewDesc("rgserver_budget_spent_ru",
			"RU the budget's current window has spent (the leader's budget book: the usage history's figures).", l, nil),
		limit: prometheus.NewDesc("rgserver_budget_limit_ru",
			"RU the budget allows per window.", l, nil),
		eta: prometheus.NewDesc("rgserver_budget_exhaustion_seconds",
			"Seconds until the budget runs out at the group's spending of the last 30 s, when that is before its window ends (0 once spent); absent otherwise.", l, nil),
		inForce: prometheus.NewDesc("rgserver_budget_action_in_force",
			"1 while a budget's trigger holds its action (by action: notify, throttle, refuse); enforced is \"false\" for a MODE WARN or OFF group, which only reports it.",
			append(l, "action", "enforced"), nil),
		rate: prometheus.NewDesc("rgserver_budget_window_end_timestamp_seconds",
			"When the budget's current window ends and its action lifts (Unix seconds).", l, nil),
	}
}

func (c *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.spent, c.limit, c.eta, c.inForce, c.rate} {
		ch <- d
	}
}

func (c *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	if !c.s.IsLeader() {
		return
	}
	now := c.s.now()
	for _, r := range c.s.budgetRows(nil, now) {
		p := strings.ToLower(r.Period)
		ch <- prometheus.MustNewConstMetric(c.spent, prometheus.GaugeValue, r.SpentRu, r.ResourceGroup, p)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(r.BudgetRu), r.ResourceGroup, p)
		ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, float64(r.WindowEndUnixMs)/1000, r.ResourceGroup, p)
		if r.ProjectedExhaustionUnixMs > 0 {
			eta := max(float64(r.ProjectedExhaustionUnixMs-now.UnixMilli())/1000, 0)
			ch <- prometheus.MustNewConstMetric(c.eta, prometheus.GaugeValue, eta, r.ResourceGroup, p)
		}
		if r.Action != "" {
			a := "notify"
			switch {
			case strings.Contains(r.Action, "REFUSE"):
				a = "refuse"
			case strings.Contains(r.Action, "THROTTLE"):
				a = "throttle"
			}
			ch <- prometheus.MustNewConstMetric(c.inForce, prometheus.GaugeValue, 1, r.ResourceGroup, p, a, fmt.Sprint(r.Enforced))
		}
	}
}

// BudgetOverview returns at most limit of the budgets' rows at now, the
// most spent (by share of the budget) first, and how many there are: the
// console's Budgets table. Only the leader's book spends; a follower's
// rows are what it held when it last led, or none.
func (s *Server) BudgetOverview(limit int) (rows []*pb.BudgetRow, total int) {
	rows = s.budgetRows(nil, s.now())
	share := func(r *pb.BudgetRow) float64 { return r.GetSpentRu() / float64(max(r.GetBudgetRu(), 1)) }
	slices.SortStableFunc(rows, func(a, b *pb.BudgetRow) int { return cmp.Compare(share(b), share(a)) })
	return rows[:min(len(rows), max(limit, 0))], len(rows)
}
