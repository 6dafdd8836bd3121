package mysqlproto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
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

// csKind says what a statement does to character_set_client.
type csKind uint8

const (
	csNone     csKind = iota // nothing
	csTo                     // sets it to csEffect.to
	csAsk                    // changes it to something the text does not say
	csPrepared               // PREPARE, EXECUTE or DEALLOCATE: the session resolves it
)

type csEffect struct {
	kind csKind
	to   sqltext.Charset
}

// charsetEffect returns what the statement whose first token is t (read
// from p) may do to character_set_client. It reads ahead only on SET,
// PREPARE, EXECUTE, DEALLOCATE and DROP PREPARE.
func charsetEffect(p sqltext.Lexer, t sqltext.Token) csEffect {
	switch word(&p, t) {
	case kwSet:
		return setEffect(p)
	case kwPrepare, kwExecute, kwDeallocate:
		return csEffect{kind: csPrepared}
	case kwDrop:
		if word(&p, p.Next()) == kwPrepare {
			return csEffect{kind: csPrepared}
		}
	}
	return csEffect{}
}

// setEffect reads the assignments of a SET statement (p is just past SET)
// and returns the last one's effect on character_set_client: NAMES x,
// CHARACTER SET x, CHARSET x and [SESSION|LOCAL|@@session.|@@local.|@@]
// character_set_client = x with x a name, a quoted name or a collation id
// set it; DEFAULT, a variable, an expression or a GLOBAL assignment of it
// ask the backend. Other assignments change nothing.
func setEffect(p sqltext.Lexer) csEffect {
	var eff csEffect
	global := false
	t := p.Next()
	if t.Kind == tkWord && sqlWordFold(p.Text(t), "STATEMENT") {
		return eff // SET STATEMENT cannot set character_set_client (1971)
	}
assign:
	for {
		// One assignment, from its first token t.
		touches, name := false, false
		if t.Kind == tkWord {
			w := p.Text(t)
			switch {
			case sqlWordFold(w, "GLOBAL"), sqlWordFold(w, "PERSIST"), sqlWordFold(w, "PERSIST_ONLY"):
				global = true
				t = p.Next()
			case sqlWordFold(w, "SESSION"), sqlWordFold(w, "LOCAL"):
				global = false
				t = p.Next()
			}
		}
		switch {
		case t.Kind == tkWord && sqlWordFold(p.Text(t), "NAMES"), t.Kind == tkWord && sqlWordFold(p.Text(t), "CHARSET"):
			touches, name = true, true
		case t.Kind == tkWord && sqlWordFold(p.Text(t), "CHARACTER"):
			if n := p.Next(); n.Kind == tkWord && sqlWordFold(p.Text(n), "SET") {
				touches, name = true, true
			}
		case t.Kind == tkWord && sqlWordFold(p.Text(t), "CHARACTER_SET_CLIENT"):
			touches = true
		case t.Kind == tkVar:
			v := p.Text(t)
			switch {
			case sqlWordFold(v, "@@CHARACTER_SET_CLIENT"):
				touches = true
			case sqlWordFold(v, "@@SESSION"), sqlWordFold(v, "@@LOCAL"), sqlWordFold(v, "@@GLOBAL"):
				g := sqlWordFold(v, "@@GLOBAL")
				if p.IsPunct(p.Next(), '.') {
					if n := p.Next(); n.Kind == tkWord && sqlWordFold(p.Text(n), "CHARACTER_SET_CLIENT") {
						touches, global = true, g
					}
				}
			}
		}
		if touches {
			e := csEffect{kind: csAsk}
			if !name {
				// "= value" or ":= value".
				if op := p.Next(); !p.IsPunct(op, '=') && !(op.Kind == tkPunct && string(p.Text(op)) == ":=") {
					return csEffect{kind: csAsk}
				}
			}
			v := p.Next()
			save := p
			after := p.Next()
			literal := after.Kind == tkEOF || after.Kind == tkSemicolon || p.IsPunct(after, ',') ||
				name && after.Kind == tkWord && sqlWordFold(p.Text(after), "COLLATE")
			p = save
			if literal && !global {
				if cs, ok := charsetValue(&p, v); ok {
					e = csEffect{kind: csTo, to: cs}
				}
			}
			eff = e
		}
		// On to the next assignment: the next "," outside parentheses.
		depth := 0
		for {
			if t.Kind == tkEOF || t.Kind == tkSemicolon {
				return eff
			}
			t = p.Next()
			switch {
			case t.Kind == tkEOF || t.Kind == tkSemicolon:
				return eff
			case p.IsPunct(t, '('):
				depth++
			case p.IsPunct(t, ')'):
				depth--
			case depth <= 0 && p.IsPunct(t, ','):
				t = p.Next()
				continue assign
			}
		}
	}
}

