package sqlscan

import "github.com/rgproxy/rgproxy/sqltext"

// Digest normalizes statements for logs and for runaway watches that match
// SIMILAR statements. It reuses the classifier's lexer, so both agree on
// what is a comment, a string or code.

// Digest returns the normalized text of q: literals (numbers, strings,
// hex and bit literals, ? placeholders) become "?", lists of literals after
// IN and the rows of literals after VALUES become "(...)", comments are
// dropped (the content of /*! */ and /*M! */ is kept as code), keywords are
// upper-cased, identifiers keep their case and lose their backquotes unless
// they need them (a keyword or a name with special characters), user and
// system variable names are lower-cased, tokens are separated by one space
// in a fixed layout, and empty statements and the trailing ";" are removed.
// NULL, TRUE and FALSE are kept.
//
// Two statements that differ only in literal values, whitespace, keyword
// case, comments or backquotes have the same digest; different tables or
// columns give different digests. Digest(Digest(q)) == Digest(q).
//
// The keyword list is fixed and covers MySQL's reserved words and common
// function and type names. An unquoted table named like one of them (user,
// status, date) is upper-cased too, so on a case-sensitive server "user" and
// "USER" share a digest.
//
// m is the mode the text is read in: the session's character set and
// NO_BACKSLASH_ESCAPES (Statement.Mode).
func Digest(q []byte, m sqltext.Mode) string {
	var res Scan
	_, _, out := Query(q, m, nil, &res, make([]byte, 0, len(q)+8), true)
	return string(out)
}

// DigestHash returns the 64-bit FNV-1a hash of Digest(q, m): a stable id
// for SIMILAR runaway watches, the same in every process and version that
// computes the same digest. Format it with %016x for a watch key.
func DigestHash(q []byte, m sqltext.Mode) uint64 {
	return HashDigest(Digest(q, m))
}

// HashDigest returns the 64-bit FNV-1a hash of a digest that Digest
// already returned, so a caller that logs the digest hashes it once.
func HashDigest(digest string) uint64 { return fnv64(digest) }

// dcat is the layout category of an emitted digest token.
type dcat uint8

const (
	dNone     dcat = iota
	dClause        // keyword that introduces or joins clauses: SELECT, FROM, IN
	dName          // identifier, or a keyword that names a value, type or function
	dLiteral       // ?
	dOpen          // (
	dClose         // )
	dComma         // ,
	dDot           // .
	dEllipsis      // ...
	dVar           // @var
	dOp            // operator or other punctuation
	dSemi          // ;
)

// operand reports whether a token of category c ends an operand, so that a
// following "-" or "+" is binary.
func (c dcat) operand() bool {
	switch c {
	case dName, dLiteral, dClose, dVar, dEllipsis:
		return true
	}
	return false
}

// spaceBefore reports whether the layout puts a space between a token of
// category prev and one of category cur. It never glues two tokens that
// would lex differently together ("." "." would read as "..").
func spaceBefore(prev, cur dcat) bool {
	switch {
	case prev == dNone:
		return false
	case (prev == dDot || prev == dEllipsis) && (cur == dDot || cur == dEllipsis):
		return true
	case prev == dOpen || prev == dDot:
		return false
	case cur == dClose || cur == dComma || cur == dDot:
		return false
	case cur == dOpen:
		// A call or a name's column list: f(x), t(a, b); a clause: IN (...).
		return prev != dName
	}
	return true
}

type digester struct {
	l       sqltext.Lexer
	out     []byte
	prev    dcat
	pending bool // a ";" was read; written only if another token follows
}

func (d *digester) emit(c dcat, text []byte) {
	if d.pending {
		d.pending = false
		if d.prev != dNone {
			d.out = append(d.out, ';')
			d.prev = dSemi
		}
	}
	// ".5" after a dot would read as a number: keep "x. 5abc" apart.
	if spaceBefore(d.prev, c) || d.prev == dDot && len(text) > 0 && sqltext.Digit(text[0]) {
		d.out = append(d.out, ' ')
	}
	d.out = append(d.out, text...)
	d.prev = c
}

