package main

import (
	_ "embed"
	"errors"
	"math"
	"net/http"
	"time"

	"github.com/rgproxy/rgproxy/internal/statuspage"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// The console: GET / on the status port is a page (console.html, whose
// inline style and script statuspage.NewConsole heads with what both
// consoles share; nothing fetched from elsewhere) that reads GET
// /api/console every 2 s and shows every group cluster-wide: its limit,
// its global bucket, the proxies using it and what they reported. Every
// replica answers; a follower shows what it knows and names the leader.
// docs/metrics.md, "Console", documents the JSON.

//go:embed console.html
var consoleHTML []byte

// How many groups /api/console lists by default (?groups=) and at most.
const (
	consoleGroups    = 500
	consoleMaxGroups = 10000
)

// consoleSource is what /api/console reads.
type consoleSource struct {
	srv *tokenserver.Server
	// name and advertise are --name and --advertise-addr.
	name, advertise string
}

// serverConsole is /api/console's answer.
type serverConsole struct {
	Kind          string    `json:"kind"`
	Version       string    `json:"version"`
	Name          string    `json:"name"`
	AdvertiseAddr string    `json:"advertise_addr"`
	Time          time.Time `json:"time"`
	Leader        bool      `json:"leader"`
	LeaderAddr    string    `json:"leader_addr"`
	// Etcd says why etcd refuses writes; "" while it does not.
	Etcd               string `json:"etcd"`
	GrantingFromMemory bool   `json:"granting_from_memory"`
	Insecure           bool   `json:"insecure"`
	TokenStreams       int64  `json:"token_streams"`
	// watch_streams is the page's name (kept) for the settings streams.
	WatchStreams int64         `json:"watch_streams"`
	GroupsTotal  int           `json:"groups_total"`
	GroupsInUse  int           `json:"groups_in_use"`
	GroupsLimit  int           `json:"groups_limit"`
	Groups       []serverGroup `json:"groups"`
	// Credentials: what each credential took, reported and had dropped
	// or refused on this replica (docs/security.md).
	Credentials []serverCredential `json:"credentials"`
	// Budgets: the budgets in their current windows, the most spent
	// first, at most as many as groups; BudgetsTotal how many there are.
	Budgets      []serverBudget `json:"budgets"`
	BudgetsTotal int            `json:"budgets_total"`
}

// serverBudget is one budget of a group in its current window.
type serverBudget struct {
	Group    string  `json:"resource_group"`
	Period   string  `json:"period"`
	BudgetRU uint64  `json:"budget_ru"`
	SpentRU  float64 `json:"spent_ru"`
	// RUPerSec is the group's spending over the last 30 s.
	RUPerSec    float64   `json:"ru_per_sec"`
	WindowStart time.Time `json:"window_start"`
	WindowEnd   time.Time `json:"window_end"`
	// ProjectedExhaustion is when the budget runs out at RUPerSec; null
	// when not within the window.
	ProjectedExhaustion *time.Time `json:"projected_exhaustion"`
	// Action is the strongest crossed trigger, as SQL writes it ("" for
	// none); Enforced: applied (MODE ENFORCE), else only reported.
	Action   string `json:"action"`
	Enforced bool   `json:"enforced"`
}

// serverCredential is one credential as this replica saw it.
type serverCredential struct {
	Name         string  `json:"name"`
	TokenStreams int     `json:"token_streams"`
	GrantedRU    float64 `json:"granted_ru"`
	ReportedRU   float64 `json:"reported_ru"`
	DroppedRU    float64 `json:"dropped_ru"`
	Refused      float64 `json:"refused"`
}

// serverGroup is one group as this replica sees it.
type serverGroup struct {
	Name string `json:"name"`
	// RUPerSec is RU_PER_SEC; null when UNLIMITED.
	RUPerSec  *uint64 `json:"ru_per_sec"`
	Burstable string  `json:"burstable"`
	Mode      string  `json:"mode"`
	// Limited: the group can be throttled; Tokens and Capacity (its
	// global bucket's level and size, RU) are null when it cannot.
	Limited  bool     `json:"limited"`
	Tokens   *float64 `json:"tokens"`
	Capacity *float64 `json:"capacity"`
	// Proxies holding a live slot in the group.
	Proxies int `json:"proxies"`
	// What the group's proxies report, per second (averaged over about
	// the last 5 s of their reports), and in all since this replica first
	// led: RU consumed, statements run, statements refused with 8252.
	RUReported         float64 `json:"ru_per_sec_reported"`
	StatementsReported float64 `json:"statements_per_sec_reported"`
	ThrottledReported  float64 `json:"throttled_per_sec_reported"`
	// Statements refused other than by 8252 (a budget's REFUSE) per
	// second, and the RU per second of those that waited for tokens, over
	// the same 5 s: who is held back now.
	RefusedReported  float64 `json:"refused_per_sec_reported"`
	WaitedRUReported float64 `json:"waited_ru_per_sec_reported"`
	RUTotal          float64 `json:"ru_total"`
	StatementsTotal  float64 `json:"statements_total"`
	ThrottledTotal   float64 `json:"throttled_total"`
}

// snapshot gathers the console's answer, listing at most groups groups.
func (c *consoleSource) snapshot(groups int) serverConsole {
	o := c.srv.Overview(groups)
	out := serverConsole{
		Kind: "rgserver", Version: versionString(), Name: c.name, AdvertiseAddr: c.advertise, Time: o.At.UTC(),
		Leader: o.Leader, LeaderAddr: o.LeaderAddr, Etcd: o.Etcd, GrantingFromMemory: o.GrantingFromMemory,
		Insecure: o.Insecure, TokenStreams: o.TokenStreams, WatchStreams: o.SettingsStreams,
		GroupsTotal: o.Total, GroupsInUse: o.InUse, GroupsLimit: groups, Groups: make([]serverGroup, 0, len(o.Groups)),
		Credentials: make([]serverCredential, 0, len(o.Credentials)),
	}
	for _, c := range o.Credentials {
		out.Credentials = append(out.Credentials, serverCredential{Name: c.Name, TokenStreams: c.Streams,
			GrantedRU: round3(c.GrantedRU), ReportedRU: round3(c.ReportedRU), DroppedRU: round3(c.DroppedRU), Refused: c.Refused})
	}
	budgets, total := c.srv.BudgetOverview(groups)
	out.Budgets, out.BudgetsTotal = make([]serverBudget, 0, len(budgets)), total
	for _, b := range budgets {
		sb := serverBudget{Group: b.GetResourceGroup(), Period: b.GetPeriod(), BudgetRU: b.GetBudgetRu(), SpentRU: round3(b.GetSpentRu()),
			RUPerSec: round3(b.GetRuPerSec()), WindowStart: time.UnixMilli(b.GetWindowStartUnixMs()).UTC(),
			WindowEnd: time.UnixMilli(b.GetWindowEndUnixMs()).UTC(), Action: b.GetAction(), Enforced: b.GetEnforced()}
		if ms := b.GetProjectedExhaustionUnixMs(); ms != 0 {
			x := time.UnixMilli(ms).UTC()
			sb.ProjectedExhaustion = &x
		}
		out.Budgets = append(out.Budgets, sb)
	}
	for _, g := range o.Groups {
		sg := serverGroup{
			Name: g.Name, Burstable: g.Settings.Burst.String(), Mode: g.Settings.Mode.String(), Limited: g.Limited,
			Proxies: g.Proxies, RUReported: round3(g.RUPerSec), StatementsReported: round3(g.StatementsPerSec),
			ThrottledReported: round3(g.ThrottledPerSec), RefusedReported: round3(g.RefusedPerSec),
			WaitedRUReported: round3(g.WaitedRUPerSec), RUTotal: round3(g.RU), StatementsTotal: g.Statements,
			ThrottledTotal: g.Throttled,
		}
		if g.Settings.RUPerSec != resourcegroup.Unlimited {
			v := g.Settings.RUPerSec
			sg.RUPerSec = &v
		}
		if g.Limited {
			tokens, capacity := round3(g.Tokens), round3(g.Capacity)
			sg.Tokens, sg.Capacity = &tokens, &capacity
		}
		out.Groups = append(out.Groups, sg)
	}
	return out
}

// serveJSON answers /api/console; ?groups= sets how many groups it lists.
func (c *consoleSource) serveJSON(w http.ResponseWriter, r *http.Request) {
	groups, err := statuspage.Limit(r, "groups", consoleGroups, consoleMaxGroups)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	statuspage.WriteJSON(w, c.snapshot(groups))
}

// chartSpan is a chart's span and bucket count by its name in
// /api/history?span=: the last hour in 30 s buckets from the history's
// seconds, the last day in 5 min buckets from its minutes.
func chartSpan(name string) (span time.Duration, buckets int, ok bool) {
	switch name {
	case "hour":
		return time.Hour, 120, true
	case "day":
		return 24 * time.Hour, 288, true
	}
	return 0, 0, false
}

// serverHistory is /api/history's answer: one group's recorded usage
// over a span, oldest bucket first, every bucket present.
type serverHistory struct {
	Group string `json:"group"`
	Span  string `json:"span"`
	// GranularityS is the history tier read; BucketS each point's length.
	GranularityS int64          `json:"granularity_s"`
	BucketS      int64          `json:"bucket_s"`
	From         time.Time      `json:"from"`
	To           time.Time      `json:"to"`
	Points       []historyPoint `json:"points"`
}

// historyPoint is one bucket of /api/history.
type historyPoint struct {
	// T is the bucket's start, Unix seconds.
	T int64 `json:"t"`
	// RUPerSec is the bucket's average; PeakRUPerSec its busiest
	// interval of the tier.
	RUPerSec     float64 `json:"ru_per_sec"`
	PeakRUPerSec float64 `json:"peak_ru_per_sec"`
	// Counts in the bucket: statements run, refused with 8252, refused
	// otherwise; the estimated RU of the statements that waited.
	Statements float64 `json:"statements"`
	Throttled  float64 `json:"throttled"`
	Refused    float64 `json:"refused"`
	WaitedRU   float64 `json:"waited_ru"`
}

// serveHistory answers /api/history?group=NAME&span=hour|day from the
// leader's usage history; a follower answers 503 naming the leader.
func (c *consoleSource) serveHistory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	span, buckets, ok := chartSpan(q.Get("span"))
	if !ok {
		http.Error(w, "span: want hour or day", http.StatusBadRequest)
		return
	}
	chart, err := c.srv.UsageChart(q.Get("group"), span, buckets)
	switch {
	case errors.Is(err, tokenserver.ErrNotLeader):
		http.Error(w, "the usage history is kept by the leader, "+c.srv.LeaderAddr()+"; its status port shows the charts", http.StatusServiceUnavailable)
		return
	case errors.Is(err, tokenserver.ErrUsageLoading):
		http.Error(w, "the leader is still reading the usage history; ask again in a moment", http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out := serverHistory{Group: chart.Group, Span: q.Get("span"), GranularityS: int64(chart.Granularity / time.Second),
		BucketS: int64(chart.Bucket / time.Second), From: chart.From, To: chart.To, Points: make([]historyPoint, len(chart.Points))}
	for i, p := range chart.Points {
		out.Points[i] = historyPoint{T: p.Start.Unix(), RUPerSec: round3(p.RUPerSec), PeakRUPerSec: round3(p.PeakRUPerSec),
			Statements: p.Statements, Throttled: p.Throttled, Refused: p.Refused, WaitedRU: round3(p.WaitedRU)}
	}
	statuspage.WriteJSON(w, out)
}

// round3 rounds to three decimals: the JSON's figures are for people.
func round3(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return math.Round(x*1000) / 1000
}
