package sqlscan

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rgproxy/rgproxy/sqltext"
)

// A runaway sample hides the statement's literals from another account as
// the server read them, in every client character set family whose trail
// byte may be '\', with and without NO_BACKSLASH_ESCAPES and ANSI_QUOTES;
// the text shown to an administrator is the client's, decoded to UTF-8.
func TestSampleHidesLiterals(t *testing.T) {
	const secret = "TopSecret"
	for _, cs := range []struct {
		name string
		cs   Charset
		ch   string // a character whose last byte is '\' in cs
		utf8 string // the same, decoded
	}{
		{"sjis", SJIS, "\x95\x5c", "表"},
		{"cp932", SJIS, "\x83\x5c", "ソ"},
		{"gbk", GBK, "\x81\x5c", "乗"},
		{"big5", Big5, "\xa5\x5c", "功"},
		{"utf8mb4", sqltext.ASCIISafe, "C:\\", "C:\\"}, // misleads only under NO_BACKSLASH_ESCAPES
	} {
		for _, nbe := range []bool{false, true} {
			for _, ansi := range []bool{false, true} {
				name := cs.name
				if nbe {
					name += "/no_backslash_escapes"
				}
				if ansi {
					name += "/ansi_quotes"
				}
				t.Run(name, func(t *testing.T) {
					// Under ANSI_QUOTES "s\" is a name: what follows is
					// read from its closing quote, where a reading of
					// "..." as a string (with escapes) would not.
					q, alias := "SELECT SLEEP(1)", ""
					if ansi {
						q, alias = q+` AS "s\", 'z"' AS c`, ` AS "s\"`
					}
					ch, dec := cs.ch, cs.utf8
					if cs.cs == sqltext.ASCIISafe && !nbe {
						ch, dec = "é", "é" // C:\ would escape its quote: a syntax error
					}
					q += ", '" + ch + "' AS a, 'pw=" + secret + "' AS b"
					m := Mode{Charset: cs.cs, NoBackslashEscapes: nbe}
					if !(cs.cs == sqltext.ASCIISafe && !nbe && !ansi) {
						// The text misleads a reading in the default mode.
						if d := Digest([]byte(q), Mode{}); !strings.Contains(d, secret) {
							t.Fatalf("the test text does not mislead a UTF-8 reading: %q", d)
						}
					}
					shown, masked := Sample(q, m)
					if strings.Contains(masked, secret) {
						t.Errorf("masked sample %q shows the literal", masked)
					}
					if want := "SELECT SLEEP(1)" + alias; !strings.HasPrefix(shown, want) ||
						!strings.Contains(shown, "'"+dec+"' AS a, 'pw="+secret+"' AS b") || !utf8.ValidString(shown) {
						t.Errorf("shown %q, want the text decoded to UTF-8", shown)
					}
					want := "SELECT SLEEP(?), ? AS a, ? AS b"
					switch {
					case ansi && !nbe:
						// "s\", 'z" is a string or a name and a string:
						// the readings disagree on what is a literal.
						want = "SELECT ..."
					case ansi:
						want = "SELECT SLEEP(?) AS ?, ? AS c, ? AS a, ? AS b"
					}
					if masked != want {
						t.Errorf("masked %q, want %q", masked, want)
					}
					// Stored by an older proxy, raw: Mask alone hides it too.
					if masked := Mask(q); strings.Contains(masked, secret) {
						t.Errorf("Mask(raw) %q shows the literal", masked)
					}
				})
			}
		}
	}
	// An ordinary text is masked to its digest, and shown whole.
	q := `SELECT * FROM t WHERE a = 'x' AND b = "y"`
	if shown, masked := Sample(q, Mode{}); shown != q || masked != "SELECT * FROM t WHERE a = ? AND b = ?" {
		t.Errorf("Sample(%q) = %q, %q", q, shown, masked)
	}
	if m := Mask(q); m != "SELECT * FROM t WHERE a = ? AND b = ?" {
		t.Errorf("Mask(%q) = %q", q, m)
	}
}

// Decode keeps the reading: an invalid or unmapped character becomes
// U+FFFD, never an ASCII byte that would end a string.
func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		q    string
		cs   Charset
		want string
	}{
		{"'\x95\x5c'", SJIS, "'表'"},
		{"'\x83'", SJIS, "'\uFFFD'"},            // a lead byte before a quote: one byte
		{"'\x85\x5c'", SJIS, "'\uFFFD'"},        // a pair cp932 does not map: still one character
		{"'\xa5\x5c' \xa5", Big5, "'功' \uFFFD"}, // cut
		{"'\xe9'", sqltext.ASCIISafe, "'\uFFFD'"},
		{"'é'", sqltext.ASCIISafe, "'é'"},
		{"\x81\x30\x81\x30", sqltext.GB18030, "\u0080"},
	} {
		got := Decode(tc.q, tc.cs)
		if got != tc.want && !(tc.cs == sqltext.GB18030 && got != "" && !strings.ContainsAny(got, "01")) {
			t.Errorf("Decode(%q, %v) = %q, want %q", tc.q, tc.cs, got, tc.want)
		}
	}
}

