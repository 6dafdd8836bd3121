package rgpolicy

import (
	"context"
	"strings"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/sqlscan"
)

func TestRewriteVirtual(t *testing.T) {
	name := func(s string) *string { return &s }
	table := func(string) (*vtable, error) {
		return &vtable{cols: []vcol{{name: "NAME"}, {name: "N", numeric: true}},
			rows: [][]*string{{name("a'b"), name("1")}, {name(`c\d`), nil}}}, nil
	}
	// a'b is 61 27 62, c\d is 63 5c 64: hex, whatever the quotes and backslashes.
	const derived = "(SELECT _utf8mb4 X'612762' AS `NAME`, 1 AS `N` UNION ALL SELECT _utf8mb4 X'635c64', NULL)"
	const rg1 = "_utf8mb4 X'726731'"
	tests := []struct {
		q, want string
		inIS    bool
	}{
		{q: "SELECT 1"},
		{q: "SELECT * FROM information_schema.resource_groups",
			want: "SELECT * FROM " + derived + " AS `resource_groups`"},
		{q: "select name from INFORMATION_SCHEMA.`Resource_Groups` g where name like 'a%'",
			want: "select name from " + derived + " g where name like 'a%'"},
		{q: "SELECT COUNT(*) FROM information_schema.resource_groups AS g JOIN t ON t.n = g.name ORDER BY 1",
			want: "SELECT COUNT(*) FROM " + derived + " AS g JOIN t ON t.n = g.name ORDER BY 1"},
		{q: "SELECT information_schema.resource_groups.NAME FROM information_schema.resource_groups",
			want: "SELECT `resource_groups`.NAME FROM " + derived + " AS `resource_groups`"},
		{q: "SELECT * FROM resource_groups WHERE NAME IN ('a', 'b')", inIS: true,
			want: "SELECT * FROM " + derived + " AS `resource_groups` WHERE NAME IN ('a', 'b')"},
		{q: "SELECT * FROM resource_groups"},                     // another database's table
		{q: "SELECT * FROM mydb.resource_groups", inIS: true},    // qualified by another database
		{q: "SELECT resource_groups FROM t", inIS: true},         // a column
		{q: "SELECT 'information_schema.resource_groups'"},       // a string
		{q: "SELECT 1 /* information_schema.resource_groups */"}, // a comment
		{q: "SELECT * FROM t, runaway_watches w", inIS: true,
			want: "SELECT * FROM t, " + derived + " w"},
		{q: "SELECT CURRENT_RESOURCE_GROUP()", want: "SELECT " + rg1 + " AS `CURRENT_RESOURCE_GROUP()`"},
		{q: "SELECT current_resource_group() AS g", want: "SELECT " + rg1 + " AS g"},
		{q: "SELECT current_resource_group() g, 1", want: "SELECT " + rg1 + " g, 1"},
		{q: "SELECT 1, current_resource_group(), 2", want: "SELECT 1, " + rg1 + " AS `current_resource_group()`, 2"},
		{q: "SELECT * FROM t WHERE g = CURRENT_RESOURCE_GROUP()", want: "SELECT * FROM t WHERE g = " + rg1},
		{q: "SELECT CURRENT_RESOURCE_GROUP( /* ` */ )", want: "SELECT " + rg1 + " AS `CURRENT_RESOURCE_GROUP()`"},
		{q: "SELECT /*!50000 CURRENT_RESOURCE_GROUP() */", want: "SELECT /*!50000 " + rg1 + " AS `CURRENT_RESOURCE_GROUP()` */"},
	}
	for _, tc := range tests {
		asked := 0
		refs := findVirtual(tc.q, sqlscan.Mode{}, func() bool { asked++; return tc.inIS })
		if asked > 1 {
			t.Errorf("%q: the current database was asked %d times", tc.q, asked)
		}
		if tc.want == "" {
			if refs != nil {
				t.Errorf("%q: references found: %+v", tc.q, refs)
			}
			continue
		}
		got, err := rewriteVirtual(tc.q, false, refs, "rg1", table)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.q, got, tc.want)
		}
	}
}

func TestDerivedTableEmpty(t *testing.T) {
	empty := derivedTable(&vtable{cols: []vcol{{name: "A"}, {name: "B", numeric: true}}})
	if want := "(SELECT _utf8mb4 X'' AS `A`, CAST(NULL AS DECIMAL(65,6)) AS `B` FROM DUAL WHERE FALSE)"; empty != want {
		t.Fatalf("empty table %s", empty)
	}
}

