package resourcegroup

// Who administers resource groups is decided from what the backend
// answers as data — the names of the account's global privileges and of
// the session's enabled roles, compared exactly — never from SQL text such
// as SHOW GRANTS, where a column, table or role name that a user chose
// could read as a privilege list.

// AdminRole is the role that makes a session a resource-group
// administrator while it is enabled in the session (SET ROLE, a default
// role, or granted to an enabled role): TiDB's RESOURCE_GROUP_ADMIN for
// MariaDB, which has no such privilege. Only an administrator can create a
// role, so its name is data no user can forge.
const AdminRole = "rgproxy_admin"

// AdminPrivileges are the global privileges that make an account a
// resource-group administrator, as information_schema.USER_PRIVILEGES
// names them: SUPER (ALL PRIVILEGES includes it) and MySQL 8's dynamic
// RESOURCE_GROUP_ADMIN.
var AdminPrivileges = [...]string{"SUPER", "RESOURCE_GROUP_ADMIN"}

// HoldsAdmin decides whether a session administers resource groups from
// privileges, the PRIVILEGE_TYPE values the backend lists for the
// session's own account (information_schema.USER_PRIVILEGES, whose
// GRANTEE is that account), and roles, the session's enabled roles
// (information_schema.ENABLED_ROLES). Each value is compared whole and
// exactly; nothing is parsed.
func HoldsAdmin(privileges, roles []string) bool {
	for _, p := range privileges {
		for _, a := range AdminPrivileges {
			if p == a {
				return true
			}
		}
	}
	for _, r := range roles {
		if r == AdminRole {
			return true
		}
	}
	return false
}

// Grantee is how information_schema.USER_PRIVILEGES names the account
// user@host in its GRANTEE column: 'user'@'host', the parts as the server
// stores them, nothing escaped.
func Grantee(user, host string) string { return "'" + user + "'@'" + host + "'" }
