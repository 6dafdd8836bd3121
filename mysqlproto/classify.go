package mysqlproto

// This file holds the cheap statement classifier that runs on every
// COM_QUERY, and the small SQL lexer it shares with Digest. Neither parses
// SQL: they look at the first keyword of each statement (after comments and
// parentheses) and at just enough structure (strings, comments, CTE bodies,
// stored-program blocks) to find where statements start and end.
//
// Lexical rules follow MySQL and MariaDB with the default SQL mode:
//   - /* ... */ and /*+ ... */ (optimizer hints) are comments;
//   - /*! ... */, /*!NNNNN ... */, /*M! ... */ and /*M!NNNNNN ... */ are
//     code: their content is read as if the markers were absent, whatever
//     the version number says (a proxy cannot know which server executes);
//   - "-- " starts a comment only when the second dash is followed by
//     whitespace, a control character or the end of the text, so
//     "SELECT 1--1" is arithmetic; "#" comments run to the end of the line;
//   - '...' and "..." are strings with doubled quotes and, unless the
//     session runs with NO_BACKSLASH_ESCAPES (which the server reports in
//     its status flags, see ClassifyQueryMode), backslash escapes.
//     ANSI_QUOTES (not reported) is not modelled: "..." stays a string,
//     which splits statements the same way unless the identifier holds a
//     backslash before its closing quote;
//   - `...` is a quoted identifier with doubled backquotes.

// tokKind is the kind of a lexer token.
type tokKind uint8

const (
	tkEOF         tokKind = iota
	tkWord                // unquoted identifier or keyword
	tkQuotedIdent         // `identifier`
	tkString              // '...', "...", N'...', _charset'...'
	tkNumber              // 12, 1.5e3, .5, 0x1F, 0b101, X'1F', B'101'
	tkParam               // ? placeholder
	tkEllipsis            // "..." as written by Digest for a collapsed list
	tkVar                 // @name, @@name, @'name', @`name`
	tkPunct               // operator or punctuation (one token, possibly several bytes)
	tkSemicolon           // statement separator
)

// sqlToken is a span of the lexer's input. Tokens never copy bytes.
type sqlToken struct {
	kind       tokKind
	start, end int
}

// sqlLexer splits SQL text into tokens, skipping whitespace and comments and
// reading executable comments as code. It is a value type: copying it gives
// a cheap lookahead cursor.
type sqlLexer struct {
	q    []byte
	pos  int
	exec bool // inside /*! ... */ or /*M! ... */
	// noBackslash is true under sql_mode NO_BACKSLASH_ESCAPES: a backslash
	// in a string is an ordinary character.
	noBackslash bool
	prev        tokKind // kind of the previous token, for ".5" vs "t.c"
	// prevClose is true when the previous token was ")".
	prevClose bool
	// cmtStart and cmtEnd span the body of the last plain block comment
	// skipped (not /*! */, /*M! */ or an optimizer hint /*+ */);
	// cmtStart is 0 when there was none.
	cmtStart, cmtEnd int
}

func sqlSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func sqlDigit(c byte) bool { return c >= '0' && c <= '9' }

func sqlHexDigit(c byte) bool {
	return sqlDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// sqlIdentByte reports whether c may appear in an unquoted identifier.
// Bytes >= 0x80 are parts of multi-byte characters, which MySQL allows.
func sqlIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || sqlDigit(c) || c == '_' || c == '$' || c >= 0x80
}

