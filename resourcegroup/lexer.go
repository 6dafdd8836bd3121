package resourcegroup

import (
	"strings"

	"github.com/rgproxy/rgproxy/sqltext"
)

// tokKind is the lexical class of a token, as the admin grammar sees
// sqltext's tokens.
type tokKind uint8

const (
	tkEOF    tokKind = iota
	tkWord           // bare identifier or keyword
	tkQIdent         // `backquoted` identifier, unescaped
	tkString         // 'single' or "double" quoted string, unescaped
	tkNumber         // unsigned decimal integer
	tkPunct          // an operator or punctuation: = ( ) , ; . * @ - ...
	tkVar            // @name, @'name' (user@host lexes so), @@name
	tkOther          // any other literal (1.5, 0x1F, N'x', ?): no rule takes it
)

// token is one lexeme; pos is its byte offset in the statement, for 1064.
type token struct {
	kind tokKind
	text string
	pos  int
}

// lexer reads an admin statement with sqltext's lexer, in the session's
// mode (character set, NO_BACKSLASH_ESCAPES), so that rgproxy reads the
// statement as the server would. Comments are skipped; executable
// comments (/*! */, /*M! */) are refused, as IsAdmin does not take them
// either; an unterminated comment or quote is a syntax error.
type lexer struct {
	src  string
	mode sqltext.Mode
	l    sqltext.Lexer
}

func newLexer(src string, m sqltext.Mode) lexer {
	return lexer{src: src, mode: m, l: sqltext.NewString(src, m)}
}

// next returns the next token.
func (lx *lexer) next() (token, error) {
	from := lx.l.Pos()
	t := lx.l.Next()
	if lx.l.SawExec() {
		return token{}, NewSyntaxWhy(lx.src, lx.markAt(from), "rgproxy does not run executable comments (/*! */, /*M! */) in its own statements")
	}
	text := lx.src[t.Start:t.End]
	switch t.Kind {
	case sqltext.EOF:
		if lx.l.Unterminated() {
			return token{}, NewSyntaxWhy(lx.src, lx.markAt(from), "a quote or comment is not closed")
		}
		return token{kind: tkEOF, pos: t.Start}, nil
	case sqltext.Word:
		return token{kind: tkWord, text: text, pos: t.Start}, nil
	case sqltext.Number:
		if strings.Trim(text, "0123456789") == "" {
			return token{kind: tkNumber, text: text, pos: t.Start}, nil
		}
	case sqltext.QuotedIdent, sqltext.String:
		v, ok := sqltext.Unquote(text, lx.mode)
		if !ok {
			if text[0] != '\'' && text[0] != '"' && text[0] != '`' {
				break // N'...', _charset'...'
			}
			return token{}, NewSyntax(lx.src, t.Start)
		}
		if t.Kind == sqltext.QuotedIdent {
			return token{kind: tkQIdent, text: v, pos: t.Start}, nil
		}
		return token{kind: tkString, text: v, pos: t.Start}, nil
	case sqltext.Punct, sqltext.Semicolon:
		return token{kind: tkPunct, text: text, pos: t.Start}, nil
	case sqltext.Var:
		if lx.l.Unterminated() {
			return token{}, NewSyntax(lx.src, t.Start)
		}
		return token{kind: tkVar, text: text, pos: t.Start}, nil
	}
	return token{kind: tkOther, text: text, pos: t.Start}, nil
}

// host reads the unquoted host name of user@host from offset p, as the
// server's lexer reads a host after '@' (192.168.1.1 is one name).
func (lx *lexer) host(p int) token {
	t := lx.l.Host(p)
	return token{kind: tkWord, text: lx.src[t.Start:t.End], pos: t.Start}
}

// markAt returns where the executable comment or the unterminated quote
// or comment the lexer met opened, for the error's position; from when it
// does not say.
func (lx *lexer) markAt(from int) int {
	if p, ok := lx.l.Mark(); ok {
		return p
	}
	return from
}
