package sqlscan

// The classifier and digester as they were before they merged into one
// pass (scan.go): the differential tests and fuzz targets check that the
// single pass gives exactly their answers.

import "github.com/rgproxy/rgproxy/sqltext"

func refClassifyQueryMode(q []byte, m sqltext.Mode) (class Class, multi bool) {
	l := sqltext.New(q, m)
	class = classNone
	parts := 0
	for {
		c, empty, more := refClassifyNext(&l)
		if !empty {
			parts++
			class = mergeClass(class, c)
		}
		if !more {
			break
		}
	}
	if parts == 0 {
		return ClassOther, false
	}
	return class, parts > 1
}

func refClassifyNext(l *sqltext.Lexer) (class Class, empty, more bool) {
	t := l.Next()
	parens := false
	for l.IsPunct(t, '(') {
		t = l.Next()
		parens = true
	}
	switch t.Kind {
	case tkEOF:
		if parens {
			return ClassOther, false, false
		}
		return classNone, true, false
	case tkSemicolon:
		if parens {
			return ClassOther, false, true
		}
		return classNone, true, true
	}
	class, depth, program := classifyHead(*l, t)
	// The one rule the separate passes did not have: after a SET NAMES
	// (or the like) of a known character set, the server reads the next
	// statement of a multi-statement in that character set.
	cs := charsetEffect(*l, t)
	more = refSkipStatement(l, depth, program)
	if cs.Kind == CharsetTo && more {
		l.SetCharset(cs.To)
	}
	return class, false, more
}

func refSkipStatement(l *sqltext.Lexer, depth int, program bool) bool {
	var (
		parens   int    // open parentheses
		ifParens uint64 // bit i: the parenthesis at level i+1 follows IF and has no comma yet
		afterIf  bool   // the previous token was IF followed by "("
	)
	for {
		t := l.Next()
		openedByIf := afterIf
		afterIf = false
		switch t.Kind {
		case tkEOF:
			return false
		case tkSemicolon:
			if !program || depth <= 0 {
				return true
			}
		case tkPunct:
			if !program {
				break
			}
			// levelBit(n) is the bit of parenthesis level n (1..64).
			levelBit := func(n int) uint64 {
				if n < 1 || n > 64 {
					return 0
				}
				return 1 << (n - 1)
			}
			switch {
			case l.IsPunct(t, '('):
				parens++
				if openedByIf {
					ifParens |= levelBit(parens)
				}
			case l.IsPunct(t, ','):
				ifParens &^= levelBit(parens)
			case l.IsPunct(t, ')'):
				if b := levelBit(parens); ifParens&b != 0 {
					// The condition of an IF statement.
					ifParens &^= b
					depth++
				}
				if parens > 0 {
					parens--
				}
			}
		case tkWord:
			if program {
				var d int
				d, afterIf = refBlockDelta(l, t)
				depth += d
			}
		}
	}
}

func refBlockDelta(l *sqltext.Lexer, t sqltext.Token) (delta int, ifParen bool) {
	switch word(l, t) {
	case kwBegin, kwCase, kwLoop, kwWhile:
		return 1, false
	case kwRepeat:
		// REPEAT(str, n) is a function.
		if p := *l; p.IsPunct(p.Next(), '(') {
			return 0, false
		}
		return 1, false
	case kwIf:
		// IF [NOT] EXISTS is a clause; IF(a, b, c) a function.
		p := *l
		n := p.Next()
		switch {
		case word(&p, n) == kwNot || word(&p, n) == kwExists:
			return 0, false
		case p.IsPunct(n, '('):
			return 0, true
		}
		return 1, false
	case kwFor:
		// MariaDB's FOR x IN ... DO loop, not FOR UPDATE, FOR EACH ROW, ...
		p := *l
		if p.Next().Kind == tkWord && word(&p, p.Next()) == kwIn {
			return 1, false
		}
		return 0, false
	case kwEnd:
		p := *l
		switch word(&p, p.Next()) {
		case kwIf, kwCase, kwLoop, kwWhile, kwRepeat, kwFor:
			*l = p
		}
		return -1, false
	}
	return 0, false
}

func refDigest(q []byte, m sqltext.Mode) string {
	d := digester{l: sqltext.New(q, m), out: make([]byte, 0, len(q)+8)}
	d.refRun()
	return string(d.out)
}

func (d *digester) refRun() {
	var buf [digestMaxKeywordLen]byte
	for {
		t := d.l.Next()
		text := d.l.Text(t)
		switch t.Kind {
		case tkEOF:
			return
		case tkSemicolon:
			d.pending = true
		case tkNumber, tkString, tkParam:
			literalRun(&d.l, t)
			d.emitString(dLiteral, "?")
		case tkEllipsis:
			d.emitString(dEllipsis, "...")
		case tkVar:
			d.emitVar(text)
		case tkQuotedIdent:
			d.emitIdent(unquoteIdent(text))
		case tkWord:
			up, ok := upperKeyword(&buf, text)
			c := dNone
			if ok {
				c = digestKeyword(up)
			}
			if c == dNone {
				d.emit(dName, text)
				continue
			}
			d.emit(c, up)
			if c == dClause && (string(up) == "IN" || string(up) == "VALUES" || string(up) == "VALUE") {
				d.collapseTuples(string(up) != "IN")
			}
		case tkPunct:
			switch {
			case d.l.IsPunct(t, '('):
				d.emitString(dOpen, "(")
			case d.l.IsPunct(t, ')'):
				d.emitString(dClose, ")")
			case d.l.IsPunct(t, ','):
				d.emitString(dComma, ",")
			case d.l.IsPunct(t, '.'):
				d.emitString(dDot, ".")
			case (d.l.IsPunct(t, '-') || d.l.IsPunct(t, '+')) && (d.pending || !d.prev.operand()):
				// A sign before a literal is part of it: "= -1" is "= ?".
				p := d.l
				if literalRun(&p, t) {
					d.l = p
					d.emitString(dLiteral, "?")
					continue
				}
				// Not a literal: write the whole run of signs now, so a long
				// run is scanned once, not once per sign.
				d.emit(dOp, text)
				for {
					p := d.l
					n := p.Next()
					if !p.IsPunct(n, '-') && !p.IsPunct(n, '+') {
						break
					}
					d.l = p
					d.emit(dOp, p.Text(n))
				}
			default:
				d.emit(dOp, text)
			}
		}
	}
}
