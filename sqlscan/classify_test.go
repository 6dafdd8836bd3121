package sqlscan

import (
	"bytes"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/threadcpu"
	"github.com/rgproxy/rgproxy/sqltext"
)

func TestClassifyQuery(t *testing.T) {
	const (
		R = ClassRead
		W = ClassWrite
		O = ClassOther
	)
	tests := []struct {
		q     string
		class Class
		multi bool
	}{
		// Reads.
		{"SELECT 1", R, false},
		{"select * from t", R, false},
		{"SeLeCt 1", R, false},
		{"  \t\n SELECT 1", R, false},
		{"SHOW TABLES", R, false},
		{"show create table t", R, false},
		{"DESCRIBE t", R, false},
		{"desc t", R, false},
		{"EXPLAIN SELECT * FROM t", R, false},
		{"EXPLAIN UPDATE t SET a = 1", R, false},
		{"EXPLAIN FORMAT=JSON DELETE FROM t", R, false},
		{"TABLE t", R, false},
		{"VALUES ROW(1, 2)", R, false},
		{"VALUES (1), (2)", R, false},
		{"HELP 'select'", R, false},
		{"CHECKSUM TABLE t", R, false},
		{"CHECK TABLE t", R, false},
		{"(SELECT 1) UNION (SELECT 2)", R, false},
		{"((SELECT 1))", R, false},
		{"( ( select 1 ) )", R, false},
		{"SELECT * FROM t FOR UPDATE", R, false},
		{"SELECT * INTO OUTFILE '/tmp/x' FROM t", R, false},
		{"SELECT a INTO @x FROM t", R, false},
		{"WITH x AS (SELECT 1) SELECT * FROM x", R, false},
		{"with recursive a (n) as (select 1 union all select n+1 from a where n < 5), b as (select 2) select * from a, b", R, false},
		{"WITH x AS (SELECT 1) (SELECT * FROM x)", R, false},
		{"WITH x AS (SELECT 1) TABLE x", R, false},
		{"WITH x AS (WITH y AS (SELECT 1) SELECT * FROM y) SELECT * FROM x", R, false},
		{"WITH a AS (SELECT ')' AS p), b AS (SELECT 'UPDATE') SELECT * FROM a", R, false},
		{"WITH `update` AS (SELECT 1) SELECT * FROM `update`", R, false},
		{"EXPLAIN ANALYZE SELECT 1", R, false},
		{"ANALYZE SELECT 1", R, false},
		{"SELECT 1--1", R, false},
		{"SELECT ';'", R, false},
		{"SELECT '--', \"#\", `;`", R, false},
		{"SELECT 'it''s; ok'", R, false},
		{"SELECT 'a\\'; INSERT'", R, false},
		{"SELECT \"a\"\";DELETE\"", R, false},
		{"SELECT `a``;DELETE` FROM t", R, false},
		{"SELECT /* ; INSERT */ 1", R, false},
		{"SELECT /*+ MAX_EXECUTION_TIME(1) */ 1", R, false},
		{"/*+ hint */ SELECT 1", R, false},
		{"select 1;", R, false},
		{"select 1;  \n -- done\n", R, false},
		{"select 1; /* trailing */ ", R, false},
		{"select 1;;;", R, false},
		{";select 1", R, false},
		{"-- comment\nSELECT 1", R, false},
		{"--\tcomment\nSELECT 1", R, false},
		{"# comment\nSELECT 1", R, false},
		{"/* c */ SELECT 1", R, false},
		{"/**/SELECT 1", R, false},
		{"/*!SELECT*/ 1", R, false},
		{"/*!40101 SELECT 1 */", R, false},
		{"/*!SELECT 1; SELECT 2*/", R, true},

		// Writes.
		{"INSERT INTO t VALUES (1)", W, false},
		{"insert into t select * from u", W, false},
		{"UPDATE t SET a = 1", W, false},
		{"DELETE FROM t", W, false},
		{"REPLACE INTO t VALUES (1)", W, false},
		{"LOAD DATA LOCAL INFILE 'f' INTO TABLE t", W, false},
		{"LOAD XML INFILE 'f' INTO TABLE t", W, false},
		{"CREATE TABLE t (a INT)", W, false},
		{"ALTER TABLE t ADD b INT", W, false},
		{"DROP TABLE t", W, false},
		{"TRUNCATE t", W, false},
		{"RENAME TABLE a TO b", W, false},
		{"GRANT SELECT ON *.* TO u", W, false},
		{"REVOKE SELECT ON *.* FROM u", W, false},
		{"COMMIT", W, false},
		{"commit work", W, false},
		{"COMMIT;", W, false},
		{"XA COMMIT 'x'", W, false},
		{"CALL p(1)", W, false},
		{"OPTIMIZE TABLE t", W, false},
		{"REPAIR TABLE t", W, false},
		{"ANALYZE TABLE t", W, false},
		{"ANALYZE NO_WRITE_TO_BINLOG TABLE t", W, false},
		{"ANALYZE LOCAL TABLE t", W, false},
		{"ANALYZE FORMAT=JSON UPDATE t SET a = 1", W, false},
		{"EXPLAIN ANALYZE DELETE FROM t", W, false},
		{"DESC ANALYZE DELETE FROM t", W, false},
		{"describe analyze select 1", R, false},
		{"EXPLAIN ANALYZE FORMAT=TREE UPDATE t SET a=1", W, false},
		{"IMPORT TABLE FROM '/x.sdi'", W, false},
		{"BINLOG 'AAAA'", W, false},
		{"WITH x AS (SELECT 1) DELETE FROM t WHERE a IN (SELECT * FROM x)", W, false},
		{"WITH x AS (SELECT 1) UPDATE t, x SET t.a = 1", W, false},
		{"WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", W, false},
		{"WITH RECURSIVE x(n) AS (SELECT 1) REPLACE INTO t SELECT * FROM x", W, false},
		{"/*M!100100 INSERT INTO t VALUES (1) */", W, false},
		{"/*M! DELETE FROM t */", W, false},
		{"/*!50100 UPDATE t SET a=1*/", W, false},
		{"(INSERT INTO t VALUES (1))", W, false},
		{"-- x\n# y\n/* z */ DELETE FROM t", W, false},

		// Other.
		{"", O, false},
		{"   ", O, false},
		{";", O, false},
		{"-- only a comment", O, false},
		{"/* only a comment */", O, false},
		{"/*!40101 SET NAMES utf8 */", O, false},
		{"/*!40101 SET @OLD_CHARACTER_SET_CLIENT=@@CHARACTER_SET_CLIENT */;", O, false},
		{"BEGIN", O, false},
		{"begin work", O, false},
		{"START TRANSACTION READ ONLY", O, false},
		{"SET autocommit = 0", O, false},
		{"SET NAMES utf8mb4", O, false},
		{"USE db", O, false},
		{"PREPARE s FROM 'INSERT INTO t VALUES (?)'", O, false},
		{"EXECUTE s USING @a", O, false},
		{"DEALLOCATE PREPARE s", O, false},
		{"DROP PREPARE s", O, false},
		{"ROLLBACK", O, false},
		{"ROLLBACK TO SAVEPOINT a", O, false},
		{"SAVEPOINT a", O, false},
		{"RELEASE SAVEPOINT a", O, false},
		{"LOCK TABLES t WRITE", O, false},
		{"UNLOCK TABLES", O, false},
		{"DO SLEEP(1)", O, false},
		{"FLUSH PRIVILEGES", O, false},
		{"KILL QUERY 12", O, false},
		{"XA START 'x'", O, false},
		{"XA ROLLBACK 'x'", O, false},
		{"HANDLER t READ FIRST", O, false},
		{"INSTALL PLUGIN x SONAME 'x.so'", O, false},
		{"LOAD INDEX INTO CACHE t", O, false},
		{"FOO BAR", O, false},
		{"`select` 1", O, false},
		{"'SELECT 1'", O, false},
		{"1", O, false},
		{"WITH", O, false},
		{"WITH x AS (SELECT 1)", O, false},
		{"--1\nSELECT 1", O, false}, // "--1" is not a comment: "-" starts the text

		// Multi-statements.
		{"SELECT 1; INSERT INTO t VALUES (1)", W, true},
		{"SELECT 1; SELECT 2", R, true},
		{"SET a = 1; SELECT 2", R, true},
		{"SET a = 1; USE b", O, true},
		{"BEGIN; UPDATE t SET a = 1; COMMIT", W, true},
		{"select 1 ; select 2 ;", R, true},
		{"select 1;\n-- x\nselect 2", R, true},
		{"SELECT 1;/*!40101 DELETE FROM t */", W, true},
		{"SELECT 1;;SELECT 2", R, true},
		{"SELECT 'a;b'; SELECT \"c;d\"", R, true},

		// Stored programs and compound statements.
		{"CREATE PROCEDURE p() BEGIN SELECT 1; SELECT 2; END", W, false},
		{"CREATE DEFINER=`root`@`localhost` PROCEDURE p() BEGIN IF a THEN SELECT 1; END IF; END", W, false},
		{"CREATE DEFINER='root'@'%' FUNCTION f() RETURNS INT BEGIN DECLARE x INT; SET x = IF(1, 2, 3); RETURN x; END", W, false},
		{"CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW BEGIN SET NEW.a = 1; END; SELECT 1", W, true},
		{"CREATE PROCEDURE p() BEGIN WHILE a < 3 DO SET a = a + 1; END WHILE; REPEAT SET a = 1; UNTIL a END REPEAT; l: LOOP LEAVE l; END LOOP; END", W, false},
		{"CREATE PROCEDURE p() BEGIN IF (a > 0) THEN SELECT 1; END IF; SELECT CASE WHEN a THEN 1 END; END", W, false},
		{"CREATE PROCEDURE p() BEGIN DROP TABLE IF EXISTS t; SELECT REPEAT('a', 3); END", W, false},
		{"CREATE PROCEDURE p() BEGIN FOR i IN 1..3 DO SELECT i; END FOR; END", W, false},
		{"CREATE EVENT e ON SCHEDULE EVERY 1 DAY DO BEGIN DELETE FROM t; END", W, false},
		{"CREATE PROCEDURE p() SELECT 1; SELECT 2", W, true},
		{"CREATE TABLE event (a INT); SELECT 1", W, true},
		{"CREATE TABLE IF NOT EXISTS t (a INT); SELECT 1", W, true},
		{"BEGIN NOT ATOMIC SELECT 1; SELECT 2; END", W, false},
		{"BEGIN NOT ATOMIC SELECT 1; END; SELECT 2", W, true},
		{"IF @a = 1 THEN SELECT 1; END IF", W, false},
		{"FOR i IN 1..3 DO INSERT INTO t VALUES (i); END FOR", W, false},

		// What drivers, ORMs and dump files send.
		{"/* mysql-connector-j-8.0.33 */SELECT  @@session.auto_increment_increment AS auto_increment_increment, @@character_set_client AS character_set_client", R, false},
		{"SELECT @@version_comment LIMIT 1", R, false},
		{"SHOW WARNINGS", R, false},
		{"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", O, false},
		{"/*!40101 SET @saved_cs_client     = @@character_set_client */;", O, false},
		{"/*!50003 CREATE*/ /*!50020 DEFINER=`root`@`localhost`*/ /*!50003 TRIGGER tr BEFORE INSERT ON t FOR EACH ROW BEGIN SET NEW.a = 1; END */;", W, false},
		{"INSERT INTO `t` (`a`,`b`) VALUES (1,'x'),(2,'y') ON DUPLICATE KEY UPDATE `b`=VALUES(`b`)", W, false},
		{"SELECT `t0`.`id` FROM `users` AS `t0` WHERE (`t0`.`id` = ?) LIMIT 1", R, false},
		{"SET STATEMENT max_statement_time = 1 FOR DELETE FROM t", W, false},
		{"set statement a = 1, b = (2) for select 1", R, false},
		{"SET STATEMENT a = 'FOR' FOR (SELECT 1)", R, false},
		{"SET STATEMENT a = 1", O, false},
		{"SET STATEMENT a = 1 FOR SET STATEMENT b = 2 FOR DELETE FROM t", O, false},
		{"(", O, false},
		{"(; SELECT 1", R, true},
		{"((;", O, false},
	}
	for _, tt := range tests {
		class, multi := ClassifyQuery([]byte(tt.q))
		if class != tt.class || multi != tt.multi {
			t.Errorf("ClassifyQuery(%q) = %v, %v; want %v, %v", tt.q, class, multi, tt.class, tt.multi)
		}
	}
	if len(tests) < 80 {
		t.Fatalf("only %d cases", len(tests))
	}
}

