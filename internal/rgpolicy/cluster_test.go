package rgpolicy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// fakeCluster answers ClusterInspect with a fixed view, or err, and
// records what it was asked.
type fakeCluster struct {
	view   *tokenclient.ClusterView
	err    error
	kinds  []tokenclient.InspectKind
	groups [][]string
}

func (f *fakeCluster) ClusterInspect(_ context.Context, kind tokenclient.InspectKind, groups []string) (*tokenclient.ClusterView, error) {
	f.kinds = append(f.kinds, kind)
	f.groups = append(f.groups, groups)
	if f.err != nil {
		return nil, f.err
	}
	// The caller filters: return every group's rows, as a hostile or
	// older rgserver might.
	return f.view, nil
}

func clusterView() *tokenclient.ClusterView {
	seen := time.Unix(1_700_000_000, 0)
	row := func(g string, n uint64) tokenclient.StatementSummary {
		return tokenclient.StatementSummary{Group: g, Digest: fmt.Sprintf("%016x", n), DigestText: "SELECT ? FROM `t` WHERE `card` = ?",
			ExecCount: n, SumLatency: time.Duration(n) * time.Millisecond, MaxLatency: time.Millisecond, FirstSeen: seen, LastSeen: seen}
	}
	use := func(g string, ru float64) tokenclient.UsageRow {
		return tokenclient.UsageRow{GroupUsage: tokenclient.GroupUsage{Group: g, RUPerSec: ru, Tokens: -1, Throttled: 2}, CPUSource: "proc"}
	}
	return &tokenclient.ClusterView{
		Instances: []tokenclient.InstanceView{
			{Instance: "10.0.0.1:4000", Statements: []tokenclient.StatementSummary{row("bound", 3), row("other", 4)},
				Usage: []tokenclient.UsageRow{use("other", 9), use("bound", 1)}},
			{Instance: "10.0.0.2:4000", Statements: []tokenclient.StatementSummary{row("tagged", 5), row("bound", 6)},
				Usage: []tokenclient.UsageRow{use("bound", 2), use("default", 0)}},
		},
		Unanswered: []string{"10.0.0.3:4000"},
	}
}

