package rgpolicy

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// reportQuery is the shape digestGroups binds to the group night.
const reportQuery = "SELECT SUM(amount) FROM orders WHERE day = ?"

// digestGroups is tagGroups with a group night the report's shape is bound
// to, and a shape bound to a group since dropped.
func digestGroups() *recordingTokens {
	tok := tagGroups()
	tok.groups["night"] = resourcegroup.Group{Name: "night", RUPerSec: 10}
	tok.digests = map[uint64]string{
		query(reportQuery).Scan.DigestHash: "night",
		query("SELECT 2").Scan.DigestHash:  "dropped",
	}
	return tok
}

// execute is a COM_STMT_EXECUTE of q as mysqlproto passes it: the command
// with the scan (digest included) of the prepared text.
func execute(q string) *mysqlproto.Statement {
	st := query(q)
	st.Command = mysql.COM_STMT_EXECUTE
	st.PayloadBytes = 20
	return st
}

// A digest binding, in strict mode, adds its group to a statement of its
// shape — text or prepared, whatever its literals — like a tag: the
// statement keeps its own group and is charged to both, each group once;
// outside strict mode it routes, below the hint and above SET, tags and
// the account's binding.
func TestPolicyResolvesDigests(t *testing.T) {
	tests := []struct {
		name   string
		user   string
		grants grants
		set    string
		st     *mysqlproto.Statement
		want   string
	}{
		{"text, its literal", "app", plainGrants, "", query("SELECT SUM(amount) FROM orders WHERE day = '2026-11-28'"), "bound+night"},
		{"text, the layout and case differ", "app", plainGrants, "", query("select sum( amount ) from orders\n where day=20261128"), "bound+night"},
		{"prepared (COM_STMT_EXECUTE)", "app", plainGrants, "", execute(reportQuery), "bound+night"},
		{"another shape", "app", plainGrants, "", query("SELECT SUM(amount) FROM orders WHERE day = ? AND shop = 1"), "bound"},
		{"another shape, prepared", "app", plainGrants, "", execute("SELECT amount FROM orders WHERE day = ?"), "bound"},
		{"unbound user", "nobody", plainGrants, "", query(reportQuery), "default+night"},
		{"a dropped group's digest is ignored", "app", plainGrants, "", query("SELECT 2"), "bound"},
		{"tag and digest both add", "app", plainGrants, "", query(reportQuery + " /*route='%2Freport'*/"), "bound+reports+night"},
		{"a digest of the tag's group adds nothing more", "app", plainGrants, "", query("SELECT 1 /*route='%2Freport'*/"), "bound+reports"},
		{"the hint does not drop the digest", "app", plainGrants, "", query("SELECT /*+ RESOURCE_GROUP(bound) */ SUM(amount) FROM orders WHERE day = 3"), "bound+night"},
		{"strict: the digest does not let the hint name its group", "app", plainGrants, "", query("SELECT /*+ RESOURCE_GROUP(night) */ SUM(amount) FROM orders WHERE day = 3"), "1227"},
		{"SET does not drop the digest", "app", superGrants, "SET RESOURCE GROUP other", query(reportQuery), "other+night"},
		{"a digest of the statement's own group adds nothing", "app", superGrants, "SET RESOURCE GROUP night", query(reportQuery), "night"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := digestGroups()
			tok.groups["reports"] = resourcegroup.Group{Name: "reports", RUPerSec: 100}
			if tc.name == "a digest of the tag's group adds nothing more" {
				tok.digests[query("SELECT 1").Scan.DigestHash] = "reports"
			}
			if got := groupOfStmt(t, newTestPolicy(tok), tok, tc.user, tc.grants, tc.set, tc.st); got != tc.want {
				t.Errorf("group %s, want %s", got, tc.want)
			}
		})
	}
	loose := []struct {
		set  string
		st   *mysqlproto.Statement
		want string
	}{
		{"", query(reportQuery), "night"},
		{"", execute(reportQuery), "night"},
		{"", query("SELECT /*+ RESOURCE_GROUP(other) */ SUM(amount) FROM orders WHERE day = 1"), "other"},
		{"SET RESOURCE GROUP other", query(reportQuery), "night"},
		{"", query(reportQuery + " /*route='%2Freport'*/"), "night"},
		{"", query("SELECT 2"), "bound"},
		{"", query("SELECT 3"), "bound"},
	}
	for _, tc := range loose {
		tok := digestGroups()
		p := newTestPolicy(tok)
		set := p.CurrentSettings()
		set.Strict = false
		p.Reload(set)
		if got := groupOfStmt(t, p, tok, "app", plainGrants, tc.set, tc.st); got != tc.want {
			t.Errorf("non-strict %q then %q: group %s, want %s", tc.set, tc.st.Query, got, tc.want)
		}
	}
}