// skip advances over whitespace, comments and executable-comment markers.
func (l *sqlLexer) skip() {
	q := l.q
	for l.pos < len(q) {
		c := q[l.pos]
		switch {
		case sqlSpace(c):
			l.pos++
		case c == '/' && l.pos+1 < len(q) && q[l.pos+1] == '*':
			p := l.pos + 2
			if p < len(q) && q[p] == '!' {
				l.pos = sqlSkipVersion(q, p+1)
				l.exec = true
				continue
			}
			if p+1 < len(q) && q[p] == 'M' && q[p+1] == '!' {
				l.pos = sqlSkipVersion(q, p+2)
				l.exec = true
				continue
			}
			l.pos = len(q)
			end := len(q)
			for i := p; i+1 < len(q); i++ {
				if q[i] == '*' && q[i+1] == '/' {
					l.pos, end = i+2, i
					break
				}
			}
			if p >= len(q) || q[p] != '+' { // optimizer hints are not tags
				l.cmtStart, l.cmtEnd = p, end
			}
		case c == '*' && l.exec && l.pos+1 < len(q) && q[l.pos+1] == '/':
			l.pos += 2
			l.exec = false
		case c == '#':
			l.skipLine()
		case c == '-' && l.pos+1 < len(q) && q[l.pos+1] == '-' &&
			(l.pos+2 == len(q) || q[l.pos+2] <= ' ' || q[l.pos+2] == 0x7f):
			l.skipLine()
		default:
			return
		}
	}
}

func (l *sqlLexer) skipLine() {
	for l.pos < len(l.q) && l.q[l.pos] != '\n' {
		l.pos++
	}
}

// sqlSkipVersion skips the 5- or 6-digit server version that may follow "/*!"
// or "/*M!". Other digit runs are code (MySQL reads them so too).
func sqlSkipVersion(q []byte, p int) int {
	n := 0
	for p+n < len(q) && sqlDigit(q[p+n]) && n < 7 {
		n++
	}
	if n == 5 || n == 6 {
		return p + n
	}
	return p
}

// next returns the next token; at the end it returns tkEOF forever.
func (l *sqlLexer) next() sqlToken {
	l.skip()
	t := l.scan()
	l.prev = t.kind
	l.prevClose = t.kind == tkPunct && t.end == t.start+1 && l.q[t.start] == ')'
	return t
}

func (l *sqlLexer) scan() sqlToken {
	q := l.q
	start := l.pos
	if start >= len(q) {
		return sqlToken{kind: tkEOF, start: start, end: start}
	}
	c := q[start]
	switch {
	case c == '\'' || c == '"':
		l.pos = sqlSkipQuoted(q, start+1, c, !l.noBackslash)
		return sqlToken{tkString, start, l.pos}
	case c == '`':
		l.pos = sqlSkipQuoted(q, start+1, '`', false)
		return sqlToken{tkQuotedIdent, start, l.pos}
	case c == ';':
		l.pos++
		return sqlToken{tkSemicolon, start, l.pos}
	case c == '?':
		l.pos++
		return sqlToken{tkParam, start, l.pos}
	case c == '.':
		if start+2 < len(q) && q[start+1] == '.' && q[start+2] == '.' {
			l.pos += 3
			return sqlToken{tkEllipsis, start, l.pos}
		}
		// ".5" is a number unless it qualifies a name ("t.5" is column 5 of t).
		if start+1 < len(q) && sqlDigit(q[start+1]) && l.prev != tkWord && l.prev != tkQuotedIdent && !l.prevClose {
			l.pos = sqlScanFraction(q, start)
			return sqlToken{tkNumber, start, l.pos}
		}
		l.pos++
		return sqlToken{tkPunct, start, l.pos}
	case c == '@':
		return l.scanVar(start)
	case sqlIdentByte(c):
		return l.scanWordOrNumber(start)
	}
	l.pos = start + sqlOperatorLen(q[start:])
	return sqlToken{tkPunct, start, l.pos}
}

// sqlSkipQuoted returns the position after the closing quote of a quoted
// string or identifier whose body starts at p. A doubled quote stands for
// itself; backslash escapes apply to strings only. An unterminated quote
// runs to the end of the text.
func sqlSkipQuoted(q []byte, p int, quote byte, escapes bool) int {
	for p < len(q) {
		c := q[p]
		switch {
		case escapes && c == '\\':
			p += 2
		case c == quote:
			if p+1 < len(q) && q[p+1] == quote {
				p += 2
				continue
			}
			return p + 1
		default:
			p++
		}
	}
	return len(q)
}

// sqlScanFraction scans ".digits[exponent]" starting at the dot.
func sqlScanFraction(q []byte, p int) int {
	p++
	for p < len(q) && sqlDigit(q[p]) {
		p++
	}
	return sqlScanExponent(q, p)
}

