package main

import (
	_ "embed"
	"math"
	"net/http"
	"slices"
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
// live figures on this proxy, and the heaviest statement shapes. docs/metrics.md,
// "Console", documents the JSON.

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
)

// consoleSource is what /api/console reads.
type consoleSource struct {
	proxyID string
	// policy is nil with --metering=false.
	policy *rgpolicy.Policy
	// conns returns the client sessions open and allowed at once.
	conns func() (open int64, most int)
	now   func() time.Time
}

// proxyConsole is /api/console's answer.
type proxyConsole struct {
	Kind                 string         `json:"kind"`
	Version              string         `json:"version"`
	ProxyID              string         `json:"proxy_id"`
	Time                 time.Time      `json:"time"`
	Metering             bool           `json:"metering"`
	Degraded             bool           `json:"degraded"`
	TokenServerConnected bool           `json:"token_server_connected"`
	CacheRevision        int64          `json:"cache_revision"`
	CPUSource            string         `json:"cpu_source"`
	WriteSource          string         `json:"write_source"`
	Connections          int64          `json:"connections"`
	MaxConnections       int            `json:"max_connections"`
	GroupsTotal          int            `json:"groups_total"`
	GroupsInUse          int            `json:"groups_in_use"`
	GroupsLimit          int            `json:"groups_limit"`
	Groups               []consoleGroup `json:"groups"`
	ShapesHeld           int            `json:"shapes_held"`
	Shapes               []consoleShape `json:"shapes"`
}

// consoleGroup is one group: its definition, then its figures here.
type consoleGroup struct {
	Name string `json:"name"`
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
func (c *consoleSource) snapshot(groups, shapes int) proxyConsole {
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
			Name: d.Name, Burstable: d.Burst.String(), Priority: d.Priority.String(), Mode: d.Mode.String(),
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
	statuspage.WriteJSON(w, c.snapshot(groups, shapes))
}

// round3 rounds to three decimals: the JSON's figures are for people.
func round3(x float64) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	return math.Round(x*1000) / 1000
}