// kinds is the token kinds of q in m.
func kinds(q string, m Mode) []sqltext.Kind {
	l := sqltext.NewString(q, m)
	var ks []sqltext.Kind
	for t := l.Next(); t.Kind != tkEOF; t = l.Next() {
		ks = append(ks, t.Kind)
	}
	return ks
}

// FuzzDecode: Decode's text is UTF-8 and reads, in UTF-8, as the text read
// in its character set: the same tokens, of the same kinds.
func FuzzDecode(f *testing.F) {
	f.Add("SELECT '\x95\\', 'x' -- '", uint8(SJIS), false)
	f.Add("SELECT `\x81`` \x81\x30\x81\x30 /* \x81*/ 'a'", uint8(GB18030), true)
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		c := Charset(cs % uint8(GB18030+1))
		d := Decode(q, c)
		if !utf8.ValidString(d) {
			t.Fatalf("%q in %v: %q is not UTF-8", q, c, d)
		}
		a, b := kinds(q, Mode{Charset: c, NoBackslashEscapes: nbe}), kinds(d, Mode{NoBackslashEscapes: nbe})
		if len(a) != len(b) {
			t.Fatalf("%q in %v: %d tokens, decoded %q: %d", q, c, len(a), d, len(b))
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%q in %v: token %d is %v, decoded %q: %v", q, c, i, a[i], d, b[i])
			}
		}
	})
}

// FuzzSampleMask: whatever the text and mode, the masked sample is the
// digest of the decoded text in the session's mode, or only its first word;
// when it is the digest, each reading of "..." hides its literals (no code
// byte of the digest's reading is a literal under ANSI_QUOTES). Mask gives
// the default mode's digest or only the first word.
func FuzzSampleMask(f *testing.F) {
	f.Add("SELECT '\x83\\', 'x' -- '", uint8(SJIS), false)
	f.Add("SELECT 'a\\', 'x' -- '", uint8(0), true)
	f.Add(`SELECT 1 AS "s\", 'z"' AS c, 'x'`, uint8(0), false)
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		m := Mode{Charset: Charset(cs % uint8(GB18030+1)), NoBackslashEscapes: nbe}
		shown, masked := Sample(q, m)
		um := Mode{NoBackslashEscapes: nbe}
		if strings.HasSuffix(masked, "...") && masked != Digest([]byte(shown), um) {
			return
		}
		if masked != Digest([]byte(shown), um) {
			t.Fatalf("%q in %+v: masked %q, digest %q", q, m, masked, Digest([]byte(shown), um))
		}
		ansi := um
		ansi.ANSIQuotes = true
		if !covered(codeSpans(shown, um), codeSpans(shown, ansi)) {
			t.Fatalf("%q in %+v: masked %q shows what ANSI_QUOTES reads as a literal", q, m, masked)
		}
		if mk := Mask(q); !strings.HasSuffix(mk, "...") && mk != Digest([]byte(q), Mode{}) {
			t.Fatalf("Mask(%q) = %q", q, mk)
		}
	})
}

// statements_summary shows a digest in UTF-8, and not at all one whose
// text ANSI_QUOTES would read otherwise.
func TestShownDigest(t *testing.T) {
	for _, tc := range []struct {
		q    string
		m    Mode
		esc  bool
		want string
	}{
		{"SELECT `\x95\x5c`, '\x95\x5c' FROM t", Mode{Charset: SJIS}, false, "SELECT `表`, ? FROM t"},
		{"SELECT 表 FROM t", Mode{}, false, "SELECT 表 FROM t"},
		{`SELECT 1 AS "s\", 'z"' AS c, 'secret'`, Mode{}, true, "SELECT ..."},
		{`SELECT "a\\", "b\n", "c""d"`, Mode{}, false, "SELECT ?, ?, ?"},
		{`SELECT 1 AS "s\", 'secret'`, Mode{NoBackslashEscapes: true}, false, "SELECT ? AS ?, ?"},
	} {
		var sc Scan
		Query([]byte(tc.q), tc.m, nil, &sc, nil, true)
		if sc.EscapedDoubleQuote != tc.esc {
			t.Errorf("%q: EscapedDoubleQuote %v, want %v", tc.q, sc.EscapedDoubleQuote, tc.esc)
		}
		if got := ShownDigest(sc.Digest, tc.m.Charset, sc.EscapedDoubleQuote); got != tc.want {
			t.Errorf("%q: shown %q, want %q", tc.q, got, tc.want)
		}
	}
}