// sqlScanExponent scans an optional "e[+-]digits" at p.
func sqlScanExponent(q []byte, p int) int {
	if p < len(q) && (q[p] == 'e' || q[p] == 'E') {
		d := p + 1
		if d < len(q) && (q[d] == '+' || q[d] == '-') {
			d++
		}
		if d < len(q) && sqlDigit(q[d]) {
			for d < len(q) && sqlDigit(q[d]) {
				d++
			}
			return d
		}
	}
	return p
}

// scanWordOrNumber scans a run starting with an identifier byte: a number
// (12, 1.5, 1e3, 0x1F, 0b01), a prefixed literal (X'1F', B'01', N'x',
// _utf8mb4'x'), or a word. "1abc" is a word, as in MySQL.
func (l *sqlLexer) scanWordOrNumber(start int) sqlToken {
	q := l.q
	end := start
	for end < len(q) && sqlIdentByte(q[end]) {
		end++
	}
	run := q[start:end]
	if sqlDigit(run[0]) {
		if p, ok := sqlNumberRun(q, start, end); ok {
			l.pos = p
			return sqlToken{tkNumber, start, p}
		}
	}
	if end < len(q) && q[end] == '\'' {
		switch {
		case len(run) == 1 && (run[0]|0x20 == 'x' || run[0]|0x20 == 'b'):
			l.pos = sqlSkipQuoted(q, end+1, '\'', false)
			return sqlToken{tkNumber, start, l.pos}
		case len(run) == 1 && run[0]|0x20 == 'n', len(run) > 1 && run[0] == '_':
			l.pos = sqlSkipQuoted(q, end+1, '\'', !l.noBackslash)
			return sqlToken{tkString, start, l.pos}
		}
	}
	l.pos = end
	return sqlToken{tkWord, start, end}
}

// sqlNumberRun decides whether the identifier-byte run q[start:end], which
// starts with a digit, is a numeric literal, and returns where it ends
// (possibly past end, for "1.5" or "1e-3").
func sqlNumberRun(q []byte, start, end int) (int, bool) {
	run := q[start:end]
	if len(run) > 2 && run[0] == '0' && (run[1] == 'x' || run[1] == 'b') {
		ok := true
		for _, c := range run[2:] {
			if run[1] == 'x' && !sqlHexDigit(c) || run[1] == 'b' && c != '0' && c != '1' {
				ok = false
				break
			}
		}
		if ok {
			return end, true
		}
	}
	p := start
	for p < end && sqlDigit(q[p]) {
		p++
	}
	if p == end {
		// Digits only: maybe a fraction or a signed exponent follows.
		if p < len(q) && q[p] == '.' && !(p+1 < len(q) && q[p+1] == '.') {
			return sqlScanFraction(q, p), true
		}
		return sqlScanExponent(q, p), true
	}
	// Digits then "e": a number only if the exponent ends the run.
	if e := sqlScanExponent(q, p); e > p && e >= end {
		return e, true
	}
	return 0, false
}

// scanVar scans @name, @@name, @'name', @"name", @`name`; a lone "@" is
// punctuation.
func (l *sqlLexer) scanVar(start int) sqlToken {
	q := l.q
	p := start + 1
	if p < len(q) && q[p] == '@' {
		p++
	}
	if p < len(q) {
		switch c := q[p]; {
		case c == '\'' || c == '"':
			l.pos = sqlSkipQuoted(q, p+1, c, !l.noBackslash)
			return sqlToken{tkVar, start, l.pos}
		case c == '`':
			l.pos = sqlSkipQuoted(q, p+1, '`', false)
			return sqlToken{tkVar, start, l.pos}
		case sqlIdentByte(c):
			for p < len(q) && sqlIdentByte(q[p]) {
				p++
			}
			l.pos = p
			return sqlToken{tkVar, start, p}
		}
	}
	l.pos = start + 1
	return sqlToken{tkPunct, start, l.pos}
}