func TestClassifyQueryMode(t *testing.T) {
	tests := []struct {
		q     string
		nbe   bool
		class Class
		multi bool
	}{
		{`SELECT 'a\'; DELETE FROM t; -- '`, false, ClassRead, false},
		{`SELECT 'a\'; DELETE FROM t; -- '`, true, ClassWrite, true},
		{`SELECT "a\"; UPDATE t SET a = 1`, true, ClassWrite, true},
		{`SELECT N'a\'; INSERT INTO t VALUES (1)`, true, ClassWrite, true},
		{`SET @'a\' = 1; DROP TABLE t`, true, ClassWrite, true},
		{`SELECT 'a''b\'`, true, ClassRead, false},
		{"SELECT 1; SELECT 2", true, ClassRead, true},
	}
	for _, tt := range tests {
		class, multi := ClassifyQueryMode([]byte(tt.q), sqltext.Mode{NoBackslashEscapes: tt.nbe})
		if class != tt.class || multi != tt.multi {
			t.Errorf("ClassifyQueryMode(%q, %v) = %v, %v; want %v, %v", tt.q, tt.nbe, class, multi, tt.class, tt.multi)
		}
	}
}

// TestClassifyQueryPrefixSafe checks that a statement cut anywhere (as a
// truncated packet or a fuzz input might be) never panics.
func TestClassifyQueryPrefixSafe(t *testing.T) {
	q := []byte("/*!40101 WITH a AS (SELECT 'x;''\\'' `b``c` 0x1F x'0A' 1.5e-3 @v @@s.x) */ UPDATE t SET a = ? -- c\n; CREATE PROCEDURE p() BEGIN IF (a) THEN SELECT 1; END IF; END; #x")
	for i := range len(q) + 1 {
		ClassifyQuery(q[:i])
	}
}