func (d *digester) emitString(c dcat, text string) {
	d.emit(c, []byte(text))
}

// token writes the digest of t, the token just read from d.l; for a
// literal list or a run of signs it reads on through d.l.
func (d *digester) token(t sqltext.Token) {
	var buf [digestMaxKeywordLen]byte
	text := d.l.Text(t)
	switch t.Kind {
	case tkEOF:
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
			return
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
				return
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

// collapseTuples replaces a following parenthesised list of literals with
// "(...)"; for VALUES (rows true) further ", (literals)" rows are dropped.
func (d *digester) collapseTuples(rows bool) {
	p, ok := literalTuple(d.l)
	if !ok {
		return
	}
	d.l = p
	d.emitString(dOpen, "(")
	d.emitString(dEllipsis, "...")
	d.emitString(dClose, ")")
	for rows {
		p := d.l
		if !p.IsPunct(p.Next(), ',') {
			return
		}
		if p, ok = literalTuple(p); !ok {
			return
		}
		d.l = p
	}
}

// literalTuple reads "(item, ...)" where every item is a literal, a
// placeholder, NULL, TRUE, FALSE or "...", and returns the lexer after ")".
func literalTuple(p sqltext.Lexer) (sqltext.Lexer, bool) {
	if !p.IsPunct(p.Next(), '(') {
		return p, false
	}
	var buf [digestMaxKeywordLen]byte
	for {
		t := p.Next()
		switch t.Kind {
		case tkEllipsis:
		case tkWord:
			up, _ := upperKeyword(&buf, p.Text(t))
			if s := string(up); s != "NULL" && s != "TRUE" && s != "FALSE" {
				return p, false
			}
		default:
			if !literalRun(&p, t) {
				return p, false
			}
		}
		t = p.Next()
		switch {
		case p.IsPunct(t, ')'):
			return p, true
		case !p.IsPunct(t, ','):
			return p, false
		}
	}
}

// literalRun reports whether t starts a literal and consumes the rest of
// it: signs before a number, string or placeholder ("- -1"), and the
// strings MySQL concatenates after a string ('a' 'b'). On false the lexer
// position is unspecified.
func literalRun(p *sqltext.Lexer, t sqltext.Token) bool {
	for p.IsPunct(t, '-') || p.IsPunct(t, '+') {
		t = p.Next()
	}
	switch t.Kind {
	case tkNumber, tkParam:
		return true
	case tkString:
		for {
			n := *p
			if n.Next().Kind != tkString {
				return true
			}
			*p = n
		}
	}
	return false
}

// emitVar writes @name or @@name lower-cased (variable names ignore case);
// quoted names are kept as written.
func (d *digester) emitVar(text []byte) {
	quoted := false
	for _, c := range text {
		if c == '\'' || c == '"' || c == '`' {
			quoted = true
			break
		}
	}
	if quoted {
		d.emit(dVar, text)
		return
	}
	lower := make([]byte, len(text))
	for i, c := range text {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	d.emit(dVar, lower)
}

// unquoteIdent returns the name inside a quoted identifier (`...`, or
// "..." under ANSI_QUOTES).
func unquoteIdent(text []byte) []byte {
	quote := text[0]
	body := text[1:]
	if len(body) > 0 && body[len(body)-1] == quote {
		body = body[:len(body)-1]
	}
	name := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		name = append(name, body[i])
		if body[i] == quote && i+1 < len(body) && body[i+1] == quote {
			i++
		}
	}
	return name
}

// emitIdent writes an identifier bare when it would read back as the same
// identifier, else backquoted.
func (d *digester) emitIdent(name []byte) {
	var buf [digestMaxKeywordLen]byte
	bare := len(name) > 0 && !sqltext.Digit(name[0])
	for _, c := range name {
		if !sqltext.IdentByte(c) {
			bare = false
			break
		}
	}
	if bare {
		if up, ok := upperKeyword(&buf, name); ok && digestKeyword(up) != dNone {
			bare = false
		}
	}
	if bare {
		d.emit(dName, name)
		return
	}
	quoted := make([]byte, 0, len(name)+2)
	quoted = append(quoted, '`')
	for _, c := range name {
		quoted = append(quoted, c)
		if c == '`' {
			quoted = append(quoted, '`')
		}
	}
	quoted = append(quoted, '`')
	d.emit(dName, quoted)
}

// digestMaxKeywordLen bounds the words digestKeyword considers.
const digestMaxKeywordLen = 24

// upperKeyword upper-cases an ASCII word into buf; ok is false when the
// word is too long or not ASCII, and so no keyword.
func upperKeyword(buf *[digestMaxKeywordLen]byte, w []byte) ([]byte, bool) {
	if len(w) > len(buf) {
		return nil, false
	}
	for i, c := range w {
		if c >= 0x80 {
			return nil, false
		}
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(w)], true
}

// digestKeyword returns the layout category of an upper-case keyword, or
// dNone if the word is not in the digest's keyword list.
func digestKeyword(up []byte) dcat {
	switch string(up) {
	case
		"AGGREGATE", "BINLOG", "IMPORT", "MERGE", "PACKAGE", "SECURITY", "TEMPTABLE", "UNDEFINED",
		"ACCESSIBLE", "ADD", "AFTER", "ALGORITHM", "ALL", "ALTER", "ANALYZE", "AND", "ANY", "AS", "ASC",
		"ASENSITIVE", "ATOMIC", "AUTO_INCREMENT", "BEFORE", "BEGIN", "BETWEEN", "BOTH", "BY", "CALL",
		"CASCADE", "CASE", "CHANGE", "CHARSET", "CHECK", "CHECKSUM", "COLLATE", "COLUMN", "COLUMNS",
		"COMMIT", "COMMITTED", "CONDITION", "CONSTRAINT", "CONTINUE", "CREATE", "CROSS", "CUBE",
		"CURSOR", "DATABASES", "DEALLOCATE", "DECLARE", "DEFAULT", "DEFINER", "DELAYED", "DELETE",
		"DESC", "DESCRIBE", "DETERMINISTIC", "DISTINCT", "DISTINCTROW", "DIV", "DO", "DROP", "DUAL",
		"DUMPFILE", "DUPLICATE", "EACH", "ELSE", "ELSEIF", "ENCLOSED", "END", "ENGINE", "ESCAPE",
		"ESCAPED", "EVENT", "EXCEPT", "EXECUTE", "EXISTS", "EXIT", "EXPLAIN", "FETCH", "FIELDS", "FOR",
		"FORCE", "FOREIGN", "FORMAT", "FROM", "FULL", "FULLTEXT", "FUNCTION", "GENERATED", "GET",
		"GLOBAL", "GRANT", "GROUP", "GROUPS", "HANDLER", "HAVING", "HELP", "HIGH_PRIORITY", "IGNORE",
		"IN", "INDEX", "INFILE", "INNER", "INOUT", "INSENSITIVE", "INTERSECT", "INTERVAL", "INTO",
		"INVOKER", "IS", "ISOLATION", "ITERATE", "JOIN", "KEY", "KEYS", "KILL", "LATERAL", "LEADING",
		"LEAVE", "LEVEL", "LIKE", "LIMIT", "LINEAR", "LINES", "LOAD", "LOCAL", "LOCK", "LOCKED", "LOOP",
		"LOW_PRIORITY", "MAXVALUE", "MODE", "MODIFIES", "NAMES", "NATURAL", "NOT", "NOWAIT",
		"NO_WRITE_TO_BINLOG", "OF", "OFFSET", "ON", "ONLY", "OPTIMIZE", "OPTION", "OPTIONALLY", "OR",
		"ORDER", "OUT", "OUTER", "OUTFILE", "OVER", "PARTITION", "PRECISION", "PREPARE", "PRIMARY",
		"PROCEDURE", "PURGE", "RANGE", "READ", "READS", "RECURSIVE", "REFERENCES", "REGEXP", "RELEASE",
		"RENAME", "REPAIR", "REPEATABLE", "REQUIRE", "RESIGNAL", "RESTRICT", "RETURN", "RETURNS",
		"REVOKE", "RLIKE", "ROLLBACK", "ROWS", "SAVEPOINT", "SELECT", "SENSITIVE", "SEPARATOR",
		"SERIALIZABLE", "SESSION", "SHARE", "SHOW", "SIGNAL", "SKIP", "SPATIAL", "SPECIFIC", "SQL",
		"SQLEXCEPTION", "SQLSTATE", "SQLWARNING", "SQL_BIG_RESULT", "SQL_CALC_FOUND_ROWS",
		"SQL_NO_CACHE", "SQL_SMALL_RESULT", "START", "STARTING", "STORED", "STRAIGHT_JOIN", "TABLE",
		"TABLES", "TEMPORARY", "TERMINATED", "THEN", "TO", "TRAILING", "TRANSACTION", "TRIGGER",
		"TRUNCATE", "UNCOMMITTED", "UNDO", "UNION", "UNIQUE", "UNLOCK", "UNSIGNED", "UNTIL", "UPDATE",
		"USAGE", "USE", "USING", "VALUE", "VALUES", "VARIABLES", "VIEW", "VIRTUAL", "WHEN", "WHERE",
		"WHILE", "WINDOW", "WITH", "WORK", "WRITE", "XA", "XOR", "ZEROFILL":
		return dClause
	case
		"ABS", "AVG", "BIGINT", "BINARY", "BIT", "BLOB", "BOOL", "BOOLEAN", "CAST", "CEIL", "CEILING",
		"CHAR", "CHARACTER", "COALESCE", "COMMENT", "CONCAT", "CONCAT_WS", "CONVERT", "COUNT",
		"CUME_DIST", "CURDATE", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP", "CURRENT_USER",
		"CURTIME", "DATABASE", "DATE", "DATETIME", "DATE_ADD", "DATE_FORMAT", "DATE_SUB", "DAY", "DEC",
		"DECIMAL", "DENSE_RANK", "DOUBLE", "ENUM", "FALSE", "FIRST_VALUE", "FLOAT", "FLOOR", "GROUPING",
		"GROUP_CONCAT", "HOUR", "IF", "IFNULL", "INSERT", "INT", "INTEGER", "JSON", "JSON_EXTRACT",
		"JSON_TABLE", "LAG", "LAST_INSERT_ID", "LAST_VALUE", "LEAD", "LEFT", "LENGTH", "LOCALTIME",
		"LOCALTIMESTAMP", "LONGBLOB", "LONGTEXT", "LOWER", "MATCH", "MAX", "MEDIUMBLOB", "MEDIUMINT",
		"MEDIUMTEXT", "MIN", "MINUTE", "MOD", "MONTH", "NOW", "NTH_VALUE", "NTILE", "NULL", "NULLIF",
		"NUMERIC", "PERCENT_RANK", "RANK", "REAL", "REPEAT", "REPLACE", "RIGHT", "ROUND", "ROW",
		"ROW_NUMBER", "SCHEMA", "SECOND", "SET", "STATUS", "SUBSTR", "SUBSTRING", "SUM", "SYSDATE",
		"TEXT", "TIME", "TIMESTAMP", "TINYBLOB", "TINYINT", "TINYTEXT", "TRIM", "TRUE", "UNIX_TIMESTAMP",
		"UPPER", "USER", "UTC_DATE", "UTC_TIME", "UTC_TIMESTAMP", "VARBINARY", "VARCHAR", "YEAR":
		return dName
	}
	return dNone
}