// sqlOperatorLen returns the length of the operator at the start of b
// (len(b) > 0): the longest of the multi-byte operators, else 1.
func sqlOperatorLen(b []byte) int {
	if len(b) >= 3 && (string(b[:3]) == "<=>" || string(b[:3]) == "->>") {
		return 3
	}
	if len(b) >= 2 {
		switch string(b[:2]) {
		case "<=", ">=", "<>", "!=", ":=", "||", "&&", "<<", ">>", "->":
			return 2
		}
	}
	return 1
}

// isPunct reports whether t is the one-byte punctuation c.
func (l *sqlLexer) isPunct(t sqlToken, c byte) bool {
	return t.kind == tkPunct && t.end == t.start+1 && l.q[t.start] == c
}

// sqlKW identifies the keywords the classifier acts on.
type sqlKW uint8

const (
	kwNone sqlKW = iota
	kwAggregate
	kwAlgorithm
	kwAlter
	kwAnalyze
	kwAtomic
	kwBegin
	kwBinlog
	kwCall
	kwCase
	kwCheck
	kwChecksum
	kwCommit
	kwCreate
	kwCurrentUser
	kwDefiner
	kwDelete
	kwDesc
	kwDescribe
	kwDrop
	kwEnd
	kwEvent
	kwExists
	kwExplain
	kwFor
	kwFormat
	kwFunction
	kwGrant
	kwHelp
	kwIf
	kwImport
	kwIn
	kwInsert
	kwInvoker
	kwLoad
	kwLocal
	kwLoop
	kwMerge
	kwNoWriteToBinlog
	kwNot
	kwOptimize
	kwOr
	kwPackage
	kwPrepare
	kwProcedure
	kwRecursive
	kwRename
	kwRepair
	kwRepeat
	kwReplace
	kwRevoke
	kwRollback
	kwSecurity
	kwSelect
	kwSet
	kwShow
	kwSQL
	kwTable
	kwTemptable
	kwTo
	kwTrigger
	kwTruncate
	kwUndefined
	kwUpdate
	kwValues
	kwWhile
	kwWith
	kwWork
	kwXA
)

// sqlMaxKeywordLen bounds the words lookupKW considers.
const sqlMaxKeywordLen = 18

// lookupKW returns the keyword a word spells, case-insensitively, without
// allocating.
func lookupKW(w []byte) sqlKW {
	if len(w) < 2 || len(w) > sqlMaxKeywordLen {
		return kwNone
	}
	var buf [sqlMaxKeywordLen]byte
	for i, c := range w {
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf[i] = c
	}
	switch string(buf[:len(w)]) {
	case "AGGREGATE":
		return kwAggregate
	case "ALGORITHM":
		return kwAlgorithm
	case "ALTER":
		return kwAlter
	case "ANALYZE":
		return kwAnalyze
	case "ATOMIC":
		return kwAtomic
	case "BEGIN":
		return kwBegin
	case "BINLOG":
		return kwBinlog
	case "CALL":
		return kwCall
	case "CASE":
		return kwCase
	case "CHECK":
		return kwCheck
	case "CHECKSUM":
		return kwChecksum
	case "COMMIT":
		return kwCommit
	case "CREATE":
		return kwCreate
	case "CURRENT_USER":
		return kwCurrentUser
	case "DEFINER":
		return kwDefiner
	case "DELETE":
		return kwDelete
	case "DESC":
		return kwDesc
	case "DESCRIBE":
		return kwDescribe
	case "DROP":
		return kwDrop
	case "END":
		return kwEnd
	case "EVENT":
		return kwEvent
	case "EXISTS":
		return kwExists
	case "EXPLAIN":
		return kwExplain
	case "FOR":
		return kwFor
	case "FORMAT":
		return kwFormat
	case "FUNCTION":
		return kwFunction
	case "GRANT":
		return kwGrant
	case "HELP":
		return kwHelp
	case "IF":
		return kwIf
	case "IMPORT":
		return kwImport
	case "IN":
		return kwIn
	case "INSERT":
		return kwInsert
	case "INVOKER":
		return kwInvoker
	case "LOAD":
		return kwLoad
	case "LOCAL":
		return kwLocal
	case "LOOP":
		return kwLoop
	case "MERGE":
		return kwMerge
	case "NO_WRITE_TO_BINLOG":
		return kwNoWriteToBinlog
	case "NOT":
		return kwNot
	case "OPTIMIZE":
		return kwOptimize
	case "OR":
		return kwOr
	case "PACKAGE":
		return kwPackage
	case "PREPARE":
		return kwPrepare
	case "PROCEDURE":
		return kwProcedure
	case "RECURSIVE":
		return kwRecursive
	case "RENAME":
		return kwRename
	case "REPAIR":
		return kwRepair
	case "REPEAT":
		return kwRepeat
	case "REPLACE":
		return kwReplace
	case "REVOKE":
		return kwRevoke
	case "SECURITY":
		return kwSecurity
	case "SELECT":
		return kwSelect
	case "SET":
		return kwSet
	case "SHOW":
		return kwShow
	case "SQL":
		return kwSQL
	case "TABLE":
		return kwTable
	case "TEMPTABLE":
		return kwTemptable
	case "TRIGGER":
		return kwTrigger
	case "TRUNCATE":
		return kwTruncate
	case "UNDEFINED":
		return kwUndefined
	case "UPDATE":
		return kwUpdate
	case "VALUES":
		return kwValues
	case "WHILE":
		return kwWhile
	case "WITH":
		return kwWith
	case "ROLLBACK":
		return kwRollback
	case "TO":
		return kwTo
	case "WORK":
		return kwWork
	case "XA":
		return kwXA
	}
	return kwNone
}

