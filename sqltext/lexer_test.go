package sqltext

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/threadcpu"
)

func kinds(q string, m Mode) []Kind {
	l := NewString(q, m)
	var got []Kind
	for t := l.Next(); t.Kind != EOF; t = l.Next() {
		got = append(got, t.Kind)
	}
	return got
}

func texts(q string, m Mode) []string {
	l := NewString(q, m)
	var got []string
	for t := l.Next(); t.Kind != EOF; t = l.Next() {
		got = append(got, string(l.Text(t)))
	}
	return got
}

func TestTokens(t *testing.T) {
	tests := []struct {
		q    string
		want []Kind
	}{
		{"SELECT 1", []Kind{Word, Number}},
		{"a.5", []Kind{Word, Punct, Number}},
		{"(.5)", []Kind{Punct, Number, Punct}},
		{"1.5e-3 1e5 0x1F 0b01 X'1f' b'01' 1abc 0xZZ", []Kind{Number, Number, Number, Number, Number, Number, Word, Word}},
		{"N'x' _utf8mb4'y' 'z' \"w\"", []Kind{String, String, String, String}},
		{"@a @@b @'c' @`d` @ ?", []Kind{Var, Var, Var, Var, Punct, Param}},
		{"a<=>b->>c", []Kind{Word, Punct, Word, Punct, Word}},
		{"1--1", []Kind{Number, Punct, Punct, Number}},
		{"1-- 1", []Kind{Number}},
		{"1 --", []Kind{Number}},
		{"/*! a */ b", []Kind{Word, Word}},
		{"/*!12345 a */", []Kind{Word}},
		{"/*!1 a */", []Kind{Number, Word}},
		{"/* a */ */", []Kind{Punct, Punct}},
		{"(...)", []Kind{Punct, Ellipsis, Punct}},
		{"a;b", []Kind{Word, Semicolon, Word}},
		{"'unterminated", []Kind{String}},
		{"/* unterminated", nil},
	}
	for _, tt := range tests {
		for _, cs := range []Charset{ASCIISafe, GBK} {
			if got := kinds(tt.q, Mode{Charset: cs}); !equal(got, tt.want) {
				t.Errorf("tokens(%q, %v) = %v, want %v", tt.q, cs, got, tt.want)
			}
		}
	}
}