// TestLinearTime guards against quadratic paths on hostile input. It does
// not time against a wall-clock budget (a loaded machine would fail it):
// it compares, in one run, the cost of n and 8n tokens of each input. A
// linear scan grows about 8x, a quadratic one about 64x.
//
// The cost is the thread's CPU time: with both cores busy, the wall time
// of the longer run also counts its waits for a CPU (it read 36x).
func TestLinearTime(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	patterns := []func(n int) string{
		func(n int) string { return "CREATE PROCEDURE p() BEGIN " + strings.Repeat("IF(", n) },
		func(n int) string { return "CREATE PROCEDURE p() BEGIN " + strings.Repeat("IF (a) THEN ", n) },
		func(n int) string { return strings.Repeat("WITH ", n) },
		func(n int) string { return "SELECT " + strings.Repeat("- ", n) + "x" },
		func(n int) string { return "SELECT " + strings.Repeat("a IN (1, 2, ", n) },
		func(n int) string { return "INSERT INTO t VALUES " + strings.Repeat("(1), ", n) + "(a)" },
		func(n int) string { return strings.Repeat("SET STATEMENT a = 1 FOR EXPLAIN ANALYZE ", n/8) },
		func(n int) string { return strings.Repeat("/*!12345 'x' ", n) },
	}
	cost := func(in []byte) time.Duration {
		best := time.Duration(1<<63 - 1)
		for range 3 {
			start, _ := threadcpu.Now()
			ClassifyQuery(in)
			Digest(in, sqltext.Mode{})
			end, _ := threadcpu.Now()
			best = min(best, end-start)
		}
		return max(best, time.Microsecond)
	}
	const n = 12500
	for _, p := range patterns {
		small, large := []byte(p(n)), []byte(p(8*n))
		if ratio := float64(cost(large)) / float64(cost(small)); ratio > 30 {
			t.Errorf("input %.40q...: 8x the input cost %.0fx the time (quadratic?)", large, ratio)
		}
	}
}

