package rgpolicy

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sort"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// The cluster-wide views: information_schema.cluster_statements_summary,
// information_schema.cluster_resource_group_usage and SHOW CLUSTER
// RESOURCE GROUP USAGE hold every live proxy's rows, each with its
// INSTANCE first, as TiDB's cluster_ tables do. They are gathered when
// asked (tokenclient.ClusterInspect: rgserver's leader asks every proxy
// on its Inspect stream and answers within 500 ms), filtered by the
// asking session's privileges here (and, as group names, by rgserver and
// every answering proxy), and rendered like every virtual table: strings
// as hex literals, numbers only once they read as numbers. A proxy that
// did not answer in time shows as one row with its INSTANCE and every
// other column NULL.
//
// The Policy is also this proxy's tokenclient.Inspector: it answers the
// leader's requests with its own rows.

// ClusterInspector gathers cluster-wide views (tokenclient.Client). Safe
// for concurrent use.
type ClusterInspector interface {
	ClusterInspect(ctx context.Context, kind tokenclient.InspectKind, groups []string) (*tokenclient.ClusterView, error)
}

// maxPushedGroups: a session that may read more groups than this asks
// for every group's rows and keeps its own here (rgserver takes at most
// 1,000 names).
const maxPushedGroups = 1000

// instanceColumn is the cluster views' first column.
var instanceColumn = vcol{name: "INSTANCE"}

// Errors of the cluster views, as the client sees them.
var (
	errClusterUnavailable = rgproxyError("rgproxy: cluster-wide views are gathered through rgserver, which could not be reached (or named no leader) within 1 s; " +
		"SHOW RESOURCE GROUP USAGE and information_schema.statements_summary show this proxy alone")
	errClusterBusy = rgproxyError("rgproxy: rgserver is gathering as many cluster-wide views as it takes at once; try again in a moment")
	errClusterOff  = rgproxyError("rgproxy: cluster-wide views need rgserver; this proxy has no token client")
)

// clusterError is what a session's statement answers when a view could
// not be gathered: readable MySQL text, never gRPC's.
func clusterError(err error) error {
	switch {
	case errors.Is(err, tokenclient.ErrUnavailable):
		return errClusterUnavailable
	case errors.Is(err, tokenclient.ErrInspectBusy):
		return errClusterBusy
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errClusterUnavailable
	}
	return rgproxyError("rgproxy: cluster-wide view: " + err.Error())
}

// gather asks for kind's rows of the groups the session may read.
func (s *session) gather(ctx context.Context, be mysqlproto.Backend, kind tokenclient.InspectKind) (*tokenclient.ClusterView, func(string) bool, error) {
	if s.p.cluster == nil {
		return nil, nil, errClusterOff
	}
	own, err := s.readableSet(ctx, be)
	if err != nil {
		return nil, nil, err
	}
	var keep func(string) bool
	var groups []string
	if own != nil {
		keep = func(g string) bool { return own[g] }
		if len(own) <= maxPushedGroups {
			groups = make([]string, 0, len(own))
			for g := range own {
				groups = append(groups, g)
			}
			sort.Strings(groups)
		}
	}
	v, err := s.p.cluster.ClusterInspect(ctx, kind, groups)
	if err != nil {
		return nil, nil, clusterError(err)
	}
	return v, keep, nil
}

// clusterTable builds a cluster view's virtual table.
func (s *session) clusterTable(ctx context.Context, be mysqlproto.Backend, name string) (*vtable, error) {
	if name == vtClusterSummary {
		v, keep, err := s.gather(ctx, be, tokenclient.InspectStatements)
		if err != nil {
			return nil, err
		}
		return clusterSummaryTable(v, keep), nil
	}
	v, keep, err := s.gather(ctx, be, tokenclient.InspectUsage)
	if err != nil {
		return nil, err
	}
	t, _ := clusterUsageTable(v, keep)
	return t, nil
}

// clusterSummaryTable is cluster_statements_summary: INSTANCE, then
// statements_summary's columns; each instance's shapes as it sent them
// (heaviest first), instances in order, then one row per instance that
// did not answer.
func clusterSummaryTable(v *tokenclient.ClusterView, keep func(string) bool) *vtable {
	t := &vtable{cols: append([]vcol{instanceColumn}, summaryColumns...)}
	for _, in := range v.Instances {
		for _, r := range in.Statements {
			if keep != nil && !keep(r.Group) {
				continue
			}
			row := append([]string{in.Instance}, summaryRow(r)...)
			t.rows = append(t.rows, cellsOf(row))
		}
	}
	t.rows = append(t.rows, unansweredRows(v, len(t.cols))...)
	return t
}

