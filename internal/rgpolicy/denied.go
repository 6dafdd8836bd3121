package rgpolicy

import (
	"fmt"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// The texts of 1227: TiDB's words, then what the session lacks and why
// it needs it, so that an operator reading a client's log knows which
// grant, role or binding to change.

// adminWays is what lets a session administer resource groups
// (session.hasSuper).
const adminWays = "SUPER or RESOURCE_GROUP_ADMIN, or the role rgproxy_admin enabled in the session (SET ROLE rgproxy_admin)"

// deniedGroup is 1227 for naming group (what: "SET RESOURCE GROUP g" or
// "the RESOURCE_GROUP(g) hint") in strict mode, which only its bound
// group passes.
func (s *session) deniedGroup(what string) *resourcegroup.Error {
	b := s.bound()
	bound := "resource group " + b
	if b == resourcegroup.DefaultGroup && !s.boundExplicitly() {
		bound = "no resource group (so to default)"
	}
	return resourcegroup.NewAccessDenied(fmt.Sprintf("the account %s is bound to %s and --strict-resource-groups is on, "+
		"so it may use only %s; %s needs %s", s.account(), bound, b, what, adminWays))
}

// boundExplicitly: an account binding names the session's group (which
// may be default).
func (s *session) boundExplicitly() bool {
	if !s.hostKnown {
		return false
	}
	_, ok := s.p.tokens.Binding(s.user, s.host)
	return ok
}

// deniedStatement is 1227 for an admin statement that changes groups,
// bindings or watches.
func (s *session) deniedStatement(stmt resourcegroup.Statement) *resourcegroup.Error {
	return resourcegroup.NewAccessDenied(fmt.Sprintf("%s changes what every account runs under and needs %s; the account %s has none of them",
		statementName(stmt), adminWays, s.account()))
}

// deniedRead is 1227 for SHOW CREATE RESOURCE GROUP of a group the
// session may not read.
func (s *session) deniedRead(group string) *resourcegroup.Error {
	return resourcegroup.NewAccessDenied(fmt.Sprintf("the account %s may read only the groups it runs in (%s) and those tags are bound to; "+
		"reading resource group %s needs %s", s.account(), s.currentGroup(), group, adminWays))
}

// statementName is how SQL spells an admin statement that needs SUPER.
func statementName(stmt resourcegroup.Statement) string {
	switch s := stmt.(type) {
	case *resourcegroup.CreateGroup:
		return "CREATE RESOURCE GROUP"
	case *resourcegroup.AlterGroup:
		return "ALTER RESOURCE GROUP"
	case *resourcegroup.DropGroup:
		return "DROP RESOURCE GROUP"
	case *resourcegroup.AlterUserGroup:
		return "ALTER USER ... RESOURCE GROUP"
	case *resourcegroup.StmtBinding:
		if s.Create {
			return "CREATE BINDING"
		}
		return "DROP BINDING"
	case *resourcegroup.CreateTagBinding, *resourcegroup.CreateDigestBinding:
		return "CREATE RESOURCE GROUP BINDING"
	case *resourcegroup.DropTagBinding, *resourcegroup.DropDigestBinding:
		return "DROP RESOURCE GROUP BINDING"
	case *resourcegroup.QueryWatchAdd:
		return "QUERY WATCH ADD"
	case *resourcegroup.QueryWatchRemove:
		return "QUERY WATCH REMOVE"
	case *resourcegroup.AlterServiceLimit:
		return "ALTER RESOURCE CONTROL"
	}
	return "this statement"
}
