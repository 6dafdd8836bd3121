package rgpolicy

import (
	"context"
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/sqltext"
)

func TestRewriteVirtual(t *testing.T) {
	name := func(s string) *string { return &s }
	table := func(string) (*vtable, error) {
		return &vtable{cols: []vcol{{name: "NAME"}, {name: "N", numeric: true}},
			rows: [][]*string{{name("a'b"), name("1")}, {name(`c\d`), nil}}}, nil
	}
	const derived = "(SELECT 'a''b' AS `NAME`, 1 AS `N` UNION ALL SELECT 'c\\\\d', NULL)"
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
		{q: "SELECT CURRENT_RESOURCE_GROUP()", want: "SELECT 'rg1' AS `CURRENT_RESOURCE_GROUP()`"},
		{q: "SELECT current_resource_group() AS g", want: "SELECT 'rg1' AS g"},
		{q: "SELECT current_resource_group() g, 1", want: "SELECT 'rg1' g, 1"},
		{q: "SELECT 1, current_resource_group(), 2", want: "SELECT 1, 'rg1' AS `current_resource_group()`, 2"},
		{q: "SELECT * FROM t WHERE g = CURRENT_RESOURCE_GROUP()", want: "SELECT * FROM t WHERE g = 'rg1'"},
		{q: "SELECT /*!50000 CURRENT_RESOURCE_GROUP() */", want: "SELECT /*!50000 'rg1' AS `CURRENT_RESOURCE_GROUP()` */"},
	}
	for _, tc := range tests {
		asked := 0
		refs := findVirtual(tc.q, sqltext.Mode{}, func() bool { asked++; return tc.inIS })
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

func TestDerivedTableEmptyAndNoBackslashEscapes(t *testing.T) {
	empty := derivedTable(&vtable{cols: []vcol{{name: "A"}, {name: "B", numeric: true}}}, false)
	if want := "(SELECT CAST(NULL AS CHAR) AS `A`, CAST(NULL AS DECIMAL(65,6)) AS `B` FROM DUAL WHERE FALSE)"; empty != want {
		t.Fatalf("empty table %s", empty)
	}
	v := `x\'y`
	if got := derivedTable(&vtable{cols: []vcol{{name: "A"}}, rows: [][]*string{{&v}}}, true); got != "(SELECT 'x\\''y' AS `A`)" {
		t.Fatalf("NO_BACKSLASH_ESCAPES: %s", got)
	}
	n := "12abc"
	if got := derivedTable(&vtable{cols: []vcol{{name: "N", numeric: true}}, rows: [][]*string{{&n}}}, false); got != "(SELECT NULL AS `N`)" {
		t.Fatalf("a non-number in a numeric column: %s", got)
	}
}

// In a gbk session 0x81 0x5C is one character: the quote after it ends
// the string, and CURRENT_RESOURCE_GROUP() is code, as the server reads it.
func TestFindVirtualCharset(t *testing.T) {
	q := "SELECT '\x81\\', CURRENT_RESOURCE_GROUP() -- '"
	if refs := findVirtual(q, sqltext.Mode{Charset: sqltext.GBK}, func() bool { return false }); len(refs) != 1 {
		t.Errorf("gbk: %d references, want 1", len(refs))
	}
	if refs := findVirtual(q, sqltext.Mode{}, func() bool { return false }); len(refs) != 0 {
		t.Errorf("utf8mb4: %d references, want 0 (all in one string)", len(refs))
	}
	q = "SELECT 1 AS `\x81`, CURRENT_RESOURCE_GROUP() -- `"
	if refs := findVirtual(q, sqltext.Mode{Charset: sqltext.GBK}, func() bool { return false }); len(refs) != 0 {
		t.Errorf("gbk: %d references in a backquoted name, want 0", len(refs))
	}
}

func FuzzFindVirtual(f *testing.F) {
	for _, s := range []string{"SELECT * FROM information_schema.resource_groups g", "SELECT CURRENT_RESOURCE_GROUP()",
		"SELECT * FROM resource_groups, runaway_watches", "SELECT (information_schema.statements_summary.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		refs := findVirtual(q, sqltext.Mode{}, func() bool { return true })
		last := 0
		for _, r := range refs {
			if r.start < last || r.end > len(q) || r.start >= r.end {
				t.Fatalf("%q: bad span %+v", q, r)
			}
			last = r.end
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
