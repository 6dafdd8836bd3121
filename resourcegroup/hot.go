package resourcegroup

// This file holds what runs on statements the single pass in mysqlproto
// flagged: IsAdmin (on a statement that mentions a resource-control word)
// and HintGroup (on the body of an optimizer-hint comment). Neither
// allocates unless it finds something (a hint's upper-case name).

import "github.com/rgproxy/rgproxy/sqltext"

// scanner walks a statement's tokens with sqltext's lexer, in the
// session's mode, without allocating; it stops (end) where Parse would
// refuse the text lexically (an executable comment, an unterminated quote
// or comment), so that IsAdmin agrees with Parse.
type scanner struct {
	s string
	l sqltext.Lexer
}

func newScanner(s string, m sqltext.Mode) scanner {
	return scanner{s: s, l: sqltext.NewString(s, m)}
}

// scanTok is a token seen by the scanner: word is the text of a bare or
// backquoted identifier (backquoted ones with quote set), punct a single
// byte (the quote of a string), or both empty at the end or on anything
// the lexer would refuse.
type scanTok struct {
	word   string
	quoted bool
	punct  byte
	end    bool
}

func (sc *scanner) next() scanTok {
	t := sc.l.Next()
	if t.Kind == sqltext.EOF || sc.l.SawExec() || sc.l.Unterminated() {
		return scanTok{end: true}
	}
	switch t.Kind {
	case sqltext.Word:
		return scanTok{word: sc.s[t.Start:t.End]}
	case sqltext.QuotedIdent:
		return scanTok{word: sc.s[t.Start+1 : t.End-1], quoted: true}
	}
	return scanTok{punct: sc.s[t.Start]}
}

// eqFold compares ASCII case-insensitively. Keywords are ASCII; unlike
// strings.EqualFold it does not match Unicode look-alikes (ſ for s, K for
// k), and the parser uses it too, so IsAdmin's cheap checks agree with Parse.
func eqFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// containsFold reports whether s contains the lower-case ASCII word sub,
// ignoring ASCII case, without allocating.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if lowerASCII(s[i]) == sub[0] && eqFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// isKw reports whether t is the bare keyword kw (case-insensitive).
func (t scanTok) isKw(kw string) bool { return !t.quoted && eqFold(t.word, kw) }

// IsAdmin reports, cheaply and without allocating, whether query is one of
// the statements rgproxy executes itself (every statement Parse accepts,
// and SELECTs on information_schema.resource_groups or runaway_watches).
// Leading comments are skipped; an executable comment (/*! */) is not.
// m is the session's mode, as for Parse.
func IsAdmin(query string, m sqltext.Mode) bool {
	sc := newScanner(query, m)
	first := sc.next()
	switch {
	case first.isKw("SET"):
		return sc.next().isKw("RESOURCE")
	case first.isKw("CREATE"), first.isKw("DROP"):
		// ... RESOURCE GROUP, or TiDB's [GLOBAL | SESSION] BINDING, which
		// neither MariaDB nor MySQL has.
		t := sc.next()
		if t.isKw("GLOBAL") || t.isKw("SESSION") {
			return sc.next().isKw("BINDING")
		}
		return t.isKw("RESOURCE") || t.isKw("BINDING")
	case first.isKw("ALTER"):
		t := sc.next()
		if t.isKw("RESOURCE") {
			return true
		}
		if !t.isKw("USER") {
			return false
		}
		// ALTER USER ... RESOURCE GROUP; a plain ALTER USER (password,
		// locks) goes to the backend.
		prevResource := false
		for t = sc.next(); !t.end; t = sc.next() {
			if prevResource && t.isKw("GROUP") {
				return true
			}
			prevResource = t.isKw("RESOURCE")
		}
		return false
	case first.isKw("SHOW"):
		t := sc.next()
		switch {
		case t.isKw("CREATE"):
			return sc.next().isKw("RESOURCE")
		case t.isKw("RESOURCE"):
			return true
		case t.isKw("CLUSTER"):
			return sc.next().isKw("RESOURCE")
		case t.isKw("LAST"):
			return sc.next().isKw("STATEMENT")
		}
		return false
	case first.isKw("QUERY"):
		return sc.next().isKw("WATCH")
	case first.isKw("EXPLAIN"), first.isKw("CALIBRATE"):
		return sc.next().isKw("RESOURCE")
	case first.isKw("SELECT"):
		// Most SELECTs name neither table nor function: a byte scan rules
		// them out before tokenizing.
		if rest := query[sc.l.Pos():]; !containsFold(rest, "resource_group") && !containsFold(rest, "runaway_watches") {
			return false
		}
		// state: 0 nothing, 1 after information_schema, 2 after its dot.
		state := 0
		for t := sc.next(); !t.end; t = sc.next() {
			switch {
			case t.isKw("CURRENT_RESOURCE_GROUP"):
				return true
			case state == 2 && t.word != "" && (eqFold(t.word, "resource_groups") || eqFold(t.word, "runaway_watches")):
				return true
			case state == 1 && t.punct == '.':
				state = 2
			case t.word != "" && eqFold(t.word, "information_schema"):
				state = 1
			default:
				state = 0
			}
		}
	}
	return false
}

// HintGroup returns the group named by RESOURCE_GROUP(name) in the body of
// an optimizer-hint comment (what is between "/*+" and "*/"); with several,
// the last one wins, as in TiDB. The name is normalized. It allocates only
// for a name that is not already lower case. m is the session's mode.
func HintGroup(body string, m sqltext.Mode) (string, bool) {
	hs := newScanner(body, m)
	name, found := "", false
	for t := hs.next(); !t.end; t = hs.next() {
		if !t.isKw("RESOURCE_GROUP") {
			continue
		}
		save := hs
		if hs.next().punct != '(' {
			hs = save
			continue
		}
		arg := hs.next()
		if arg.word == "" || hs.next().punct != ')' {
			hs = save
			continue
		}
		name, found = arg.word, true
	}
	if !found {
		return "", false
	}
	for k := 0; k < len(name); k++ {
		if c := name[k]; c >= 'A' && c <= 'Z' || c >= 0x80 {
			return NormalizeName(name), true
		}
	}
	return name, true
}
