package sqlscan

import (
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// This file holds two readings the write accounting needs of some
// statements only: which step of an XA transaction a statement is, and
// which user variables a write reads (their values are bytes its packet
// does not carry).

// XAStep is the step of an XA transaction a statement takes.
type XAStep uint8

const (
	// XANone: the statement is not an XA statement (or XA RECOVER).
	XANone XAStep = iota
	// XAStart: XA START / XA BEGIN.
	XAStart
	// XAEnd: XA END.
	XAEnd
	// XAPrepare: XA PREPARE.
	XAPrepare
	// XACommit: XA COMMIT (OnePhase says whether ONE PHASE ends it).
	XACommit
	// XARollback: XA ROLLBACK.
	XARollback
)

// ReadXA reads an XA statement's step: XANone unless text's first
// statement starts with XA. onePhase: an XA COMMIT ending in ONE PHASE.
// Only the first words and the last two are read, so an xid of any length
// costs one pass of the lexer.
func ReadXA(text string, m Mode) (step XAStep, onePhase bool) {
	l := sqltext.NewString(text, m)
	t := l.Next()
	if t.Kind != tkWord || !strings.EqualFold(text[t.Start:t.End], "XA") {
		return XANone, false
	}
	t = l.Next()
	if t.Kind != tkWord {
		return XANone, false
	}
	switch strings.ToUpper(text[t.Start:t.End]) {
	case "START", "BEGIN":
		return XAStart, false
	case "END":
		return XAEnd, false
	case "PREPARE":
		return XAPrepare, false
	case "ROLLBACK":
		return XARollback, false
	case "COMMIT":
	default:
		return XANone, false
	}
	var prev, last string
	for t = l.Next(); t.Kind != tkEOF && t.Kind != tkSemicolon; t = l.Next() {
		prev, last = last, ""
		if t.Kind == tkWord {
			last = strings.ToUpper(text[t.Start:t.End])
		}
	}
	return XACommit, prev == "ONE" && last == "PHASE"
}

// maxUserVars bounds the user variables UserVars names.
const maxUserVars = 16

// UserVars returns the user variables (@name, not @@name) text reads, each
// once, lower case, as they may be written unquoted in a query (letters,
// digits, '_' and '$'). all is true when text names a variable that cannot
// be written so (quoted, non-ASCII, followed by '.'), or more than 16:
// then a caller that wants their sizes must take every variable of the
// session.
func UserVars(text string, m Mode) (names []string, all bool) {
	l := sqltext.NewString(text, m)
	for t := l.Next(); t.Kind != tkEOF; t = l.Next() {
		if t.Kind != tkVar || t.End-t.Start < 2 || text[t.Start+1] == '@' {
			continue
		}
		name := text[t.Start+1 : t.End]
		if !plainVarName(name) || (t.End < len(text) && text[t.End] == '.') {
			return nil, true
		}
		name = strings.ToLower(name)
		dup := false
		for _, n := range names {
			dup = dup || n == name
		}
		if dup {
			continue
		}
		if len(names) == maxUserVars {
			return nil, true
		}
		names = append(names, name)
	}
	return names, false
}

// plainVarName: name is letters, digits, '_' and '$' (ASCII) only, at
// most 64 bytes.
func plainVarName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$') {
			return false
		}
	}
	return true
}
