package textcut

import (
	"testing"
	"unicode/utf8"
)

func TestCuts(t *testing.T) {
	for _, tt := range []struct {
		s                     string
		n                     int
		prefix, valid, marked string
	}{
		{"abc", 5, "abc", "abc", "abc"},
		{"abc", 3, "abc", "abc", "abc"},
		{"abc", 2, "ab", "ab", "ab…"},
		{"abc", -1, "", "", "…"},
		{"a表b", 2, "a", "a", "a…"}, // 表 is 3 bytes: not split
		{"a表b", 4, "a表", "a表", "a表…"},
		{"a\xffb", 2, "a\xff", "a", "a\xff…"}, // kept by Prefix; Valid makes it U+FFFD (3 bytes), cut
		{"\xe8\xa1", 5, "\xe8\xa1", "\uFFFD", "\xe8\xa1"},
	} {
		if got := Prefix(tt.s, tt.n); got != tt.prefix {
			t.Errorf("Prefix(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.prefix)
		}
		if got := Valid(tt.s, tt.n); got != tt.valid || !utf8.ValidString(got) {
			t.Errorf("Valid(%q, %d) = %q, want %q (valid UTF-8)", tt.s, tt.n, got, tt.valid)
		}
		if got := Marked(tt.s, tt.n); got != tt.marked {
			t.Errorf("Marked(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.marked)
		}
	}
}

func FuzzPrefix(f *testing.F) {
	f.Add("a表b\xff", 3)
	f.Fuzz(func(t *testing.T, s string, n int) {
		p := Prefix(s, n)
		if len(p) > max(n, 0) && len(p) != len(s) {
			t.Fatalf("Prefix(%q, %d) = %q: longer than the bound", s, n, p)
		}
		if len(s) > n && utf8.ValidString(s) && !utf8.ValidString(p) {
			t.Fatalf("Prefix(%q, %d) = %q split a character", s, n, p)
		}
		if v := Valid(s, n); !utf8.ValidString(v) {
			t.Fatalf("Valid(%q, %d) = %q is not UTF-8", s, n, v)
		}
	})
}
