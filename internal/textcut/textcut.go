// Package textcut cuts strings to a byte bound without splitting a UTF-8
// character. Every bound on text that crosses a process or a page (a
// runaway sample, a digest text in a console, the "near" of a syntax
// error) uses it, so that one rule decides where text may be cut.
package textcut

import (
	"strings"
	"unicode/utf8"
)

// Prefix returns the longest prefix of s of at most n bytes that does not
// end inside a UTF-8 sequence. Bytes that are not UTF-8 are kept as they
// are; a negative n is 0.
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Valid is Prefix of s with every byte sequence that is not UTF-8 replaced
// by U+FFFD first: what a protobuf string field may carry.
func Valid(s string, n int) string {
	return Prefix(strings.ToValidUTF8(s, "\uFFFD"), n)
}

// Marked is Prefix followed by "…" when something was cut, for text shown
// to a person.
func Marked(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Prefix(s, n) + "…"
}
