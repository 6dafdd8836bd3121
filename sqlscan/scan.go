package sqlscan

import (
	"bytes"
	"fmt"

	"github.com/rgproxy/rgproxy/sqltext"
)

// This file holds the single pass over a statement's SQL text: one walk of
// the lexer (classify.go) yields the class, the statement boundaries, the
// digest and its hash, the optimizer-hint and tag comments and the words a
// policy asked to be told about. A policy reads the Scan instead of lexing
// the text again; mysqlproto gives these facts no meaning.
//
// The walk reads a few tokens ahead at a statement's head (EXPLAIN ANALYZE,
// SET STATEMENT ... FOR, WITH ... AS (...), CREATE ... PROCEDURE look for
// their main keyword on a copy of the lexer); everything else is lexed once.

// Scan is what the single pass over a statement's text found. Strings are
// substrings of the text and Digest is a buffer of the session's: both are
// valid as long as the Statement that carries them.
type Scan struct {
	// EndsTxn is true when the text is one COMMIT, ROLLBACK (not ROLLBACK
	// TO SAVEPOINT), XA COMMIT or XA ROLLBACK statement.
	EndsTxn bool
	// Digest is the normalized text (see Digest); DigestHash is its
	// HashDigest. Both are empty for commands without SQL text.
	Digest     []byte
	DigestHash uint64
	// Hint is the body of the optimizer-hint comment (/*+ ... */) written
	// right after the first keyword of a SELECT, INSERT, REPLACE, UPDATE or
	// DELETE; "" when there is none.
	Hint string
	// LeadingComment is the body of the last plain /* ... */ comment before
	// the first token, TrailingComment that of the last one after the last
	// token (a ";" aside); "" when there is none. Executable comments and
	// optimizer hints are not plain comments.
	LeadingComment, TrailingComment string
	// Mentions has bit i set when word i of the server's scan words (mysqlproto.Config.ScanWords)
	// appears as an identifier or keyword, bare or backquoted, outside
	// strings and comments (any letter case).
	Mentions uint64
	// Charset is what the text may do to the session's
	// character_set_client.
	Charset CharsetEffect
	// EscapedDoubleQuote: a backslash escaped a '"' inside a "..." string,
	// so that under ANSI_QUOTES (which no session follows) the text would
	// read differently: its digest is not shown to another account
	// (ShownDigest).
	EscapedDoubleQuote bool
}

// maxScanWords is how many words a Scan can report in Mentions.
const maxScanWords = 64

// maxScanWordLen bounds the length of a word in scan words (mysqlproto.Config.ScanWords).
const maxScanWordLen = 64

// Words finds a small fixed set of words among identifiers without
// hashing: a word is compared only with the set's words of its length.
type Words struct {
	words []string // lower case
	byLen [maxScanWordLen + 1]uint64
}

// NewWords indexes words (at most 64, each 1..64 ASCII bytes).
func NewWords(words []string) (*Words, error) {
	if len(words) == 0 {
		return nil, nil
	}
	if len(words) > maxScanWords {
		return nil, fmt.Errorf("sqlscan: %d scan words, at most %d", len(words), maxScanWords)
	}
	ws := &Words{}
	for i, w := range words {
		if len(w) == 0 || len(w) > maxScanWordLen {
			return nil, fmt.Errorf("sqlscan: scan word %q: length must be 1..%d", w, maxScanWordLen)
		}
		lw := make([]byte, len(w))
		for j := range len(w) {
			c := w[j]
			if c >= 0x80 {
				return nil, fmt.Errorf("sqlscan: scan word %q is not ASCII", w)
			}
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			lw[j] = c
		}
		ws.words = append(ws.words, string(lw))
		ws.byLen[len(w)] |= 1 << i
	}
	return ws, nil
}

// match returns the bits of the words equal to w, ignoring ASCII case.
func (ws *Words) match(w []byte) uint64 {
	if len(w) > maxScanWordLen {
		return 0
	}
	cand := ws.byLen[len(w)]
	var hit uint64
	for cand != 0 {
		i := trailingZeros(cand)
		cand &^= 1 << i
		if foldEqualLower(w, ws.words[i]) {
			hit |= 1 << i
		}
	}
	return hit
}

