package rgpolicy

import (
	"context"
	"encoding/hex"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// resolve is Before's first step: it sets the statement's group — the
// hint, else (outside strict mode) the group its digest is bound to, else
// SET RESOURCE GROUP, else (outside strict mode) a bound SQLCommenter
// tag, else the account's binding, else default — and answers 1227 when
// strict mode refuses the hint. A group that no longer exists is skipped.
// In strict mode a bound tag or digest does not choose the group: its
// group is added to the statement's (cur.tagGroup, cur.shapeGroup), whose
// limits it must pass too — such a binding adds limits and never removes
// one, since anyone can write a tag, and any account may send a bound
// statement shape.
func (s *session) resolve(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend, set *Settings) *mysqlproto.Reply {
	s.cur.group = s.resolveGroup(ctx, st, be, set)
	if s.cur.group == "" {
		// Only the hint is refused: it names an existing group strict
		// mode does not let the account use.
		h, _ := resourcegroup.HintGroup(st.Scan.Hint, st.Mode())
		return &mysqlproto.Reply{Err: mysqlError(s.deniedGroup("the RESOURCE_GROUP(" + resourcegroup.NormalizeName(h) + ") hint"))}
	}
	if set.Strict {
		if g, ok := s.tagGroup(&st.Scan); ok && g != s.cur.group {
			s.cur.tagGroup = g
		}
		if g, ok := s.shapeGroup(&st.Scan); ok && g != s.cur.group && g != s.cur.tagGroup {
			s.cur.shapeGroup = g
		}
	}
	s.bill(&st.Scan, set)
	return nil
}

func (s *session) resolveGroup(ctx context.Context, st *mysqlproto.Statement, be mysqlproto.Backend, set *Settings) string {
	if st.Command == mysql.COM_QUERY && st.Scan.Hint != "" {
		if h, ok := resourcegroup.HintGroup(st.Scan.Hint, st.Mode()); ok {
			// A group that does not exist is ignored, as TiDB does (which
			// also adds warning 8249; rgproxy cannot add one to the
			// backend's response).
			if _, ok := s.group(h); ok {
				if !s.mayUse(ctx, h, be, set) {
					return ""
				}
				return h
			}
			s.p.logger.Debug("hint names an unknown resource group: ignored", "resource_group", h)
		}
	}
	if !set.Strict {
		// A digest binding is TiDB's binding with a RESOURCE_GROUP hint:
		// it acts as the statement's hint, below one the text carries.
		if g, ok := s.shapeGroup(&st.Scan); ok {
			return g
		}
	}
	if s.setGroup != "" {
		if _, ok := s.group(s.setGroup); ok {
			return s.setGroup
		}
	}
	if !set.Strict {
		if g, ok := s.tagGroup(&st.Scan); ok {
			return g
		}
	}
	return s.bound()
}

// recheckSet judges the session's SET RESOURCE GROUP again when the
// bindings (the token client's cache generation) or the settings changed
// since it was last allowed: a pooled connection must not keep a group
// its account may no longer use. A group it may no longer use is
// forgotten, and the session's statements run in its binding's group.
func (s *session) recheckSet(ctx context.Context, be mysqlproto.Backend, set *Settings) {
	if s.setGroup == "" || (s.setGen == s.rt.gen && s.setSettings == set) {
		return
	}
	if _, ok := s.group(s.setGroup); ok && !s.mayUse(ctx, s.setGroup, be, set) {
		s.p.logger.Info("SET RESOURCE GROUP no longer allowed by the account's binding: the session returns to its bound group",
			"resource_group", s.setGroup, "bound", s.bound())
		s.setGroup = ""
		return
	}
	s.setGen, s.setSettings = s.rt.gen, set
}

// tagGroup is the group of the first bound tag of the statement's
// SQLCommenter comment: the trailing comment's tags, in order, then the
// leading comment's. A statement without such a comment costs two string
// tests, and no comment is parsed while no tag is bound.
func (s *session) tagGroup(sc *sqlscan.Scan) (string, bool) {
	if sc.TrailingComment == "" && sc.LeadingComment == "" || !s.p.tokens.HasTagBindings() {
		return "", false
	}
	group := ""
	match := func(key, value string) bool {
		g, ok := s.p.tokens.TagGroup(key, value)
		if !ok {
			return true
		}
		if _, ok := s.p.tokens.Group(g); !ok {
			return true // bound to a group since dropped: ignored
		}
		group = g
		return false
	}
	for _, c := range [2]string{sc.TrailingComment, sc.LeadingComment} {
		if c != "" && sqlscan.ParseTags(c, match) && group != "" {
			return group, true
		}
	}
	return "", false
}

// shapeGroup is the group the statement's digest (its shape: for a
// COM_STMT_EXECUTE the prepared text's, as statements_summary's DIGEST
// shows it) is bound to, when that group exists. While no digest is bound
// it costs one atomic load (tokenclient.Client.DigestGroup).
func (s *session) shapeGroup(sc *sqlscan.Scan) (string, bool) {
	if sc.Digest == nil {
		return "", false
	}
	g, ok := s.p.tokens.DigestGroup(sc.DigestHash)
	if !ok {
		return "", false
	}
	if _, ok := s.p.tokens.Group(g); !ok {
		return "", false // bound to a group since dropped: ignored
	}
	return g, true
}

// currentGroup is the session's group: SET RESOURCE GROUP, else the
// binding, else default.
func (s *session) currentGroup() string {
	if s.setGroup != "" {
		if _, ok := s.group(s.setGroup); ok {
			return s.setGroup
		}
	}
	return s.bound()
}

// bound is the group of the session's account binding if it exists, else
// default.
func (s *session) bound() string {
	if !s.hostKnown {
		return resourcegroup.DefaultGroup // no account of the user name is bound
	}
	if s.rt.boundOK {
		return s.rt.bound
	}
	g := resourcegroup.DefaultGroup
	if b, ok := s.p.tokens.Binding(s.user, s.host); ok {
		if _, ok := s.group(b.Group); ok {
			g = b.Group
		}
	}
	s.rt.bound, s.rt.boundOK = g, true
	return g
}

// route is what a session keeps of the token client's cache between
// statements while its generation (Tokens.CacheGeneration) stays gen:
// whether its user name has any binding, the group its account binding
// names, and the definition and in-flight
// gate of the group it last looked up. A statement on the usual route
// then takes no lock to find its group. The session goroutine alone uses
// it.
type route struct {
	gen uint64
	// unbound: no account of the session's user name is bound, so the
	// session need not ask the backend which account it is.
	unbound bool
	boundOK bool   // bound is known
	bound   string // the account binding's group, or default
	name    string // the group def and gate belong to; "" = none yet
	def     resourcegroup.Group
	defOK   bool  // the group exists
	gate    *gate // nil until asked for
}

// freshRoute forgets the route when the token client's cache changed
// since the session filled it; Before calls it first.
func (s *session) freshRoute() {
	if gen := s.p.tokens.CacheGeneration(); gen != s.rt.gen {
		s.rt = route{gen: gen}
	}
}

// group returns a group's definition: from the route when it names the
// group, else from the token client, and then the route keeps it. The
// definition is shared: read it, never change it.
func (s *session) group(name string) (resourcegroup.Group, bool) {
	if name != "" && name == s.rt.name {
		return s.rt.def, s.rt.defOK
	}
	g, ok := s.p.tokens.Group(name)
	s.rt.name, s.rt.def, s.rt.defOK, s.rt.gate = name, g, ok, nil
	return g, ok
}

// gate returns the in-flight gate of a group, kept in the route when the
// route names the group.
func (s *session) gateOf(name string) *gate {
	if name == s.rt.name && s.rt.gate != nil {
		return s.rt.gate
	}
	g := s.p.gates.get(name)
	if name == s.rt.name {
		s.rt.gate = g
	}
	return g
}

// learnAccount asks the backend which account it matched at login: the
// host pattern of CURRENT_USER(), which a binding must name. If it
// cannot tell, the session is taken for the user@'%' account.
func (s *session) learnAccount(ctx context.Context, be mysqlproto.Backend) {
	s.cpu.stale()
	s.host, s.hostKnown = "%", true
	s.rt.boundOK = false
	_, rows, err := be.Query(ctx, "SELECT CURRENT_USER()")
	if err != nil || len(rows) != 1 || len(rows[0]) != 1 || rows[0][0] == nil {
		s.p.logger.Warn("CURRENT_USER() failed: taking the session for user@'%'", "err", err)
		return
	}
	_, host := resourcegroup.SplitAccount(*rows[0][0])
	s.host = strings.ToLower(host)
}

// mayUse applies strict mode: without SUPER (hasSuper) a session may name
// only the group it is bound to — default only when it is bound to none —
// whether by hint or by SET RESOURCE GROUP, so that no bound user escapes
// its quota into the unlimited default.
func (s *session) mayUse(ctx context.Context, group string, be mysqlproto.Backend, set *Settings) bool {
	if !set.Strict || group == s.bound() {
		return true
	}
	return s.hasSuper(ctx, be)
}

// Queries whose answers decide who administers resource groups
// (resourcegroup.HoldsAdmin). Their text is constant; every value comes
// back hex-encoded, so the session's character set and SQL mode cannot
// change a byte that is compared.
const (
	// privilegesQuery lists the global administrator privileges the
	// backend shows this session — its own account's, or every account's
	// when it may read the grant tables — with the account itself.
	privilegesQuery = "SELECT HEX(GRANTEE), HEX(PRIVILEGE_TYPE), HEX(CURRENT_USER()) FROM information_schema.USER_PRIVILEGES " +
		"WHERE PRIVILEGE_TYPE IN ('SUPER', 'RESOURCE_GROUP_ADMIN')"
	// rolesQuery lists the roles enabled in the session, those granted
	// to an enabled role included.
	rolesQuery = "SELECT HEX(ROLE_NAME) FROM information_schema.ENABLED_ROLES WHERE ROLE_NAME IS NOT NULL"
)

// hasSuper reports whether the session administers resource groups:
// SUPER (or MySQL 8's RESOURCE_GROUP_ADMIN) held by its account, or the
// role rgproxy_admin enabled in it. It asks the backend once per session
// (hasSuperFresh asks again); a failed question counts as no.
func (s *session) hasSuper(ctx context.Context, be mysqlproto.Backend) bool {
	if s.super != nil {
		return *s.super
	}
	s.cpu.stale()
	v := false
	_, rows, err := be.Query(ctx, privilegesQuery)
	if err != nil {
		s.p.logger.Warn("reading the session's privileges failed", "err", err)
	} else if v = adminPrivileges(rows); !v {
		_, roles, err := be.Query(ctx, rolesQuery)
		if err != nil {
			// A backend without roles (MySQL 5.7) answers an error.
			s.p.logger.Debug("reading the session's enabled roles failed", "err", err)
		}
		names := roleNames(roles)
		v = resourcegroup.HoldsAdmin(nil, names)
		if !v && len(names) > 0 && s.p.roles != nil {
			// SUPER granted to an enabled role counts as MariaDB counts it;
			// a session cannot read a role's privileges, the service
			// account can (as data: the role names are bound parameters).
			rctx, cancel := context.WithTimeout(ctx, killTimeout)
			v, err = s.p.roles.RolesHoldAdmin(rctx, names)
			cancel()
			if err != nil {
				s.p.logger.Warn("reading the enabled roles' privileges through the service account failed", "err", err)
				v = false
			}
		}
	}
	s.super = &v
	return v
}

// unhex decodes a hex-encoded cell; ok is false for NULL or non-hex.
func unhex(c *string) (string, bool) {
	if c == nil {
		return "", false
	}
	b, err := hex.DecodeString(*c)
	return string(b), err == nil
}

// adminPrivileges decides from privilegesQuery's rows: an administrator
// privilege whose GRANTEE is the session's own account, CURRENT_USER()
// split at its last '@' (a host cannot hold one). A GRANTEE names an
// account without escaping ('user'@'host'), so it is unambiguous only
// while neither part holds a quote: an account whose name holds one is an
// administrator only through the role.
func adminPrivileges(rows [][]*string) bool {
	var privs []string
	for _, r := range rows {
		if len(r) != 3 {
			return false
		}
		grantee, ok1 := unhex(r[0])
		priv, ok2 := unhex(r[1])
		account, ok3 := unhex(r[2])
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		at := strings.LastIndexByte(account, '@')
		if at < 0 {
			continue
		}
		user, host := account[:at], account[at+1:]
		if strings.ContainsRune(user, '\'') || strings.ContainsRune(host, '\'') || grantee != resourcegroup.Grantee(user, host) {
			continue
		}
		privs = append(privs, priv)
	}
	return resourcegroup.HoldsAdmin(privs, nil)
}

// roleNames reads rolesQuery's rows.
func roleNames(rows [][]*string) []string {
	var roles []string
	for _, r := range rows {
		if len(r) == 1 {
			if name, ok := unhex(r[0]); ok {
				roles = append(roles, name)
			}
		}
	}
	return roles
}

// adminRoles decides from rolesQuery's rows.
func adminRoles(rows [][]*string) bool { return resourcegroup.HoldsAdmin(nil, roleNames(rows)) }

// hasSuperFresh asks the backend again: a DDL is rare, and a privilege
// revoked, or a role enabled or disabled (SET ROLE), since the session
// last asked must count.
func (s *session) hasSuperFresh(ctx context.Context, be mysqlproto.Backend) bool {
	s.super = nil
	return s.hasSuper(ctx, be)
}
