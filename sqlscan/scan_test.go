package sqlscan

import (
	"bytes"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

// scanSeeds are texts the differential tests and fuzz targets start from.
var scanSeeds = []string{
	"SELECT 1", "select 1; insert into t values (1)", "/*!40101 SET x=1*/",
	"WITH a AS (SELECT 1) DELETE FROM t", "((SELECT 1))", "SELECT '--;' -- x",
	"CREATE PROCEDURE p() BEGIN SELECT 1; END", "/*M!100100 INSERT INTO t VALUES (1) */",
	"BEGIN NOT ATOMIC IF 1 THEN SELECT 1; END IF; END", "SELECT 1--1", "#",
	"CREATE PROCEDURE p() BEGIN IF (a) THEN SELECT 1; END IF; WHILE x DO SET x = x - 1; END WHILE; END; SELECT 2",
	"CREATE PROCEDURE p() BEGIN CASE WHEN 1 THEN SELECT 1; END CASE; REPEAT SET x = 1; UNTIL 1 END REPEAT; END",
	"SELECT a FROM t WHERE b IN (1, -2, 'x' 'y', NULL, ?)", "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
	"SELECT `a``b`, `select`, x. .y, a...b", "SELECT 1--1; -- x\n#y\nSELECT .5e-3",
	"/* app */ COMMIT", "ROLLBACK TO SAVEPOINT a", "XA COMMIT 'x'", "SELECT /*+ RESOURCE_GROUP(a) */ 1 /*k='v'*/",
}

// The single pass classifies, splits and digests exactly as the separate
// passes it replaced.
func TestScanMatchesSeparatePasses(t *testing.T) {
	for _, q := range scanSeeds {
		checkScanMatchesReference(t, []byte(q))
	}
}

func FuzzScanMatchesSeparatePasses(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) { checkScanMatchesReference(t, q) })
}

func checkScanMatchesReference(t *testing.T, q []byte) {
	t.Helper()
	for _, mode := range []sqltext.Mode{{}, {NoBackslashEscapes: true}, {Charset: sqltext.GBK}, {Charset: sqltext.SJIS, NoBackslashEscapes: true}} {
		wc, wm := refClassifyQueryMode(q, mode)
		var res Scan
		c, m, _ := Query(q, mode, nil, &res, nil, true)
		if c != wc || m != wm {
			t.Fatalf("scan(%q, %+v) = %v, %v; separate passes %v, %v", q, mode, c, m, wc, wm)
		}
		if gc, gm := ClassifyQueryMode(q, mode); gc != wc || gm != wm {
			t.Fatalf("ClassifyQueryMode(%q, %+v) = %v, %v; want %v, %v", q, mode, gc, gm, wc, wm)
		}
		// The reference digester reads the whole text in one mode: a
		// SET NAMES inside a multi-statement switches the scan's.
		switches := bytes.Contains(bytes.ToUpper(q), []byte("SET")) && bytes.Contains(q, []byte(";"))
		if _, _, d := Query(q, mode, nil, &res, nil, true); !switches && string(d) != refDigest(q, mode) || res.DigestHash != HashDigest(refDigest(q, mode)) {
			t.Fatalf("scan digest of %q in %+v = %q (hash %x); Digest was %q", q, mode, d, res.DigestHash, refDigest(q, mode))
		}
	}
}

