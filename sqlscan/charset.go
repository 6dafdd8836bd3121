package sqlscan

import (
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

// CharsetKind says what a statement does to character_set_client.
type CharsetKind uint8

const (
	CharsetNone     CharsetKind = iota // nothing
	CharsetTo                          // sets it to CharsetEffect.To
	CharsetAsk                         // changes it to something the text does not say
	CharsetPrepared                    // PREPARE, EXECUTE or DEALLOCATE: the session resolves it
)

// CharsetEffect is what a statement's text does to the session's
// character_set_client.
type CharsetEffect struct {
	Kind CharsetKind
	// To is the character set a CharsetTo sets.
	To Charset
}

// charsetEffect returns what the statement whose first token is t (read
// from p) may do to character_set_client. It reads ahead only on SET,
// PREPARE, EXECUTE, DEALLOCATE and DROP PREPARE.
func charsetEffect(p sqltext.Lexer, t sqltext.Token) CharsetEffect {
	switch word(&p, t) {
	case kwSet:
		return setEffect(p)
	case kwPrepare, kwExecute, kwDeallocate:
		return CharsetEffect{Kind: CharsetPrepared}
	case kwDrop:
		if word(&p, p.Next()) == kwPrepare {
			return CharsetEffect{Kind: CharsetPrepared}
		}
	}
	return CharsetEffect{}
}

// setEffect reads the assignments of a SET statement (p is just past SET)
// and returns the last one's effect on character_set_client: NAMES x,
// CHARACTER SET x, CHARSET x and [SESSION|LOCAL|@@session.|@@local.|@@]
// character_set_client = x with x a name, a quoted name or a collation id
// set it; DEFAULT, a variable, an expression or a GLOBAL assignment of it
// ask the backend. Other assignments change nothing.
func setEffect(p sqltext.Lexer) CharsetEffect {
	var eff CharsetEffect
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
			e := CharsetEffect{Kind: CharsetAsk}
			if !name {
				// "= value" or ":= value".
				if op := p.Next(); !p.IsPunct(op, '=') && !(op.Kind == tkPunct && string(p.Text(op)) == ":=") {
					return CharsetEffect{Kind: CharsetAsk}
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
					e = CharsetEffect{Kind: CharsetTo, To: cs}
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

// PreparedOp is which SQL-level prepared-statement command a text is.
type PreparedOp uint8

const (
	// PreparedNone: none of them.
	PreparedNone PreparedOp = iota
	// PreparedPrepare: PREPARE name FROM 'text' | @var.
	PreparedPrepare
	// PreparedExecute: EXECUTE name.
	PreparedExecute
	// PreparedExecuteImmediate: EXECUTE IMMEDIATE 'text' | expr.
	PreparedExecuteImmediate
	// PreparedDeallocate: DEALLOCATE PREPARE name or DROP PREPARE name.
	PreparedDeallocate
)

// Prepared is what a single SQL-level prepared-statement command says,
// for a session that follows what it does to character_set_client.
type Prepared struct {
	Op PreparedOp
	// Name is the statement's name in lower case (names ignore case);
	// Named is false when the text does not give one the server would take.
	Name  string
	Named bool
	// HasFrom is true for a PREPARE whose name is followed by FROM.
	HasFrom bool
	// Effect is what the prepared text (PREPARE ... FROM) or the text run
	// (EXECUTE IMMEDIATE) does to character_set_client.
	Effect CharsetEffect
}

// ReadPrepared reads text, a statement whose Scan.Charset.Kind is
// CharsetPrepared, as PREPARE, EXECUTE [IMMEDIATE] or DEALLOCATE / DROP
// PREPARE. It runs only for those statements, and may allocate.
func ReadPrepared(text string, m Mode) Prepared {
	p := sqltext.NewString(text, m)
	t := p.Next()
	for p.IsPunct(t, '(') {
		t = p.Next()
	}
	k := word(&p, t)
	if k == kwDrop {
		k = kwDeallocate // DROP PREPARE name reads as DEALLOCATE PREPARE name
	}
	name := p.Next()
	if k == kwDeallocate {
		name = p.Next() // after PREPARE
	}
	var r Prepared
	r.Name, r.Named = preparedName(&p, name)
	switch k {
	case kwPrepare:
		r.Op = PreparedPrepare
		if !r.Named {
			return r
		}
		if from := p.Next(); from.Kind == tkWord && sqlWordFold(p.Text(from), "FROM") {
			r.HasFrom = true
			r.Effect = textEffect(&p, p.Next())
		}
	case kwExecute:
		if name.Kind == tkWord && sqlWordFold(p.Text(name), "IMMEDIATE") {
			r.Op = PreparedExecuteImmediate
			r.Effect = textEffect(&p, p.Next())
			return r
		}
		r.Op = PreparedExecute
	case kwDeallocate:
		r.Op = PreparedDeallocate
	}
	return r
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
func textEffect(p *sqltext.Lexer, t sqltext.Token) CharsetEffect {
	if t.Kind != tkString || p.Src()[t.Start] == 'N' || p.Src()[t.Start] == 'n' || p.Src()[t.Start] == '_' {
		return CharsetEffect{Kind: CharsetAsk}
	}
	if n := p.Next(); n.Kind != tkEOF && n.Kind != tkSemicolon {
		return CharsetEffect{Kind: CharsetAsk}
	}
	text, ok := sqltext.Unquote(string(p.Text(t)), p.Mode())
	if !ok {
		return CharsetEffect{Kind: CharsetAsk}
	}
	l := sqltext.NewString(text, p.Mode())
	first := l.Next()
	for l.IsPunct(first, '(') {
		first = l.Next()
	}
	e := charsetEffect(l, first)
	if e.Kind == CharsetPrepared {
		return CharsetEffect{Kind: CharsetAsk}
	}
	return e
}
