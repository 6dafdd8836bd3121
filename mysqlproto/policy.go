package mysqlproto

import (
	"context"
	"net"
	"time"

	"github.com/rgproxy/rgproxy/sqlscan"
)

// Statement is what mysqlproto knows of a command before forwarding it.
// A session reuses one Statement (and one Outcome) for all its commands:
// the pointers a policy receives are valid only during the call.
type Statement struct {
	// Command is the COM_* code of the command packet.
	Command byte
	// Class is the classifier's verdict.
	Class sqlscan.Class
	// Query is the SQL text of COM_QUERY (after its query attributes,
	// when CLIENT_QUERY_ATTRIBUTES is in force) and COM_STMT_PREPARE, and
	// the prepared text for COM_STMT_EXECUTE / COM_STMT_FETCH /
	// COM_STMT_SEND_LONG_DATA / MariaDB's COM_STMT_BULK_EXECUTE when
	// known; empty otherwise.
	Query string
	// PayloadBytes is the size of the command's first packet payload, the
	// write payload known before forwarding. A COM_STMT_BULK_EXECUTE
	// (0xfa) is one statement of ClassWrite whatever its number of
	// parameter rows; its payload, the rows included, is written bytes.
	PayloadBytes int64
	// Multi is true for a COM_QUERY holding more than one statement.
	Multi bool
	// InTransaction is true when the backend's last status said a
	// transaction is open.
	InTransaction bool
	// NoBackslashEscapes is true when the backend's last status said the
	// session's sql_mode has NO_BACKSLASH_ESCAPES: a backslash in a string
	// literal is then an ordinary character.
	NoBackslashEscapes bool
	// Charset is how the session's character_set_client reads: in gbk,
	// big5, sjis, cp932 (and MySQL's gb18030) a multi-byte character's
	// trail byte may be '\' or '`'. For COM_STMT_EXECUTE and the other
	// commands on a prepared statement it is the one the text was
	// prepared in.
	Charset sqlscan.Charset
	// Scan is what the single pass over the SQL text found, for
	// COM_QUERY, COM_STMT_PREPARE and (from the prepared text)
	// COM_STMT_EXECUTE; zero for other commands. The digest is computed
	// only for a policy other than PassThrough.
	Scan sqlscan.Scan
}

// Mode is how the server reads the statement's text: pass it to sqlscan
// to read the text as the server does.
func (st *Statement) Mode() sqlscan.Mode {
	return sqlscan.Mode{Charset: st.Charset, NoBackslashEscapes: st.NoBackslashEscapes}
}

// Outcome is what mysqlproto measured while forwarding a statement.
type Outcome struct {
	// RequestBytes is every payload byte the client sent for this command:
	// the first packet, multi-packet continuations, LOCAL INFILE data.
	RequestBytes int64
	// ResponseBytes is every payload byte the backend returned.
	ResponseBytes int64
	// BackendTime runs from forwarding the statement to its final packet,
	// less the time spent blocked writing to the client.
	BackendTime time.Duration
	// AffectedRows is the sum of affected rows reported in OK packets.
	AffectedRows uint64
	// Warnings is the warning count of the response's last OK or EOF
	// packet: what SHOW WARNINGS would list after it.
	Warnings uint16
	// ErrCode is the backend's error code, 0 when the statement succeeded.
	ErrCode uint16
	// InTransaction is true when, after the response, a transaction is open.
	InTransaction bool
	// NotForwarded is true when the statement never reached the backend:
	// the session ended after Before let it through (ErrCode is then
	// 1317). It cost the backend nothing and says nothing about its shape.
	NotForwarded bool
}

// Reply is a response that mysqlproto writes to the client instead of
// forwarding the statement. Exactly one of Err, OK and Columns is used:
// Err if non-nil, else a result set if Columns is non-nil, else OK.
type Reply struct {
	// Err answers with an ERR packet.
	Err *Error
	// Columns and Rows answer with a text result set (all columns strings;
	// a nil *string in Rows is SQL NULL).
	Columns []string
	Rows    [][]*string
	// AffectedRows, Warnings (the warning count) and Info fill the OK
	// packet. The policy answers the SHOW WARNINGS that may follow.
	AffectedRows uint64
	Warnings     uint16
	Info         string
}

// Error is a MySQL error as sent in an ERR packet.
type Error struct {
	Code    uint16
	State   string // SQLSTATE, 5 characters; "HY000" when empty
	Message string
}

func (e *Error) Error() string { return e.Message }

// Verdict is a policy's answer before a statement.
type Verdict struct {
	// Reply, when non-nil, is written to the client and the statement is
	// not forwarded. A refusal is a Reply with Err set.
	Reply *Reply
	// Rewrite, when not empty, is the SQL text forwarded instead of a
	// COM_QUERY's own (ignored for other commands), after the client's
	// query attributes when CLIENT_QUERY_ATTRIBUTES is in force. The
	// Outcome still counts the client's bytes.
	Rewrite string
}

