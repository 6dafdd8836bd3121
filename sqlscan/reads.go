package sqlscan

import (
	"strconv"
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// This file holds the readings a policy needs of some statements only: the
// single pass (scan.go) says cheaply when one is needed (a Mentions bit, the
// class, the command), and the reading then runs over the text in the
// session's Mode, as the pass did. A policy never lexes a text itself.

// HeadWords returns the first n tokens of text's first statement, upper
// case (SHOW WARNINGS, SHOW COUNT(*) WARNINGS, ...).
func HeadWords(text string, m Mode, n int) []string {
	l := sqltext.NewString(text, m)
	var words []string
	for t := l.Next(); t.Kind != tkEOF && t.Kind != tkSemicolon && len(words) < n; t = l.Next() {
		words = append(words, strings.ToUpper(text[t.Start:t.End]))
	}
	return words
}

// FirstWord is a statement's first keyword, upper case ("" when it starts
// with anything else); only its first 64 bytes are read.
func FirstWord(text string, m Mode) string {
	if len(text) > 64 {
		text = text[:64]
	}
	l := sqltext.NewString(text, m)
	if t := l.Next(); t.Kind == tkWord {
		return strings.ToUpper(text[t.Start:t.End])
	}
	return ""
}

// Table is a table as a statement names it; Schema "" is the current
// database.
type Table struct{ Schema, Table string }

// Head is what a statement's first words say about what it writes.
type Head struct {
	// Verb is the first keyword, upper case ("" when none was read).
	Verb string
	// Target is the one table an INSERT, REPLACE or single-table UPDATE
	// writes (also through EXECUTE IMMEDIATE 'text', or PREPARE name FROM
	// 'text').
	Target Table
	// Prepare is the name EXECUTE runs or a PREPARE ... FROM 'text'
	// defines (its target is Target).
	Prepare string
}

// headPrefix is how much of a text ReadHead reads: a 1 MiB literal costs
// nothing there.
const headPrefix = 1024

// ReadHead reads the first words of a statement: its verb and, when it
// writes one table, that table. Only the first 1 KiB is read.
func ReadHead(text string, m Mode) Head {
	if len(text) > headPrefix {
		text = text[:headPrefix]
	}
	l := sqltext.NewString(text, m)
	next := func() (sqltext.Token, string) {
		t := l.Next()
		return t, text[t.Start:t.End]
	}
	word := func(t sqltext.Token, s string) string {
		if t.Kind != tkWord {
			return ""
		}
		return strings.ToUpper(s)
	}
	t, s := next()
	h := Head{Verb: word(t, s)}
	switch h.Verb {
	case "INSERT", "REPLACE":
		for {
			t, s = next()
			switch word(t, s) {
			case "LOW_PRIORITY", "DELAYED", "HIGH_PRIORITY", "IGNORE", "INTO":
				continue
			}
			break
		}
		h.Target, _ = tableRef(t, s, &l, text)
	case "UPDATE":
		for {
			t, s = next()
			switch word(t, s) {
			case "LOW_PRIORITY", "IGNORE":
				continue
			}
			break
		}
		tbl, after := tableRef(t, s, &l, text)
		// One table: SET follows it, or an alias and SET.
		for i := 0; i < 3 && (after.Kind == tkWord || after.Kind == tkQuotedIdent); i++ {
			w := word(after, text[after.Start:after.End])
			if w == "SET" {
				h.Target = tbl
				break
			}
			if w == "JOIN" || w == "STRAIGHT_JOIN" || w == "INNER" || w == "LEFT" || w == "RIGHT" || w == "CROSS" || w == "NATURAL" {
				break
			}
			after = l.Next()
		}
	case "EXECUTE":
		t, s = next()
		if word(t, s) == "IMMEDIATE" {
			t, s = next()
			if t.Kind == tkString {
				inner := ReadHead(literalText(s, m), m)
				if inner.Verb == "INSERT" || inner.Verb == "REPLACE" || inner.Verb == "UPDATE" {
					h.Target = inner.Target
				}
			}
			return h
		}
		if name := identText(t, s, m); name != "" {
			h.Prepare = name // looked up by the caller
		}
	case "PREPARE":
		t, s = next()
		name := identText(t, s, m)
		if t, s = next(); word(t, s) != "FROM" || name == "" {
			return h
		}
		if t, s = next(); t.Kind == tkString {
			inner := ReadHead(literalText(s, m), m)
			if inner.Verb == "INSERT" || inner.Verb == "REPLACE" || inner.Verb == "UPDATE" {
				h.Target = inner.Target
			}
			h.Prepare = name // remembered even without a target: EXECUTE then finds none
		}
	}
	return h
}

// tableRef reads a table reference, [schema.]table, whose first token is
// t; it returns the table ("" when t is not a name) and the token after
// it.
func tableRef(t sqltext.Token, s string, l *sqltext.Lexer, q string) (Table, sqltext.Token) {
	m := l.Mode()
	first := identText(t, s, m)
	if first == "" {
		return Table{}, t
	}
	n := l.Next()
	if n.Kind != tkPunct || q[n.Start:n.End] != "." {
		return Table{Table: first}, n
	}
	n = l.Next()
	second := identText(n, q[n.Start:n.End], m)
	if second == "" {
		return Table{}, n
	}
	return Table{Schema: first, Table: second}, l.Next()
}

// identText is the name a word or `quoted identifier` token stands for,
// read in the session's mode (a backquote may be a multi-byte character's
// trail byte).
func identText(t sqltext.Token, s string, m Mode) string {
	switch t.Kind {
	case tkWord:
		return s
	case tkQuotedIdent:
		if v, ok := sqltext.Unquote(s, m); ok {
			return v
		}
		// Cut by ReadHead's prefix: unquote what there is, closed.
		if v, ok := sqltext.Unquote(s+"`", m); ok {
			return v
		}
	}
	return ""
}

// literalText is the text of a string literal token (an N or _charset
// prefix, quotes and escapes undone, as the server reads it in m); an
// unterminated literal (cut by ReadHead's prefix) gives what there is of
// it.
func literalText(s string, m Mode) string {
	i := strings.IndexAny(s, `'"`)
	if i < 0 {
		return ""
	}
	if v, ok := sqltext.Unquote(s[i:], m); ok {
		return v
	}
	// Cut: unquote what there is, closed by its quote.
	if v, ok := sqltext.Unquote(s[i:]+s[i:i+1], m); ok {
		return v
	}
	return ""
}

// ReplaceRowCount replaces each ROW_COUNT() call in text by n, as a
// BIGINT; a bare select item is aliased to its own text. ok is false when
// text calls none.
func ReplaceRowCount(text string, m Mode, n int64) (string, bool) {
	q := text
	l := sqltext.NewString(q, m)
	var toks []sqltext.Token
	for t := l.Next(); t.Kind != tkEOF; t = l.Next() {
		toks = append(toks, t)
	}
	tokText := func(i int) string {
		if i < 0 || i >= len(toks) {
			return ""
		}
		return q[toks[i].Start:toks[i].End]
	}
	is := func(i int, kind sqltext.Kind, s string) bool {
		return i >= 0 && i < len(toks) && toks[i].Kind == kind && strings.EqualFold(tokText(i), s)
	}
	value := "CAST(" + strconv.FormatInt(n, 10) + " AS SIGNED)"
	var b strings.Builder
	last, depth := 0, 0
	for i := 0; i < len(toks); i++ {
		switch {
		case is(i, tkPunct, "("):
			depth++
			continue
		case is(i, tkPunct, ")"):
			depth--
			continue
		}
		if !is(i, tkWord, "ROW_COUNT") || !is(i+1, tkPunct, "(") ||
			!is(i+2, tkPunct, ")") || is(i-1, tkPunct, ".") {
			continue
		}
		start, end := toks[i].Start, toks[i+2].End
		b.WriteString(q[last:start])
		b.WriteString(value)
		bare := depth == 0 && (is(i-1, tkWord, "SELECT") || is(i-1, tkWord, "DISTINCT") ||
			is(i-1, tkWord, "ALL") || is(i-1, tkPunct, ","))
		if next := i + 3; bare && next < len(toks) {
			switch k := toks[next].Kind; {
			case k == tkSemicolon, is(next, tkPunct, ","):
			case k == tkWord:
				switch strings.ToUpper(tokText(next)) {
				case "FROM", "INTO", "WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "UNION", "FOR", "LOCK", "WINDOW":
				default:
					bare = false // an alias, or an operator word (AND, DIV, ...)
				}
			default:
				bare = false
			}
		}
		if bare {
			b.WriteString(" AS `" + strings.ReplaceAll(q[start:end], "`", "``") + "`")
		}
		last = end
		i += 2
	}
	if last == 0 {
		return "", false
	}
	b.WriteString(q[last:])
	return b.String(), true
}
