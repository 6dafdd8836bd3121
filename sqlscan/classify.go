package sqlscan

import "github.com/rgproxy/rgproxy/sqltext"

// This file holds the cheap statement classifier that runs on every
// COM_QUERY. It does not parse SQL: it looks at the first keyword of each
// statement (after comments and parentheses) and at just enough structure
// (CTE bodies, stored-program blocks) to find where statements start and
// end. Tokens come from sqltext's lexer, in the session's mode (character
// set and NO_BACKSLASH_ESCAPES), so that strings, identifiers and comments
// end where the server ends them.

// Token kinds, as sqltext names them.
const (
	tkEOF         = sqltext.EOF
	tkWord        = sqltext.Word
	tkQuotedIdent = sqltext.QuotedIdent
	tkString      = sqltext.String
	tkNumber      = sqltext.Number
	tkParam       = sqltext.Param
	tkEllipsis    = sqltext.Ellipsis
	tkVar         = sqltext.Var
	tkPunct       = sqltext.Punct
	tkSemicolon   = sqltext.Semicolon
)

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
	kwDeallocate
	kwDesc
	kwDescribe
	kwDrop
	kwEnd
	kwEvent
	kwExecute
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
	case "DEALLOCATE":
		return kwDeallocate
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
	case "EXECUTE":
		return kwExecute
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

// word returns the keyword of t, read from l, or kwNone if t is not an
// unquoted word.
func word(l *sqltext.Lexer, t sqltext.Token) sqlKW {
	if t.Kind != tkWord {
		return kwNone
	}
	return lookupKW(l.Text(t))
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
	return ClassifyQueryMode(q, sqltext.Mode{})
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
func classifyHead(p sqltext.Lexer, t sqltext.Token) (class Class, depth int, program bool) {
	k := word(&p, t)
	switch k {
	case kwSelect, kwShow, kwTable, kwValues, kwHelp, kwChecksum:
		return ClassRead, 0, false
	case kwExplain, kwDescribe, kwDesc:
		if word(&p, p.Next()) == kwAnalyze {
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
		if n := p.Next(); n.Kind == tkWord && sqlWordFold(p.Text(n), "INDEX") {
			return ClassOther, 0, false
		}
		return ClassWrite, 0, false
	case kwDrop:
		// DROP PREPARE is DEALLOCATE PREPARE.
		if word(&p, p.Next()) == kwPrepare {
			return ClassOther, 0, false
		}
		return ClassWrite, 0, false
	case kwCreate, kwAlter:
		return ClassWrite, 0, isStoredProgram(p)
	case kwSet:
		// MariaDB's SET STATEMENT var = value [, ...] FOR statement.
		if n := p.Next(); n.Kind == tkWord && sqlWordFold(p.Text(n), "STATEMENT") {
			return classifySetStatement(p), 0, false
		}
		return ClassOther, 0, false
	case kwXA:
		if word(&p, p.Next()) == kwCommit {
			return ClassWrite, 0, false
		}
		return ClassOther, 0, false
	case kwBegin:
		// BEGIN [WORK] starts a transaction; MariaDB's BEGIN NOT ATOMIC is
		// a compound statement.
		if word(&p, p.Next()) == kwNot && word(&p, p.Next()) == kwAtomic {
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
func classifyAnalyzed(p sqltext.Lexer, def Class) Class {
	t := p.Next()
	if word(&p, t) == kwFormat {
		t = p.Next()
		if p.IsPunct(t, '=') {
			t = p.Next()
		}
		t = p.Next()
	}
	switch word(&p, t) {
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
func classifySetStatement(p sqltext.Lexer) Class {
	depth := 0
	for {
		t := p.Next()
		switch {
		case t.Kind == tkEOF || t.Kind == tkSemicolon:
			return ClassOther
		case p.IsPunct(t, '('):
			depth++
		case p.IsPunct(t, ')'):
			depth--
		case depth == 0 && word(&p, t) == kwFor:
			t = p.Next()
			for p.IsPunct(t, '(') {
				t = p.Next()
			}
			switch word(&p, t) {
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
func classifyWith(p sqltext.Lexer) Class {
	depth := 0
	afterBody := false // the previous token closed a CTE body
	for {
		t := p.Next()
		closed := false
		switch t.Kind {
		case tkEOF, tkSemicolon:
			return ClassOther
		case tkPunct:
			switch {
			case p.IsPunct(t, '(') && depth == 0 && afterBody:
				// "WITH a AS (...) (SELECT ...)": skip to the keyword.
				for p.IsPunct(t, '(') {
					t = p.Next()
				}
				if c := withMain(p, t); c != classNone {
					return c
				}
				if word(&p, t) != kwWith {
					return ClassOther
				}
			case p.IsPunct(t, '('):
				depth++
			case p.IsPunct(t, ')'):
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
func withMain(p sqltext.Lexer, t sqltext.Token) Class {
	switch word(&p, t) {
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
func isStoredProgram(p sqltext.Lexer) bool {
	afterEq := false
	for {
		t := p.Next()
		switch t.Kind {
		case tkEOF, tkSemicolon:
			return false
		case tkString, tkQuotedIdent, tkVar, tkParam, tkNumber:
			// A definer's name or host, possibly a digest's "?".
			afterEq = false
			continue
		case tkPunct:
			if p.IsPunct(t, '=') || p.IsPunct(t, '(') || p.IsPunct(t, ')') || p.IsPunct(t, '@') {
				afterEq = p.IsPunct(t, '=')
				continue
			}
			return false
		case tkWord:
			if afterEq {
				afterEq = false
				continue
			}
			switch word(&p, t) {
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