// word returns the keyword of t, or kwNone if t is not an unquoted word.
func (l *sqlLexer) word(t sqlToken) sqlKW {
	if t.kind != tkWord {
		return kwNone
	}
	return lookupKW(l.q[t.start:t.end])
}

// classNone ranks below every class when merging the parts of a
// multi-statement.
const classNone Class = ClassFree

// ClassifyQuery returns the cost class of the SQL text of a COM_QUERY (or
// COM_STMT_PREPARE) and whether it holds more than one statement. It reads
// only the first keyword of each statement after comments and opening
// parentheses, and never allocates.
//
// Classes: read (SELECT, SHOW, DESCRIBE/DESC, EXPLAIN, TABLE, VALUES, HELP,
// CHECKSUM TABLE, CHECK TABLE, WITH ... SELECT); write (INSERT, UPDATE,
// DELETE, REPLACE, LOAD DATA/XML, CREATE, ALTER, DROP, TRUNCATE, RENAME,
// GRANT, REVOKE, COMMIT, XA COMMIT, CALL, OPTIMIZE/REPAIR/ANALYZE TABLE,
// IMPORT TABLE, BINLOG, WITH ... UPDATE/DELETE/INSERT/REPLACE, EXPLAIN
// ANALYZE and MariaDB's ANALYZE of a writing statement, and MariaDB's
// compound statements outside stored programs); other (everything else:
// BEGIN, START TRANSACTION, SET (MariaDB's SET STATEMENT ... FOR stmt is
// classified as stmt), USE, PREPARE, EXECUTE, ROLLBACK, LOCK, KILL,
// ..., an empty text, and unknown statements).
//
// Choices: CALL and compound statements (BEGIN NOT ATOMIC, top-level IF,
// LOOP, ...) are writes because what they run is not visible in the text.
// SELECT ... INTO OUTFILE/DUMPFILE/@var is a read: it changes no table, and
// the file bytes are the result bytes a plain SELECT would have returned.
// SELECT ... FOR UPDATE is a read too (TiDB charges it so).
//
// A multi-statement is a write if any part writes, else a read if any part
// reads, else other. A trailing ";" (with only whitespace or comments after
// it) does not make a multi-statement, and neither do the ";" inside the
// BEGIN ... END body of CREATE PROCEDURE/FUNCTION/TRIGGER/EVENT.
func ClassifyQuery(q []byte) (class Class, multi bool) {
	return ClassifyQueryMode(q, false)
}