func trailingZeros(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

// foldEqualLower reports whether w equals the lower-case ASCII word lw,
// ignoring ASCII case.
func foldEqualLower(w []byte, lw string) bool {
	if len(w) != len(lw) {
		return false
	}
	for i := range len(w) {
		c := w[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lw[i] {
			return false
		}
	}
	return true
}

// scanner is one pass: the lexer lives in the digester, and every token
// the classification reads through next is fed to the digest and checked
// against the word set.
type scanner struct {
	d digester
	// text is the input as a string, when the caller has one: the Scan's
	// strings are then its substrings, not copies.
	text   string
	digest bool // write the digest
	words  *Words
	res    Scan // copied out at the end: a pointer would escape
	// lastEnd is where the last token other than ";" ended, for telling a
	// trailing comment.
	lastEnd int
	// skipBlockWord: the previous word was END, and the block type after
	// it (END IF, END LOOP, ...) closes no further block.
	skipBlockWord bool
	// multiCS: a statement that may change the character set is part of
	// a multi-statement.
	multiCS bool
}

// sub returns the input's bytes [i, j) as a string.
func (s *scanner) sub(i, j int) string {
	if s.text != "" {
		return s.text[i:j]
	}
	return string(s.d.l.Src()[i:j])
}

func (s *scanner) next() sqltext.Token {
	t := s.d.l.Next()
	switch t.Kind {
	case tkEOF:
		return t
	case tkWord:
		if s.words != nil {
			s.res.Mentions |= s.words.match(s.d.l.Text(t))
		}
	case tkQuotedIdent:
		if s.words != nil && t.End-t.Start >= 2 {
			s.res.Mentions |= s.words.match(s.d.l.Src()[t.Start+1 : t.End-1])
		}
	}
	if s.digest {
		s.d.token(t) // may read on, through a list of literals
	}
	if t.Kind != tkSemicolon {
		s.lastEnd = s.d.l.Pos()
	}
	return t
}

// Query makes the single pass over q (the text of a COM_QUERY or
// COM_STMT_PREPARE): it returns the class and whether q holds several
// statements (as ClassifyQueryMode), and fills res. With withDigest it
// writes the digest into digest[:0], returns that buffer (grown as needed)
// and sets res.Digest and res.DigestHash. words may be nil. It allocates
// only to grow the digest buffer.
func Query(q []byte, m sqltext.Mode, words *Words, res *Scan, digest []byte, withDigest bool) (Class, bool, []byte) {
	return Text(q, "", m, words, res, digest, withDigest)
}

// Text is Query for a caller that also holds q as the string
// text, so that the Scan's strings are substrings of it.
func Text(q []byte, text string, m sqltext.Mode, words *Words, res *Scan, digest []byte, withDigest bool) (Class, bool, []byte) {
	s := scanner{
		text:   text,
		d:      digester{l: sqltext.New(q, m), out: digest[:0]},
		digest: withDigest,
		words:  words,
	}
	class := classNone
	parts := 0
	endsTxn := false
	for {
		c, empty, more, ends := s.classifyNext(parts == 0)
		if !empty {
			parts++
			class = mergeClass(class, c)
			endsTxn = ends
		}
		if !more {
			break
		}
	}
	if cs, ce := s.d.l.Comment(); cs > 0 && cs >= s.lastEnd && s.lastEnd > 0 {
		s.res.TrailingComment = s.sub(cs, ce)
	}
	if parts == 0 {
		class = ClassOther
	}
	s.res.EndsTxn = parts == 1 && endsTxn
	if s.multiCS && parts > 1 && s.res.Charset.Kind == CharsetPrepared {
		s.res.Charset.Kind = CharsetAsk // the session follows prepared names of single statements only
	}
	s.res.EscapedDoubleQuote = s.d.l.EscapedDoubleQuote()
	if withDigest {
		s.res.Digest = s.d.out
		s.res.DigestHash = fnv64(s.d.out)
	}
	*res = s.res
	return class, parts > 1, s.d.out
}

// ClassifyQueryMode is ClassifyQuery for a session whose sql_mode may
// include NO_BACKSLASH_ESCAPES: pass true when the backend's last status
// flags had SERVER_STATUS_NO_BACKSLASH_ESCAPES (0x0200) set. Under that mode
// 'a\'; DELETE ...' ends the string at the second quote, so the DELETE is
// a second statement; reading it with escapes would hide the write.
func ClassifyQueryMode(q []byte, m sqltext.Mode) (class Class, multi bool) {
	var res Scan
	class, multi, _ = Query(q, m, nil, &res, nil, false)
	return class, multi
}

// classifyNext classifies one statement and consumes it with its
// terminating ";". more is true when a ";" was consumed (more text may
// follow); empty is true when the statement had no tokens; ends is true
// when it ends a transaction. first is true for the text's first
// statement, whose leading comment and hint are recorded.
func (s *scanner) classifyNext(first bool) (class Class, empty, more, ends bool) {
	l := &s.d.l
	t := s.next()
	if cs, ce := l.Comment(); first && cs > 0 && ce <= t.Start && t.Kind != tkEOF {
		s.res.LeadingComment = s.sub(cs, ce)
	}
	parens := false
	for l.IsPunct(t, '(') {
		t = s.next()
		parens = true
	}
	switch t.Kind {
	case tkEOF:
		if parens {
			return ClassOther, false, false, false
		}
		return classNone, true, false, false
	case tkSemicolon:
		if parens {
			return ClassOther, false, true, false
		}
		return classNone, true, true, false
	}
	if first && !parens {
		s.hint(t)
	}
	class, depth, program := classifyHead(*l, t)
	ends = !parens && endsTransaction(*l, t)
	var cs CharsetEffect
	if n := t.End - t.Start; t.Kind == tkWord && (n == 3 || n == 4 || n == 7 || n == 10) {
		// SET, DROP (PREPARE), EXECUTE, PREPARE, DEALLOCATE: the few
		// statements that may change character_set_client.
		cs = charsetEffect(*l, t)
	}
	more = s.skipStatement(depth, program)
	if cs.Kind != CharsetNone {
		if !first || more {
			s.multiCS = true
		}
		s.res.Charset = cs
		if cs.Kind == CharsetTo && more {
			// The server parses the next statement after running this one.
			l.SetCharset(cs.To)
		}
	}
	return class, false, more, ends
}

// hint records the optimizer-hint comment right after t, the first
// keyword, when t may carry one.
func (s *scanner) hint(t sqltext.Token) {
	l := &s.d.l
	switch word(l, t) {
	case kwSelect, kwInsert, kwReplace, kwUpdate, kwDelete:
	default:
		return
	}
	q, p := l.Src(), l.Pos()
	for p < len(q) && sqltext.Space(q[p]) {
		p++
	}
	if !bytes.HasPrefix(q[p:], []byte("/*+")) {
		return
	}
	if end := bytes.Index(q[p+3:], []byte("*/")); end >= 0 {
		s.res.Hint = s.sub(p+3, p+3+end)
	}
}

// endsTransaction reports whether the statement whose first token is t
// (read from p) is COMMIT, ROLLBACK [WORK] but not ROLLBACK ... TO, or XA
// COMMIT / XA ROLLBACK.
func endsTransaction(p sqltext.Lexer, t sqltext.Token) bool {
	switch word(&p, t) {
	case kwCommit:
		return true
	case kwRollback:
		n := p.Next()
		if word(&p, n) == kwWork {
			n = p.Next()
		}
		return word(&p, n) != kwTo
	case kwXA:
		switch word(&p, p.Next()) {
		case kwCommit, kwRollback:
			return true
		}
	}
	return false
}

// skipStatement consumes tokens up to and including the ";" that ends the
// current statement, and reports whether it found one (false at the end of
// the text). In a stored program or compound statement (program true),
// ";" ends the statement only outside BEGIN ... END, IF ... END IF, CASE
// ... END, LOOP, WHILE, REPEAT and FOR blocks; depth is the number of
// blocks already open. It runs in time linear in the text: "IF (" is a
// block only if its parenthesis closes without a comma at its own level
// (else it is the IF function), which is decided when it closes.
func (s *scanner) skipStatement(depth int, program bool) bool {
	l := &s.d.l
	var (
		parens   int    // open parentheses
		ifParens uint64 // bit i: the parenthesis at level i+1 follows IF and has no comma yet
		afterIf  bool   // the previous token was IF followed by "("
	)
	s.skipBlockWord = false
	for {
		t := s.next()
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
				if s.skipBlockWord {
					s.skipBlockWord = false
					continue
				}
				var d int
				d, afterIf = s.blockDelta(t)
				depth += d
			}
		}
	}
}

