package rgpolicy

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// tagGroups is testGroups with a group for reports and three bound tags,
// one of them to a group that no longer exists.
func tagGroups() *recordingTokens {
	tok := testGroups()
	tok.groups["reports"] = resourcegroup.Group{Name: "reports", RUPerSec: 100}
	tok.tags = map[string]string{
		resourcegroup.TagBindingKey("route", "/report"): "reports",
		resourcegroup.TagBindingKey("app", "billing"):   "other",
		resourcegroup.TagBindingKey("gone", "x"):        "dropped",
	}
	return tok
}

// groupOf runs set (if any) and then q through a session of user and
// returns the group the statement was charged to — "g+t" when it was
// charged to its group g and to a tag's group t too — or "1227".
func groupOf(t *testing.T, tok *recordingTokens, user string, g grants, set, q string) string {
	t.Helper()
	return groupOfIn(t, newTestPolicy(tok), tok, user, g, set, q)
}

func groupOfIn(t *testing.T, p *Policy, tok *recordingTokens, user string, g grants, set, q string) string {
	t.Helper()
	return groupOfStmt(t, p, tok, user, g, set, query(q))
}

// groupOfStmt is groupOfIn for any statement; "g+t+s" when a tag's group t
// and a digest's group s were added.
func groupOfStmt(t *testing.T, p *Policy, tok *recordingTokens, user string, g grants, set string, st *mysqlproto.Statement) string {
	t.Helper()
	q := st.Query
	s := p.Open(mysqlproto.SessionInfo{User: user})
	ctx := context.Background()
	if set != "" {
		if v := s.Before(ctx, query(set), g); v.Reply == nil || v.Reply.Err != nil {
			t.Fatalf("%s: %+v", set, v.Reply)
		}
	}
	tok.acquired = nil
	v := s.Before(ctx, st, g)
	if v.Reply != nil {
		if v.Reply.Err != nil && v.Reply.Err.Code == 1227 {
			return "1227"
		}
		t.Fatalf("%s: answered locally: %+v", q, v.Reply)
	}
	cur := &s.(*session).cur
	got := cur.group
	if cur.tagGroup != "" {
		got += "+" + cur.tagGroup
	}
	if cur.shapeGroup != "" {
		got += "+" + cur.shapeGroup
	}
	var want []string
	for _, gr := range strings.Split(got, "+") {
		want = append(want, gr+":30s")
	}
	if !reflect.DeepEqual(tok.acquired, want) {
		t.Fatalf("%s: acquired %v, want %v", q, tok.acquired, want)
	}
	return got
}