// Where a multi-byte character set's trail byte is '\' or '`', the
// character ends a string or identifier where a byte-wise reading does not.
func TestCharsetTrailBytes(t *testing.T) {
	tests := []struct {
		q    string
		m    Mode
		want []string
	}{
		// 0x81 0x5C is one gbk character: the quote after it closes.
		{"SELECT '\x81\\' , 2 -- '", Mode{Charset: GBK}, []string{"SELECT", "'\x81\\'", ",", "2"}},
		{"SELECT '\x81\\' , 2 -- '", Mode{}, []string{"SELECT", "'\x81\\' , 2 -- '"}},
		// Under NO_BACKSLASH_ESCAPES both readings close there.
		{"SELECT '\x81\\' , 2 -- '", Mode{NoBackslashEscapes: true}, []string{"SELECT", "'\x81\\'", ",", "2"}},
		// 0x81 0x60 is one gbk character: the backquote does not close.
		{"SELECT `\x81` , 2 -- `", Mode{Charset: GBK}, []string{"SELECT", "`\x81` , 2 -- `"}},
		{"SELECT `\x81` , 2 -- `", Mode{}, []string{"SELECT", "`\x81`", ",", "2"}},
		// Unquoted: the trail '`' or '@' is part of the word.
		{"SELECT a\x81`b", Mode{Charset: GBK}, []string{"SELECT", "a\x81`b"}},
		{"SELECT a\x81`b`", Mode{}, []string{"SELECT", "a\x81", "`b`"}},
		{"SELECT @a\x81@b", Mode{Charset: SJIS}, []string{"SELECT", "@a\x81@b"}},
		// big5 leads start at 0xA1: 0x81 is alone, its '\' escapes.
		{"SELECT '\x81\\' , 2 -- '", Mode{Charset: Big5}, []string{"SELECT", "'\x81\\' , 2 -- '"}},
		{"SELECT '\xA1\\' , 2 -- '", Mode{Charset: Big5}, []string{"SELECT", "'\xA1\\'", ",", "2"}},
		// sjis: 0xA0..0xDF are one-byte katakana.
		{"SELECT '\xB0\\' , 2 -- '", Mode{Charset: SJIS}, []string{"SELECT", "'\xB0\\' , 2 -- '"}},
		{"SELECT '\xE0\\' , 2 -- '", Mode{Charset: SJIS}, []string{"SELECT", "'\xE0\\'", ",", "2"}},
		// An escaped lead byte is escaped alone: the '\' after it escapes the quote.
		{"SELECT '\\\x81\\' , 2 -- '", Mode{Charset: GBK}, []string{"SELECT", "'\\\x81\\' , 2 -- '"}},
		// gb18030's four-byte characters; a trail '\' of a two-byte one.
		{"SELECT '\x81\x30\x81\x30\\'' x", Mode{Charset: GB18030}, []string{"SELECT", "'\x81\x30\x81\x30\\''", "x"}},
		{"SELECT '\x81\\' x", Mode{Charset: GB18030}, []string{"SELECT", "'\x81\\'", "x"}},
		// A lead byte at the very end, or before a byte that is no trail.
		{"SELECT '\x81", Mode{Charset: GBK}, []string{"SELECT", "'\x81"}},
		{"SELECT '\x81' x", Mode{Charset: GBK}, []string{"SELECT", "'\x81'", "x"}},
		// Comments are byte-wise in every character set.
		{"SELECT /* \x81*/ 1", Mode{Charset: GBK}, []string{"SELECT", "1"}},
		{"SELECT 1 -- \x81\n2", Mode{Charset: GBK}, []string{"SELECT", "1", "2"}},
		// N'' and _charset'' strings, variables' quoted names.
		{"SELECT N'\x81\\', _gbk'\x81\\', @'\x81\\'", Mode{Charset: GBK}, []string{"SELECT", "N'\x81\\'", ",", "_gbk'\x81\\'", ",", "@'\x81\\'"}},
	}
	for _, tt := range tests {
		if got := texts(tt.q, tt.m); !equal(got, tt.want) {
			t.Errorf("tokens(%q, %+v) = %q, want %q", tt.q, tt.m, got, tt.want)
		}
	}
}

func TestUnquote(t *testing.T) {
	tests := []struct {
		text string
		m    Mode
		want string
		ok   bool
	}{
		{`'plain'`, Mode{}, "plain", true},
		{`'it''s'`, Mode{}, "it's", true},
		{`"say ""hi"""`, Mode{}, `say "hi"`, true},
		{`'a\nb\tc\rd\0e\bf\Zg\\h\'i\%j\_k\x'`, Mode{}, "a\nb\tc\rd\x00e\bf\x1ag\\h'i\\%j\\_kx", true},
		{`'a\nb'`, Mode{NoBackslashEscapes: true}, `a\nb`, true},
		{`'a\'`, Mode{NoBackslashEscapes: true}, `a\`, true},
		{"`a\\``b`", Mode{}, "a\\`b", true},
		{"'\x81\\'", Mode{Charset: GBK}, "\x81\\", true},
		{"'\x81\\''", Mode{}, "\x81'", true},
		{"`\x81``", Mode{Charset: GBK}, "\x81`", true},
		{"`\x81``", Mode{}, "", false},
		{`'é'`, Mode{}, "é", true},
		{`'open`, Mode{}, "", false},
		{`'a' b`, Mode{}, "", false},
		{`x`, Mode{}, "", false},
		{`'a\'`, Mode{}, "", false},
	}
	for _, tt := range tests {
		got, ok := Unquote(tt.text, tt.m)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Unquote(%q, %+v) = %q, %v; want %q, %v", tt.text, tt.m, got, ok, tt.want, tt.ok)
		}
	}
}

