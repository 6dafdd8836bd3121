package mysqlproto

// TokenKind is the kind of a Token.
type TokenKind uint8

// Token kinds, as the classifier's lexer sees SQL text.
const (
	TokenEOF         TokenKind = TokenKind(tkEOF)
	TokenWord        TokenKind = TokenKind(tkWord)        // unquoted identifier or keyword
	TokenQuotedIdent TokenKind = TokenKind(tkQuotedIdent) // `identifier`
	TokenString      TokenKind = TokenKind(tkString)      // '...', "...", N'...', _charset'...'
	TokenNumber      TokenKind = TokenKind(tkNumber)      // 12, 1.5e3, 0x1F, X'1F', ...
	TokenParam       TokenKind = TokenKind(tkParam)       // ? placeholder
	TokenVar         TokenKind = TokenKind(tkVar)         // @name, @@name
	TokenPunct       TokenKind = TokenKind(tkPunct)       // an operator or punctuation
	TokenSemicolon   TokenKind = TokenKind(tkSemicolon)   // statement separator
)

// Token is a span [Start, End) of the text given to a Tokenizer.
type Token struct {
	Kind       TokenKind
	Start, End int
}

// Tokenizer splits SQL text into tokens by the lexical rules of the
// classifier (see classify.go): comments are skipped, the content of
// executable comments (/*! */, /*M! */) is read as code. It is for a
// policy that must find spans of a statement to rewrite (a rare path: it
// copies the text). A Tokenizer is a value: copying it gives a lookahead cursor.
type Tokenizer struct{ l sqlLexer }

// NewTokenizer returns a Tokenizer over q; noBackslashEscapes is the
// session's NO_BACKSLASH_ESCAPES (Statement.NoBackslashEscapes).
func NewTokenizer(q string, noBackslashEscapes bool) Tokenizer {
	return Tokenizer{l: sqlLexer{q: []byte(q), noBackslash: noBackslashEscapes}}
}

// Next returns the next token; at the end it returns TokenEOF forever.
func (t *Tokenizer) Next() Token {
	tok := t.l.next()
	k := TokenKind(tok.kind)
	if tok.kind == tkEllipsis {
		k = TokenPunct
	}
	return Token{Kind: k, Start: tok.start, End: tok.end}
}