// SessionInfo describes a client session.
type SessionInfo struct {
	// ID is the proxy's own session id, unique in the process.
	ID uint64
	// User is the user name the client logged in with (no host).
	User string
	// ClientAddr is the client's address.
	ClientAddr net.Addr
	// BackendConnID is the backend's connection (thread) id of this
	// session's dedicated backend connection.
	BackendConnID uint32
}

// EventKind names a session event.
type EventKind uint8

const (
	EventLogin EventKind = iota
	EventChangeUser
	EventResetConnection
	EventClose
)

// Backend lets a policy run a text query on the session's own backend
// connection between statements (for example SHOW GRANTS). Rows are
// strings; a nil entry is SQL NULL. It is valid only during the Before (or
// FollowUp) call that receives it and must not be used from another
// goroutine.
type Backend interface {
	Query(ctx context.Context, sql string) (columns []string, rows [][]*string, err error)
}

// Policy decides what happens to each statement. It is implemented by the
// caller (internal/rgpolicy, wired by cmd/rgproxy); mysqlproto knows
// nothing of what it does.
//
// Concurrency: Open is called concurrently from many session goroutines.
// Each SessionPolicy it returns is used by one session goroutine only, so
// its methods are never called concurrently with each other.
type Policy interface {
	// Open is called once per session after a successful login. The
	// returned SessionPolicy receives that session's statements and events;
	// Event(EventLogin) is not sent separately.
	Open(info SessionInfo) SessionPolicy
}

// SessionPolicy is one session's policy. See Policy for concurrency.
type SessionPolicy interface {
	// Before is called before a statement is forwarded. It may block (to
	// throttle) until ctx is done; ctx ends when the session or the proxy
	// closes. be runs queries on the session's backend connection.
	Before(ctx context.Context, st *Statement, be Backend) Verdict
	// After is called once the statement's final response packet has been
	// relayed (or the statement failed), only for forwarded statements.
	After(st *Statement, out *Outcome)
	// Event reports a session event: COM_CHANGE_USER (info carries the new
	// user), COM_RESET_CONNECTION, and close (the last call).
	Event(kind EventKind, info SessionInfo)
}

// ErrorRewriter may be implemented by a SessionPolicy. When a forwarded
// statement's response ends in an ERR packet, mysqlproto asks it before
// relaying that packet, and sends the returned error instead when it is
// not nil (for example to tell the client why its statement was killed).
// It is called from the session goroutine, between Before and After.
type ErrorRewriter interface {
	RewriteError(st *Statement, code uint16) *Error
}

// FollowUpper may be implemented by a SessionPolicy that must read the
// session's backend connection once a statement is over, for what only
// that connection knows afterwards (for example a session variable the
// statement changed, such as MariaDB's @@last_gtid). mysqlproto calls
// FollowUp right after After, only for a statement that was forwarded and
// whose whole response was relayed and flushed to the client, so a query
// it runs adds nothing to the statement's latency; the client's next
// command waits for it. be is valid during the call only; an I/O failure
// of one of its queries ends the session once FollowUp returns, as the
// backend connection is then in an unknown state. ctx ends when the
// session or the proxy closes. It is called from the session goroutine.
type FollowUpper interface {
	FollowUp(ctx context.Context, st *Statement, out *Outcome, be Backend)
}

// ProgressObserver may be implemented by a SessionPolicy to follow a
// statement while its response streams: mysqlproto calls Progress every
// 64 KiB of response payload relayed, with the payload bytes so far. It is
// called from the session goroutine, between Before and After, and must
// not block.
type ProgressObserver interface {
	Progress(st *Statement, responseBytes int64)
}

// PassThrough is a Policy that forwards everything: a pure proxy.
type PassThrough struct{}

// PassThroughWrapper is implemented by a Policy that wraps another (to
// count or log) and never blocks when what it wraps is PassThrough: the
// server then skips, as for PassThrough itself, the hangup check during
// Before and the digest of every statement.
type PassThroughWrapper interface {
	Policy
	WrapsPassThrough() bool
}

// passesThrough reports whether p is PassThrough, or wraps it.
func passesThrough(p Policy) bool {
	if _, ok := p.(PassThrough); ok {
		return true
	}
	w, ok := p.(PassThroughWrapper)
	return ok && w.WrapsPassThrough()
}

// Open implements Policy.
func (PassThrough) Open(SessionInfo) SessionPolicy { return passThroughSession{} }

type passThroughSession struct{}

func (passThroughSession) Before(context.Context, *Statement, Backend) Verdict { return Verdict{} }
func (passThroughSession) After(*Statement, *Outcome)                          {}
func (passThroughSession) Event(EventKind, SessionInfo)                        {}

// ScanStatement fills st.Class, st.Multi and st.Scan from st.Query as a
// session does for a COM_QUERY whose server has Config.ScanWords words.
// It is for tests and tools: it indexes words on every call.
func ScanStatement(st *Statement, words []string) error {
	ws, err := sqlscan.NewWords(words)
	if err != nil {
		return err
	}
	st.Class, st.Multi, _ = sqlscan.Text([]byte(st.Query), st.Query, st.Mode(), ws, &st.Scan, nil, true)
	return nil
}
