package sqlscan

import (
	"strings"
	"testing"
)

func TestReplaceRowCount(t *testing.T) {
	tests := []struct{ q, want string }{
		{"SELECT ROW_COUNT()", "SELECT CAST(7 AS SIGNED) AS `ROW_COUNT()`"},
		{"SELECT a, row_count( ), b FROM t", "SELECT a, CAST(7 AS SIGNED) AS `row_count( )`, b FROM t"},
		{"SELECT ROW_COUNT() AS n", "SELECT CAST(7 AS SIGNED) AS n"},
		{"SELECT ROW_COUNT() n", "SELECT CAST(7 AS SIGNED) n"},
		{"SELECT IF(ROW_COUNT() > 0, 'y', 'n')", "SELECT IF(CAST(7 AS SIGNED) > 0, 'y', 'n')"},
		{"SELECT ROW_COUNT() + 1", "SELECT CAST(7 AS SIGNED) + 1"},
		{"SET @n = ROW_COUNT()", "SET @n = CAST(7 AS SIGNED)"},
		{"SELECT db.row_count(), 'ROW_COUNT()' /* ROW_COUNT() */", ""},
		{"SELECT `row_count`()", ""},
	}
	for _, tc := range tests {
		got, ok := ReplaceRowCount(tc.q, Mode{}, 7)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: %q %v, want %q", tc.q, got, ok, tc.want)
		}
	}
}

// FuzzReplaceRowCount: any text, in any mode, is rewritten without panic,
// and a text that calls no ROW_COUNT() is left alone.
func FuzzReplaceRowCount(f *testing.F) {
	for _, s := range []string{"SELECT ROW_COUNT()", "SELECT a, row_count( ) x", "SELECT '\x81\\', ROW_COUNT() -- '", "SELECT `row_count`()"} {
		f.Add(s, uint8(0), false)
		f.Add(s, uint8(GBK), true)
	}
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		m := Mode{Charset: Charset(cs % uint8(GB18030+1)), NoBackslashEscapes: nbe}
		out, ok := ReplaceRowCount(q, m, -1)
		if !ok && out != "" {
			t.Fatalf("%q: not ok but %q", q, out)
		}
		if ok && !strings.Contains(out, "CAST(-1 AS SIGNED)") {
			t.Fatalf("%q: ok but %q", q, out)
		}
	})
}

// A ROW_COUNT() the session's character set puts in code is found; one
// it puts in a string is not.
func TestReplaceRowCountCharset(t *testing.T) {
	q := "SELECT '\x81\\', ROW_COUNT() -- '"
	if _, ok := ReplaceRowCount(q, Mode{Charset: GBK}, 1); !ok {
		t.Errorf("gbk: ROW_COUNT() not found")
	}
	if _, ok := ReplaceRowCount(q, Mode{}, 1); ok {
		t.Errorf("utf8mb4: ROW_COUNT() found in a string")
	}
}

func TestReadHead(t *testing.T) {
	tests := []struct {
		q       string
		verb    string
		target  Table
		prepare string
	}{
		{"INSERT INTO t VALUES (1)", "INSERT", Table{Table: "t"}, ""},
		{"insert /*+ RESOURCE_GROUP(a) */ ignore db.t(a) values (1)", "INSERT", Table{"db", "t"}, ""},
		{"INSERT `my``db`.`t 1` SET a = 1", "INSERT", Table{"my`db", "t 1"}, ""},
		{"REPLACE DELAYED INTO t SELECT 1", "REPLACE", Table{Table: "t"}, ""},
		{"UPDATE t SET a = 1", "UPDATE", Table{Table: "t"}, ""},
		{"UPDATE LOW_PRIORITY d.t x SET a = 1", "UPDATE", Table{"d", "t"}, ""},
		{"UPDATE t, u SET t.a = u.a", "UPDATE", Table{}, ""},
		{"UPDATE t LEFT JOIN u USING (id) SET t.a = 1", "UPDATE", Table{}, ""},
		{"DELETE FROM t", "DELETE", Table{}, ""},
		{"EXECUTE IMMEDIATE 'INSERT INTO t VALUES (?)' USING 1", "EXECUTE", Table{Table: "t"}, ""},
		{`EXECUTE IMMEDIATE _utf8mb4"UPDATE \"x\" SET a=1"`, "EXECUTE", Table{}, ""},
		{"EXECUTE IMMEDIATE 'INSERT INTO `it''s` VALUES (''" + strings.Repeat("x", 4000) + "'')'", "EXECUTE", Table{Table: "it's"}, ""},
		{"EXECUTE IMMEDIATE @sql", "EXECUTE", Table{}, ""},
		{"EXECUTE stmt1 USING @a", "EXECUTE", Table{}, "stmt1"},
		{"PREPARE s FROM 'INSERT INTO d.t VALUES (?)'", "PREPARE", Table{"d", "t"}, "s"},
		{"PREPARE s FROM @q", "PREPARE", Table{}, ""},
		{"INSERT INTO t (b) VALUES ('" + strings.Repeat("y", 5000), "INSERT", Table{Table: "t"}, ""},
		{"SET @v = 1", "SET", Table{}, ""},
		{"  ", "", Table{}, ""},
	}
	for _, tc := range tests {
		h := ReadHead(tc.q, Mode{})
		if h.Verb != tc.verb || h.Target != tc.target || h.Prepare != tc.prepare {
			t.Errorf("%.60s: %+v, want %s %+v %q", tc.q, h, tc.verb, tc.target, tc.prepare)
		}
	}
}

