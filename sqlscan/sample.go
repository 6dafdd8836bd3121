package sqlscan

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/japanese"
	"golang.org/x/text/encoding/simplifiedchinese"
	"golang.org/x/text/encoding/traditionalchinese"

	"github.com/rgproxy/rgproxy/sqltext"
)

// A statement's text is shown to people who did not send it: the runaway
// history's SAMPLE_SQL, runaway_watches' WATCH_TEXT. An administrator (and
// the statement's own account) sees the text as the client sent it,
// decoded from its character set (Decode); another account sees it masked
// (Sample, Mask): its digest, literals replaced by ?, read as the server
// read it. No session knows whether its sql_mode has ANSI_QUOTES (no status
// flag says so), so a masked text is shown only when its "..." read either
// way hides every literal.

// sampleInput bounds the text Sample reads, in bytes: what it returns is
// cut to 1 KiB by the history, and a 1 MiB statement costs no more than
// this.
const sampleInput = 4096

// Sample returns text, sent in a session whose mode is m, as the runaway
// history keeps it: shown is the text decoded from m's character set to
// UTF-8 (for administrators and the statement's own account); masked is
// its digest as the server read it, in m's character set and
// NO_BACKSLASH_ESCAPES, and safe whether or not ANSI_QUOTES was on (m's
// ANSIQuotes is ignored: no session knows it); when the two readings of
// "..." disagree on a literal, masked is the first keyword and " ...".
// Only the first 4 KiB of text are read.
func Sample(text string, m Mode) (shown, masked string) {
	if len(text) > sampleInput {
		text = text[:sampleInput]
	}
	shown = Decode(text, m.Charset)
	// The decoded text reads in UTF-8 as text read in m.Charset: every
	// character of more than one byte is one of UTF-8's, no byte of which
	// is ASCII.
	um := Mode{NoBackslashEscapes: m.NoBackslashEscapes}
	ansi := um
	ansi.ANSIQuotes = true
	return shown, maskIn(shown, um, ansi)
}

// maskModes are the ways a text may be read when its mode is unknown.
var maskModes = func() []Mode {
	var ms []Mode
	for _, cs := range []Charset{sqltext.ASCIISafe, sqltext.GBK, sqltext.Big5, sqltext.SJIS, sqltext.GB18030} {
		for _, nbe := range []bool{false, true} {
			for _, ansi := range []bool{false, true} {
				ms = append(ms, Mode{Charset: cs, NoBackslashEscapes: nbe, ANSIQuotes: ansi})
			}
		}
	}
	return ms
}()

// Mask is text's digest (its literals replaced by ?) for a text whose
// mode is not known (a watch's text, a history row of an older proxy):
// the digest in the default mode when every byte it shows is code in
// every mode a session may have read it in (any character set family,
// NO_BACKSLASH_ESCAPES and ANSI_QUOTES on or off), else only the first
// keyword and " ...".
func Mask(text string) string {
	return maskIn(text, maskModes[0], maskModes[1:]...)
}

// maskIn is the digest of text in mode m when every byte of text that the
// digest shows (its code tokens: words, names, variables, operators) is
// code in each of the readings others too, so that no literal of any of
// them shows; else the first keyword and " ...".
func maskIn(text string, m Mode, others ...Mode) string {
	shown := codeSpans(text, m)
	for _, o := range others {
		if !covered(shown, codeSpans(text, o)) {
			if w := FirstWord(text, Mode{}); w != "" {
				return w + " ..."
			}
			return "..."
		}
	}
	return Digest([]byte(text), m)
}

// span is [start, end) of a text.
type span struct{ start, end int }

// codeSpans returns the spans of the tokens that a digest of text in m
// shows as they are written (every token but literals; comments and
// spaces are not tokens), in order; adjacent tokens are merged.
func codeSpans(text string, m Mode) []span {
	l := sqltext.NewString(text, m)
	var out []span
	for t := l.Next(); t.Kind != tkEOF; t = l.Next() {
		switch t.Kind {
		case tkString, tkNumber, tkParam:
			continue
		}
		if n := len(out); n > 0 && out[n-1].end == t.Start {
			out[n-1].end = t.End
			continue
		}
		out = append(out, span{t.Start, t.End})
	}
	return out
}

// covered reports whether every byte of the spans a is inside the spans
// b (both in order, neither overlapping itself).
func covered(a, b []span) bool {
	j := 0
	for _, s := range a {
		for j < len(b) && b[j].end <= s.start {
			j++
		}
		if j == len(b) || b[j].start > s.start || b[j].end < s.end {
			return false // b's spans are merged: one must hold all of s
		}
	}
	return true
}

// Decode returns text, read in the character set family cs, as UTF-8, for
// a person to read. It keeps how the text reads: every ASCII byte stays
// where it is, and each character of more than one byte (as the lexer
// reads cs, so a trail byte '\' stays in its character) becomes one
// non-ASCII UTF-8 character, U+FFFD when cs has none for it; so Decode's
// result read in UTF-8 has the tokens text has in cs. An ASCIISafe text
// is taken as UTF-8, any other byte becoming U+FFFD (a latin1 session's
// é too: the family does not name the character set). sjis and cp932
// decode as cp932 (Windows-31J).
func Decode(text string, cs Charset) string {
	var enc encoding.Encoding
	switch cs {
	case sqltext.GBK:
		enc = simplifiedchinese.GBK
	case sqltext.GB18030:
		enc = simplifiedchinese.GB18030
	case sqltext.Big5:
		enc = traditionalchinese.Big5
	case sqltext.SJIS:
		enc = japanese.ShiftJIS
	default:
		return strings.ToValidUTF8(text, "\uFFFD")
	}
	dec := enc.NewDecoder()
	var b strings.Builder
	b.Grow(len(text) + len(text)/2)
	var buf [16]byte
	for p := 0; p < len(text); {
		if c := text[p]; c < utf8.RuneSelf {
			b.WriteByte(c)
			p++
			continue
		}
		n := sqltext.CharLen(text, p, cs)
		dec.Reset()
		nDst, _, err := dec.Transform(buf[:], []byte(text[p:p+n]), true)
		r, size := utf8.DecodeRune(buf[:nDst])
		if err != nil || size != nDst || r < utf8.RuneSelf || r == utf8.RuneError {
			r = utf8.RuneError
		}
		b.WriteRune(r)
		p += n
	}
	return b.String()
}

// ShownDigest is a digest the scan wrote in character set cs as
// statements_summary shows it, to every account of its group: decoded to
// UTF-8; when the statement's text had a '"' escaped inside "..."
// (Scan.EscapedDoubleQuote), under ANSI_QUOTES its literals might be
// elsewhere, and only the first keyword and " ..." are shown.
func ShownDigest(digest []byte, cs Charset, escapedDQ bool) string {
	d := string(digest)
	if escapedDQ {
		if w := FirstWord(d, Mode{}); w != "" {
			return w + " ..."
		}
		return "..."
	}
	return Decode(d, cs)
}
