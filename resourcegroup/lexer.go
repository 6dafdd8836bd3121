package resourcegroup

import "strings"

// tokKind is the lexical class of a token.
type tokKind uint8

const (
	tkEOF    tokKind = iota
	tkWord           // bare identifier or keyword
	tkQIdent         // `backquoted` identifier, unescaped
	tkString         // 'single' or "double" quoted string, unescaped
	tkNumber         // unsigned decimal integer
	tkPunct          // one of = ( ) , ; . * @ -
)

// token is one lexeme; pos is its byte offset in the statement, for 1064.
type token struct {
	kind tokKind
	text string
	pos  int
}

// lexer splits an admin statement into tokens. Comments are skipped;
// executable comments (/*! */, /*M! */) are refused, as IsAdmin does not
// look inside them either.
type lexer struct {
	src string
	pos int
}

// skipSpace skips whitespace and comments; it reports the offset of an
// unterminated or executable comment as a failure.
func skipSpace(s string, i int) (int, bool) {
	for i < len(s) {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '#':
			i = lineEnd(s, i)
		case c == '-' && i+2 < len(s) && s[i+1] == '-' && isCommentSpace(s[i+2]):
			i = lineEnd(s, i)
		case c == '-' && i+2 == len(s) && s[i+1] == '-':
			// "--" at the very end is an empty comment.
			i = len(s)
		case c == '/' && i+1 < len(s) && s[i+1] == '*':
			if isCodeComment(s, i) {
				return i, false
			}
			end := strings.Index(s[i+2:], "*/")
			if end < 0 {
				return i, false
			}
			i += 2 + end + 2
		default:
			return i, true
		}
	}
	return i, true
}

// isCommentSpace reports whether c may follow "--" to start a comment
// (MySQL wants a space or control character there).
func isCommentSpace(c byte) bool { return c <= ' ' }

// lineEnd returns the offset just past the line that holds offset i.
func lineEnd(s string, i int) int {
	if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(s)
}

// isCodeComment reports whether the comment at i is /*! or /*M!.
func isCodeComment(s string, i int) bool {
	rest := s[i+2:]
	return strings.HasPrefix(rest, "!") || strings.HasPrefix(rest, "M!")
}

// isIdentByte reports whether c may appear in a bare identifier; bytes of
// multi-byte UTF-8 characters are accepted, as MySQL does.
func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '$' || c >= 0x80
}

// next returns the next token.
func (l *lexer) next() (token, error) {
	i, ok := skipSpace(l.src, l.pos)
	if !ok {
		return token{}, NewSyntax(l.src, i)
	}
	l.pos = i
	if i >= len(l.src) {
		return token{kind: tkEOF, pos: i}, nil
	}
	c := l.src[i]
	switch {
	case isIdentByte(c):
		j := i
		digits := true
		for j < len(l.src) && isIdentByte(l.src[j]) {
			if l.src[j] < '0' || l.src[j] > '9' {
				digits = false
			}
			j++
		}
		l.pos = j
		if digits {
			return token{kind: tkNumber, text: l.src[i:j], pos: i}, nil
		}
		return token{kind: tkWord, text: l.src[i:j], pos: i}, nil
	case c == '`':
		text, end, ok := unquote(l.src, i, '`', false)
		if !ok {
			return token{}, NewSyntax(l.src, i)
		}
		l.pos = end
		return token{kind: tkQIdent, text: text, pos: i}, nil
	case c == '\'' || c == '"':
		text, end, ok := unquote(l.src, i, c, true)
		if !ok {
			return token{}, NewSyntax(l.src, i)
		}
		l.pos = end
		return token{kind: tkString, text: text, pos: i}, nil
	case strings.IndexByte("=(),;.*@-", c) >= 0:
		l.pos = i + 1
		return token{kind: tkPunct, text: l.src[i : i+1], pos: i}, nil
	}
	return token{}, NewSyntax(l.src, i)
}

// unquote reads the quoted text starting at s[i] == q: a doubled quote is
// one quote and, when backslash is true, \x escapes as MySQL's strings do.
// It returns the text, the offset after the closing quote, and false when
// the quote is not closed.
func unquote(s string, i int, q byte, backslash bool) (string, int, bool) {
	var b strings.Builder
	j := i + 1
	for j < len(s) {
		c := s[j]
		switch {
		case c == q:
			if j+1 < len(s) && s[j+1] == q {
				b.WriteByte(q)
				j += 2
				continue
			}
			return b.String(), j + 1, true
		case c == '\\' && backslash && j+1 < len(s):
			b.WriteByte(unescape(s[j+1]))
			j += 2
		default:
			b.WriteByte(c)
			j++
		}
	}
	return "", j, false
}

// unescape maps the character after a backslash in a MySQL string.
func unescape(c byte) byte {
	switch c {
	case 'n':
		return '\n'
	case 't':
		return '\t'
	case 'r':
		return '\r'
	case '0':
		return 0
	case 'b':
		return '\b'
	case 'Z':
		return 26
	}
	return c
}