// FuzzReadHead: any text, in either escaping mode, is read without panic
// and names at most what it holds.
func FuzzReadHead(f *testing.F) {
	for _, s := range []string{"INSERT INTO t VALUES (1)", "EXECUTE IMMEDIATE 'UPDATE `a`.b SET x=1'", "PREPARE s FROM '", "UPDATE `", "EXECUTE IMMEDIATE '\\"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, q string, nbe bool) {
		h := ReadHead(q, Mode{NoBackslashEscapes: nbe})
		if len(h.Target.Table) > len(q) || len(h.Target.Schema) > len(q) || len(h.Prepare) > len(q) {
			t.Fatalf("%q: %+v longer than the text", q, h)
		}
	})
}

// A backquoted name is unquoted in the session's mode: in sjis 0x83 0x60
// is one character, whose trail byte is a backquote.
func TestReadHeadSessionMode(t *testing.T) {
	q := "INSERT INTO `t\x83`` VALUES (1)"
	h := ReadHead(q, Mode{Charset: SJIS})
	if h.Target.Table != "t\x83`" {
		t.Errorf("sjis: target %q, want %q", h.Target.Table, "t\x83`")
	}
}

func TestHeadWords(t *testing.T) {
	for _, tc := range []struct {
		q    string
		want string
	}{
		{"show warnings", "SHOW WARNINGS"},
		{"SHOW COUNT(*) WARNINGS; SELECT 1", "SHOW COUNT ( * ) WARNINGS"},
		{"/* c */ SHOW  WARNINGS LIMIT 1, 2, 3, 4, 5", "SHOW WARNINGS LIMIT 1 , 2 , 3"},
		{"", ""},
	} {
		if got := strings.Join(HeadWords(tc.q, Mode{}, 8), " "); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.q, got, tc.want)
		}
	}
}

// FuzzHeadWords: at most n words, each from the text.
func FuzzHeadWords(f *testing.F) {
	f.Add("SHOW COUNT(*) WARNINGS", 8)
	f.Add("'\\", 2)
	f.Fuzz(func(t *testing.T, q string, n int) {
		n %= 16
		words := HeadWords(q, Mode{}, n)
		if len(words) > max(n, 0) {
			t.Fatalf("%q: %d words, n = %d", q, len(words), n)
		}
		for _, w := range words {
			if !strings.Contains(strings.ToUpper(q), w) {
				t.Fatalf("%q: %q is not in it", q, w)
			}
		}
	})
}

// In a gbk session 0x81 0x5C is one character: the quote after it ends
// the string, and the function call is code, as the server reads it.
func TestTableRefsCharset(t *testing.T) {
	isT := func(n string) bool { return strings.EqualFold(n, "resource_groups") }
	q := "SELECT '\x81\\', f() -- '"
	if refs := TableRefs(q, Mode{Charset: GBK}, isT, "f", func() bool { return false }); len(refs) != 1 {
		t.Errorf("gbk: %d references, want 1", len(refs))
	}
	if refs := TableRefs(q, Mode{}, isT, "f", func() bool { return false }); len(refs) != 0 {
		t.Errorf("utf8mb4: %d references, want 0 (all in one string)", len(refs))
	}
	q = "SELECT * FROM information_schema.Resource_Groups g, resource_groups"
	asked := 0
	refs := TableRefs(q, Mode{}, isT, "f", func() bool { asked++; return true })
	if len(refs) != 2 || asked != 1 || refs[0].Table != "resource_groups" || !refs[0].Alias || refs[1].Alias {
		t.Errorf("%q: %+v (asked %d)", q, refs, asked)
	}
}

// FuzzTableRefs: spans are in order, inside the text and not empty, in
// any mode.
func FuzzTableRefs(f *testing.F) {
	for _, s := range []string{"SELECT * FROM information_schema.resource_groups g", "SELECT f()",
		"SELECT * FROM resource_groups, t", "SELECT (information_schema.resource_groups.x", "SELECT '\x81\\', f() -- '"} {
		f.Add(s, uint8(0), false)
		f.Add(s, uint8(GBK), true)
	}
	isT := func(n string) bool { return strings.EqualFold(n, "resource_groups") }
	f.Fuzz(func(t *testing.T, q string, cs uint8, nbe bool) {
		m := Mode{Charset: Charset(cs % uint8(GB18030+1)), NoBackslashEscapes: nbe}
		last := 0
		for _, r := range TableRefs(q, m, isT, "f", func() bool { return true }) {
			if r.Start < last || r.End > len(q) || r.Start >= r.End {
				t.Fatalf("%q: bad span %+v", q, r)
			}
			last = r.End
		}
	})
}

func TestFirstStatementLen(t *testing.T) {
	for _, tc := range []struct {
		q    string
		want string
	}{
		{"SELECT 1; SELECT 2", "SELECT 1;"},
		{"SELECT ';'; SELECT 2", "SELECT ';';"},
		{"SELECT 1 /* ; */ ; SELECT 2", "SELECT 1 /* ; */ ;"},
		{" ; ;SELECT 1;SELECT 2", " ; ;SELECT 1;"},
		{"SELECT 1", "SELECT 1"},
		{"SELECT 'a\\';' ; SELECT 2", "SELECT 'a\\';' ;"}, // the string is a';
	} {
		if got := tc.q[:FirstStatementLen([]byte(tc.q), Mode{})]; got != tc.want {
			t.Errorf("%q: %q, want %q", tc.q, got, tc.want)
		}
	}
}