func TestClassifyQueryAllocs(t *testing.T) {
	inputs := []string{
		"SELECT * FROM t WHERE id = 1",
		"/*!40101 SET NAMES utf8 */",
		"WITH RECURSIVE a AS (SELECT 1), b AS (SELECT 2) UPDATE t SET x = 1",
		"SELECT 1; INSERT INTO t VALUES ('a;b'); COMMIT",
		"CREATE PROCEDURE p() BEGIN IF (a) THEN SELECT 1; END IF; END",
		"EXPLAIN ANALYZE FORMAT=TREE DELETE FROM t",
	}
	for _, in := range inputs {
		q := []byte(in)
		if n := testing.AllocsPerRun(100, func() { ClassifyQuery(q) }); n != 0 {
			t.Errorf("ClassifyQuery(%q) allocates %v times", in, n)
		}
	}
}

func TestLookupKW(t *testing.T) {
	tests := []struct {
		w    string
		want sqlKW
	}{
		{"select", kwSelect},
		{"SELECT", kwSelect},
		{"SeLeCt", kwSelect},
		{"selectx", kwNone},
		{"s", kwNone},
		{"no_write_to_binlog", kwNoWriteToBinlog},
		{"no_write_to_binlogx", kwNone},
		{"\xc3\xa9", kwNone},
	}
	for _, tt := range tests {
		if got := lookupKW([]byte(tt.w)); got != tt.want {
			t.Errorf("lookupKW(%q) = %v, want %v", tt.w, got, tt.want)
		}
	}
}