// blockDelta returns how the word t changes the block depth of a stored
// program body: +1 for a block opener, -1 for END (and the block type
// after it, as in END IF, opens nothing), 0 otherwise. ifParen is true for
// IF followed by "(", which skipStatement resolves.
func (s *scanner) blockDelta(t sqltext.Token) (delta int, ifParen bool) {
	l := &s.d.l
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
			s.skipBlockWord = true
		}
		return -1, false
	}
	return 0, false
}

// SplitStatements returns the non-empty statements of a query, each
// without its terminating ";", by the same lexical rules as ClassifyQuery.
// A backslash is an ordinary character in strings when
// noBackslashEscapes (the session's sql_mode says NO_BACKSLASH_ESCAPES).
// It allocates, so it is for the rare multi-statement (st.Multi), never
// for every query.
func SplitStatements(q []byte, m sqltext.Mode) [][]byte {
	s := scanner{d: digester{l: sqltext.New(q, m)}}
	var out [][]byte
	for {
		start := s.d.l.Pos()
		_, empty, more, _ := s.classifyNext(false)
		if !empty {
			part := bytes.TrimSpace(q[start:s.d.l.Pos()])
			if more {
				part = bytes.TrimSpace(bytes.TrimSuffix(part, []byte(";")))
			}
			out = append(out, part)
		}
		if !more {
			return out
		}
	}
}

// FirstStatementLen is the length of a multi-statement text's first
// non-empty statement with what precedes it and its terminating ";" (all
// of q when it has one statement), by the same rules as SplitStatements.
// Like it, it is for the rare multi-statement.
func FirstStatementLen(q []byte, m sqltext.Mode) int {
	s := scanner{d: digester{l: sqltext.New(q, m)}}
	for {
		_, empty, more, _ := s.classifyNext(false)
		if !empty || !more {
			return s.d.l.Pos()
		}
	}
}

// fnv64 is the 64-bit FNV-1a hash of b.
func fnv64[T string | []byte](b T) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := range len(b) {
		h ^= uint64(b[i])
		h *= prime
	}
	return h
}
