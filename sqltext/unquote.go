package sqltext

import "strings"

// Unquote returns the value of a quoted string ('...' or "...") or quoted
// identifier (`...`, or "..." under ANSIQuotes) as the server reads it in mode m: doubled quotes
// stand for one, and in strings (unless NO_BACKSLASH_ESCAPES) \n \t \r \b
// \0 \Z are control characters, \% and \_ keep their backslash (they are
// LIKE's), and a backslash before any other byte stands for that byte. A
// multi-byte character of m's Charset is copied whole, so its trail byte
// is never read as a quote or a backslash. ok is false when text does not
// start with a quote or does not end exactly at its closing quote.
func Unquote(text string, m Mode) (value string, ok bool) {
	if len(text) < 2 {
		return "", false
	}
	quote := text[0]
	if quote != '\'' && quote != '"' && quote != '`' {
		return "", false
	}
	escapes := quote != '`' && !(quote == '"' && m.ANSIQuotes) && !m.NoBackslashEscapes
	q := bytesOf(text)
	var b strings.Builder
	b.Grow(len(text) - 2)
	for p := 1; p < len(text); {
		c := text[p]
		switch {
		case c >= 0x80 && m.Charset != ASCIISafe:
			n := m.Charset.charLen(q, p)
			b.WriteString(text[p : p+n])
			p += n
		case escapes && c == '\\' && p+1 < len(text):
			switch e := text[p+1]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'b':
				b.WriteByte('\b')
			case '0':
				b.WriteByte(0)
			case 'Z':
				b.WriteByte(0x1a)
			case '%', '_':
				b.WriteByte('\\')
				b.WriteByte(e)
			default:
				b.WriteByte(e)
			}
			p += 2
		case c == quote:
			if p+1 < len(text) && text[p+1] == quote {
				b.WriteByte(quote)
				p += 2
				continue
			}
			if p+1 != len(text) {
				return "", false
			}
			return b.String(), true
		default:
			b.WriteByte(c)
			p++
		}
	}
	return "", false
}
