package sqlscan

import (
	"net/url"
	"strings"
)

// SQLCommenter tags (https://google.github.io/sqlcommenter/spec/): web
// frameworks append to each statement a comment such as
//
//	/*controller='index',framework='django%3A4.2',route='%2Freport'*/
//
// key='value' pairs joined by commas, keys and values URL-encoded, then
// any ' in them escaped as \'. A tag binding routes the statements that
// carry its tag to its group.

// ParseTags reads comment, the body of a /* */ comment, as SQLCommenter
// tags and calls yield with each pair's key and value, decoded, in the
// comment's order, until yield returns false. A comment that is not
// entirely in that format holds no tags: ParseTags then returns false
// without calling yield. Whitespace is allowed around the commas and at
// both ends (the spec's own exhibit breaks lines there); a '+' decodes to
// a space, as the Java and Go sqlcommenters encode spaces so and every
// encoder encodes a literal '+' as %2B.
//
// It allocates only to decode a key or value that holds an escape.
func ParseTags(comment string, yield func(key, value string) bool) bool {
	// First check the whole comment, so that a free-text comment that
	// happens to start like a tag yields nothing.
	n := 0
	for i := skipTagSpace(comment, 0); i < len(comment); n++ {
		_, _, next, ok := nextTag(comment, i)
		if !ok {
			return false
		}
		i = next
	}
	if n == 0 {
		return false
	}
	for i := skipTagSpace(comment, 0); i < len(comment); {
		k, v, next, _ := nextTag(comment, i)
		if !yield(decodeTag(k), decodeTag(v)) {
			break
		}
		i = next
	}
	return true
}

// nextTag reads the pair key='value' at s[i:] and the separator after it
// (spaces, a comma, spaces; or spaces to the end). It returns the raw
// (still encoded) key and value and the offset of the next pair.
func nextTag(s string, i int) (key, value string, next int, ok bool) {
	start := i
	for i < len(s) {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '\'' {
			i += 2
			continue
		}
		if c == '=' || c == ',' || c == '\'' || isTagSpace(c) {
			break
		}
		i++
	}
	if i == start || i+1 >= len(s) || s[i] != '=' || s[i+1] != '\'' {
		return "", "", 0, false
	}
	key = s[start:i]
	i += 2
	vstart := i
	for {
		if i >= len(s) {
			return "", "", 0, false // no closing quote
		}
		if s[i] == '\\' && i+1 < len(s) && s[i+1] == '\'' {
			i += 2
			continue
		}
		if s[i] == '\'' {
			break
		}
		i++
	}
	value = s[vstart:i]
	if !validEscapes(key) || !validEscapes(value) {
		return "", "", 0, false
	}
	i = skipTagSpace(s, i+1)
	if i < len(s) {
		if s[i] != ',' {
			return "", "", 0, false
		}
		i = skipTagSpace(s, i+1)
		if i >= len(s) {
			return "", "", 0, false // a trailing comma
		}
	}
	return key, value, i, true
}

func isTagSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipTagSpace(s string, i int) int {
	for i < len(s) && isTagSpace(s[i]) {
		i++
	}
	return i
}

// validEscapes reports whether every '%' in s starts a %XX escape, which
// is all url.QueryUnescape checks.
func validEscapes(s string) bool {
	for i := strings.IndexByte(s, '%'); i >= 0; {
		if i+2 >= len(s) {
			return false
		}
		if !isHex(s[i+1]) || !isHex(s[i+2]) {
			return false
		}
		j := strings.IndexByte(s[i+3:], '%')
		if j < 0 {
			break
		}
		i += 3 + j
	}
	return true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// decodeTag undoes the meta escaping (\' for ') and the URL encoding of a
// raw key or value checked by nextTag.
func decodeTag(raw string) string {
	if strings.IndexByte(raw, '%') < 0 && strings.IndexByte(raw, '+') < 0 && strings.IndexByte(raw, '\\') < 0 {
		return raw
	}
	s := strings.ReplaceAll(raw, `\'`, `'`)
	if d, err := url.QueryUnescape(s); err == nil {
		return d
	}
	return s // not reached: nextTag checked the escapes
}