// Precedence: hint, then SET RESOURCE GROUP, then the account's binding,
// then default; in strict mode the first bound tag (trailing comment
// before leading, in the comment's order) adds its group: the statement
// is charged to both and must pass both. Outside strict mode the tag
// chooses the group, after hint and SET.
func TestPolicyResolvesTags(t *testing.T) {
	tests := []struct {
		name   string
		user   string
		grants grants
		set    string
		query  string
		want   string
	}{
		{"untagged: the binding", "app", plainGrants, "", "SELECT 1", "bound"},
		{"trailing tag", "app", plainGrants, "", "SELECT 1 /*controller='r',route='%2Freport'*/", "bound+reports"},
		{"trailing tag after ;", "app", plainGrants, "", "SELECT 1 /*route='%2Freport'*/;", "bound+reports"},
		{"leading tag", "app", plainGrants, "", "/*route='%2Freport'*/ SELECT 1", "bound+reports"},
		{"trailing before leading", "app", plainGrants, "", "/*app='billing'*/ SELECT 1 /*route='%2Freport'*/", "bound+reports"},
		{"leading when the trailing has no bound tag", "app", plainGrants, "", "/*app='billing'*/ SELECT 1 /*route='%2Fother'*/", "bound+other"},
		{"the comment's order", "app", plainGrants, "", "SELECT 1 /*app='billing',route='%2Freport'*/", "bound+other"},
		{"first bound tag", "app", plainGrants, "", "SELECT 1 /*x='y',route='%2Freport'*/", "bound+reports"},
		{"a tag of a dropped group is ignored", "app", plainGrants, "", "SELECT 1 /*gone='x',app='billing'*/", "bound+other"},
		{"only a dropped group's tag", "app", plainGrants, "", "SELECT 1 /*gone='x'*/", "bound"},
		{"unbound tag", "app", plainGrants, "", "SELECT 1 /*route='%2Fother'*/", "bound"},
		{"exact value", "app", plainGrants, "", "SELECT 1 /*route='%2FReport'*/", "bound"},
		{"free-text comment", "app", plainGrants, "", "SELECT 1 /* route='/report' by hand */", "bound"},
		{"a hint is not a tag", "app", plainGrants, "", "SELECT /*+ route='/report' */ 1", "bound"},
		{"a comment inside is not a tag", "app", plainGrants, "", "SELECT /*route='%2Freport'*/ 1", "bound"},
		{"unbound user", "nobody", plainGrants, "", "SELECT 1 /*route='%2Freport'*/", "default+reports"},
		{"a write is charged to both", "app", plainGrants, "", "UPDATE t SET a = 1 /*route='%2Freport'*/", "bound+reports"},
		{"the hint does not drop the tag", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(bound) */ 1 /*route='%2Freport'*/", "bound+reports"},
		{"strict: a tag does not let the hint name its group", "app", plainGrants, "", "SELECT /*+ RESOURCE_GROUP(reports) */ 1 /*route='%2Freport'*/", "1227"},
		{"SET does not drop the tag", "app", superGrants, "SET RESOURCE GROUP other", "SELECT 1 /*route='%2Freport'*/", "other+reports"},
		{"a tag of the same group adds nothing", "app", superGrants, "SET RESOURCE GROUP reports", "SELECT 1 /*route='%2Freport'*/", "reports"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := groupOf(t, tagGroups(), tc.user, tc.grants, tc.set, tc.query); got != tc.want {
				t.Errorf("group %s, want %s", got, tc.want)
			}
		})
	}
	// Outside strict mode a tag routes: it replaces the account's group,
	// after hint and SET.
	loose := []struct{ set, query, want string }{
		{"", "SELECT 1 /*route='%2Freport'*/", "reports"},
		{"", "SELECT /*+ RESOURCE_GROUP(other) */ 1 /*route='%2Freport'*/", "other"},
		{"SET RESOURCE GROUP other", "SELECT 1 /*route='%2Freport'*/", "other"},
		{"", "SELECT 1 /*gone='x'*/", "bound"},
	}
	for _, tc := range loose {
		tok := tagGroups()
		p := newTestPolicy(tok)
		set := p.CurrentSettings()
		set.Strict = false
		p.Reload(set)
		if got := groupOfIn(t, p, tok, "app", plainGrants, tc.set, tc.query); got != tc.want {
			t.Errorf("non-strict %q then %q: group %s, want %s", tc.set, tc.query, got, tc.want)
		}
	}
}

// No tag is looked up for a statement without a comment, nor while no tag
// is bound.
func TestPolicyTagsCostNothingUnused(t *testing.T) {
	tok := tagGroups()
	groupOf(t, tok, "app", plainGrants, "", "SELECT 1")
	if tok.tagLookups != 0 {
		t.Fatalf("an untagged statement looked up %d tags", tok.tagLookups)
	}
	groupOf(t, tok, "app", plainGrants, "", "SELECT 1 /*a='1',route='%2Freport'*/")
	if tok.tagLookups != 2 {
		t.Fatalf("a tagged statement looked up %d tags, want 2", tok.tagLookups)
	}
	none := testGroups()
	if got := groupOf(t, none, "app", plainGrants, "", "SELECT 1 /*route='%2Freport'*/"); got != "bound" || none.tagLookups != 0 {
		t.Fatalf("no tag bound: group %s after %d lookups", got, none.tagLookups)
	}
}

