package sqlscan

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// tags collects what ParseTags yields, as "key=value" strings.
func tags(comment string) ([]string, bool) {
	var out []string
	ok := ParseTags(comment, func(k, v string) bool {
		out = append(out, k+"="+v)
		return true
	})
	return out, ok
}

func TestParseTags(t *testing.T) {
	tests := []struct {
		name    string
		comment string
		want    []string // nil: not SQLCommenter, nothing yielded
	}{
		// The spec's examples (google.github.io/sqlcommenter/spec): value
		// serialization, key-value format, concatenation, and the parsing
		// exhibit with its line breaks after the commas.
		{"spec: DROP TABLE FOO", "name='DROP%20TABLE%20FOO'", []string{"name=DROP TABLE FOO"}},
		{"spec: /param first", "route='%2Fparam%20first'", []string{"route=/param first"}},
		{"spec: 1234", "id='1234'", []string{"id=1234"}},
		{"spec: FOO 'BAR", `v='FOO%20\'BAR'`, []string{"v=FOO 'BAR"}},
		{"spec: route=/polls 1000", "route='%2Fpolls%201000'", []string{"route=/polls 1000"}},
		// The spec's table prints this key serialized as name=\'\' (a stray '=').
		{"spec: quotes in the key", `name\'\'='DROP%20TABLE%20USERS\''`, []string{"name''=DROP TABLE USERS'"}},
		{"quotes URL-encoded", "name%27%27='DROP%20TABLE%20USERS%27'", []string{"name''=DROP TABLE USERS'"}},
		{"spec: concatenation",
			"controller='index',route='%2Fparam*d',traceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01',tracestate='congo%3Dt61rcWkgMzE%2Crojo%3D00f067aa0ba902b7'",
			[]string{"controller=index", "route=/param*d", "traceparent=00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01",
				"tracestate=congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}},
		{"spec: parsing exhibit (its typo controller='index,' fixed)",
			"action='%2Fparam*d',controller='index',framework='spring',\ntraceparent='00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01',\ntracestate='congo%3Dt61rcWkgMzE%2Crojo%3D00f067aa0ba902b7'",
			[]string{"action=/param*d", "controller=index", "framework=spring",
				"traceparent=00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01", "tracestate=congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"}},
		// The exhibit as printed lacks a comma: not in the format, and
		// guessing would bind controller to "index,".
		{"spec: parsing exhibit as printed", "action='%2Fparam*d',controller='index,'framework='spring'", nil},
		// Frameworks.
		{"django", "controller='index',framework='django%3A4.2',route='%2Freport'",
			[]string{"controller=index", "framework=django:4.2", "route=/report"}},
		{"rails", "application='Shop',controller='reports',action='index'",
			[]string{"application=Shop", "controller=reports", "action=index"}},
		{"java/go: + is a space", "route='%2Fa+b',x='1%2B1'", []string{"route=/a b", "x=1+1"}},
		{"order kept", "b='2',a='1',b='3'", []string{"b=2", "a=1", "b=3"}},
		{"spaces around commas and ends", "  a='1' ,\tb='2'  ", []string{"a=1", "b=2"}},
		{"empty value", "a=''", []string{"a="}},
		{"encoded key", "route%20parameter='x'", []string{"route parameter=x"}},
		{"comma and star inside a value", "a='x,y*z'", []string{"a=x,y*z"}},
		{"backslash kept", `a='x\y'`, []string{`a=x\y`}},
		{"utf-8", "page='%C3%A9t%C3%A9'", []string{"page=été"}},
		// Not SQLCommenter.
		{"empty", "", nil},
		{"blank", "  ", nil},
		{"free text", " app: web ", nil},
		{"free text after a tag", "a='1' done", nil},
		{"unquoted value", "a=1", nil},
		{"double quotes", `a="1"`, nil},
		{"space before =", "a ='1'", nil},
		{"no key", "='1'", nil},
		{"unterminated", "a='1", nil},
		{"escaped closing quote", `a='1\'`, nil},
		{"trailing comma", "a='1',", nil},
		{"empty pair", "a='1',,b='2'", nil},
		{"bad escape", "a='%zz'", nil},
		{"truncated escape", "a='%4'", nil},
		{"bad escape in key", "a%='1'", nil},
		{"comma in key", "a,b='1'", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tags(tt.comment)
			if ok != (tt.want != nil) || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseTags(%q) = %q, %v; want %q", tt.comment, got, ok, tt.want)
			}
		})
	}
}

