package sqlscan

import (
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// afterTableRef are the words that may follow a table reference without
// being its alias.
var afterTableRef = map[string]bool{
	"WHERE": true, "JOIN": true, "INNER": true, "LEFT": true, "RIGHT": true, "CROSS": true, "NATURAL": true,
	"STRAIGHT_JOIN": true, "FULL": true, "OUTER": true, "ON": true, "USING": true, "GROUP": true, "ORDER": true,
	"HAVING": true, "LIMIT": true, "UNION": true, "EXCEPT": true, "INTERSECT": true, "WINDOW": true, "FOR": true,
	"LOCK": true, "INTO": true, "PARTITION": true, "USE": true, "IGNORE": true, "FORCE": true, "SET": true,
	"RETURNING": true, "PROCEDURE": true, "OFFSET": true, "FETCH": true, "MINUS": true, "FROM": true,
}

// clauseOf maps the keywords that start a clause to the clause: a table
// name right after FROM or JOIN (or a comma in a FROM list) is a table
// reference; an item right after SELECT (or a comma in a select list) is
// a select-list item.
func clauseOf(word string) (string, bool) {
	switch strings.ToUpper(word) {
	case "SELECT":
		return "select", true
	case "FROM", "JOIN", "STRAIGHT_JOIN", "UPDATE":
		return "from", true
	case "WHERE", "GROUP", "ORDER", "HAVING", "LIMIT", "ON", "USING", "UNION", "WINDOW", "INTO",
		"SET", "VALUES", "EXCEPT", "INTERSECT":
		return "other", true
	}
	return "", false
}

// TableRef is one span of a text that names a table of interest (or
// calls the function asked about), for a caller that rewrites it.
type TableRef struct {
	Start, End int
	Table      string // the table, lower case; "" for the function call
	Column     bool   // information_schema.t.col: only the qualifier goes
	Alias      bool   // the reference is followed by an alias
	SelectItem bool   // the function call as a select-list item without alias
}

// TableRefs returns the references in q to the information_schema tables
// isTable accepts and the calls of the zero-argument function fn. A bare
// table name (no information_schema qualifier) counts only when inDB
// reports that the session's current database is information_schema; inDB
// is asked at most once, and only when such a name stands where a table
// does. It records token positions, so it allocates: a caller runs it only
// when the scan's Mentions say a name of interest appears.
func TableRefs(q string, mode Mode, isTable func(name string) bool, fn string, inDB func() bool) []TableRef {
	tz := sqltext.NewString(q, mode)
	var toks []sqltext.Token
	for {
		t := tz.Next()
		if t.Kind == tkEOF {
			break
		}
		toks = append(toks, t)
	}
	text := func(i int) string {
		if i < 0 || i >= len(toks) {
			return ""
		}
		t := toks[i]
		s := q[t.Start:t.End]
		if t.Kind == tkQuotedIdent {
			s, _ = sqltext.Unquote(s, mode)
		}
		return s
	}
	isName := func(i int) bool {
		return i >= 0 && i < len(toks) && (toks[i].Kind == tkWord || toks[i].Kind == tkQuotedIdent)
	}
	isPunct := func(i int, p string) bool {
		return i >= 0 && i < len(toks) && toks[i].Kind == tkPunct && q[toks[i].Start:toks[i].End] == p
	}
	isWord := func(i int, w string) bool {
		return i >= 0 && i < len(toks) && toks[i].Kind == tkWord && strings.EqualFold(text(i), w)
	}
	hasAlias := func(i int) bool { // is toks[i] an alias?
		switch {
		case i >= len(toks):
			return false
		case isWord(i, "AS"), toks[i].Kind == tkQuotedIdent:
			return true
		case toks[i].Kind == tkWord:
			return !afterTableRef[strings.ToUpper(text(i))]
		}
		return false
	}
	clause := []string{""} // by parenthesis depth
	dbAsked, dbIsIS := false, false
	var refs []TableRef
	for i := 0; i < len(toks); i++ {
		d := len(clause) - 1
		switch {
		case isPunct(i, "("):
			clause = append(clause, "")
			continue
		case isPunct(i, ")"):
			if d > 0 {
				clause = clause[:d]
			}
			continue
		case toks[i].Kind == tkSemicolon:
			clause = []string{""}
			continue
		case toks[i].Kind == tkWord:
			if c, ok := clauseOf(text(i)); ok {
				clause[d] = c
			}
		}
		switch {
		case isName(i) && strings.EqualFold(text(i), "information_schema") && isPunct(i+1, ".") &&
			isName(i+2) && isTable(text(i+2)) && !isPunct(i-1, "."):
			r := TableRef{Start: toks[i].Start, End: toks[i+2].End, Table: strings.ToLower(text(i + 2))}
			if isPunct(i+3, ".") {
				r.Column = true
			} else {
				r.Alias = hasAlias(i + 3)
			}
			refs = append(refs, r)
			i += 2
		case isName(i) && isTable(text(i)) && !isPunct(i-1, ".") && !isPunct(i+1, ".") &&
			(isWord(i-1, "FROM") || isWord(i-1, "JOIN") || isWord(i-1, "STRAIGHT_JOIN") || isPunct(i-1, ",") && clause[d] == "from"):
			if !dbAsked {
				dbAsked, dbIsIS = true, inDB()
			}
			if dbIsIS {
				refs = append(refs, TableRef{Start: toks[i].Start, End: toks[i].End, Table: strings.ToLower(text(i)),
					Alias: hasAlias(i + 1)})
			}
		case toks[i].Kind == tkWord && strings.EqualFold(text(i), fn) &&
			isPunct(i+1, "(") && isPunct(i+2, ")") && !isPunct(i-1, "."):
			r := TableRef{Start: toks[i].Start, End: toks[i+2].End}
			r.SelectItem = clause[d] == "select" && (isWord(i-1, "SELECT") || isPunct(i-1, ",") || isWord(i-1, "DISTINCT")) &&
				!hasAlias(i+3)
			refs = append(refs, r)
			i += 2
		}
	}
	return refs
}
