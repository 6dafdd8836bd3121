// Package mysqlproto is rgproxy's wire layer: it accepts MySQL clients,
// relays their authentication to a dedicated backend connection (rgproxy
// stores no password), forwards every command and streams each response
// back while a small state machine follows the response's shape. It knows
// nothing of Request Units or resource groups.
//
// # Sessions
//
// Each client connection is one goroutine and one backend connection, so
// transactions, session variables, temporary tables and prepared
// statements behave exactly as on a direct connection. The backend's
// greeting (its salt and connection id included) is relayed with only the
// capabilities rgproxy implements (see supportedCaps and
// supportedMariaCaps: MariaDB's PROGRESS, STMT_BULK_OPERATIONS,
// EXTENDED_TYPE_INFO and CACHE_METADATA, MySQL's QUERY_ATTRIBUTES and
// DEPRECATE_EOF pass; compression does not); the client's answer
// and every auth-switch / auth-more-data packet are relayed both ways
// until the backend's OK or ERR. Plugins that put the password in clear on
// the wire are relayed only when both legs use TLS.
//
// # Policy
//
// Before every command that has a response (COM_QUIT, COM_STMT_CLOSE and
// COM_STMT_SEND_LONG_DATA have none) the session calls
// SessionPolicy.Before; a Reply is written locally, otherwise the command
// is forwarded and SessionPolicy.After receives the measured Outcome.
// SEND_LONG_DATA bytes are added to the RequestBytes of the next
// COM_STMT_EXECUTE (or COM_STMT_BULK_EXECUTE) of the same statement. For a multi-packet COM_QUERY,
// Statement.Query and the class are taken from the first packet (16 MiB - 2
// bytes of text). While a non-PassThrough Before blocks for more than a few
// milliseconds, the session reads the client (the hangup check) so that a disconnect
// cancels Before's context.
//
// # Backend closes
//
// A backend that closes an idle session's connection (wait_timeout, KILL,
// a restart) closes the client's too, at once, after its last ERR packet,
// if any, is relayed as it came: one epoll set per Server polls every
// backend socket for EPOLLRDHUP (backendpoll_linux.go) and wakes the session,
// which is blocked reading its client, with a read deadline in the past.
// The same holds during login, which HandshakeTimeout bounds. A statement
// in flight when the backend dies gets ERR 1927 (SQLSTATE 08S01); a client
// whose backend cannot be reached gets ERR 9001 after a greeting of
// rgproxy's own. No client-range code (2000-2999) is ever sent.
//
// # Hostile clients
//
// What a client may hold is bounded (limits.go, memory.go): sessions by
// Config.MaxConnections (derived from the descriptor limit by default);
// connections not logged in yet, which each hold a backend connection, by
// MaxUnauthenticated and MaxUnauthenticatedPerHost (beyond them: 1040 at
// once, no backend dial); a command's buffer grows as its bytes arrive,
// within CommandBufferLimit over all sessions, and each wait for the rest
// of a command is bounded by NetReadTimeout; an idle session holds a 4 KiB
// reader, its other buffers pooled. A packet rgproxy refuses gets the ERR
// MariaDB sends for it (protoerr.go), counted by kind; refusals and
// protocol errors are logged at most once a second (ratelog.go).
//
// # Counting
//
// Outcome.RequestBytes and ResponseBytes count packet payloads (no
// headers). Stats.ClientBytes and BackendBytes count bytes on the wire in
// both directions, headers and TLS records included.
package mysqlproto