// clusterUsageTable is cluster_resource_group_usage and SHOW CLUSTER
// RESOURCE GROUP USAGE: INSTANCE, then SHOW RESOURCE GROUP USAGE's
// columns, sorted by group and instance, then one row per instance that
// did not answer; as a virtual table and as text (NULL = nil).
func clusterUsageTable(v *tokenclient.ClusterView, keep func(string) bool) (*vtable, [][]*string) {
	t := &vtable{cols: []vcol{instanceColumn}}
	for i, c := range usageColumns {
		t.cols = append(t.cols, vcol{name: c, numeric: i >= 1 && i <= 3})
	}
	type irow struct {
		instance string
		u        tokenclient.UsageRow
	}
	var rows []irow
	for _, in := range v.Instances {
		for _, u := range in.Usage {
			if keep == nil || keep(u.Group) {
				rows = append(rows, irow{in.Instance, u})
			}
		}
	}
	slices.SortStableFunc(rows, func(a, b irow) int {
		return cmp.Or(cmp.Compare(a.u.Group, b.u.Group), cmp.Compare(a.instance, b.instance))
	})
	for _, r := range rows {
		t.rows = append(t.rows, cellsOf(append([]string{r.instance}, usageRow(r.u.GroupUsage, r.u.CPUSource)...)))
	}
	t.rows = append(t.rows, unansweredRows(v, len(t.cols))...)
	return t, t.rows
}

// unansweredRows are the rows of the instances that did not answer in
// time: INSTANCE, every other column NULL.
func unansweredRows(v *tokenclient.ClusterView, ncols int) [][]*string {
	var rows [][]*string
	for _, inst := range v.Unanswered {
		row := make([]*string, ncols)
		row[0] = &inst
		rows = append(rows, row)
	}
	return rows
}

// showClusterUsage answers SHOW CLUSTER RESOURCE GROUP USAGE [LIKE |
// WHERE]: itself without a filter, else as a rewrite over the derived
// table, as SHOW RESOURCE GROUP USAGE.
func (s *session) showClusterUsage(ctx context.Context, be mysqlproto.Backend, filter string) mysqlproto.Verdict {
	v, keep, err := s.gather(ctx, be, tokenclient.InspectUsage)
	if err != nil {
		return errReply(err)
	}
	t, rows := clusterUsageTable(v, keep)
	if filter != "" {
		return mysqlproto.Verdict{Rewrite: "SELECT * FROM " + derivedTable(t) +
			" AS `cluster_resource_group_usage` " + likeOnName(filter)}
	}
	cols := make([]string, len(t.cols))
	for i, c := range t.cols {
		cols[i] = c.name
	}
	return mysqlproto.Verdict{Reply: &mysqlproto.Reply{Columns: cols, Rows: rows}}
}

var _ tokenclient.Inspector = (*Policy)(nil)

// InspectStatements implements tokenclient.Inspector: this proxy's
// statement shapes of the groups keep accepts, heaviest (by total
// latency) first, so that a reply cut to its size keeps those.
func (p *Policy) InspectStatements(keep func(string) bool) []tokenclient.StatementSummary {
	shapes := p.shapes.summary(keep)
	slices.SortStableFunc(shapes, func(a, b ShapeSummary) int { return cmp.Compare(b.SumLatency, a.SumLatency) })
	return shapes
}

// InspectUsage implements tokenclient.Inspector: this proxy's usage of
// the groups keep accepts, the busiest first (then those that throttled),
// so that a reply cut to its size keeps those.
func (p *Policy) InspectUsage(keep func(string) bool) []tokenclient.UsageRow {
	cpu := p.cpu.inForce().String()
	var out []tokenclient.UsageRow
	for _, u := range p.tokens.Usage(p.clk.Now()) {
		if keep == nil || keep(u.Group) {
			out = append(out, tokenclient.UsageRow{GroupUsage: u, CPUSource: cpu})
		}
	}
	slices.SortStableFunc(out, func(a, b tokenclient.UsageRow) int {
		return cmp.Or(cmp.Compare(b.RUPerSec, a.RUPerSec), cmp.Compare(b.Throttled, a.Throttled))
	})
	return out
}