func BenchmarkClassifyQuery(b *testing.B) {
	q := []byte("/* app=web */ SELECT id, name FROM users WHERE id = 42 AND status IN ('a', 'b')")
	b.ReportAllocs()
	for b.Loop() {
		ClassifyQuery(q)
	}
}

// FuzzClassifyQuery checks that the classifier never panics and that its
// verdict is stable under changes that do not alter the statements:
// appending a ";" (a trailing empty statement) and prefixing a comment.
func FuzzClassifyQuery(f *testing.F) {
	for _, s := range []string{
		"SELECT 1", "select 1; insert into t values (1)", "/*!40101 SET x=1*/",
		"WITH a AS (SELECT 1) DELETE FROM t", "((SELECT 1))", "SELECT '--;' -- x",
		"CREATE PROCEDURE p() BEGIN SELECT 1; END", "/*M!100100 INSERT INTO t VALUES (1) */",
		"BEGIN NOT ATOMIC IF 1 THEN SELECT 1; END IF; END", "SELECT 1--1", "#",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		for _, nbe := range []bool{false, true} {
			checkClassifyInvariants(t, q, nbe)
			// FirstStatementLen cuts where SplitStatements' first part ends.
			m := sqltext.Mode{NoBackslashEscapes: nbe}
			n := FirstStatementLen(q, m)
			if n < 0 || n > len(q) {
				t.Fatalf("FirstStatementLen(%q) = %d", q, n)
			}
			all, first := SplitStatements(q, m), SplitStatements(q[:n], m)
			if len(all) > 0 && (len(first) != 1 || !bytes.Equal(first[0], all[0])) {
				t.Fatalf("FirstStatementLen(%q) = %d: %q, the first statement is %q", q, n, first, all[0])
			}
		}
	})
}

func checkClassifyInvariants(t *testing.T, q []byte, nbe bool) {
	class, multi := ClassifyQueryMode(q, sqltext.Mode{NoBackslashEscapes: nbe})
	if class != ClassRead && class != ClassWrite && class != ClassOther {
		t.Fatalf("ClassifyQueryMode(%q, %v) class %v", q, nbe, class)
	}
	// "--" at the very end is a comment; "--;" is not.
	if bytes.HasSuffix(q, []byte("--")) {
		return
	}
	q2 := append(bytes.Clone(q), ';')
	if c2, m2 := ClassifyQueryMode(q2, sqltext.Mode{NoBackslashEscapes: nbe}); c2 != class || m2 != multi {
		t.Fatalf("ClassifyQueryMode(%q, %v) = %v, %v but with ';' = %v, %v", q, nbe, class, multi, c2, m2)
	}
	q3 := append([]byte("/* x */ "), q...)
	if c3, m3 := ClassifyQueryMode(q3, sqltext.Mode{NoBackslashEscapes: nbe}); c3 != class || m3 != multi {
		t.Fatalf("ClassifyQueryMode(%q, %v) = %v, %v but with a comment before = %v, %v", q, nbe, class, multi, c3, m3)
	}
}

func TestSplitStatements(t *testing.T) {
	cases := []struct {
		q    string
		nbe  bool // NO_BACKSLASH_ESCAPES
		want []string
	}{
		{"SELECT 'a\\'; DROP RESOURCE GROUP g", true, []string{"SELECT 'a\\'", "DROP RESOURCE GROUP g"}},
		{"SELECT 'a\\'; DROP RESOURCE GROUP g", false, []string{"SELECT 'a\\'; DROP RESOURCE GROUP g"}},
		{"SELECT 1", false, []string{"SELECT 1"}},
		{"SELECT 1;", false, []string{"SELECT 1"}},
		{"SELECT 1; SELECT ';' ; ;  INSERT INTO t VALUES (1) ", false, []string{"SELECT 1", "SELECT ';'", "INSERT INTO t VALUES (1)"}},
		{"SELECT 1; CREATE RESOURCE GROUP rg RU_PER_SEC = 1", false, []string{"SELECT 1", "CREATE RESOURCE GROUP rg RU_PER_SEC = 1"}},
		{"SELECT 'a;b' /* ; */; -- x;\nSELECT 2", false, []string{"SELECT 'a;b' /* ; */", "-- x;\nSELECT 2"}},
		{"", false, nil},
	}
	for _, c := range cases {
		var got []string
		for _, p := range SplitStatements([]byte(c.q), sqltext.Mode{NoBackslashEscapes: c.nbe}) {
			got = append(got, string(p))
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("SplitStatements(%q) = %q, want %q", c.q, got, c.want)
		}
	}
}
