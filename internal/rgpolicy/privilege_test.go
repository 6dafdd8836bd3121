package rgpolicy

import (
	"context"
	"encoding/hex"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
)

// hexUpper is MySQL's HEX() of a string.
func hexUpper(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }

// privRow is one row of privilegesQuery as the backend answers it.
func privRow(grantee, priv, currentUser string) []*string {
	c := []string{hexUpper(grantee), hexUpper(priv), hexUpper(currentUser)}
	return []*string{&c[0], &c[1], &c[2]}
}

func roleRow(role string) []*string {
	c := hexUpper(role)
	return []*string{&c}
}

func TestAdminFromRows(t *testing.T) {
	null := (*string)(nil)
	bad := "zz"
	tests := []struct {
		name  string
		privs [][]*string
		roles [][]*string
		want  bool
	}{
		{"own SUPER", [][]*string{privRow("'app'@'%'", "SUPER", "app@%")}, nil, true},
		{"own RESOURCE_GROUP_ADMIN", [][]*string{privRow("'app'@'10.%'", "RESOURCE_GROUP_ADMIN", "app@10.%")}, nil, true},
		{"a user name holding @", [][]*string{privRow("'me@x.org'@'%'", "SUPER", "me@x.org@%")}, nil, true},
		{"nothing", nil, nil, false},
		// A user with SELECT on the grant tables sees every account's rows.
		{"another account's SUPER", [][]*string{privRow("'root'@'localhost'", "SUPER", "app@%")}, nil, false},
		{"same user, other host", [][]*string{privRow("'app'@'localhost'", "SUPER", "app@%")}, nil, false},
		{"case differs", [][]*string{privRow("'APP'@'%'", "SUPER", "app@%")}, nil, false},
		// 'a'@'b'@'c' is both a'@'b@c and a@b'@'c: a quote makes the
		// GRANTEE ambiguous, so the privileges of such an account do not count.
		{"ambiguous grantee", [][]*string{privRow("'a'@'b'@'c'", "SUPER", "a'@'b@c")}, nil, false},
		{"not a privilege name", [][]*string{privRow("'app'@'%'", "super", "app@%")}, nil, false},
		{"the role", nil, [][]*string{roleRow("dba"), roleRow("rgproxy_admin")}, true},
		{"another role", nil, [][]*string{roleRow("rgproxy_admin2"), roleRow("x`, SUPER ON *.* TO y")}, false},
		{"NULL and garbage", [][]*string{{null, null, null}, {&bad, &bad, &bad}}, [][]*string{{null}, {&bad}}, false},
		{"short row", [][]*string{{null}}, nil, false},
	}
	for _, tt := range tests {
		if got := adminPrivileges(tt.privs) || adminRoles(tt.roles); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// FuzzAdminFromRows: whatever the account and role names, a session whose
// own account holds no administrator privilege and which has not enabled
// rgproxy_admin is never an administrator, even when it may read other
// accounts' SUPER rows (with SELECT on the grant tables); one whose
// account holds SUPER is, unless a quote in its name makes the GRANTEE
// ambiguous. (Column, table and database names, which users choose, are
// not in these answers at all.)
func FuzzAdminFromRows(f *testing.F) {
	f.Add("app", "%", "root", "localhost", "rgproxy_admin ")
	f.Add("a'@'b", "c", "a", "b'@'c", "`), SUPER ON *.* TO x`")
	f.Add("u@x", "%", "u", "x@%", "RGPROXY_ADMIN")
	f.Add("app", "%", "APP", "%", "SUPER")
	f.Fuzz(func(t *testing.T, user, host, otherUser, otherHost, role string) {
		if strings.Contains(host, "@") || strings.Contains(otherHost, "@") {
			return // MariaDB refuses a host name holding '@'
		}
		if user == otherUser && host == otherHost {
			return
		}
		self := user + "@" + host
		privs := [][]*string{
			privRow(resourcegroup.Grantee(otherUser, otherHost), "SUPER", self),
			privRow(resourcegroup.Grantee(otherUser, otherHost), "RESOURCE_GROUP_ADMIN", self),
			privRow(resourcegroup.Grantee(user, host), "USAGE", self),
		}
		var roles [][]*string
		if role != resourcegroup.AdminRole {
			roles = append(roles, roleRow(role))
		}
		if adminPrivileges(privs) || adminRoles(roles) {
			t.Fatalf("a session of %q@%q without SUPER is an administrator (%q@%q holds SUPER, role %q)",
				user, host, otherUser, otherHost, role)
		}
		own := append(privs, privRow(resourcegroup.Grantee(user, host), "SUPER", self))
		if want := !strings.ContainsRune(user+host, '\''); adminPrivileges(own) != want {
			t.Fatalf("a session of %q@%q holding SUPER: %v, want %v", user, host, !want, want)
		}
	})
}

// hasSuper asks the backend its two questions at most once per session,
// hasSuperFresh again; a failed question is a no.
func TestHasSuperAsksOnce(t *testing.T) {
	p := newTestPolicy(testGroups())
	s := p.Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	be := &countingBackend{Backend: plainGrants}
	ctx := context.Background()
	if s.hasSuper(ctx, be) || s.hasSuper(ctx, be) {
		t.Fatal("plain grants: an administrator")
	}
	if be.n != 2 {
		t.Fatalf("%d questions, want 2 (privileges, roles) once", be.n)
	}
	be.Backend = superGrants
	if !s.hasSuperFresh(ctx, be) || be.n != 3 {
		t.Fatalf("hasSuperFresh after SUPER was granted: %d questions", be.n)
	}
	be.Backend = brokenBackend{}
	if s.hasSuperFresh(ctx, be) {
		t.Fatal("a failed question counts as SUPER")
	}
}

type countingBackend struct {
	mysqlproto.Backend
	n int
}

func (c *countingBackend) Query(ctx context.Context, sql string) ([]string, [][]*string, error) {
	c.n++
	return c.Backend.Query(ctx, sql)
}

// Without SUPER a session reads in the virtual tables only the groups it
// may use — its account's, its current one, the tag-bound ones — and an
// EXACT watch's text only as its digest; with SUPER, everything.
func TestVirtualTablesFilteredWithoutSuper(t *testing.T) {
	ctx := context.Background()
	tok := testGroups()
	tok.groups["tagged"] = resourcegroup.Group{Name: "tagged", RUPerSec: 100}
	tok.tags = map[string]string{resourcegroup.TagBindingKey("route", "/r"): "tagged"}
	st := resourcegroup.NewMemStore()
	tok.store = st
	for _, g := range []string{"bound", "other", "tagged"} {
		if err := st.CreateGroup(ctx, resourcegroup.Group{Name: g, RUPerSec: 100}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.BindUser(ctx, resourcegroup.Binding{TagKey: "route", TagValue: "/r", Group: "tagged"}); err != nil {
		t.Fatal(err)
	}
	const card = "SELECT * FROM pay WHERE card = '4111-1111-1111-1111'"
	for _, w := range []resourcegroup.Watch{
		{Group: "bound", Match: resourcegroup.WatchExact, Text: card, Action: resourcegroup.ActionKill},
		{Group: "other", Match: resourcegroup.WatchExact, Text: card + " AND 1", Action: resourcegroup.ActionKill},
		{Group: "bound", Match: resourcegroup.WatchSimilar, Text: "SELECT ? FROM t", Action: resourcegroup.ActionKill},
	} {
		if _, err := st.AddWatch(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	read := func(g grants, table, col string) []string {
		s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
		s.learnAccount(ctx, g)
		vt, err := s.virtualTable(ctx, table, g)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range vt.rows {
			out = append(out, *r[vt.col(col)])
		}
		return out
	}
	join := func(v []string) string { return strings.Join(v, "|") }
	if got := join(read(plainGrants, vtResourceGroups, "NAME")); got != "bound|tagged" {
		t.Errorf("resource_groups without SUPER: %s", got)
	}
	if got := join(read(superGrants, vtResourceGroups, "NAME")); got != "bound|default|other|tagged" {
		t.Errorf("resource_groups with SUPER: %s", got)
	}
	if got := join(read(plainGrants, vtRunawayWatches, "WATCH_TEXT")); got != "SELECT * FROM pay WHERE card = ?|SELECT ? FROM t" {
		t.Errorf("runaway_watches without SUPER: %s", got)
	}
	if got := join(read(superGrants, vtRunawayWatches, "RESOURCE_GROUP_NAME")); got != "bound|other|bound" {
		t.Errorf("runaway_watches with SUPER: %s", got)
	}
	if got := read(superGrants, vtRunawayWatches, "WATCH_TEXT"); got[0] != card {
		t.Errorf("runaway_watches with SUPER: %q", got)
	}

	s := newTestPolicy(tok).Open(mysqlproto.SessionInfo{User: "app"}).(*session)
	for q, want := range map[string]uint16{
		"SHOW CREATE RESOURCE GROUP other":  1227,
		"SHOW CREATE RESOURCE GROUP bound":  0,
		"SHOW CREATE RESOURCE GROUP tagged": 0,
	} {
		v := s.Before(ctx, query(q), plainGrants)
		got := uint16(0)
		if v.Reply != nil && v.Reply.Err != nil {
			got = v.Reply.Err.Code
		}
		if got != want {
			t.Errorf("%s without SUPER: %d, want %d", q, got, want)
		}
	}
}

// A QUERY_LIMIT RU too large for a Duration arms a timer that never fires
// instead of one that fires at once (a plain float conversion gives the
// smallest int64).
func TestRunawayRULimitSaturates(t *testing.T) {
	for _, tt := range []struct {
		ms   float64
		want time.Duration
	}{
		{1, time.Millisecond},
		{0, 0},
		{-5, 0},
		{math.NaN(), 0},
		{math.Inf(1), math.MaxInt64},
		{1e13 * 3, math.MaxInt64}, // RU = 10¹³ at ⅓ RU per CPU millisecond
		{float64(math.MaxInt64) / 1e6, math.MaxInt64},
		{9.2e12, 9.2e12 * time.Millisecond},
	} {
		if got := msDuration(tt.ms); got != tt.want {
			t.Errorf("msDuration(%g) = %v, want %v", tt.ms, got, tt.want)
		}
	}
}

// 1227 says what the session lacks and why: TiDB's words, then the
// account, its bound group and strict mode, or the statement, and what
// would let it through (SUPER, RESOURCE_GROUP_ADMIN or rgproxy_admin).
func TestAccessDeniedSaysWhy(t *testing.T) {
	const denied = "Access denied; you need (at least one of) the SUPER privilege(s) for this operation: "
	const ways = "SUPER or RESOURCE_GROUP_ADMIN, or the role rgproxy_admin enabled in the session (SET ROLE rgproxy_admin)"
	tests := []struct {
		user, stmt, want string
	}{
		{"app", "SET RESOURCE GROUP other", "the account app@% is bound to resource group bound and --strict-resource-groups is on, " +
			"so it may use only bound; SET RESOURCE GROUP other needs " + ways},
		{"app", "SELECT /*+ RESOURCE_GROUP(Other) */ 1", "the account app@% is bound to resource group bound and --strict-resource-groups is on, " +
			"so it may use only bound; the RESOURCE_GROUP(other) hint needs " + ways},
		{"nobody", "SET RESOURCE GROUP other", "the account nobody is bound to no resource group (so to default) and " +
			"--strict-resource-groups is on, so it may use only default; SET RESOURCE GROUP other needs " + ways},
		{"app", "CREATE RESOURCE GROUP x RU_PER_SEC = 1", "CREATE RESOURCE GROUP changes what every account runs under and needs " +
			ways + "; the account app@% has none of them"},
		{"app", "QUERY WATCH REMOVE 1", "QUERY WATCH REMOVE changes what every account runs under and needs " +
			ways + "; the account app@% has none of them"},
		{"app", "SHOW CREATE RESOURCE GROUP other", "the account app@% may read only the groups it runs in (bound) and those tags are bound to; " +
			"reading resource group other needs " + ways},
	}
	for _, tc := range tests {
		s := newTestPolicy(testGroups()).Open(mysqlproto.SessionInfo{User: tc.user})
		v := s.Before(context.Background(), query(tc.stmt), plainGrants)
		if v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1227 || v.Reply.Err.State != "42000" ||
			v.Reply.Err.Message != denied+tc.want {
			t.Errorf("%s as %s:\n got %+v\nwant 1227 %s", tc.stmt, tc.user, v.Reply, denied+tc.want)
		}
	}
}
