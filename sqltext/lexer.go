package sqltext

import "unsafe"

// Kind is the kind of a token.
type Kind uint8

const (
	EOF         Kind = iota
	Word             // unquoted identifier or keyword
	QuotedIdent      // `identifier`
	String           // '...', "...", N'...', _charset'...'
	Number           // 12, 1.5e3, .5, 0x1F, 0b101, X'1F', B'101'
	Param            // ? placeholder
	Ellipsis         // "..." as a digest writes a collapsed list
	Var              // @name, @@name, @'name', @`name`
	Punct            // operator or punctuation (one token, possibly several bytes)
	Semicolon        // statement separator
)

// Token is a span [Start, End) of the lexer's input. Tokens never copy bytes.
type Token struct {
	Kind       Kind
	Start, End int
}

// Mode is what, besides the text, decides how a server reads it: the
// session's character_set_client and whether its sql_mode has
// NO_BACKSLASH_ESCAPES or ANSI_QUOTES. The zero Mode is a utf8mb4 (or
// latin1) session with backslash escapes and "..." strings.
type Mode struct {
	Charset            Charset
	NoBackslashEscapes bool
	// ANSIQuotes: "..." is a quoted identifier (no backslash escapes), as
	// under sql_mode ANSI_QUOTES. A session does not follow it (no status
	// flag says it); readers that show text to another account read it
	// both ways.
	ANSIQuotes bool
}

// Lexer splits SQL text into tokens, skipping whitespace and comments and
// reading executable comments as code. It is a value type: copying it
// gives a cheap lookahead cursor.
type Lexer struct {
	q    []byte
	pos  int
	cs   Charset
	exec bool // inside /*! ... */ or /*M! ... */
	// noBackslash: sql_mode NO_BACKSLASH_ESCAPES, a backslash in a string
	// is an ordinary character.
	noBackslash bool
	// ansiQuotes: sql_mode ANSI_QUOTES, "..." is a quoted identifier.
	ansiQuotes bool
	// escapedDQ: a backslash escaped a '"' inside "...": see
	// EscapedDoubleQuote.
	escapedDQ bool
	prev      Kind // kind of the previous token, for ".5" vs "t.c"
	// prevClose is true when the previous token was ")".
	prevClose bool
	// sawExec: an executable comment marker was read; open: a comment or
	// quote ran unterminated to the end of the text.
	sawExec, open bool
	// mark is 1 + where the first executable comment, or the comment or
	// quote that ran unterminated, opened (see Mark); 0 when none did.
	mark int
	// cmtStart and cmtEnd span the body of the last plain block comment
	// skipped (not /*! */, /*M! */ or an optimizer hint /*+ */);
	// cmtStart is 0 when there was none.
	cmtStart, cmtEnd int
}

// New returns a Lexer over q read in mode m.
func New(q []byte, m Mode) Lexer {
	return Lexer{q: q, cs: m.Charset, noBackslash: m.NoBackslashEscapes, ansiQuotes: m.ANSIQuotes}
}

// NewString returns a Lexer over the bytes of s without copying them; the
// lexer only reads its input.
func NewString(s string, m Mode) Lexer { return New(bytesOf(s), m) }

// bytesOf views the bytes of s without copying; callers only read them.
func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// Src returns the lexer's input.
func (l *Lexer) Src() []byte { return l.q }

// Pos returns the offset where the next token's search starts.
func (l *Lexer) Pos() int { return l.pos }

// Text returns the bytes of t.
func (l *Lexer) Text(t Token) []byte { return l.q[t.Start:t.End] }

// Mode returns the mode the lexer reads in.
func (l *Lexer) Mode() Mode {
	return Mode{Charset: l.cs, NoBackslashEscapes: l.noBackslash, ANSIQuotes: l.ansiQuotes}
}