func TestHost(t *testing.T) {
	for _, tt := range []struct{ q, want string }{
		{"192.168.1.1 RESOURCE", "192.168.1.1"},
		{"db-1", "db"},
		{"h.example.com;", "h.example.com"},
		{"\x81`x y", "\x81`x"},
	} {
		l := NewString(tt.q, Mode{Charset: GBK})
		if got := string(l.Text(l.Host(0))); got != tt.want {
			t.Errorf("Host(%q) = %q, want %q", tt.q, got, tt.want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, tt := range []struct {
		q          string
		exec, open bool
	}{
		{"SELECT 1", false, false},
		{"/*!40101 SET x=1 */", true, false},
		{"/*M!100100 SET x=1 */", true, false},
		{"SELECT 1 /* open", false, true},
		{"SELECT 'open", false, true},
		{"SELECT `open", false, true},
		{"SELECT 'a' /* c */", false, false},
	} {
		l := NewString(tt.q, Mode{})
		for l.Next().Kind != EOF {
		}
		if l.SawExec() != tt.exec || l.Unterminated() != tt.open {
			t.Errorf("%q: SawExec %v Unterminated %v, want %v %v", tt.q, l.SawExec(), l.Unterminated(), tt.exec, tt.open)
		}
	}
}

func TestCharsetByName(t *testing.T) {
	for name, want := range map[string]Charset{"gbk": GBK, "GBK": GBK, "big5": Big5, "sjis": SJIS, "cp932": SJIS,
		"gb18030": GB18030, "utf8mb4": ASCIISafe, "latin1": ASCIISafe, "ujis": ASCIISafe, "euckr": ASCIISafe, "": ASCIISafe} {
		if got := CharsetByName(name); got != want {
			t.Errorf("CharsetByName(%q) = %v, want %v", name, got, want)
		}
	}
	for id, want := range map[uint16]struct {
		cs    Charset
		known bool
	}{28: {GBK, true}, 87: {GBK, true}, 1: {Big5, true}, 13: {SJIS, true}, 95: {SJIS, true}, 248: {GB18030, true},
		33: {ASCIISafe, true}, 45: {ASCIISafe, true}, 255: {ASCIISafe, true}, 8: {ASCIISafe, true},
		0: {ASCIISafe, false}, 17: {ASCIISafe, false}, 254: {ASCIISafe, false}, 2048: {ASCIISafe, false}, 1111: {GBK, true}} {
		if cs, known := CharsetByCollationID(id); cs != want.cs || known != want.known {
			t.Errorf("CharsetByCollationID(%d) = %v, %v; want %v, %v", id, cs, known, want.cs, want.known)
		}
	}
}

// TestLinearTime compares, in one run, the cost of n and 8n bytes of
// hostile input: a linear lexer grows about 8x, a quadratic one about 64x.
// The cost is the thread's CPU time: with both cores busy, the wall time
// of the longer run also counts its waits for a CPU (it read 34-81x).
func TestLinearTime(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	patterns := []string{"'\x81\\", "`\x81`", "a\x81@", "/*!12345 '", "/* ", "@\x81\\", "\x81", "'\\"}
	cost := func(in []byte, m Mode) time.Duration {
		best := time.Duration(1<<63 - 1)
		for range 3 {
			start, _ := threadcpu.Now()
			l := New(in, m)
			for l.Next().Kind != EOF {
			}
			end, _ := threadcpu.Now()
			best = min(best, end-start)
		}
		return max(best, time.Microsecond)
	}
	const n = 20000
	for _, p := range patterns {
		for _, cs := range []Charset{ASCIISafe, GBK, GB18030} {
			small, large := []byte(strings.Repeat(p, n)), []byte(strings.Repeat(p, 8*n))
			if ratio := float64(cost(large, Mode{Charset: cs})) / float64(cost(small, Mode{Charset: cs})); ratio > 30 {
				t.Errorf("%q x %d in %v: 8x the input cost %.0fx the time", p, n, cs, ratio)
			}
		}
	}
}

func TestNoAllocs(t *testing.T) {
	q := "SELECT a, `b\x81`, 'c\x81\\' FROM t WHERE x = @v /* c */"
	for _, cs := range []Charset{ASCIISafe, GBK} {
		if n := testing.AllocsPerRun(100, func() {
			l := NewString(q, Mode{Charset: cs})
			for l.Next().Kind != EOF {
			}
		}); n != 0 {
			t.Errorf("lexing in %v allocates %v times", cs, n)
		}
	}
}

// FuzzLexer: the lexer never panics in any mode; tokens are non-empty,
// in order, inside the text; in a text without comment marks everything
// between tokens is whitespace; a multi-byte reading never splits a
// character its Charset joins.
func FuzzLexer(f *testing.F) {
	for _, s := range []string{"SELECT 1", "SELECT '\x81\\' , 2 -- '", "SELECT `\x81`` x", "a\x81@b", "/*!40101 'x' */",
		"@'a' @@b.c X'1f' N'x' _gbk'\x81\\'", "'\x81\x30\x81\x30\\''", "1.5e-3 .5 a.5 (...) <=>", "# x\n-- y\n/* z */"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		for _, m := range []Mode{{}, {NoBackslashEscapes: true}, {Charset: GBK}, {Charset: Big5}, {Charset: SJIS}, {Charset: GB18030, NoBackslashEscapes: true}} {
			checkTokens(t, q, m)
		}
	})
}

func checkTokens(t *testing.T, q []byte, m Mode) {
	t.Helper()
	l := New(q, m)
	plain := !bytes.ContainsAny(q, "/#-")
	last := 0
	for n := 0; ; n++ {
		if n > len(q)+1 {
			t.Fatalf("%q %+v: more tokens than bytes", q, m)
		}
		tok := l.Next()
		if tok.Kind == EOF {
			if tok.Start != len(q) || tok.End != len(q) {
				t.Fatalf("%q %+v: EOF at %d..%d", q, m, tok.Start, tok.End)
			}
			if plain && len(bytes.TrimLeft(q[last:], " \t\n\r\f\v")) != 0 {
				t.Fatalf("%q %+v: bytes %q after the last token", q, m, q[last:])
			}
			return
		}
		if tok.Start < last || tok.End <= tok.Start || tok.End > len(q) {
			t.Fatalf("%q %+v: token %v out of order (last end %d)", q, m, tok, last)
		}
		if plain && len(bytes.TrimLeft(q[last:tok.Start], " \t\n\r\f\v")) != 0 {
			t.Fatalf("%q %+v: bytes %q skipped before token %v", q, m, q[last:tok.Start], tok)
		}
		if m.Charset != ASCIISafe {
			// A token never ends inside a character: the bytes before its end
			// read as whole characters from its start.
			for p := tok.Start; p < tok.End; {
				if q[p] >= 0x80 {
					p += m.Charset.charLen(q, p)
				} else {
					p++
				}
				if p > tok.End && tok.Kind != Number {
					t.Fatalf("%q %+v: token %v ends inside a character", q, m, tok)
				}
			}
		}
		last = tok.End
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Mark is where the executable comment, or the unterminated comment or
// quote, opened: a "/*" inside a line comment or a string is not it.
func TestMark(t *testing.T) {
	for _, tc := range []struct {
		q    string
		want int // -1: no mark
	}{
		{"SELECT 1", -1},
		{"SELECT 1 /*! 2 */", 9},
		{"SELECT '/*' /*M!100000 2 */", 12},
		{"SELECT 1 -- /*\n /* open", 16},
		{"SELECT 'a /* b", 7},
		{"SELECT `a", 7},
		{"SELECT '/*' 'x", 12},
	} {
		l := NewString(tc.q, Mode{})
		for l.Next().Kind != EOF {
		}
		p, ok := l.Mark()
		if !ok {
			p = -1
		}
		if p != tc.want {
			t.Errorf("%q: mark %d, want %d", tc.q, p, tc.want)
		}
	}
}