// mergeClass ranks write over read over other.
func mergeClass(a, b Class) Class {
	rank := func(c Class) int {
		switch c {
		case ClassWrite:
			return 3
		case ClassRead:
			return 2
		case ClassOther:
			return 1
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// classifyHead classifies a statement from its first token t, reading
// ahead on its own copy of the lexer. depth is the number of compound
// blocks t opens (MariaDB's BEGIN NOT ATOMIC, top-level IF, ...), program
// is true when the statement defines a stored program whose body may hold
// ";".
func classifyHead(p sqlLexer, t sqlToken) (class Class, depth int, program bool) {
	k := p.word(t)
	switch k {
	case kwSelect, kwShow, kwTable, kwValues, kwHelp, kwChecksum:
		return ClassRead, 0, false
	case kwExplain, kwDescribe, kwDesc:
		if p.word(p.next()) == kwAnalyze {
			// EXPLAIN ANALYZE runs the statement.
			return classifyAnalyzed(p, ClassRead), 0, false
		}
		return ClassRead, 0, false
	case kwAnalyze:
		// MariaDB's ANALYZE <statement> runs it; ANALYZE TABLE updates statistics.
		return classifyAnalyzed(p, ClassWrite), 0, false
	case kwCheck:
		// CHECK TABLE scans and reports; it changes no rows.
		return ClassRead, 0, false
	case kwWith:
		return classifyWith(p), 0, false
	case kwInsert, kwUpdate, kwDelete, kwReplace, kwTruncate, kwRename,
		kwGrant, kwRevoke, kwCommit, kwCall, kwOptimize, kwRepair, kwBinlog, kwImport:
		return ClassWrite, 0, false
	case kwLoad:
		// LOAD DATA and LOAD XML write; LOAD INDEX INTO CACHE does not.
		if n := p.next(); n.kind == tkWord && sqlWordFold(p.q[n.start:n.end], "INDEX") {
			return ClassOther, 0, false
		}
		return ClassWrite, 0, false
	case kwDrop:
		// DROP PREPARE is DEALLOCATE PREPARE.
		if p.word(p.next()) == kwPrepare {
			return ClassOther, 0, false
		}
		return ClassWrite, 0, false
	case kwCreate, kwAlter:
		return ClassWrite, 0, isStoredProgram(p)
	case kwSet:
		// MariaDB's SET STATEMENT var = value [, ...] FOR statement.
		if n := p.next(); n.kind == tkWord && sqlWordFold(p.q[n.start:n.end], "STATEMENT") {
			return classifySetStatement(p), 0, false
		}
		return ClassOther, 0, false
	case kwXA:
		if p.word(p.next()) == kwCommit {
			return ClassWrite, 0, false
		}
		return ClassOther, 0, false
	case kwBegin:
		// BEGIN [WORK] starts a transaction; MariaDB's BEGIN NOT ATOMIC is
		// a compound statement.
		if p.word(p.next()) == kwNot && p.word(p.next()) == kwAtomic {
			return ClassWrite, 1, true
		}
		return ClassOther, 0, false
	case kwIf, kwCase, kwLoop, kwWhile, kwRepeat:
		// MariaDB runs compound statements outside stored programs.
		return ClassWrite, 1, true
	case kwFor:
		return ClassWrite, 1, true
	}
	return ClassOther, 0, false
}

// classifyAnalyzed classifies the statement after EXPLAIN ANALYZE or
// ANALYZE: [FORMAT = name] statement. A TABLE keyword or a missing
// statement gives def.
func classifyAnalyzed(p sqlLexer, def Class) Class {
	t := p.next()
	if p.word(t) == kwFormat {
		t = p.next()
		if p.isPunct(t, '=') {
			t = p.next()
		}
		t = p.next()
	}
	switch p.word(t) {
	case kwSelect, kwValues:
		return ClassRead
	case kwInsert, kwUpdate, kwDelete, kwReplace:
		return ClassWrite
	case kwWith:
		return classifyWith(p)
	}
	// TABLE (EXPLAIN ANALYZE TABLE t runs the TABLE statement; ANALYZE
	// TABLE t updates statistics), LOCAL, NO_WRITE_TO_BINLOG, or unknown.
	return def
}

// classifySetStatement classifies the statement after the FOR of SET
// STATEMENT ... FOR; without one it is other.
func classifySetStatement(p sqlLexer) Class {
	depth := 0
	for {
		t := p.next()
		switch {
		case t.kind == tkEOF || t.kind == tkSemicolon:
			return ClassOther
		case p.isPunct(t, '('):
			depth++
		case p.isPunct(t, ')'):
			depth--
		case depth == 0 && p.word(t) == kwFor:
			t = p.next()
			for p.isPunct(t, '(') {
				t = p.next()
			}
			switch p.word(t) {
			case kwSet, kwBegin, kwIf, kwCase, kwLoop, kwWhile, kwRepeat, kwFor:
				// Not allowed after SET STATEMENT; and no recursion.
				return ClassOther
			}
			c, _, _ := classifyHead(p, t)
			return c
		}
	}
}

// classifyWith finds the main statement after WITH [RECURSIVE] name [(cols)]
// AS (body) [, ...] and classifies it. The main statement is the first
// statement keyword outside the CTE bodies, or a parenthesised query right
// after a body; a nested WITH there is scanned the same way. A malformed
// WITH is other.
func classifyWith(p sqlLexer) Class {
	depth := 0
	afterBody := false // the previous token closed a CTE body
	for {
		t := p.next()
		closed := false
		switch t.kind {
		case tkEOF, tkSemicolon:
			return ClassOther
		case tkPunct:
			switch {
			case p.isPunct(t, '(') && depth == 0 && afterBody:
				// "WITH a AS (...) (SELECT ...)": skip to the keyword.
				for p.isPunct(t, '(') {
					t = p.next()
				}
				if c := withMain(p, t); c != classNone {
					return c
				}
				if p.word(t) != kwWith {
					return ClassOther
				}
			case p.isPunct(t, '('):
				depth++
			case p.isPunct(t, ')'):
				if depth > 0 {
					depth--
				}
				closed = depth == 0
			}
		case tkWord:
			if depth == 0 {
				if c := withMain(p, t); c != classNone {
					return c
				}
			}
		}
		afterBody = closed
	}
}

// withMain classifies t if it is the keyword of a WITH's main statement,
// else returns classNone.
func withMain(p sqlLexer, t sqlToken) Class {
	switch p.word(t) {
	case kwSelect, kwTable, kwValues:
		return ClassRead
	case kwUpdate, kwDelete, kwInsert, kwReplace:
		return ClassWrite
	}
	return classNone
}

// isStoredProgram reports whether a CREATE or ALTER statement (the lexer
// is just past that keyword) defines a procedure, function, trigger, event
// or package, whose body may contain ";". It skips the clauses that may
// precede the object type: OR REPLACE, DEFINER = user, ALGORITHM = x,
// SQL SECURITY x, AGGREGATE.
func isStoredProgram(p sqlLexer) bool {
	afterEq := false
	for {
		t := p.next()
		switch t.kind {
		case tkEOF, tkSemicolon:
			return false
		case tkString, tkQuotedIdent, tkVar, tkParam, tkNumber:
			// A definer's name or host, possibly a digest's "?".
			afterEq = false
			continue
		case tkPunct:
			if p.isPunct(t, '=') || p.isPunct(t, '(') || p.isPunct(t, ')') || p.isPunct(t, '@') {
				afterEq = p.isPunct(t, '=')
				continue
			}
			return false
		case tkWord:
			if afterEq {
				afterEq = false
				continue
			}
			switch p.word(t) {
			case kwOr, kwReplace, kwDefiner, kwAlgorithm, kwSQL, kwSecurity, kwAggregate,
				kwCurrentUser, kwInvoker, kwUndefined, kwMerge, kwTemptable:
				continue
			case kwProcedure, kwFunction, kwTrigger, kwEvent, kwPackage:
				return true
			}
			return false
		default:
			return false
		}
	}
}

// sqlWordFold reports whether w equals the upper-case ASCII word s,
// ignoring case.
func sqlWordFold(w []byte, s string) bool {
	if len(w) != len(s) {
		return false
	}
	for i := range len(w) {
		c := w[i]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
