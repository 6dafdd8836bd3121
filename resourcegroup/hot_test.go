package resourcegroup

import (
	"testing"

	"github.com/go-mysql-org/go-mysql/mysql"

	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/sqltext"
)

// hintOf is what the proxy does with a COM_QUERY: mysqlproto's single pass
// finds the hint comment's body, HintGroup reads the group from it.
func hintOf(t testing.TB, q string) (string, bool) {
	st := mysqlproto.Statement{Command: mysql.COM_QUERY, Query: q}
	if err := mysqlproto.ScanStatement(&st, nil); err != nil {
		t.Fatal(err)
	}
	if st.Scan.Hint == "" {
		return "", false
	}
	return HintGroup(st.Scan.Hint, sqltext.Mode{})
}

func TestIsAdmin(t *testing.T) {
	tests := []struct {
		q    string
		want bool
	}{
		{"CREATE RESOURCE GROUP x RU_PER_SEC=1", true},
		{"  \n\t/* hi */ -- c\n # h\n create resource group x", true},
		{"DROP RESOURCE GROUP x", true},
		{"ALTER RESOURCE GROUP x RU_PER_SEC=1", true},
		{"ALTER USER 'app'@'%' RESOURCE GROUP rg1", true},
		{"alter user app resource /* c */ group rg1", true},
		{"ALTER USER 'app'@'%' IDENTIFIED BY 'RESOURCE GROUP'", false},
		{"ALTER USER app IDENTIFIED BY 'x' ACCOUNT LOCK", false},
		{"ALTER USER app IDENTIFIED BY \"it\\\"s RESOURCE GROUP\"", false},
		{"ALTER USER `resource` group", false},
		{"ALTER TABLE t ADD COLUMN resource INT", false},
		{"SET RESOURCE GROUP rg1", true},
		{"SET NAMES utf8mb4", false},
		{"SET @resource = 1", false},
		{"SHOW CREATE RESOURCE GROUP rg1", true},
		{"SHOW CREATE TABLE t", false},
		{"SHOW RESOURCE GROUP USAGE", true},
		{"SHOW CLUSTER RESOURCE GROUP USAGE", true},
		{"SHOW CLUSTER STATUS", false},
		{"SHOW LAST STATEMENT RU", true},
		{"SHOW TABLES", false},
		{"SHOW", false},
		{"QUERY WATCH REMOVE 1", true},
		{"SELECT CURRENT_RESOURCE_GROUP()", true},
		{"select * from information_schema.resource_groups", true},
		{"select * from `INFORMATION_SCHEMA`.`RESOURCE_GROUPS`", true},
		{"select * from information_schema . runaway_watches", true},
		{"select * from t where x in (select name from information_schema.resource_groups)", true},
		{"select * from information_schema.tables", false},
		{"select 'information_schema.resource_groups'", false},
		{"select information_schema, resource_groups", false},
		{"select 1 -- information_schema.resource_groups", false},
		{"SELECT 1", false},
		{"INSERT INTO t VALUES (1)", false},
		{"/*!40101 SET RESOURCE GROUP x */", false},
		{"/* unterminated", false},
		{"", false},
		{"CREATE TABLE resource (a int)", false},
		{"CREATE", false},
		{"select * from information_schema.`resource_groups", false},
		{"select 'unterminated", false},
		{"ſet resource group x", false},
		{"select * from information_schema.reſource_groups", false},
		{"SELECT * FROM INFORMATION_SCHEMA.RUNAWAY_WATCHES", true},
		{"select `information_schema`.`resource_groups`.name from x", true},
	}
	for _, tt := range tests {
		if got := IsAdmin(tt.q, sqltext.Mode{}); got != tt.want {
			t.Errorf("IsAdmin(%q) = %v, want %v", tt.q, got, tt.want)
		}
	}
}