// SetCharset changes the character set for the rest of the text, as a
// server does after a SET NAMES inside a multi-statement.
func (l *Lexer) SetCharset(cs Charset) { l.cs = cs }

// Comment returns the body of the last plain block comment skipped
// (not an executable comment or an optimizer hint); start is 0 when there
// was none.
func (l *Lexer) Comment() (start, end int) { return l.cmtStart, l.cmtEnd }

// SawExec reports whether an executable comment (/*! or /*M!) was read.
func (l *Lexer) SawExec() bool { return l.sawExec }

// EscapedDoubleQuote reports whether a backslash escaped a '"' inside a
// "..." string: under ANSI_QUOTES, which no session follows, that quote
// would end a name, and the text would read differently from there.
func (l *Lexer) EscapedDoubleQuote() bool { return l.escapedDQ }

// Unterminated reports whether a comment, string or quoted identifier ran
// to the end of the text without its closing mark.
func (l *Lexer) Unterminated() bool { return l.open }

// Mark returns where the first executable comment, or the unterminated
// comment or quote, opened (for an error's position); ok is false when
// neither SawExec nor Unterminated.
func (l *Lexer) Mark() (pos int, ok bool) { return l.mark - 1, l.mark > 0 }

func (l *Lexer) setMark(p int) {
	if l.mark == 0 {
		l.mark = p + 1
	}
}

// IsPunct reports whether t is the one-byte punctuation c.
func (l *Lexer) IsPunct(t Token, c byte) bool {
	return t.Kind == Punct && t.End == t.Start+1 && l.q[t.Start] == c
}

