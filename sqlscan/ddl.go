package sqlscan

import (
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// This file reads the DDL whose writes no session pays for by itself:
// events, which the server runs later as their definer, and the statements
// that copy or rebuild a table, which write the whole table while the
// binary log shows one statement.

// maxDynamicDepth bounds how deep EventDDL follows a statement's text held
// in a literal (PREPARE ... FROM 'text', EXECUTE IMMEDIATE 'text').
const maxDynamicDepth = 4

// EventDDL reports whether text creates or alters an event: CREATE [OR
// REPLACE] [DEFINER = user] EVENT or ALTER [DEFINER = user] EVENT, in any
// of its statements (a multi-statement), inside a stored program's body,
// or in the literal text a PREPARE ... FROM or EXECUTE IMMEDIATE runs.
// It reads every token of text, in m; a caller asks only when the scan
// mentioned the word event.
func EventDDL(text string, m Mode) bool { return eventDDL(text, m, 0) }

func eventDDL(text string, m Mode, depth int) bool {
	l := sqltext.NewString(text, m)
	// The three tokens before the current one, newest first, as words
	// (upper case) or "" for anything else.
	var prev [3]string
	for t := l.Next(); t.Kind != tkEOF; t = l.Next() {
		s := text[t.Start:t.End]
		switch t.Kind {
		case tkWord:
			w := strings.ToUpper(s)
			if (w == "CREATE" || w == "ALTER") && eventFollows(&l, text) {
				return true
			}
			prev = [3]string{w, prev[0], prev[1]}
			continue
		case tkString:
			// PREPARE name FROM 'text', EXECUTE IMMEDIATE 'text'.
			if depth < maxDynamicDepth && (prev[0] == "IMMEDIATE" || prev[0] == "FROM" && prev[2] == "PREPARE") &&
				eventDDL(literalText(s, m), m, depth+1) {
				return true
			}
		case tkQuotedIdent:
			prev = [3]string{"", prev[0], prev[1]} // a PREPARE's `name`
			continue
		}
		prev = [3]string{}
	}
	return false
}

// eventFollows reads, on its own copy of the lexer just past CREATE or
// ALTER, the clauses that may stand before the object's kind (OR REPLACE,
// DEFINER = user) and reports whether that kind is EVENT.
func eventFollows(p *sqltext.Lexer, text string) bool {
	l := *p
	name := false // the next token is a definer's name or host
	for range 16 {
		t := l.Next()
		s := text[t.Start:t.End]
		switch t.Kind {
		case tkWord:
			if name {
				name = false
				continue
			}
			switch strings.ToUpper(s) {
			case "OR", "REPLACE", "DEFINER", "CURRENT_USER":
				continue
			case "EVENT":
				return true
			}
			return false
		case tkString, tkQuotedIdent, tkVar:
			name = false
			continue
		case tkPunct:
			switch s {
			case "=", "@":
				name = true
				continue
			case "(", ")": // CURRENT_USER()
				continue
			}
		}
		return false
	}
	return false
}

// CopyDDL is what a statement that may copy or rebuild tables says about
// them (ReadCopyDDL).
type CopyDDL struct {
	// Verb is ALTER (ALTER TABLE) or OPTIMIZE (OPTIMIZE TABLE).
	Verb string
	// Tables are the tables it names: ALTER TABLE's one, OPTIMIZE's list
	// (at most MaxCopyTables).
	Tables []Table
	// Rebuild: a clause that rewrites the whole table whichever algorithm
	// the engine picks (ALTER TABLE with FORCE, ENGINE, ALGORITHM = COPY,
	// ROW_FORMAT, KEY_BLOCK_SIZE, PAGE_COMPRESSED, PAGE_COMPRESSION_LEVEL,
	// ENCRYPTED, ENCRYPTION_KEY_ID, CONVERT TO CHARACTER SET, a PRIMARY
	// KEY added or dropped, PARTITION BY, REMOVE PARTITIONING, REORGANIZE /
	// COALESCE / REBUILD / OPTIMIZE PARTITION); every OPTIMIZE TABLE. An
	// ALTER TABLE without one may still copy (a column's type changed):
	// the server then reports the rows it copied.
	Rebuild bool
}

// MaxCopyTables bounds the tables ReadCopyDDL returns of one statement.
const MaxCopyTables = 256

// copyPrefix is how much of a text ReadCopyDDL reads: an ALTER's clauses,
// an OPTIMIZE's list of MaxCopyTables names.
const copyPrefix = 64 << 10

// rebuildWords are the ALTER TABLE clauses that rebuild the table
// (CopyDDL.Rebuild), when they start a clause.
var rebuildWords = map[string]bool{
	"FORCE": true, "ENGINE": true, "ROW_FORMAT": true, "KEY_BLOCK_SIZE": true, "PAGE_COMPRESSED": true,
	"PAGE_COMPRESSION_LEVEL": true, "ENCRYPTED": true, "ENCRYPTION_KEY_ID": true, "CONVERT": true,
	"REORGANIZE": true, "COALESCE": true, "REBUILD": true, "REMOVE": true, "OPTIMIZE": true,
}

// nameWords are the ALTER TABLE words after which names follow (a
// column's, an index's, a constraint's, a partition's), not a clause: how
// many. keepWords stand between such a word and its name (ADD COLUMN IF
// NOT EXISTS c, ADD UNIQUE INDEX i).
var (
	nameWords = map[string]int{
		"ADD": 1, "MODIFY": 1, "CHANGE": 2, "DROP": 1, "AFTER": 1, "ALTER": 1, "RENAME": 1, "BY": 1,
	}
	keepWords = map[string]bool{
		"COLUMN": true, "IF": true, "NOT": true, "EXISTS": true, "INDEX": true, "KEY": true, "UNIQUE": true,
		"FULLTEXT": true, "SPATIAL": true, "CONSTRAINT": true, "FOREIGN": true, "CHECK": true, "PERIOD": true,
		"TO": true, "AS": true,
	}
)

// ReadCopyDDL reads an ALTER [ONLINE] [IGNORE] TABLE [IF EXISTS] t ... or
// an OPTIMIZE [NO_WRITE_TO_BINLOG | LOCAL] TABLE t1, t2, ... statement
// (also as the literal text of EXECUTE IMMEDIATE): the tables it names and
// whether a clause rebuilds them. ok is false for any other statement (or
// one whose table it cannot read).
func ReadCopyDDL(text string, m Mode) (CopyDDL, bool) {
	if len(text) > copyPrefix {
		text = text[:copyPrefix]
	}
	l := sqltext.NewString(text, m)
	next := func() (sqltext.Token, string) {
		t := l.Next()
		return t, text[t.Start:t.End]
	}
	upper := func(t sqltext.Token, s string) string {
		if t.Kind != tkWord {
			return ""
		}
		return strings.ToUpper(s)
	}
	t, s := next()
	d := CopyDDL{Verb: upper(t, s)}
	if d.Verb == "EXECUTE" {
		// EXECUTE IMMEDIATE 'text' runs text (once: not EXECUTE in it).
		if t, s = next(); upper(t, s) == "IMMEDIATE" {
			if t, s = next(); t.Kind == tkString {
				if inner := literalText(s, m); FirstWord(inner, m) != "EXECUTE" {
					return ReadCopyDDL(inner, m)
				}
			}
		}
		return CopyDDL{}, false
	}
	if d.Verb != "ALTER" && d.Verb != "OPTIMIZE" {
		return CopyDDL{}, false
	}
	for {
		t, s = next()
		w := upper(t, s)
		if w == "TABLE" {
			break
		}
		if w != "ONLINE" && w != "IGNORE" && w != "NO_WRITE_TO_BINLOG" && w != "LOCAL" {
			return CopyDDL{}, false // ALTER DATABASE, ALTER EVENT, ...
		}
	}
	t, s = next()
	if upper(t, s) == "IF" {
		next() // EXISTS
		t, s = next()
	}
	if d.Verb == "OPTIMIZE" {
		d.Rebuild = true
		for {
			tbl, after := tableRef(t, s, &l, text)
			if tbl.Table == "" {
				break
			}
			if len(d.Tables) < MaxCopyTables {
				d.Tables = append(d.Tables, tbl)
			}
			if after.Kind != tkPunct || text[after.Start:after.End] != "," {
				break
			}
			t, s = next()
		}
		return d, len(d.Tables) > 0
	}
	tbl, after := tableRef(t, s, &l, text)
	if tbl.Table == "" {
		return CopyDDL{}, false
	}
	d.Tables = []Table{tbl}
	// The clauses: a rebuilding word counts where a clause starts, not
	// where a column's or an index's name stands (a column named engine).
	depth := 0
	names := 0 // how many of the next words are names
	for t = after; t.Kind != tkEOF && t.Kind != tkSemicolon; t = l.Next() {
		s = text[t.Start:t.End]
		switch t.Kind {
		case tkPunct:
			switch s {
			case "(":
				depth++
			case ")":
				depth--
			case ",":
				if depth == 0 {
					names = 0
				}
			}
			continue
		case tkWord:
		default:
			names = max(names-1, 0) // a quoted name
			continue
		}
		if depth != 0 {
			continue
		}
		w := strings.ToUpper(s)
		switch {
		case w == "PRIMARY": // reserved: never a name
			d.Rebuild = true // ADD / DROP PRIMARY KEY
			continue
		case keepWords[w]:
			names = max(names, 1)
			continue
		case names > 0:
			names--
			continue
		case w == "PARTITION":
			// PARTITION BY (a new partitioning) rebuilds; ADD / DROP /
			// TRUNCATE / EXCHANGE PARTITION do not.
			n := l
			if nt := n.Next(); nt.Kind == tkWord && strings.EqualFold(text[nt.Start:nt.End], "BY") {
				d.Rebuild = true
			}
		case w == "ALGORITHM":
			n := l
			nt := n.Next()
			if n.IsPunct(nt, '=') {
				nt = n.Next()
			}
			if nt.Kind == tkWord && strings.EqualFold(text[nt.Start:nt.End], "COPY") {
				d.Rebuild = true
			}
		case rebuildWords[w]:
			d.Rebuild = true
		}
		names = nameWords[w]
	}
	return d, true
}

// DynamicVar returns the user variable a PREPARE name FROM @v or EXECUTE
// IMMEDIATE @v runs the value of, for a caller that reads the value (as
// @`name`, so ok only for a name of ASCII letters, digits, _ and $, which
// that quoting cannot end early in any character set).
func DynamicVar(text string, m Mode) (name string, ok bool) {
	if len(text) > headPrefix {
		return "", false
	}
	l := sqltext.NewString(text, m)
	word := func(t sqltext.Token) string {
		if t.Kind != tkWord {
			return ""
		}
		return strings.ToUpper(text[t.Start:t.End])
	}
	var v sqltext.Token
	switch word(l.Next()) {
	case "PREPARE":
		if t := l.Next(); identText(t, text[t.Start:t.End], m) == "" || word(l.Next()) != "FROM" {
			return "", false
		}
		v = l.Next()
	case "EXECUTE":
		if word(l.Next()) != "IMMEDIATE" {
			return "", false
		}
		v = l.Next()
	default:
		return "", false
	}
	if v.Kind != tkVar {
		return "", false
	}
	if t := l.Next(); t.Kind != tkEOF && t.Kind != tkSemicolon {
		return "", false // an expression: @a + ..., or USING
	}
	s := text[v.Start+1 : v.End]
	if strings.HasPrefix(s, "@") {
		return "", false // a system variable
	}
	if s != "" && (s[0] == '`' || s[0] == '\'' || s[0] == '"') {
		u, ok := sqltext.Unquote(s, m)
		if !ok {
			return "", false
		}
		s = u
	}
	if s == "" {
		return "", false
	}
	for i := range len(s) {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$') {
			return "", false
		}
	}
	return s, true
}
