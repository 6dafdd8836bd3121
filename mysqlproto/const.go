package mysqlproto

import "github.com/go-mysql-org/go-mysql/mysql"

// Protocol constants come from go-mysql's mysql package (command codes,
// capability and status flags, packet headers, server error codes). Only
// what that package lacks is declared here.

// supportedCaps is every capability rgproxy passes between client and
// backend: each one changes packets that rgproxy follows (the response
// state machine, the reply writer, the query-attribute block before a
// COM_QUERY's text) or none that it reads. Everything else the backend
// offers is cleared from the greeting and from the client's answer:
//
//   - COMPRESS, ZSTD_COMPRESSION_ALGORITHM: rgproxy must read every
//     command and response in clear to classify and meter it, so it does
//     not compress; a client that asks for compression gets an
//     uncompressed session (drivers do not insist on it).
//   - SSL: decided per leg (Config.ClientTLS, Config.BackendTLS).
//   - OPTIONAL_RESULTSET_METADATA: with it a client may set
//     resultset_metadata = NONE, after which MySQL 8 leaves out the
//     definitions of prepared statements and result sets behind flags
//     rgproxy does not follow; MySQL refuses that setting to a client
//     without the capability, so the client loses an option, not a result.
//   - MULTI_FACTOR_AUTHENTICATION: a next factor's plugin would bypass
//     rgproxy's check that a clear-text password never crosses a leg
//     without TLS.
//   - SSL_VERIFY_SERVER_CERT, REMEMBER_OPTIONS, CAPABILITY_EXTENSION and
//     PROGRESS_OBSOLETE (bit 29): client-side or unused bits.
//
// DEPRECATE_EOF is offered: without the EOF after column definitions a
// COM_STMT_EXECUTE that opened a cursor is told from a streaming one by
// what follows the definitions: the result set's terminator (an OK with
// the 0xfe header, CURSOR_EXISTS in its status) right away, as an empty
// result set would end, rather than rows; either way the response is over.
const supportedCaps = mysql.CLIENT_LONG_PASSWORD | mysql.CLIENT_FOUND_ROWS | mysql.CLIENT_LONG_FLAG |
	mysql.CLIENT_CONNECT_WITH_DB | mysql.CLIENT_NO_SCHEMA | mysql.CLIENT_ODBC | mysql.CLIENT_LOCAL_FILES |
	mysql.CLIENT_IGNORE_SPACE | mysql.CLIENT_PROTOCOL_41 | mysql.CLIENT_INTERACTIVE |
	mysql.CLIENT_IGNORE_SIGPIPE | mysql.CLIENT_TRANSACTIONS | mysql.CLIENT_RESERVED |
	mysql.CLIENT_SECURE_CONNECTION | mysql.CLIENT_MULTI_STATEMENTS | mysql.CLIENT_MULTI_RESULTS |
	mysql.CLIENT_PS_MULTI_RESULTS | mysql.CLIENT_PLUGIN_AUTH | mysql.CLIENT_CONNECT_ATTRS |
	mysql.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA | mysql.CLIENT_CAN_HANDLE_EXPIRED_PASSWORDS |
	mysql.CLIENT_SESSION_TRACK | mysql.CLIENT_DEPRECATE_EOF | mysql.CLIENT_QUERY_ATTRIBUTES

// MariaDB's extended capabilities, the upper half of its 64-bit flags. A
// MariaDB server that leaves CLIENT_MYSQL (CLIENT_LONG_PASSWORD) out of its
// greeting carries them in the last 4 of the greeting's 10 reserved bytes,
// and a client that leaves CLIENT_MYSQL out of its answer carries its own
// in the last 4 bytes of the answer's 23-byte filler.
const (
	// mariaProgress: progress reports (an ERR packet with code 0xffff)
	// while a statement runs, before its real response.
	mariaProgress uint32 = 1 << 0
	// mariaComMulti: COM_MULTI, never released by MariaDB.
	mariaComMulti uint32 = 1 << 1
	// mariaStmtBulk: COM_STMT_BULK_EXECUTE, many parameter rows for one
	// prepared statement in one command.
	mariaStmtBulk uint32 = 1 << 2
	// mariaExtendedTypeInfo: column definitions carry the data type's own
	// name (uuid, inet6) or format (json) after the original column name.
	mariaExtendedTypeInfo uint32 = 1 << 3
	// mariaCacheMetadata: a result set's column count is followed by a
	// byte that says whether column definitions follow; COM_STMT_EXECUTE
	// leaves them out when the client has them from the PREPARE.
	mariaCacheMetadata uint32 = 1 << 4
	// mariaBulkUnitResults (MariaDB 11.5): a bulk execute answers with
	// one result row per parameter row.
	mariaBulkUnitResults uint32 = 1 << 5
)

// supportedMariaCaps is every MariaDB extended capability rgproxy passes.
// COM_MULTI was never released; BULK_UNIT_RESULTS (MariaDB 11.5) changes a
// bulk execute's answer into a result set whose shape no test here has
// seen (the project's backend is MariaDB 10.11), so it stays masked until
// one does: a client without it gets one OK for the whole bulk, as from
// MariaDB 11.4.
const supportedMariaCaps = mariaProgress | mariaStmtBulk | mariaExtendedTypeInfo | mariaCacheMetadata

// comStmtBulkExecute is MariaDB's COM_STMT_BULK_EXECUTE: a prepared
// statement's id, flags, then parameter types and rows; its response is
// an OK (affected rows summed), an ERR, or a result set (RETURNING).
const comStmtBulkExecute byte = 0xfa

// lastStmtID in a command's statement id means, to MariaDB, the statement
// prepared last on the connection (connectors pipeline PREPARE and
// EXECUTE with it).
const lastStmtID uint32 = 0xffffffff

// progressCode is the error code of a MariaDB progress report: an ERR
// packet that does not end the response.
const progressCode = 0xffff

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