func newClusterPolicy(tok Tokens, c ClusterInspector) *Policy {
	p, err := New(Config{Tokens: tok, Cluster: c, Settings: Settings{Strict: true, MaxWait: 30 * time.Second},
		CPU: CPUWall, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	return p
}

// cell is a virtual table's cell as text ("NULL" for NULL).
func cell(v *string) string {
	if v == nil {
		return "NULL"
	}
	return *v
}

// rowTexts are rows as text, each row's cells (NULL for nil) joined by
// spaces.
func rowTexts(rows [][]*string) []string {
	var out []string
	for _, r := range rows {
		var cells []string
		for _, c := range r {
			cells = append(cells, cell(c))
		}
		out = append(out, strings.Join(cells, " "))
	}
	return out
}

// TestClusterTables: the cluster views put INSTANCE first and each
// instance's rows after it; an instance that did not answer is one row
// of NULLs; without SUPER a session asks only for the groups it may read
// and keeps only those, whatever comes back; with SUPER every group.
func TestClusterTables(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["tagged"] = resourcegroup.Group{Name: "tagged", RUPerSec: 100}
	tok.tags = map[string]string{resourcegroup.TagBindingKey("route", "/r"): "tagged"}
	st := resourcegroup.NewMemStore()
	tok.store = st
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "tagged", RUPerSec: 100}); err != nil {
		t.Fatal(err)
	}
	if err := st.BindUser(ctx, resourcegroup.Binding{TagKey: "route", TagValue: "/r", Group: "tagged"}); err != nil {
		t.Fatal(err)
	}
	read := func(g grants, table string) (*fakeCluster, []string) {
		t.Helper()
		fc := &fakeCluster{view: clusterView()}
		s := newClusterPolicy(tok, fc).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		s.learnAccount(ctx, g)
		vt, err := s.virtualTable(ctx, table, g)
		if err != nil {
			t.Fatal(err)
		}
		if vt.cols[0].name != "INSTANCE" {
			t.Fatalf("%s's first column %s", table, vt.cols[0].name)
		}
		var rows []string
		for _, r := range vt.rows {
			cells := []string{cell(r[0]), cell(r[1])}
			if table == vtClusterSummary {
				cells = append(cells, cell(r[vt.col("EXEC_COUNT")]), cell(r[vt.col("DIGEST_TEXT")]))
			} else {
				cells = append(cells, cell(r[vt.col("THROTTLED")]), cell(r[vt.col("CPU_SOURCE")]))
			}
			rows = append(rows, strings.Join(cells, " "))
		}
		return fc, rows
	}
	const text = "SELECT ? FROM `t` WHERE `card` = ?"
	fc, rows := read(plainGrants, vtClusterSummary)
	if want := []string{"10.0.0.1:4000 bound 3 " + text, "10.0.0.2:4000 tagged 5 " + text, "10.0.0.2:4000 bound 6 " + text,
		"10.0.0.3:4000 NULL NULL NULL"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("cluster_statements_summary without SUPER:\n%v\nwant\n%v", rows, want)
	}
	if fmt.Sprint(fc.groups) != "[[bound tagged]]" || fc.kinds[0] != tokenclient.InspectStatements {
		t.Errorf("asked %v for %v, want the session's groups", fc.kinds, fc.groups)
	}
	fc, rows = read(superGrants, vtClusterSummary)
	if len(rows) != 5 || fc.groups[0] != nil {
		t.Errorf("cluster_statements_summary with SUPER: %v (asked for %v)", rows, fc.groups)
	}
	fc, rows = read(plainGrants, vtClusterUsage)
	if want := []string{"10.0.0.1:4000 bound 2 proc", "10.0.0.2:4000 bound 2 proc", "10.0.0.3:4000 NULL NULL NULL"}; fmt.Sprint(rows) != fmt.Sprint(want) ||
		fc.kinds[0] != tokenclient.InspectUsage {
		t.Errorf("cluster_resource_group_usage without SUPER: %v", rows)
	}
	_, rows = read(superGrants, vtClusterUsage)
	if want := []string{"10.0.0.1:4000 bound 2 proc", "10.0.0.2:4000 bound 2 proc", "10.0.0.2:4000 default 2 proc",
		"10.0.0.1:4000 other 2 proc", "10.0.0.3:4000 NULL NULL NULL"}; fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("cluster_resource_group_usage with SUPER (by group, then instance):\n%v\nwant\n%v", rows, want)
	}

	// Through Before: the rewrite carries the instances as hex literals.
	fc = &fakeCluster{view: clusterView()}
	s := newClusterPolicy(tok, fc).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	q := query("SELECT INSTANCE, SUM(EXEC_COUNT) FROM information_schema.cluster_statements_summary GROUP BY INSTANCE")
	v := s.Before(ctx, q, superGrants)
	if v.Reply != nil || !strings.Contains(v.Rewrite, sqlText("10.0.0.2:4000")) || !strings.Contains(v.Rewrite, "AS `cluster_statements_summary`") ||
		strings.Contains(v.Rewrite, "10.0.0.2") {
		t.Errorf("rewrite %.300q (reply %v)", v.Rewrite, v.Reply)
	}
	s.After(q, &mysqlproto.Outcome{})
	// SHOW CLUSTER RESOURCE GROUP USAGE: answered here, or rewritten with
	// its filter.
	v = s.Before(ctx, query("SHOW CLUSTER RESOURCE GROUP USAGE"), superGrants)
	if v.Reply == nil || v.Reply.Err != nil || len(v.Reply.Columns) != 7 || v.Reply.Columns[0] != "INSTANCE" || len(v.Reply.Rows) != 5 ||
		cell(v.Reply.Rows[4][0]) != "10.0.0.3:4000" || v.Reply.Rows[4][1] != nil {
		t.Errorf("SHOW CLUSTER RESOURCE GROUP USAGE: %+v", v.Reply)
	}
	q = query("SHOW CLUSTER RESOURCE GROUP USAGE LIKE 'b%'")
	v = s.Before(ctx, q, superGrants)
	if v.Reply != nil || !strings.HasSuffix(v.Rewrite, " AS `cluster_resource_group_usage` WHERE `NAME` LIKE 'b%'") {
		t.Errorf("SHOW CLUSTER RESOURCE GROUP USAGE LIKE: %.200q, %v", v.Rewrite, v.Reply)
	}
	s.After(q, &mysqlproto.Outcome{})
}

