package mysqlproto

import (
	"errors"
	"fmt"

	"github.com/rgproxy/rgproxy/sqlscan"
)

// The server reads a statement in the session's character_set_client: in
// gbk, big5, sjis, cp932 (and MySQL's gb18030) a multi-byte character may
// end in '\' or '`', so the scan must lex in that character set to end
// strings and identifiers where the server does. A session starts from its
// handshake's collation and follows what may change it: SET NAMES, SET
// CHARACTER SET / CHARSET, SET character_set_client (read from the text
// when the value is a literal), SQL PREPARE / EXECUTE / EXECUTE IMMEDIATE
// of such a SET, COM_STMT_EXECUTE of a prepared one, COM_RESET_CONNECTION
// and COM_CHANGE_USER. When the text does not say (a variable, DEFAULT, an
// expression, a statement prepared from a variable, a reset), the session
// asks the backend before it scans the next text. CALL does not change it:
// a stored program's SET NAMES is undone when the program returns.

// setLoginCharset starts the session's character set from the collation
// id of its handshake response (or COM_CHANGE_USER).
func (ss *session) setLoginCharset(id uint16) {
	cs, known := sqlscan.CharsetByCollationID(id)
	ss.charset, ss.csStale = cs, !known
}

// refreshCharset asks the backend for character_set_client, before a text
// is scanned, when a statement may have changed it. The query runs on the
// session's connection between the client's statements (like a policy's
// queries); an I/O failure ends the session.
func (ss *session) refreshCharset() error {
	ss.csStale = false
	_, rows, err := sessionBackend{ss}.Query(ss.ctx, "SELECT @@character_set_client")
	if err != nil {
		var me *Error
		if errors.As(err, &me) {
			ss.log.Warn("reading character_set_client failed; the scan keeps the last known one", "err", err)
			return nil
		}
		return ss.backendFailed(1, fmt.Errorf("reading character_set_client: %w", err))
	}
	if len(rows) == 1 && len(rows[0]) == 1 && rows[0][0] != nil {
		ss.charset = sqlscan.CharsetByName(*rows[0][0])
	}
	return nil
}

// charsetAfter follows what a forwarded statement (COM_QUERY or
// COM_STMT_EXECUTE) did to character_set_client.
func (ss *session) charsetAfter(st *Statement, out *Outcome) {
	e := st.Scan.Charset
	if e.Kind == sqlscan.CharsetPrepared {
		e = ss.preparedEffect(st, out)
	}
	switch {
	case e.Kind == sqlscan.CharsetNone:
	case e.Kind == sqlscan.CharsetTo && out.ErrCode == 0:
		ss.charset = e.To
	case e.Kind == sqlscan.CharsetTo && !st.Multi:
		// A SET that failed changed nothing.
	default:
		ss.csStale = true
	}
}

// preparedEffect follows SQL-level prepared statements (a single
// statement: PREPARE name FROM 'text' | @var, EXECUTE name, EXECUTE
// IMMEDIATE 'text' | expr, DEALLOCATE / DROP PREPARE name) and returns
// what the statement did to character_set_client. It runs only for those
// statements, and may allocate.
func (ss *session) preparedEffect(st *Statement, out *Outcome) sqlscan.CharsetEffect {
	pr := sqlscan.ReadPrepared(st.Query, st.Mode())
	switch pr.Op {
	case sqlscan.PreparedPrepare:
		if !pr.Named {
			return sqlscan.CharsetEffect{}
		}
		if ss.sqlPrepared == nil {
			ss.sqlPrepared = make(map[string]sqlscan.CharsetEffect)
		}
		delete(ss.sqlPrepared, pr.Name) // a failed PREPARE drops the old one too
		if out.ErrCode != 0 || !pr.HasFrom {
			return sqlscan.CharsetEffect{}
		}
		ss.sqlPrepared[pr.Name] = pr.Effect
		return sqlscan.CharsetEffect{} // preparing runs nothing
	case sqlscan.PreparedExecuteImmediate:
		return pr.Effect
	case sqlscan.PreparedExecute:
		if e, found := ss.sqlPrepared[pr.Name]; found && pr.Named {
			return e
		}
		return sqlscan.CharsetEffect{Kind: sqlscan.CharsetAsk}
	case sqlscan.PreparedDeallocate:
		if pr.Named {
			delete(ss.sqlPrepared, pr.Name)
		}
	}
	return sqlscan.CharsetEffect{}
}

// charsetReset: after COM_RESET_CONNECTION or COM_CHANGE_USER the server
// resets session variables (to the handshake's character set, to the
// global ones, or to the packet's: it depends on the server), and forgets
// prepared statements.
func (ss *session) charsetReset(collation uint16, hasCollation bool) {
	clear(ss.sqlPrepared)
	if hasCollation {
		ss.setLoginCharset(collation)
		return
	}
	ss.csStale = true
}