func TestParseTagsStops(t *testing.T) {
	var seen []string
	ok := ParseTags("a='1',b='2',c='3'", func(k, v string) bool {
		seen = append(seen, k)
		return k != "b"
	})
	if !ok || !reflect.DeepEqual(seen, []string{"a", "b"}) {
		t.Errorf("yield returning false: saw %v, %v", seen, ok)
	}
}

func TestParseTagsAllocations(t *testing.T) {
	for _, c := range []string{"", "just a comment", "controller='index',route='report'"} {
		if n := testing.AllocsPerRun(100, func() { ParseTags(c, func(k, v string) bool { return true }) }); n != 0 {
			t.Errorf("ParseTags(%q) allocates %v times", c, n)
		}
	}
}

// formatTags serializes pairs as the spec's sqlcommenter does: each key
// and value URL-encoded, ' escaped as \', the value in single quotes.
func formatTags(pairs [][2]string) string {
	enc := func(s string) string {
		return strings.ReplaceAll(strings.ReplaceAll(url.QueryEscape(s), "+", "%20"), "'", `\'`)
	}
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(enc(p[0]) + "='" + enc(p[1]) + "'")
	}
	return b.String()
}

// FuzzParseTags: ParseTags never panics; what it yields for a comment
// serializes back to a comment that yields the same; and any key and
// value survive formatting and parsing.
func FuzzParseTags(f *testing.F) {
	for _, s := range []string{
		"controller='index',framework='django%3A4.2',route='%2Freport'",
		`name\'\'='DROP%20TABLE%20USERS\''`,
		"a='1' , b='x+y'",
		"a='%zz'",
		"free text",
		"",
	} {
		f.Add(s, "k", "v")
	}
	f.Fuzz(func(t *testing.T, comment, key, value string) {
		var pairs [][2]string
		ok := ParseTags(comment, func(k, v string) bool {
			pairs = append(pairs, [2]string{k, v})
			return true
		})
		if !ok && pairs != nil {
			t.Fatalf("ParseTags(%q) yielded %q but returned false", comment, pairs)
		}
		if ok {
			if len(pairs) == 0 {
				t.Fatalf("ParseTags(%q) = true without a pair", comment)
			}
			var again [][2]string
			text := formatTags(pairs)
			ParseTags(text, func(k, v string) bool {
				again = append(again, [2]string{k, v})
				return true
			})
			if !reflect.DeepEqual(again, pairs) {
				t.Fatalf("round trip of %q via %q: %q != %q", comment, text, again, pairs)
			}
		}
		if key == "" {
			return
		}
		one := formatTags([][2]string{{key, value}})
		var got [][2]string
		if !ParseTags(one, func(k, v string) bool { got = append(got, [2]string{k, v}); return true }) ||
			len(got) != 1 || got[0] != [2]string{key, value} {
			t.Fatalf("key %q value %q formatted as %q parse back as %q", key, value, one, got)
		}
	})
}

func BenchmarkParseTags(b *testing.B) {
	for _, c := range []string{
		"controller='index',framework='django%3A4.2',route='%2Freport'",
		"controller='index',framework='django',route='report'",
		" a developer's note, not tags ",
	} {
		b.Run(c, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ParseTags(c, func(k, v string) bool { return true })
			}
		})
	}
}
