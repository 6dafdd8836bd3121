package mysqlproto

// The classifier and digester as they were before they merged into one
// pass (scan.go): the differential tests and fuzz targets check that the
// single pass gives exactly their answers.

func refClassifyQueryMode(q []byte, noBackslashEscapes bool) (class Class, multi bool) {
	l := sqlLexer{q: q, noBackslash: noBackslashEscapes}
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

func refClassifyNext(l *sqlLexer) (class Class, empty, more bool) {
	t := l.next()
	parens := false
	for l.isPunct(t, '(') {
		t = l.next()
		parens = true
	}
	switch t.kind {
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
	return class, false, l.refSkipStatement(depth, program)
}

func (l *sqlLexer) refSkipStatement(depth int, program bool) bool {
	var (
		parens   int    // open parentheses
		ifParens uint64 // bit i: the parenthesis at level i+1 follows IF and has no comma yet
		afterIf  bool   // the previous token was IF followed by "("
	)
	for {
		t := l.next()
		openedByIf := afterIf
		afterIf = false
		switch t.kind {
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
			case l.isPunct(t, '('):
				parens++
				if openedByIf {
					ifParens |= levelBit(parens)
				}
			case l.isPunct(t, ','):
				ifParens &^= levelBit(parens)
			case l.isPunct(t, ')'):
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
				d, afterIf = l.refBlockDelta(t)
				depth += d
			}
		}
	}
}

func (l *sqlLexer) refBlockDelta(t sqlToken) (delta int, ifParen bool) {
	switch l.word(t) {
	case kwBegin, kwCase, kwLoop, kwWhile:
		return 1, false
	case kwRepeat:
		// REPEAT(str, n) is a function.
		if p := *l; p.isPunct(p.next(), '(') {
			return 0, false
		}
		return 1, false
	case kwIf:
		// IF [NOT] EXISTS is a clause; IF(a, b, c) a function.
		p := *l
		n := p.next()
		switch {
		case p.word(n) == kwNot || p.word(n) == kwExists:
			return 0, false
		case p.isPunct(n, '('):
			return 0, true
		}
		return 1, false
	case kwFor:
		// MariaDB's FOR x IN ... DO loop, not FOR UPDATE, FOR EACH ROW, ...
		p := *l
		if p.next().kind == tkWord && p.word(p.next()) == kwIn {
			return 1, false
		}
		return 0, false
	case kwEnd:
		p := *l
		switch p.word(p.next()) {
		case kwIf, kwCase, kwLoop, kwWhile, kwRepeat, kwFor:
			*l = p
		}
		return -1, false
	}
	return 0, false
}

func refDigest(q []byte) string {
	d := digester{l: sqlLexer{q: q}, out: make([]byte, 0, len(q)+8)}
	d.refRun()
	return string(d.out)
}

func (d *digester) refRun() {
	var buf [digestMaxKeywordLen]byte
	for {
		t := d.l.next()
		text := d.l.q[t.start:t.end]
		switch t.kind {
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
			case d.l.isPunct(t, '('):
				d.emitString(dOpen, "(")
			case d.l.isPunct(t, ')'):
				d.emitString(dClose, ")")
			case d.l.isPunct(t, ','):
				d.emitString(dComma, ",")
			case d.l.isPunct(t, '.'):
				d.emitString(dDot, ".")
			case (d.l.isPunct(t, '-') || d.l.isPunct(t, '+')) && (d.pending || !d.prev.operand()):
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
					n := p.next()
					if !p.isPunct(n, '-') && !p.isPunct(n, '+') {
						break
					}
					d.l = p
					d.emit(dOp, p.q[n.start:n.end])
				}
			default:
				d.emit(dOp, text)
			}
		}
	}
}