// resource_group_bindings: account rows carry NULL tags, tag rows NULL
// accounts; without SUPER a session sees its own account's row and every
// tag's.
func TestBindingsTableWithTags(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	st := resourcegroup.NewMemStore()
	tok.store = st
	if err := st.CreateGroup(ctx, resourcegroup.Group{Name: "bound", RUPerSec: 100}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []resourcegroup.Binding{
		{User: "app", Host: "%", Group: "bound"},
		{User: "zed", Host: "%", Group: "bound"},
		{TagKey: "route", TagValue: "/report", Group: "bound"},
	} {
		if err := st.BindUser(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	rows := func(g grants) [][]string {
		s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		s.learnAccount(ctx, g)
		vt, err := s.bindingsTable(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		var cols []string
		for _, c := range vt.cols {
			cols = append(cols, c.name)
		}
		if want := []string{"USER", "HOST", "RESOURCE_GROUP", "TAG_KEY", "TAG_VALUE", "DIGEST"}; !reflect.DeepEqual(cols, want) {
			t.Fatalf("columns %v", cols)
		}
		var out [][]string
		for _, r := range vt.rows {
			var row []string
			for _, v := range r {
				if v == nil {
					row = append(row, "NULL")
				} else {
					row = append(row, *v)
				}
			}
			out = append(out, row)
		}
		return out
	}
	acct := func(u string) []string { return []string{u, "%", "bound", "NULL", "NULL", "NULL"} }
	tag := []string{"NULL", "NULL", "bound", "route", "/report", "NULL"}
	if got, want := rows(superGrants), [][]string{acct("app"), acct("zed"), tag}; !reflect.DeepEqual(got, want) {
		t.Errorf("with SUPER:\n got  %q\n want %q", got, want)
	}
	if got, want := rows(plainGrants), [][]string{acct("app"), tag}; !reflect.DeepEqual(got, want) {
		t.Errorf("without SUPER:\n got  %q\n want %q", got, want)
	}
}

// A session keeps its route — the binding's group, that group's
// definition — while the token client's cache stays the same generation,
// so that a statement on the usual route looks nothing up; a change of
// generation (a Watch event) makes the next statement look again.
func TestSessionRouteFollowsTheCacheGeneration(t *testing.T) {
	tok := testGroups()
	p := newTestPolicy(tok)
	s := p.Open(mysqlproto.SessionInfo{User: "app"})
	ctx := context.Background()
	run := func() string {
		t.Helper()
		st := query("SELECT c FROM t WHERE id = 1")
		if v := s.Before(ctx, st, plainGrants); v.Reply != nil {
			t.Fatalf("answered locally: %+v", v.Reply)
		}
		s.After(st, &mysqlproto.Outcome{})
		return s.(*session).cur.group
	}
	for i := range 3 {
		if g := run(); g != "bound" {
			t.Fatalf("statement %d charged to %s, want bound", i+1, g)
		}
	}
	if tok.bindingLookups != 1 || tok.groupLookups != 1 {
		t.Fatalf("3 statements looked up %d bindings and %d groups, want 1 and 1", tok.bindingLookups, tok.groupLookups)
	}
	// The binding moves to other: seen once the generation changes.
	tok.bindings["app@%"] = resourcegroup.Binding{User: "app", Host: "%", Group: "other"}
	tok.gen++
	if g := run(); g != "other" {
		t.Fatalf("after the binding moved: charged to %s, want other", g)
	}
	// other is dropped: default.
	delete(tok.groups, "other")
	tok.gen++
	if g := run(); g != "default" {
		t.Fatalf("after other was dropped: charged to %s, want default", g)
	}
	// A new login of another user on the session forgets the route.
	tok.bindings["ops@%"] = resourcegroup.Binding{User: "ops", Host: "%", Group: "bound"}
	s.Event(mysqlproto.EventChangeUser, mysqlproto.SessionInfo{User: "ops"})
	if g := run(); g != "bound" {
		t.Fatalf("after COM_CHANGE_USER to ops: charged to %s, want bound", g)
	}
	// A user with no binding asks whether it has one once per generation.
	s.Event(mysqlproto.EventChangeUser, mysqlproto.SessionInfo{User: "nobody"})
	asked := tok.hasBindingsLookups
	for range 3 {
		if g := run(); g != "default" {
			t.Fatalf("unbound user charged to %s, want default", g)
		}
	}
	if n := tok.hasBindingsLookups - asked; n != 1 {
		t.Fatalf("3 statements of an unbound user asked HasBindings %d times, want 1", n)
	}
	tok.bindings["nobody@%"] = resourcegroup.Binding{User: "nobody", Host: "%", Group: "bound"}
	tok.gen++
	if g := run(); g != "bound" {
		t.Fatalf("after nobody was bound: charged to %s, want bound", g)
	}
}
