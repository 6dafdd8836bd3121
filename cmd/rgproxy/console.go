package main

import (
	"context"
	_ "embed"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/internal/statuspage"
	"github.com/rgproxy/rgproxy/internal/textcut"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The console: GET / on the status port is a page (console.html, whose
// inline style and script statuspage.NewConsole heads with what both
// consoles share; nothing fetched from elsewhere) that reads GET
// /api/console every 2 s and shows every group with its limit and its
// live figures on this proxy (children indented under their PARENT), the
// heaviest statement shapes, the service limit as rgserver last said and
// a warning when the groups' RU_PER_SEC add up to more than the backend's
// capacity (CALIBRATE RESOURCE). docs/metrics.md, "Console", documents
// the JSON.

//go:embed console.html
var consoleHTML []byte

// Console bounds: how many groups and shapes /api/console lists by
// default (?groups=, ?shapes=) and at most. With 100,000 groups the page
// lists those in use first and says how many it leaves out.
const (
	consoleGroups    = 500
	consoleMaxGroups = 10000
	consoleShapes    = 10
	consoleMaxShapes = 1000
	// consoleDigestBytes bounds a shape's digest text in the JSON.
	consoleDigestBytes = 1024
	// The service limit is rgserver's: the console asks at most once per
	// serviceLimitTTL (every open page reads every 2 s) and waits at most
	// serviceLimitWait, so that a page load never hangs on rgserver.
	serviceLimitTTL  = 5 * time.Second
	serviceLimitWait = 500 * time.Millisecond
)

// consoleSource is what /api/console reads.
type consoleSource struct {
	proxyID string
	// policy is nil with --metering=false.
	policy *rgpolicy.Policy
	// conns returns the client sessions open and allowed at once.
	conns func() (open int64, most int)
	now   func() time.Time
	// limit caches the service limit (zero value ready: it asks policy).
	limit serviceLimitCache
}

// proxyConsole is /api/console's answer.
type proxyConsole struct {
	Kind                 string    `json:"kind"`
	Version              string    `json:"version"`
	ProxyID              string    `json:"proxy_id"`
	Time                 time.Time `json:"time"`
	Metering             bool      `json:"metering"`
	Degraded             bool      `json:"degraded"`
	TokenServerConnected bool      `json:"token_server_connected"`
	CacheRevision        int64     `json:"cache_revision"`
	CPUSource            string    `json:"cpu_source"`
	WriteSource          string    `json:"write_source"`
	Connections          int64     `json:"connections"`
	MaxConnections       int       `json:"max_connections"`
	GroupsTotal          int       `json:"groups_total"`
	GroupsInUse          int       `json:"groups_in_use"`
	GroupsLimit          int       `json:"groups_limit"`
	// Capacity and ServiceLimit are null with --metering=false.
	Capacity     *consoleCapacity     `json:"capacity"`
	ServiceLimit *consoleServiceLimit `json:"service_limit"`
	// Groups: a child follows its parent (and the parent's other
	// children), Depth deep; a group whose parent is not listed is a root.
	Groups     []consoleGroup `json:"groups"`
	ShapesHeld int            `json:"shapes_held"`
	Shapes     []consoleShape `json:"shapes"`
}

// consoleCapacity is the last check of the groups' RU_PER_SEC against the
// backend's capacity (the gauges rgproxy_backend_capacity_ru_per_second,
// rgproxy_resource_groups_ru_per_second and
// rgproxy_resource_groups_over_capacity), every 10 s.
type consoleCapacity struct {
	// CapacityRUPerSec is CALIBRATE RESOURCE's live answer; 0 while the
	// load is too low to tell.
	CapacityRUPerSec float64 `json:"capacity_ru_per_sec"`
	// LimitsRUPerSec sums the groups' RU_PER_SEC (UNLIMITED left out).
	LimitsRUPerSec float64 `json:"limits_ru_per_sec"`
	Over           bool    `json:"over"`
}

// consoleServiceLimit is SHOW RESOURCE CONTROL's answer, as of AsOf.
type consoleServiceLimit struct {
	// Known: rgserver answered; else Error says why not, and nothing
	// else is filled.
	Known bool   `json:"known"`
	Error string `json:"error,omitempty"`
	// RUPerSec is the limit; null when none (UNLIMITED).
	RUPerSec *uint64 `json:"ru_per_sec"`
	// Source is SQL (ALTER RESOURCE CONTROL) or FLAG (rgserver's
	// --service-limit).
	Source string `json:"source"`
	// RUPerSecSum sums the MODE ENFORCE groups' RU_PER_SEC.
	RUPerSecSum float64 `json:"ru_per_sec_sum"`
	// GroupsWithDemand, DemandRUPerSec and AllocatedRUPerSec are the
	// leader's last sharing of the limit (0 when a follower answered).
	GroupsWithDemand  int       `json:"groups_with_demand"`
	DemandRUPerSec    float64   `json:"demand_ru_per_sec"`
	AllocatedRUPerSec float64   `json:"allocated_ru_per_sec"`
	AsOf              time.Time `json:"as_of"`
}

// consoleGroup is one group: its definition, then its figures here.
type consoleGroup struct {
	Name string `json:"name"`
	// Parent is PARENT ("" for none); Depth the group's place in the
	// listing's tree (0: a root, 1: a child of the row above it...).
	Parent string `json:"parent"`
	Depth  int    `json:"depth"`
	// Background is BACKGROUND's UTILIZATION_LIMIT in percent; 0 when
	// the group is not a background group.
	Background uint8 `json:"background_utilization_limit"`
	// RUPerSec is RU_PER_SEC; null when UNLIMITED.
	RUPerSec  *uint64 `json:"ru_per_sec"`
	Burstable string  `json:"burstable"`
	Priority  string  `json:"priority"`
	Mode      string  `json:"mode"`
	// MaxConcurrency is MAX_CONCURRENCY; 0 = no cap.
	MaxConcurrency uint64 `json:"max_concurrency"`
	// QueryLimit is QUERY_LIMIT as information_schema.resource_groups
	// shows it; "" for none.
	QueryLimit string `json:"query_limit"`
	// Defined: rgserver knows the group (false: used here, dropped a
	// moment ago). InUse: it has state on this proxy.
	Defined bool `json:"defined"`
	InUse   bool `json:"in_use"`
	// Unlimited: never throttled (UNLIMITED, MODE WARN or OFF).
	Unlimited               bool    `json:"unlimited"`
	RUPerSecLast10s         float64 `json:"ru_per_sec_last_10s"`
	StatementsPerSecLast10s float64 `json:"statements_per_sec_last_10s"`
	// Tokens is the local bucket's level (negative: debt); null when the
	// group is never throttled or not in use here.
	Tokens *float64 `json:"tokens"`
	// OwedRU is the debt of the local bucket (statements that cost more
	// than they prepaid): 0 when none. ClearsInSeconds is how long the
	// group's RU_PER_SEC takes to pay it back; null when it owes nothing.
	// A group in debt refuses statements (8252) until about then.
	OwedRU          float64  `json:"owed_ru"`
	ClearsInSeconds *float64 `json:"clears_in_seconds"`
	Throttled       uint64   `json:"throttled"`
	WouldThrottle   uint64   `json:"would_throttle"`
	WouldWait       uint64   `json:"would_wait"`
	Statements      uint64   `json:"statements"`
	// Proxies using the group, as rgserver last said (0: not asked yet).
	Proxies uint32 `json:"proxies"`
}

// consoleShape is one statement shape: its digest text, never a literal.
type consoleShape struct {
	Group             string    `json:"resource_group"`
	Digest            string    `json:"digest"`
	DigestText        string    `json:"digest_text"`
	ExecCount         uint64    `json:"exec_count"`
	TotalRU           float64   `json:"total_ru"`
	AvgRU             float64   `json:"avg_ru"`
	AvgLatencySeconds float64   `json:"avg_latency_seconds"`
	MaxLatencySeconds float64   `json:"max_latency_seconds"`
	Errors            uint64    `json:"errors"`
	LastSeen          time.Time `json:"last_seen"`
}

// queryLimitColumn is QUERY_LIMIT's place in InfoSchemaRow.
var queryLimitColumn = slices.Index(resourcegroup.InfoSchemaColumns(), "QUERY_LIMIT")

// snapshot gathers the console's answer, listing at most groups groups
// and shapes shapes.
func (c *consoleSource) snapshot(ctx context.Context, groups, shapes int) proxyConsole {
	out := proxyConsole{
		Kind: "rgproxy", Version: version, ProxyID: c.proxyID, Time: c.now().UTC(), Metering: c.policy != nil,
		GroupsLimit: groups, Groups: []consoleGroup{}, Shapes: []consoleShape{},
	}
	out.Connections, out.MaxConnections = c.conns()
	if c.policy == nil {
		return out
	}
	o := c.policy.Overview(groups, shapes)
	out.Degraded, out.TokenServerConnected, out.CacheRevision = o.Degraded, o.Connected, o.Revision
	out.CPUSource, out.WriteSource = o.CPUSource, o.WriteSource
	out.GroupsTotal, out.GroupsInUse, out.ShapesHeld = o.Total, o.InUse, o.ShapesHeld
	for _, g := range o.Groups {
		d := g.Definition
		cg := consoleGroup{
			Name: d.Name, Parent: d.Parent, Background: d.Background, Burstable: d.Burst.String(), Priority: d.Priority.String(), Mode: d.Mode.String(),
			MaxConcurrency: d.MaxConcurrency, Defined: g.Defined, InUse: g.InUse, Unlimited: g.Unlimited,
			RUPerSecLast10s: round3(g.RUPerSec), StatementsPerSecLast10s: round3(g.StatementsPerSec),
			Throttled: g.Throttled, WouldThrottle: g.WouldThrottle, WouldWait: g.WouldWait,
			Statements: g.Statements, Proxies: g.Proxies,
		}
		if d.RUPerSec != resourcegroup.Unlimited {
			v := d.RUPerSec
			cg.RUPerSec = &v
		}
		if q := resourcegroup.InfoSchemaRow(d)[queryLimitColumn]; q != nil {
			cg.QueryLimit = *q
		}
		if g.InUse && !g.Unlimited {
			v := round3(g.Tokens)
			cg.Tokens = &v
			if g.Tokens < 0 && d.RUPerSec != resourcegroup.Unlimited && d.RUPerSec > 0 {
				cg.OwedRU = round3(-g.Tokens)
				clears := round3(-g.Tokens / float64(d.RUPerSec))
				cg.ClearsInSeconds = &clears
			}
		}
		out.Groups = append(out.Groups, cg)
	}
	out.Groups = treeOrder(out.Groups)
	capacity, limits, over := c.policy.CapacityStatus()
	out.Capacity = &consoleCapacity{CapacityRUPerSec: round3(capacity), LimitsRUPerSec: round3(limits), Over: over}
	sl := c.limit.get(ctx, c.policy, c.now)
	out.ServiceLimit = &sl
	for _, s := range o.Shapes {
		out.Shapes = append(out.Shapes, consoleShape{
			Group: s.Group, Digest: s.Digest, DigestText: textcut.Marked(s.DigestText, consoleDigestBytes),
			ExecCount: s.ExecCount, TotalRU: round3(s.TotalRU()), AvgRU: round3(s.AvgRRU + s.AvgWRU),
			AvgLatencySeconds: s.AvgLatency().Seconds(), MaxLatencySeconds: s.MaxLatency.Seconds(),
			Errors: s.SumErrors, LastSeen: s.LastSeen.UTC(),
		})
	}
	return out
}

// serveJSON answers /api/console; ?groups= and ?shapes= set how many it
// lists.
func (c *consoleSource) serveJSON(w http.ResponseWriter, r *http.Request) {
	groups, err := statuspage.Limit(r, "groups", consoleGroups, consoleMaxGroups)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	shapes, err := statuspage.Limit(r, "shapes", consoleShapes, consoleMaxShapes)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	statuspage.WriteJSON(w, c.snapshot(r.Context(), groups, shapes))
}

// treeOrder puts each group's children (PARENT) right after it, in
// their order in gs, and sets their Depth; the groups whose parent gs
// does not hold stay roots, in their order. A cycle, which the SQL
// refuses, is cut where it is entered.
func treeOrder(gs []consoleGroup) []consoleGroup {
	listed := make(map[string]bool, len(gs))
	for _, g := range gs {
		listed[g.Name] = true
	}
	isRoot := func(g consoleGroup) bool { return g.Parent == "" || g.Parent == g.Name || !listed[g.Parent] }
	children := map[string][]int{}
	for i, g := range gs {
		if !isRoot(g) {
			children[g.Parent] = append(children[g.Parent], i)
		}
	}
	out := make([]consoleGroup, 0, len(gs))
	placed := make([]bool, len(gs))
	var place func(i, depth int)
	place = func(i, depth int) {
		if placed[i] {
			return
		}
		placed[i] = true
		g := gs[i]
		g.Depth = depth
		out = append(out, g)
		for _, c := range children[g.Name] {
			place(c, depth+1)
		}
	}
	for i, g := range gs {
		if isRoot(g) {
			place(i, 0)
		}
	}
	for i := range gs { // the members of a cycle: no root reaches them
		place(i, 0)
	}
	return out
}

// serviceLimitCache keeps the last answer about the service limit. Its
// zero value is ready.
type serviceLimitCache struct {
	mu     sync.Mutex
	last   consoleServiceLimit
	at     time.Time // of last; zero: never asked
	asking bool
}

// get returns the service limit, asking p when the last answer is older
// than serviceLimitTTL, waiting at most serviceLimitWait. While one
// request asks, the others get the last answer at once.
func (c *serviceLimitCache) get(ctx context.Context, p *rgpolicy.Policy, now func() time.Time) consoleServiceLimit {
	c.mu.Lock()
	if c.asking || (!c.at.IsZero() && now().Sub(c.at) < serviceLimitTTL) {
		defer c.mu.Unlock()
		if c.at.IsZero() {
			return consoleServiceLimit{Error: "rgserver has not answered yet"}
		}
		return c.last
	}
	c.asking = true
	c.mu.Unlock()

	// A page closed meanwhile must not leave an error cached.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serviceLimitWait)
	defer cancel()
	l, err := p.ServiceLimit(ctx)
	v := consoleServiceLimit{AsOf: now().UTC()}
	if err != nil {
		v.Error = err.Error()
	} else {
		v.Known, v.Source = true, "SQL"
		if l.FromFlag {
			v.Source = "FLAG"
		}
		if l.RUPerSec > 0 {
			r := l.RUPerSec
			v.RUPerSec = &r
		}
		v.RUPerSecSum, v.GroupsWithDemand = round3(l.RUPerSecSum), l.Groups
		v.DemandRUPerSec, v.AllocatedRUPerSec = round3(l.Demand), round3(l.Allocated)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last, c.at, c.asking = v, now(), false
	return v
}

// round3 rounds to three decimals: the JSON's figures are for people.
func round3(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return math.Round(x*1000) / 1000
}
