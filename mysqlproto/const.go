package mysqlproto

import "github.com/go-mysql-org/go-mysql/mysql"

// Protocol constants come from go-mysql's mysql package (command codes,
// capability and status flags, packet headers, server error codes). Only
// what that package lacks is declared here.

// supportedCaps is every capability rgproxy implements. Everything else
// the backend offers is cleared from the greeting and from the client's
// answer: COMPRESS (rgproxy does not compress), SSL (decided per leg),
// QUERY_ATTRIBUTES, OPTIONAL_RESULTSET_METADATA, and MariaDB's extended
// capabilities (PROGRESS, COM_MULTI, STMT_BULK_OPERATIONS,
// EXTENDED_TYPE_INFO, CACHE_METADATA), which live in the greeting's filler
// and are zeroed there.
//
// DEPRECATE_EOF is deliberately not offered: without it every result set's
// column definitions end with an EOF packet that carries the status flags,
// which is how a COM_STMT_EXECUTE that opened a cursor is told apart from
// one that streams rows. The state machine still understands the
// DEPRECATE_EOF framing, so offering it later is a one-line change.
const supportedCaps = mysql.CLIENT_LONG_PASSWORD | mysql.CLIENT_FOUND_ROWS | mysql.CLIENT_LONG_FLAG |
	mysql.CLIENT_CONNECT_WITH_DB | mysql.CLIENT_NO_SCHEMA | mysql.CLIENT_ODBC | mysql.CLIENT_LOCAL_FILES |
	mysql.CLIENT_IGNORE_SPACE | mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_INTERACTIVE |
	mysql.CLIENT_IGNORE_SIGPIPE | mysql.CLIENT_TRANSACTIONS | mysql.CLIENT_RESERVED |
	mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_MULTI_STATEMENTS | mysql.CLIENT_MULTI_RESULTS |
	mysql.CLIENT_PS_MULTI_RESULTS | mysql.CLIENT_PLUGIN_AUTH | mysql.CLIENT_CONNECT_ATTRS |
	mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | mysql.CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS |
	mysql.CLIENT_SESSION_TRACK

// Error codes rgproxy sends that go-mysql's list (MySQL's, up to 1863)
// does not have. Codes of the client range (2000-2999, such as 2003
// CR_CONN_HOST_ERROR or 2013 CR_SERVER_LOST) are never sent: libmariadb
// refuses them from a server and shows "2027 Received malformed packet".
const (
	// errCodeSecureTransport is MySQL 5.7's ER_SECURE_TRANSPORT_REQUIRED.
	errCodeSecureTransport uint16 = 3159
	// errCodeBackendLost is MariaDB's ER_CONNECTION_KILLED, which MariaDB
	// MaxScale sends when it loses a backend in the middle of a session.
	errCodeBackendLost uint16 = 1927
	// errCodeBackendUnreachable is ProxySQL's code for "the backend
	// cannot be reached" (9001 "Max connect timeout reached while reaching
	// hostgroup"); MySQL defines no server code for it.
	errCodeBackendUnreachable uint16 = 9001
)