func TestScanFields(t *testing.T) {
	words := []string{"resource", "CURRENT_RESOURCE_GROUP", "resource_groups"}
	ws, err := NewWords(words)
	if err != nil {
		t.Fatal(err)
	}
	const (
		mResource = 1 << iota
		mCurrent
		mGroups
	)
	tests := []struct {
		q        string
		ends     bool
		hint     string
		lead     string
		trail    string
		mentions uint64
	}{
		{q: "SELECT 1"},
		{q: "COMMIT", ends: true},
		{q: "/* app */ commit work", ends: true, lead: " app "},
		{q: "ROLLBACK", ends: true},
		{q: "rollback work", ends: true},
		{q: "ROLLBACK TO SAVEPOINT a"},
		{q: "ROLLBACK WORK TO a"},
		{q: "XA COMMIT 'x'", ends: true},
		{q: "XA ROLLBACK 'x'", ends: true},
		{q: "XA END 'x'"},
		{q: "COMMIT; SELECT 1"},
		{q: "(COMMIT)"},
		{q: "SELECT /*+ RESOURCE_GROUP(rg1) */ 1", hint: " RESOURCE_GROUP(rg1) "},
		{q: "update /*+RESOURCE_GROUP(x)*/ t set a=1", hint: "RESOURCE_GROUP(x)"},
		{q: "SELECT 1 /*+ RESOURCE_GROUP(rg1) */"},
		{q: "SHOW /*+ RESOURCE_GROUP(rg1) */ TABLES"},
		{q: "SELECT * FROM t /*application='billing',route='%2Freport'*/", trail: "application='billing',route='%2Freport'"},
		{q: "SELECT 1 /*a='b'*/;", trail: "a='b'"},
		{q: "/*controller='x'*/ SELECT 1", lead: "controller='x'"},
		{q: "SELECT /* mid */ 1"},
		{q: "SELECT 1 /*!50000 , 2 */"},
		{q: "SELECT '/*x*/'"},
		{q: "SELECT a IN /*c*/ (1, 2)"},
		{q: "SELECT CURRENT_RESOURCE_GROUP()", mentions: mCurrent},
		{q: "select * from information_schema.`Resource_Groups`", mentions: mGroups},
		{q: "ALTER USER u RESOURCE GROUP g", mentions: mResource},
		{q: "SELECT 'resource' /* resource_groups */", trail: " resource_groups "},
	}
	for _, tc := range tests {
		var res Scan
		Text([]byte(tc.q), tc.q, sqltext.Mode{}, ws, &res, nil, false)
		if res.EndsTxn != tc.ends || res.Hint != tc.hint || res.LeadingComment != tc.lead ||
			res.TrailingComment != tc.trail || res.Mentions != tc.mentions {
			t.Errorf("%q: ends=%v hint=%q lead=%q trail=%q mentions=%b; want %v %q %q %q %b", tc.q,
				res.EndsTxn, res.Hint, res.LeadingComment, res.TrailingComment, res.Mentions,
				tc.ends, tc.hint, tc.lead, tc.trail, tc.mentions)
		}
	}
}

func TestScanAllocations(t *testing.T) {
	ws, _ := NewWords([]string{"resource", "current_resource_group"})
	q := "/* app */ SELECT id, name FROM users WHERE id = 42 AND status IN ('a', 'b') /*route='x'*/"
	b := []byte(q)
	buf := make([]byte, 0, 256)
	var res Scan
	if n := testing.AllocsPerRun(100, func() {
		_, _, buf = Text(b, q, sqltext.Mode{}, ws, &res, buf, true)
	}); n != 0 {
		t.Fatalf("scan allocates %v times per statement", n)
	}
	if !bytes.Equal(res.Digest, []byte(Digest(b, sqltext.Mode{}))) {
		t.Fatalf("digest %q, want %q", res.Digest, Digest(b, sqltext.Mode{}))
	}
}

func TestNewWordSet(t *testing.T) {
	if _, err := NewWords([]string{""}); err == nil {
		t.Fatal("empty word accepted")
	}
	if _, err := NewWords([]string{"résumé"}); err == nil {
		t.Fatal("non-ASCII word accepted")
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = "w"
	}
	if _, err := NewWords(many); err == nil {
		t.Fatal("65 words accepted")
	}
}

func BenchmarkScan(b *testing.B) {
	ws, _ := NewWords([]string{"resource", "current_resource_group", "resource_groups", "runaway_watches", "statements_summary", "watch", "last"})
	q := "SELECT c FROM sbtest1 WHERE id=4242"
	bq := []byte(q)
	buf := make([]byte, 0, 256)
	var res Scan
	b.ReportAllocs()
	for b.Loop() {
		_, _, buf = Text(bq, q, sqltext.Mode{}, ws, &res, buf, true)
	}
}

func BenchmarkClassifyOnly(b *testing.B) {
	q := []byte("SELECT c FROM sbtest1 WHERE id=4242")
	b.ReportAllocs()
	for b.Loop() {
		ClassifyQuery(q)
	}
}