// In a gbk session 0x81 0x5C is one character: the string ends after it,
// and what follows is code, as the server reads it; byte by byte the
// backslash escapes the quote and it is all one string.
func TestIsAdminCharset(t *testing.T) {
	q := "ALTER USER app IDENTIFIED BY '\x81\\' RESOURCE GROUP rg1 -- '"
	if !IsAdmin(q, sqltext.Mode{Charset: sqltext.GBK}) {
		t.Errorf("IsAdmin(%q) in gbk = false", q)
	}
	if IsAdmin(q, sqltext.Mode{}) {
		t.Errorf("IsAdmin(%q) in utf8mb4 = true", q)
	}
	st, err := Parse("SELECT * FROM information_schema.resource_groups WHERE NAME = '\x81\\'", sqltext.Mode{Charset: sqltext.GBK})
	if err != nil || st.(*SelectGroups).Name != NormalizeName("\x81\\") {
		t.Errorf("Parse in gbk = %#v, %v", st, err)
	}
	if _, err := Parse("SELECT * FROM information_schema.resource_groups WHERE NAME = '\x81\\'", sqltext.Mode{}); err == nil {
		t.Error("Parse in utf8mb4 accepted an unterminated string")
	}
}

// The hint as TiDB reads it: right after the first keyword of SELECT,
// INSERT, UPDATE, DELETE or REPLACE; the last RESOURCE_GROUP wins.
func TestHint(t *testing.T) {
	tests := []struct {
		q    string
		want string
		ok   bool
	}{
		{"SELECT /*+ RESOURCE_GROUP(rg1) */ * FROM t", "rg1", true},
		{"select /*+ resource_group(RG1) */ 1", "rg1", true},
		{"  /* c */ INSERT\n/*+ MAX_EXECUTION_TIME(10) resource_group( `My G` ) */ INTO t VALUES (1)", "my g", true},
		{"UPDATE /*+resource_group(a) resource_group(b)*/ t SET a=1", "b", true},
		{"DELETE /*+ RESOURCE_GROUP(x) */ FROM t", "x", true},
		{"REPLACE /*+ RESOURCE_GROUP(x) */ INTO t VALUES (1)", "x", true},
		{"SELECT /*+ RESOURCE_GROUP(ÉTÉ) */ 1", "été", true},
		{"SELECT /*+ QB_NAME('resource_group(x)') RESOURCE_GROUP(y) */ 1", "y", true},
		{"SELECT /*+ RESOURCE_GROUP x */ 1", "", false},
		{"SELECT /*+ RESOURCE_GROUP(x */ 1", "", false},
		{"SELECT /*+ RESOURCE_GROUP() */ 1", "", false},
		{"SELECT /*+ XRESOURCE_GROUP(x) */ 1", "", false},
		{"SELECT /* RESOURCE_GROUP(x) */ 1", "", false},
		{"SELECT 1 /*+ RESOURCE_GROUP(x) */", "", false},
		{"/*+ RESOURCE_GROUP(x) */ SELECT 1", "", false},
		{"SET /*+ RESOURCE_GROUP(x) */ a=1", "", false},
		{"SELECT /*+ RESOURCE_GROUP(x)", "", false},
		{"SELECT", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, ok := hintOf(t, tt.q)
		if got != tt.want || ok != tt.ok {
			t.Errorf("hint of %q = %q, %v; want %q, %v", tt.q, got, ok, tt.want, tt.ok)
		}
	}
}

func TestHotPathAllocations(t *testing.T) {
	queries := []string{
		"SELECT * FROM t WHERE id = 1",
		"/* app */ INSERT INTO t VALUES (1, 'x')",
		"ALTER USER app IDENTIFIED BY 'secret'",
		"SELECT * FROM information_schema.resource_groups",
		"CREATE RESOURCE GROUP x RU_PER_SEC=1",
		"select /*+ resource_group(rg1) */ 1",
	}
	for _, q := range queries {
		if n := testing.AllocsPerRun(100, func() { IsAdmin(q, sqltext.Mode{}) }); n != 0 {
			t.Errorf("IsAdmin(%q) allocates %v times", q, n)
		}
	}
	for _, body := range []string{" resource_group(rg1) ", " MAX_EXECUTION_TIME(10) ", ""} {
		if n := testing.AllocsPerRun(100, func() { HintGroup(body, sqltext.Mode{}) }); n != 0 {
			t.Errorf("HintGroup(%q) allocates %v times", body, n)
		}
	}
}

func BenchmarkIsAdmin(b *testing.B) {
	q := "/* app=web */ SELECT id, name, email FROM users WHERE id = 42 AND status = 'active'"
	b.ReportAllocs()
	for b.Loop() {
		IsAdmin(q, sqltext.Mode{})
	}
}

func BenchmarkHintGroup(b *testing.B) {
	body := " RESOURCE_GROUP(rg1) "
	b.ReportAllocs()
	for b.Loop() {
		HintGroup(body, sqltext.Mode{})
	}
}