// sqlText writes every byte of a value as hex: no quote, backslash or
// multi-byte lead byte of any character set reaches the backend's lexer,
// and the SQL mode does not matter.
func TestSQLText(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "_utf8mb4 X''"},
		{"rg1", "_utf8mb4 X'726731'"},
		{`x\'y`, "_utf8mb4 X'785c2779'"},
		{"中\\' AS x) t; GRANT ALL ON *.* TO a; #", "_utf8mb4 X'e4b8ad5c2720415320782920743b204752414e5420414c4c204f4e202a2e2a20544f20613b2023'"},
		{"\xbf\x5c\x27", "_utf8mb4 X'efbfbd5c27'"}, // not UTF-8: U+FFFD, so the backend never refuses it (1300)
		{"a\x00b", "_utf8mb4 X'610062'"},
	}
	for _, tt := range tests {
		got := sqlText(tt.in)
		if got != tt.want {
			t.Errorf("sqlText(%q) = %s, want %s", tt.in, got, tt.want)
		}
		if strings.ContainsAny(got[len("_utf8mb4 X'"):len(got)-1], "'\\`\"") {
			t.Errorf("sqlText(%q) = %s holds a quote or backslash", tt.in, got)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"12", "12"}, {"-3.5", "-3.5"}, {"0.000000", "0.000000"}, {"18446744073709551615", "18446744073709551615"},
		{"NaN", "NULL"}, {"Inf", "NULL"}, {"1e5", "NULL"}, {"", "NULL"}, {"-", "NULL"}, {"1.", "NULL"}, {".5", "NULL"},
		{"1.2.3", "NULL"}, {"12abc", "NULL"}, {"1; DROP", "NULL"}, {"0x10", "NULL"}, {"1_000", "NULL"}, {"--1", "NULL"},
	} {
		if got := sqlNumber(tt.in); got != tt.want {
			t.Errorf("sqlNumber(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// In a gbk session 0x81 0x5C is one character: the quote after it ends
// the string, and CURRENT_RESOURCE_GROUP() is code, as the server reads it.
func TestFindVirtualCharset(t *testing.T) {
	q := "SELECT '\x81\\', CURRENT_RESOURCE_GROUP() -- '"
	if refs := findVirtual(q, sqlscan.Mode{Charset: sqlscan.GBK}, func() bool { return false }); len(refs) != 1 {
		t.Errorf("gbk: %d references, want 1", len(refs))
	}
	if refs := findVirtual(q, sqlscan.Mode{}, func() bool { return false }); len(refs) != 0 {
		t.Errorf("utf8mb4: %d references, want 0 (all in one string)", len(refs))
	}
	q = "SELECT 1 AS `\x81`, CURRENT_RESOURCE_GROUP() -- `"
	if refs := findVirtual(q, sqlscan.Mode{Charset: sqlscan.GBK}, func() bool { return false }); len(refs) != 0 {
		t.Errorf("gbk: %d references in a backquoted name, want 0", len(refs))
	}
}

func FuzzFindVirtual(f *testing.F) {
	for _, s := range []string{"SELECT * FROM information_schema.resource_groups g", "SELECT CURRENT_RESOURCE_GROUP()",
		"SELECT * FROM resource_groups, runaway_watches", "SELECT (information_schema.statements_summary.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		refs := findVirtual(q, sqlscan.Mode{}, func() bool { return true })
		last := 0
		for _, r := range refs {
			if r.Start < last || r.End > len(q) || r.Start >= r.End {
				t.Fatalf("%q: bad span %+v", q, r)
			}
			last = r.End
		}
		if _, err := rewriteVirtual(q, false, refs, "g", func(string) (*vtable, error) { return &vtable{cols: []vcol{{name: "A"}}}, nil }); err != nil {
			t.Fatal(err)
		}
	})
}

// Every virtual table refuses COM_STMT_PREPARE (1295): a prepared
// statement would keep a stale copy of its rows.
func TestVirtualTablesRefusePrepare(t *testing.T) {
	s := newTestPolicy(testGroups()).Open(mysqlproto.SessionInfo{User: "root"})
	for _, q := range []string{"SELECT * FROM information_schema.statements_summary",
		"SELECT * FROM information_schema.resource_group_bindings WHERE USER = ?",
		"SELECT COUNT(*) FROM information_schema.resource_groups WHERE NAME LIKE ?"} {
		st := query(q)
		st.Command = mysql.COM_STMT_PREPARE
		if v := s.Before(context.Background(), st, superGrants); v.Reply == nil || v.Reply.Err == nil || v.Reply.Err.Code != 1295 {
			t.Errorf("PREPARE %s: %+v, want 1295", q, v.Reply)
		}
	}
}
