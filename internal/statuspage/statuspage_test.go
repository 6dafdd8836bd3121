package statuspage

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestPagePolicyNamesItsInlineCode(t *testing.T) {
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(h[:]) + "'"
	}
	for _, tc := range []struct {
		name, html, script, style, err string
	}{
		{"both", "<style>p{}</style><p>x</p><script>go()</script>", sum("go()"), sum("p{}"), ""},
		{"no script", "<style>p{}</style>", "'none'", sum("p{}"), ""},
		{"neither", "<p>x</p>", "'none'", "'none'", ""},
		{"two scripts", "<script>a()</script><script>b()</script>", "", "", "more than one <script>"},
		{"unclosed", "<script>a()", "", "", "without </script>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPage([]byte(tc.html))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			csp := p.CSP()
			for _, want := range []string{"default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'",
				"script-src " + tc.script, "style-src " + tc.style} {
				if !strings.Contains(csp, want) {
					t.Errorf("CSP %q lacks %q", csp, want)
				}
			}
			rec := httptest.NewRecorder()
			p.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
			if rec.Body.String() != tc.html || rec.Header().Get("Content-Security-Policy") != csp ||
				rec.Header().Get("Cache-Control") != "no-store" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
				t.Fatalf("served %q with %v", rec.Body.String(), rec.Header())
			}
		})
	}
}

func TestWriteJSON(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteJSON(rec, map[string]any{"name": "<script>"})
	// encoding/json escapes <, > and & so the answer is inert as HTML too.
	if rec.Body.String() != `{"name":"\u003cscript\u003e"}`+"\n" || rec.Header().Get("Content-Type") != "application/json" ||
		rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("%q %v", rec.Body.String(), rec.Header())
	}
}

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  int
		bad   bool
	}{
		{"", 500, false},
		{"groups=0", 0, false},
		{"groups=10000", 10000, false},
		{"groups=10001", 0, true},
		{"groups=-1", 0, true},
		{"groups=1e3", 0, true},
		{"groups=", 500, false},
	} {
		n, err := Limit(httptest.NewRequest("GET", "/api/console?"+tc.query, nil), "groups", 500, 10000)
		if tc.bad != (err != nil) || (err != nil && !errors.Is(err, ErrLimit)) || n != tc.want {
			t.Errorf("%q: %d, %v; want %d, bad %v", tc.query, n, err, tc.want, tc.bad)
		}
	}
}

// Browsers refuse the ports on the Fetch standard's bad-port list;
// 10080, rgproxy's status port, is one of them.
func TestBrowserBlocked(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:10080": true,
		"127.0.0.1:6000":  true,
		"[::1]:6697":      true,
		"127.0.0.1:10081": false,
		"127.0.0.1:3380":  false,
		"127.0.0.1:4000":  false,
		"127.0.0.1:0":     false,
		"no port":         false,
	} {
		if got := BrowserBlocked(addr); got != want {
			t.Errorf("BrowserBlocked(%q) = %v, want %v", addr, got, want)
		}
	}
}

// A console page holds only its own style and code; NewConsole heads
// them with the shared ones, and the policy names the composed texts, so
// the browser runs the shared code and nothing else.
func TestConsoleHeadsPageWithSharedCode(t *testing.T) {
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(h[:]) + "'"
	}
	page := "<style>\n.own{}\n</style><p>x</p><script>\nfunction render(d) {}\nstartConsole(render);\n</script>"
	p, err := NewConsole([]byte(page))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	for _, want := range []string{"function startConsole(render)", "function el(tag, text, cls)", "startConsole(render);", ".own{}", "tr.idle td"} {
		if !strings.Contains(body, want) {
			t.Errorf("composed page lacks %q", want)
		}
	}
	script := "\n" + string(consoleJS) + "function render(d) {}\nstartConsole(render);\n"
	style := "\n" + string(consoleCSS) + ".own{}\n"
	for _, want := range []string{"script-src " + sum(script), "style-src " + sum(style)} {
		if !strings.Contains(p.CSP(), want) {
			t.Errorf("CSP %q lacks %q", p.CSP(), want)
		}
	}
	for _, bad := range []string{"<p>no style or script</p>", "<style>\n</style><script>\n</script><script>\n</script>"} {
		if _, err := NewConsole([]byte(bad)); err == nil {
			t.Errorf("NewConsole(%q) = nil error, want one", bad)
		}
	}
}