// TestClusterErrors: a view that cannot be gathered is a readable 1105,
// never gRPC's text, and the session goes on.
func TestClusterErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		c    ClusterInspector
		want string
	}{
		{&fakeCluster{err: fmt.Errorf("%w: rgserver 127.0.0.1:1: connection error: desc = \"transport: dial\"", tokenclient.ErrUnavailable)}, "could not be reached"},
		{&fakeCluster{err: fmt.Errorf("%w: busy", tokenclient.ErrInspectBusy)}, "try again"},
		{&fakeCluster{err: context.DeadlineExceeded}, "could not be reached"},
		{nil, "no token client"},
	}
	for _, tc := range tests {
		for _, q := range []string{"SELECT * FROM information_schema.cluster_resource_group_usage", "SHOW CLUSTER RESOURCE GROUP USAGE WHERE THROTTLED > 0"} {
			s := newClusterPolicy(testGroups(), tc.c).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
			v := s.Before(ctx, query(q), superGrants)
			if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1105 || !strings.Contains(v.Reply.Err.Message, tc.want) ||
				strings.Contains(v.Reply.Err.Message, "desc =") {
				t.Errorf("%s with %v: %+v, want 1105 saying %q", q, tc.c, v.Reply, tc.want)
			}
			if v := s.Before(ctx, query("SELECT 1"), superGrants); v.Reply != nil {
				t.Errorf("the next statement: %+v", v.Reply)
			}
		}
	}
}

// usageTokens is testGroups with a usage to report.
type usageTokens struct {
	*recordingTokens
	usage []tokenclient.GroupUsage
}

func (u usageTokens) Usage(time.Time) []tokenclient.GroupUsage { return u.usage }

// TestPolicyInspects: what this proxy answers rgserver: its shapes the
// heaviest first, its usage the busiest first, the groups asked only.
func TestPolicyInspects(t *testing.T) {
	tok := usageTokens{recordingTokens: testGroups(), usage: []tokenclient.GroupUsage{
		{Group: "a", RUPerSec: 1}, {Group: "b", RUPerSec: 5}, {Group: "c", Throttled: 3}, {Group: "d"}}}
	p := newClusterPolicy(tok, nil)
	now := time.Unix(1_700_000_000, 0)
	for i, lat := range []time.Duration{time.Millisecond, 9 * time.Millisecond, 3 * time.Millisecond} {
		k := shapeKey{group: "bound", hash: uint64(i + 1)}
		p.shapes.observe(k, nil, digestText{b: []byte(fmt.Sprintf("SELECT %d", i))}, ru.Consumption{RRU: 1}, lat, 0, false, now)
	}
	p.shapes.observe(shapeKey{group: "other", hash: 9}, nil, digestText{b: []byte("SELECT 9")}, ru.Consumption{RRU: 1}, time.Second, 0, false, now)
	var got []string
	for _, s := range p.InspectStatements(func(g string) bool { return g == "bound" }) {
		got = append(got, s.DigestText)
	}
	if fmt.Sprint(got) != "[SELECT 1 SELECT 2 SELECT 0]" {
		t.Errorf("statements by total latency: %v", got)
	}
	got = nil
	for _, u := range p.InspectUsage(nil) {
		got = append(got, u.Group+"/"+u.CPUSource)
	}
	if fmt.Sprint(got) != "[b/wall a/wall c/wall d/wall]" {
		t.Errorf("usage, busiest first: %v", got)
	}
}
