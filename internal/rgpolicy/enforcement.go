package rgpolicy

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// A proxy without a service account (Config.Killer nil) cannot carry out
// QUERY_LIMIT ACTION = KILL. rgserver refuses a new KILL rule while such a
// proxy is live (docs/design.md §7.8), but the rule may predate the proxy:
// then the proxy says so, never silently lets the statement run. It logs an
// ERROR naming the groups, sets rgproxy_query_limit_unenforced for each,
// lists them in /readyz, and counts each of their runaways as
// KILL_UNENFORCED.

// actionKillUnenforced is rgproxy_runaway_total's action for a KILL this
// proxy could not carry out.
const actionKillUnenforced = "KILL_UNENFORCED"

// enforcementPoll is how often the proxy looks whether the groups
// changed (an atomic load); it lists them only when they did.
const enforcementPoll = time.Second

// maxUnenforcedLogged bounds the group names one log line lists.
const maxUnenforcedLogged = 20

// killGroups lists, sorted, the groups whose QUERY_LIMIT kills.
func killGroups(groups []resourcegroup.Group) []string {
	var out []string
	for _, g := range groups {
		if g.QueryLimit != nil && g.QueryLimit.Action == resourcegroup.ActionKill {
			out = append(out, g.Name)
		}
	}
	sort.Strings(out)
	return out
}

// QueryLimitUnenforced lists, sorted, the groups with a QUERY_LIMIT this
// proxy cannot carry out (ACTION = KILL without --admin-user), as last
// seen; nil when it can carry out every rule.
func (p *Policy) QueryLimitUnenforced() []string {
	if l := p.unenforced.Load(); l != nil {
		return slices.Clone(*l)
	}
	return nil
}

// followEnforcement keeps the unenforced groups up to date until ctx ends:
// at once, then whenever the cached groups change.
func (p *Policy) followEnforcement(ctx context.Context) {
	gen := p.tokens.CacheGeneration() - 1 // differs: the first look is now
	for {
		if g := p.tokens.CacheGeneration(); g != gen {
			gen = g
			p.checkEnforcement(ctx)
		}
		t := p.clk.NewTimer(enforcementPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// checkEnforcement compares the groups with a KILL rule against those
// seen before: the new ones are logged at ERROR and get the gauge, the
// gone ones lose it.
func (p *Policy) checkEnforcement(ctx context.Context) {
	groups, err := p.tokens.Store().ListGroups(ctx)
	if err != nil {
		p.logger.Warn("listing the resource groups to check their QUERY_LIMIT", "err", err)
		return
	}
	now := killGroups(groups)
	var before []string
	if l := p.unenforced.Load(); l != nil {
		before = *l
	}
	var added []string
	for _, g := range now {
		if _, ok := slices.BinarySearch(before, g); !ok {
			added = append(added, g)
		}
		p.metrics.unenforced.WithLabelValues(g).Set(1)
	}
	for _, g := range before {
		if _, ok := slices.BinarySearch(now, g); !ok {
			p.metrics.unenforced.DeleteLabelValues(g)
		}
	}
	p.unenforced.Store(&now)
	if len(added) > 0 {
		named := added[:min(len(added), maxUnenforcedLogged)]
		p.logger.Error("this rgproxy cannot enforce QUERY_LIMIT ACTION=KILL: it has no service account on the backend; "+
			"statements of these groups that cross their limit will run to the end. Restart it with --admin-user and --admin-password-file",
			"resource_groups", named, "groups", len(added))
	}
}