// SHOW LAST STATEMENT RU names a digest's group in SHAPE_RESOURCE_GROUP;
// statements_summary counts the statement in both groups, and so do
// their buckets.
func TestDigestLegSettles(t *testing.T) {
	tok := digestGroups()
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	ctx := context.Background()
	st := execute(reportQuery)
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("answered: %+v", v.Reply)
	}
	s.After(st, &mysqlproto.Outcome{ResponseBytes: 4000})
	v := s.Before(ctx, query("SHOW LAST STATEMENT RU"), plainGrants)
	if v.Reply == nil || len(v.Reply.Rows) != 1 {
		t.Fatalf("SHOW LAST STATEMENT RU: %+v", v.Reply)
	}
	got := map[string]string{}
	for i, c := range v.Reply.Columns {
		if r := v.Reply.Rows[0][i]; r != nil {
			got[c] = *r
		}
	}
	if got["RESOURCE_GROUP"] != "bound" || got["SHAPE_RESOURCE_GROUP"] != "night" || got["TAG_RESOURCE_GROUP"] != "" {
		t.Errorf("SHOW LAST STATEMENT RU: %v", got)
	}
	var groups []string
	for _, r := range p.shapes.summary(nil) {
		if r.DigestText == string(query(reportQuery).Scan.Digest) {
			groups = append(groups, r.Group)
		}
	}
	if !reflect.DeepEqual(groups, []string{"bound", "night"}) {
		t.Errorf("statements_summary rows of the shape in groups %v", groups)
	}

	// Three legs: its own group, a tag's and the shape's, each charged.
	tok.charged, tok.acquired = nil, nil
	st = query("SELECT SUM(amount) FROM orders WHERE day = 9 /*route='%2Freport'*/")
	if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
		t.Fatalf("answered: %+v", v.Reply)
	}
	if got := fmt.Sprint(tok.acquired); got != "[bound:30s reports:30s night:30s]" {
		t.Errorf("tokens taken from %s", got)
	}
	s.After(st, &mysqlproto.Outcome{ResponseBytes: 1 << 20})
	groups = nil
	for _, r := range p.shapes.summary(nil) {
		if r.DigestText == string(st.Scan.Digest) {
			groups = append(groups, fmt.Sprint(r.Group, "=", r.ExecCount))
		}
	}
	if !reflect.DeepEqual(groups, []string{"bound=2", "night=2", "reports=1"}) {
		t.Errorf("statements_summary after a three-leg statement: %v", groups)
	}
}

// While no digest is bound a statement asks nothing more than the
// token client's atomic index (recordingTokens' empty map here).
func TestDigestsNeedADigest(t *testing.T) {
	tok := digestGroups()
	st := query("SELECT SUM(amount) FROM orders WHERE day = 1")
	st.Scan.Digest = nil // a statement the scan gave no digest
	if got := groupOfStmt(t, newTestPolicy(tok), tok, "app", plainGrants, "", st); got != "bound" {
		t.Errorf("a statement without a digest: %s", got)
	}
}

// TiDB's statement binding becomes the digest binding of its FOR
// statement: the split at the USING whose two sides are one shape (a
// JOIN ... USING (col) is not the split), the group of the USING side's
// hint; a USING side without the hint, or of another shape, is 1105.
func TestStmtBindingOf(t *testing.T) {
	join := "SELECT a FROM t JOIN u USING (id) WHERE a = 1"
	tests := []struct {
		sql  string
		want resourcegroup.Statement
		err  string
	}{
		{"CREATE GLOBAL BINDING FOR " + join + " USING SELECT /*+ RESOURCE_GROUP(Night) */ a FROM t JOIN u USING (id) WHERE a = 2",
			&resourcegroup.CreateDigestBinding{Digest: resourcegroup.FormatDigest(query(join).Scan.DigestHash), Group: "night"}, ""},
		{"CREATE BINDING USING " + "SELECT /*+ RESOURCE_GROUP(night) */ SUM(amount) FROM orders WHERE day = 3",
			&resourcegroup.CreateDigestBinding{Digest: resourcegroup.FormatDigest(query(reportQuery).Scan.DigestHash), Group: "night"}, ""},
		{"DROP GLOBAL BINDING FOR " + join,
			&resourcegroup.DropDigestBinding{Digest: resourcegroup.FormatDigest(query(join).Scan.DigestHash)}, ""},
		{"DROP BINDING FOR " + reportQuery + " USING SELECT /*+ RESOURCE_GROUP(night) */ SUM(amount) FROM orders WHERE day = 1",
			&resourcegroup.DropDigestBinding{Digest: resourcegroup.FormatDigest(query(reportQuery).Scan.DigestHash)}, ""},
		{"CREATE GLOBAL BINDING FOR " + join + " USING SELECT /*+ USE_INDEX(t, a) */ a FROM t JOIN u USING (id) WHERE a = 2", nil,
			"the USING statement carries no /*+ RESOURCE_GROUP(g) */ hint"},
		{"CREATE GLOBAL BINDING FOR " + join + " USING SELECT /*+ RESOURCE_GROUP(night) */ b FROM t JOIN u USING (id) WHERE a = 2", nil,
			"the FOR and USING statements are not the same statement"},
	}
	for _, tc := range tests {
		parsed, err := resourcegroup.Parse(tc.sql, query(tc.sql).Mode())
		if err != nil {
			t.Fatalf("%s: %v", tc.sql, err)
		}
		b, ok := parsed.(*resourcegroup.StmtBinding)
		if !ok {
			t.Fatalf("%s parsed as %T", tc.sql, parsed)
		}
		got, err := stmtBindingOf(b, query(tc.sql).Mode())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.sql, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %#v %v, want %#v", tc.sql, got, err, tc.want)
		}
	}
}