// Space reports whether c is SQL whitespace.
func Space(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// Digit reports whether c is an ASCII digit.
func Digit(c byte) bool { return c >= '0' && c <= '9' }

func hexDigit(c byte) bool {
	return Digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// IdentByte reports whether c may appear in an unquoted identifier.
// Bytes >= 0x80 are parts of multi-byte characters, which MySQL allows.
func IdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || Digit(c) || c == '_' || c == '$' || c >= 0x80
}

// skip advances over whitespace, comments and executable-comment markers.
// Comments are read byte by byte, as the server reads them: no trail byte
// of a multi-byte character is '*', '/', '-', '#' or a newline.
func (l *Lexer) skip() {
	q := l.q
	for l.pos < len(q) {
		c := q[l.pos]
		switch {
		case Space(c):
			l.pos++
		case c == '/' && l.pos+1 < len(q) && q[l.pos+1] == '*':
			p := l.pos + 2
			if p < len(q) && q[p] == '!' {
				l.setMark(l.pos)
				l.pos = skipVersion(q, p+1)
				l.exec, l.sawExec = true, true
				continue
			}
			if p+1 < len(q) && q[p] == 'M' && q[p+1] == '!' {
				l.setMark(l.pos)
				l.pos = skipVersion(q, p+2)
				l.exec, l.sawExec = true, true
				continue
			}
			start := l.pos
			l.pos = len(q)
			end := len(q)
			closed := false
			for i := p; i+1 < len(q); i++ {
				if q[i] == '*' && q[i+1] == '/' {
					l.pos, end, closed = i+2, i, true
					break
				}
			}
			if !closed {
				l.open = true
				l.setMark(start)
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

func (l *Lexer) skipLine() {
	for l.pos < len(l.q) && l.q[l.pos] != '\n' {
		l.pos++
	}
}

// skipVersion skips the 5- or 6-digit server version that may follow "/*!"
// or "/*M!". Other digit runs are code (MySQL reads them so too).
func skipVersion(q []byte, p int) int {
	n := 0
	for p+n < len(q) && Digit(q[p+n]) && n < 7 {
		n++
	}
	if n == 5 || n == 6 {
		return p + n
	}
	return p
}

// Next returns the next token; at the end it returns EOF forever.
func (l *Lexer) Next() Token {
	l.skip()
	t := l.scan()
	l.prev = t.Kind
	l.prevClose = t.Kind == Punct && t.End == t.Start+1 && l.q[t.Start] == ')'
	return t
}

func (l *Lexer) scan() Token {
	q := l.q
	start := l.pos
	if start >= len(q) {
		return Token{Kind: EOF, Start: start, End: start}
	}
	c := q[start]
	switch {
	case c == '"' && l.ansiQuotes:
		l.pos = l.skipQuoted(start+1, '"', false)
		return Token{QuotedIdent, start, l.pos}
	case c == '\'' || c == '"':
		l.pos = l.skipQuoted(start+1, c, !l.noBackslash)
		return Token{String, start, l.pos}
	case c == '`':
		l.pos = l.skipQuoted(start+1, '`', false)
		return Token{QuotedIdent, start, l.pos}
	case c == ';':
		l.pos++
		return Token{Semicolon, start, l.pos}
	case c == '?':
		l.pos++
		return Token{Param, start, l.pos}
	case c == '.':
		if start+2 < len(q) && q[start+1] == '.' && q[start+2] == '.' {
			l.pos += 3
			return Token{Ellipsis, start, l.pos}
		}
		// ".5" is a number unless it qualifies a name ("t.5" is column 5 of t).
		if start+1 < len(q) && Digit(q[start+1]) && l.prev != Word && l.prev != QuotedIdent && !l.prevClose {
			l.pos = scanFraction(q, start)
			return Token{Number, start, l.pos}
		}
		l.pos++
		return Token{Punct, start, l.pos}
	case c == '@':
		return l.scanVar(start)
	case IdentByte(c):
		return l.scanWordOrNumber(start)
	}
	l.pos = start + operatorLen(q[start:])
	return Token{Punct, start, l.pos}
}

// skipQuoted returns the position after the closing quote of a quoted
// string or identifier whose body starts at p. A doubled quote stands for
// itself; backslash escapes apply to strings only and escape one byte, as
// in the server. An unterminated quote runs to the end of the text.
func (l *Lexer) skipQuoted(p int, quote byte, escapes bool) int {
	q, start := l.q, p
	if l.cs != ASCIISafe {
		return l.skipQuotedMB(p, quote, escapes)
	}
	for p < len(q) {
		c := q[p]
		switch {
		case escapes && c == '\\':
			if quote == '"' && p+1 < len(q) && q[p+1] == '"' {
				l.escapedDQ = true
			}
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
	l.open = true
	l.setMark(start - 1)
	return len(q)
}

// skipQuotedMB is skipQuoted for a multi-byte Charset: a lead byte and its
// trail bytes are one character, whatever the trail bytes are.
func (l *Lexer) skipQuotedMB(p int, quote byte, escapes bool) int {
	q, start := l.q, p
	for p < len(q) {
		c := q[p]
		switch {
		case c >= 0x80:
			p += l.cs.charLen(q, p)
		case escapes && c == '\\':
			if quote == '"' && p+1 < len(q) && q[p+1] == '"' {
				l.escapedDQ = true
			}
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
	l.open = true
	l.setMark(start - 1)
	return len(q)
}

// identEnd returns the end of the run of identifier characters at p.
func (l *Lexer) identEnd(p int) int {
	q := l.q
	if l.cs == ASCIISafe {
		for p < len(q) && IdentByte(q[p]) {
			p++
		}
		return p
	}
	for p < len(q) && IdentByte(q[p]) {
		if q[p] >= 0x80 {
			p += l.cs.charLen(q, p)
		} else {
			p++
		}
	}
	return p
}

// scanFraction scans ".digits[exponent]" starting at the dot.
func scanFraction(q []byte, p int) int {
	p++
	for p < len(q) && Digit(q[p]) {
		p++
	}
	return scanExponent(q, p)
}

// scanExponent scans an optional "e[+-]digits" at p.
func scanExponent(q []byte, p int) int {
	if p < len(q) && (q[p] == 'e' || q[p] == 'E') {
		d := p + 1
		if d < len(q) && (q[d] == '+' || q[d] == '-') {
			d++
		}
		if d < len(q) && Digit(q[d]) {
			for d < len(q) && Digit(q[d]) {
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
func (l *Lexer) scanWordOrNumber(start int) Token {
	q := l.q
	end := l.identEnd(start)
	run := q[start:end]
	if Digit(run[0]) {
		if p, ok := numberRun(q, start, end); ok {
			l.pos = p
			return Token{Number, start, p}
		}
	}
	if end < len(q) && q[end] == '\'' {
		switch {
		case len(run) == 1 && (run[0]|0x20 == 'x' || run[0]|0x20 == 'b'):
			l.pos = l.skipQuoted(end+1, '\'', false)
			return Token{Number, start, l.pos}
		case len(run) == 1 && run[0]|0x20 == 'n', len(run) > 1 && run[0] == '_':
			l.pos = l.skipQuoted(end+1, '\'', !l.noBackslash)
			return Token{String, start, l.pos}
		}
	}
	l.pos = end
	return Token{Word, start, end}
}

// numberRun decides whether the identifier-byte run q[start:end], which
// starts with a digit, is a numeric literal, and returns where it ends
// (possibly past end, for "1.5" or "1e-3").
func numberRun(q []byte, start, end int) (int, bool) {
	run := q[start:end]
	if len(run) > 2 && run[0] == '0' && (run[1] == 'x' || run[1] == 'b') {
		ok := true
		for _, c := range run[2:] {
			if run[1] == 'x' && !hexDigit(c) || run[1] == 'b' && c != '0' && c != '1' {
				ok = false
				break
			}
		}
		if ok {
			return end, true
		}
	}
	p := start
	for p < end && Digit(q[p]) {
		p++
	}
	if p == end {
		// Digits only: maybe a fraction or a signed exponent follows.
		if p < len(q) && q[p] == '.' && !(p+1 < len(q) && q[p+1] == '.') {
			return scanFraction(q, p), true
		}
		return scanExponent(q, p), true
	}
	// Digits then "e": a number only if the exponent ends the run.
	if e := scanExponent(q, p); e > p && e >= end {
		return e, true
	}
	return 0, false
}

// scanVar scans @name, @@name, @'name', @"name", @`name`; a lone "@" is
// punctuation.
func (l *Lexer) scanVar(start int) Token {
	q := l.q
	p := start + 1
	if p < len(q) && q[p] == '@' {
		p++
	}
	if p < len(q) {
		switch c := q[p]; {
		case c == '\'' || c == '"':
			l.pos = l.skipQuoted(p+1, c, !l.noBackslash)
			return Token{Var, start, l.pos}
		case c == '`':
			l.pos = l.skipQuoted(p+1, '`', false)
			return Token{Var, start, l.pos}
		case IdentByte(c):
			l.pos = l.identEnd(p)
			return Token{Var, start, l.pos}
		}
	}
	l.pos = start + 1
	return Token{Punct, start, l.pos}
}

// operatorLen returns the length of the operator at the start of b
// (len(b) > 0): the longest of the multi-byte operators, else 1.
func operatorLen(b []byte) int {
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

// Host scans, from offset p, the unquoted host name of an account
// (user@host): the run of letters, digits, '_', '$', '.' and multi-byte
// characters, as the server's lexer reads a host after '@'. The lexer
// goes on after it.
func (l *Lexer) Host(p int) Token {
	q := l.q
	end := p
	for end < len(q) && (IdentByte(q[end]) || q[end] == '.') {
		if q[end] >= 0x80 && l.cs != ASCIISafe {
			end += l.cs.charLen(q, end)
		} else {
			end++
		}
	}
	l.pos = end
	t := Token{Word, p, end}
	l.prev, l.prevClose = Word, false
	return t
}
