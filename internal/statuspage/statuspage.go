// Package statuspage is what rgproxy's and rgserver's status consoles
// share: serving a page embedded in the binary, whose one inline <style>
// and one inline <script> are the only style and code the browser will
// run (a Content-Security-Policy naming their hashes), and serving the
// JSON the page reads.
//
// The consoles show names and statement shapes that clients chose: the
// page writes them as text, never as markup, and the policy stops
// anything else (an injected script, an outside resource) from running or
// loading even if it did.
package statuspage

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Page is a console page: one HTML document with at most one inline
// <style> and one inline <script>.
type Page struct {
	html []byte
	csp  string
}

// NewPage checks html and computes its policy: only its inline style
// and script run, only the same origin is fetched, nothing embeds it.
func NewPage(html []byte) (*Page, error) {
	script, err := inline(html, "script")
	if err != nil {
		return nil, err
	}
	style, err := inline(html, "style")
	if err != nil {
		return nil, err
	}
	csp := "default-src 'none'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'" +
		"; script-src " + hashSource(script) + "; style-src " + hashSource(style)
	return &Page{html: html, csp: csp}, nil
}

// The style and code both consoles share: NewConsole puts them at the
// head of a page's own <style> and <script>, so that each page keeps one
// of each (one hash each in its policy) and holds only what is its own.
var (
	//go:embed console.css
	consoleCSS []byte
	//go:embed console.js
	consoleJS []byte
)

// NewConsole is NewPage for a console: html's <style> and <script> are
// given the shared style and code (console.css, console.js) first. The
// page's script defines render(d) and calls startConsole(render).
func NewConsole(html []byte) (*Page, error) {
	out := html
	for _, part := range []struct {
		open   string
		shared []byte
	}{{"<style>\n", consoleCSS}, {"<script>\n", consoleJS}} {
		if bytes.Count(out, []byte(part.open)) != 1 {
			return nil, fmt.Errorf("statuspage: a console needs exactly one %q", part.open)
		}
		out = bytes.Replace(out, []byte(part.open), append([]byte(part.open), part.shared...), 1)
	}
	return NewPage(out)
}

// inline returns the text of the one <tag>…</tag> of html (nil for
// none); an error for several.
func inline(html []byte, tag string) ([]byte, error) {
	open, end := []byte("<"+tag+">"), []byte("</"+tag+">")
	i := bytes.Index(html, open)
	if i < 0 {
		return nil, nil
	}
	rest := html[i+len(open):]
	j := bytes.Index(rest, end)
	if j < 0 {
		return nil, fmt.Errorf("statuspage: <%s> without </%s>", tag, tag)
	}
	if bytes.Contains(rest[j:], open) {
		return nil, fmt.Errorf("statuspage: more than one <%s>", tag)
	}
	return rest[:j], nil
}

// hashSource is a CSP source for exactly text ('none' for none).
func hashSource(text []byte) string {
	if text == nil {
		return "'none'"
	}
	sum := sha256.Sum256(text)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// CSP is the page's Content-Security-Policy.
func (p *Page) CSP() string { return p.csp }

// ServeHTTP serves the page.
func (p *Page) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", p.csp)
	setCommon(h)
	_, _ = w.Write(p.html)
}

// WriteJSON writes v as the console's JSON answer.
func WriteJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	setCommon(h)
	_, _ = w.Write(append(b, '\n'))
}

// setCommon sets what the page and its JSON share: never cached (the
// figures are live), never sniffed as another type, no referrer sent on.
func setCommon(h http.Header) {
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// ErrLimit is a query parameter that is not a number within its bounds.
var ErrLimit = errors.New("statuspage: bad limit")

// Limit reads the query parameter name of r as a count in [0, most];
// absent, it is def.
func Limit(r *http.Request, name string, def, most int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > most {
		return 0, fmt.Errorf("%w: %s=%q: want a whole number from 0 to %d", ErrLimit, name, s, most)
	}
	return n, nil
}