// charsetValue reads the value v of a character-set assignment: a bare,
// quoted or backquoted name, or a collation id. DEFAULT and anything else
// are not known from the text.
func charsetValue(p *sqltext.Lexer, v sqltext.Token) (sqltext.Charset, bool) {
	text := p.Text(v)
	switch v.Kind {
	case tkWord:
		if sqlWordFold(text, "DEFAULT") {
			return 0, false
		}
		return sqltext.CharsetByName(string(text)), true
	case tkString, tkQuotedIdent:
		name, ok := sqltext.Unquote(string(text), p.Mode())
		if !ok {
			return 0, false
		}
		return sqltext.CharsetByName(name), true
	case tkNumber:
		id, err := strconv.ParseUint(string(text), 10, 16)
		if err != nil {
			return 0, false
		}
		return sqltext.CharsetByCollationID(uint16(id))
	}
	return 0, false
}

// setLoginCharset starts the session's character set from the collation
// id of its handshake response (or COM_CHANGE_USER).
func (ss *session) setLoginCharset(id uint16) {
	cs, known := sqltext.CharsetByCollationID(id)
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
		ss.charset = sqltext.CharsetByName(*rows[0][0])
	}
	return nil
}

// charsetAfter follows what a forwarded statement (COM_QUERY or
// COM_STMT_EXECUTE) did to character_set_client.
func (ss *session) charsetAfter(st *Statement, out *Outcome) {
	e := st.Scan.cs
	if e.kind == csPrepared {
		e = ss.preparedEffect(st, out)
	}
	switch {
	case e.kind == csNone:
	case e.kind == csTo && out.ErrCode == 0:
		ss.charset = e.to
	case e.kind == csTo && !st.Multi:
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
func (ss *session) preparedEffect(st *Statement, out *Outcome) csEffect {
	p := sqltext.NewString(st.Query, st.Mode())
	t := p.Next()
	for p.IsPunct(t, '(') {
		t = p.Next()
	}
	k := word(&p, t)
	if k == kwDrop {
		p.Next() // PREPARE
		k = kwDeallocate
	}
	name := p.Next()
	if k == kwDeallocate {
		name = p.Next() // after PREPARE
	}
	key, ok := preparedName(&p, name)
	switch k {
	case kwPrepare:
		if !ok {
			return csEffect{}
		}
		if ss.sqlPrepared == nil {
			ss.sqlPrepared = make(map[string]csEffect)
		}
		delete(ss.sqlPrepared, key) // a failed PREPARE drops the old one too
		if out.ErrCode != 0 {
			return csEffect{}
		}
		if from := p.Next(); from.Kind != tkWord || !sqlWordFold(p.Text(from), "FROM") {
			return csEffect{}
		}
		ss.sqlPrepared[key] = textEffect(&p, p.Next())
		return csEffect{} // preparing runs nothing
	case kwExecute:
		if name.Kind == tkWord && sqlWordFold(p.Text(name), "IMMEDIATE") {
			return textEffect(&p, p.Next())
		}
		if e, found := ss.sqlPrepared[key]; found && ok {
			return e
		}
		return csEffect{kind: csAsk}
	case kwDeallocate:
		if ok {
			delete(ss.sqlPrepared, key)
		}
	}
	return csEffect{}
}

// preparedName returns the lower-case name of a prepared statement (names
// ignore case), bare or backquoted.
func preparedName(p *sqltext.Lexer, t sqltext.Token) (string, bool) {
	switch t.Kind {
	case tkWord:
		return strings.ToLower(string(p.Text(t))), true
	case tkQuotedIdent:
		n, ok := sqltext.Unquote(string(p.Text(t)), p.Mode())
		return strings.ToLower(n), ok
	}
	return "", false
}

// textEffect returns what a statement given as the value t of PREPARE ...
// FROM or EXECUTE IMMEDIATE does to character_set_client: read from a
// string literal that ends the statement, else unknown.
func textEffect(p *sqltext.Lexer, t sqltext.Token) csEffect {
	if t.Kind != tkString || p.Src()[t.Start] == 'N' || p.Src()[t.Start] == 'n' || p.Src()[t.Start] == '_' {
		return csEffect{kind: csAsk}
	}
	if n := p.Next(); n.Kind != tkEOF && n.Kind != tkSemicolon {
		return csEffect{kind: csAsk}
	}
	text, ok := sqltext.Unquote(string(p.Text(t)), p.Mode())
	if !ok {
		return csEffect{kind: csAsk}
	}
	l := sqltext.NewString(text, p.Mode())
	first := l.Next()
	for l.IsPunct(first, '(') {
		first = l.Next()
	}
	e := charsetEffect(l, first)
	if e.kind == csPrepared {
		return csEffect{kind: csAsk}
	}
	return e
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
