package rgpolicy

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// What rgproxy's status console shows (cmd/rgproxy serves it as
// /api/console): the token client's view of every group, the policy's
// counts per group, and the heaviest statement shapes — their digest text,
// never a literal.

// GroupOverview is one group as this proxy sees it: the token client's
// view and the policy's counts since the group's series were made here
// (its first statement, or its first since it was last forgotten).
type GroupOverview struct {
	tokenclient.GroupOverview
	// Statements counts the metered statements charged to the group
	// (rgproxy_group_statements_total, every class).
	Statements uint64
	// WouldThrottle and WouldWait count the statements of a group in MODE
	// WARN that ENFORCE would have refused or made wait
	// (rgproxy_would_throttle_total, rgproxy_would_wait_total).
	WouldThrottle, WouldWait uint64
}

// Overview is what this proxy knows of its groups and statements.
type Overview struct {
	// Groups are tokenclient.Overview's, with the policy's counts.
	Groups []GroupOverview
	// Total, InUse, Degraded, Connected and Revision are
	// tokenclient.Overview's.
	Total, InUse        int
	Degraded, Connected bool
	Revision            int64
	// CPUSource and WriteSource are where statements' CPU time and
	// written bytes come from now.
	CPUSource, WriteSource string
	// Shapes are the statement shapes with the most RU in all, heaviest
	// first (statements_summary's rows: digest text, no literal);
	// ShapesHeld is how many shapes the proxy holds.
	Shapes     []ShapeSummary
	ShapesHeld int
}

// Overview returns at most groups groups (those in use here first, by
// RU/s; then the others by name) and the shapes heaviest shapes. Its cost
// is a walk over the groups and the shapes, a lock's chunk at a time.
func (p *Policy) Overview(groups, shapes int) Overview {
	to := p.tokens.Overview(p.clk.Now(), groups)
	o := Overview{
		Total: to.Total, InUse: to.InUse, Degraded: to.Degraded, Connected: to.Connected, Revision: to.Revision,
		CPUSource: p.CPUSourceInForce(), WriteSource: p.WriteSourceInForce(),
		Groups: make([]GroupOverview, len(to.Groups)),
	}
	for i, g := range to.Groups {
		o.Groups[i] = GroupOverview{GroupOverview: g}
		if g.InUse {
			p.metrics.counts(&o.Groups[i])
		}
	}
	o.Shapes, o.ShapesHeld = p.shapes.heaviest(shapes)
	return o
}

// errNoServiceLimit: the groups' store keeps no service limit (only
// rgserver's does).
var errNoServiceLimit = errors.New("rgpolicy: the groups' store keeps no service limit")

// ServiceLimit asks the groups' store (rgserver) for the service limit in
// force and its leader's last sharing of it, as SHOW RESOURCE CONTROL
// does; ctx bounds the wait.
func (p *Policy) ServiceLimit(ctx context.Context) (resourcegroup.ServiceLimit, error) {
	ss, ok := p.tokens.Store().(resourcegroup.ServiceLimitStore)
	if !ok {
		return resourcegroup.ServiceLimit{}, errNoServiceLimit
	}
	l, err := ss.ServiceLimit(ctx)
	if err != nil {
		return l, fmt.Errorf("rgpolicy: service limit: %w", err)
	}
	return l, nil
}

// counts fills g's counts from the group's series, if it has them.
func (m *metrics) counts(g *GroupOverview) {
	name := g.Definition.Name
	m.mu.Lock()
	defer m.mu.Unlock()
	gs, ok := m.seen[name]
	if !ok {
		return
	}
	for _, c := range statementClasses {
		g.Statements += uint64(counterValue(gs.stmts[c]))
	}
	// These exist since seeGroup; forgetGroup, which deletes them, holds
	// m.mu too.
	g.WouldThrottle = uint64(counterValue(m.wouldRefuse.WithLabelValues(name)))
	g.WouldWait = uint64(counterValue(m.wouldWaitN.WithLabelValues(name)))
}

// counterValue reads a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
