package sqlscan

import (
	"hash/fnv"
	"strings"
	"testing"

	"github.com/rgproxy/rgproxy/sqltext"
)

func TestDigest(t *testing.T) {
	tests := []struct {
		q, want string
	}{
		{"", ""},
		{"  ;  ; ", ""},
		{"SELECT 1", "SELECT ?"},
		{"select * from t where id=42", "SELECT * FROM t WHERE id = ?"},
		{"SELECT\n\t*  FROM t  WHERE id = 'x'", "SELECT * FROM t WHERE id = ?"},
		{"SELECT * FROM `t` WHERE `id` = \"x\"", "SELECT * FROM t WHERE id = ?"},
		{"SELECT * FROM T", "SELECT * FROM T"},
		{"SELECT 1.5, .5, 1e-3, 0x1F, 0b101, X'AB', b'01', N'x', _utf8mb4'y', ?", "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"},
		{"SELECT 'a' 'b' \"c\"", "SELECT ?"},
		{"SELECT 1 'a'", "SELECT ? ?"},
		{"SELECT NULL, TRUE, false", "SELECT NULL, TRUE, FALSE"},
		{"SELECT -1, +2, - - 3, a-1, a - -1, (-1)", "SELECT ?, ?, ?, a - ?, a - ?, (?)"},
		{"SELECT 1--1", "SELECT ? - ?"},
		{"SELECT 1 -- comment\n", "SELECT ?"},
		{"SELECT 1 # comment\n, 2", "SELECT ?, ?"},
		{"SELECT /* c */ 1 /*+ hint */", "SELECT ?"},
		{"/*!40101 SET NAMES utf8 */", "SET NAMES utf8"},
		{"/*M!100100 DELETE FROM t */;", "DELETE FROM t"},
		{"SELECT a FROM t WHERE b IN (1, 2, 3)", "SELECT a FROM t WHERE b IN (...)"},
		{"SELECT a FROM t WHERE b in(?,?)", "SELECT a FROM t WHERE b IN (...)"},
		{"SELECT a FROM t WHERE b NOT IN ('x', NULL, -1)", "SELECT a FROM t WHERE b NOT IN (...)"},
		{"SELECT a FROM t WHERE b IN (c, 1)", "SELECT a FROM t WHERE b IN (c, ?)"},
		{"SELECT a FROM t WHERE b IN (SELECT c FROM u WHERE d = 2)", "SELECT a FROM t WHERE b IN (SELECT c FROM u WHERE d = ?)"},
		{"SELECT a FROM t WHERE b IN ()", "SELECT a FROM t WHERE b IN ()"},
		{"INSERT INTO t (a, b) VALUES (1, 'x'), (2, 'y')", "INSERT INTO t(a, b) VALUES (...)"},
		{"insert into t values(1)", "INSERT INTO t VALUES (...)"},
		{"INSERT INTO t VALUES (1, 2), (a, 3)", "INSERT INTO t VALUES (...), (a, ?)"},
		{"INSERT INTO t VALUES (1) ON DUPLICATE KEY UPDATE a = VALUES(a)", "INSERT INTO t VALUES (...) ON DUPLICATE KEY UPDATE a = VALUES (a)"},
		{"SELECT COUNT(*), max(a), f(b), t.c FROM db.t", "SELECT COUNT(*), MAX(a), f(b), t.c FROM db.t"},
		{"SELECT `select`, `a b`, `a``b`, `1a`, `é` FROM `order`", "SELECT `select`, `a b`, `a``b`, `1a`, é FROM `order`"},
		{"SET @A = 1, @@SESSION.sql_mode = 'x', @'Q' = 2", "SET @a = ?, @@session.sql_mode = ?, @'Q' = ?"},
		{"SELECT a<=>b, a->>'$.x', a!=b, a<>b", "SELECT a <=> b, a ->> ?, a != b, a <> b"},
		{"SELECT 1; SELECT 2;", "SELECT ?; SELECT ?"},
		{"SELECT 1;;; SELECT 2", "SELECT ?; SELECT ?"},
		{";SELECT 1", "SELECT ?"},
		{"SELECT a; -1", "SELECT a; ?"},
		{"UPDATE t SET a = a + 1 WHERE id = ?", "UPDATE t SET a = a + ? WHERE id = ?"},
		{"SELECT * FROM t LIMIT 10 OFFSET 20", "SELECT * FROM t LIMIT ? OFFSET ?"},
		{"SELECT a FROM t WHERE x = 'unterminated", "SELECT a FROM t WHERE x = ?"},
		{"SELECT a . b, x. .y", "SELECT a.b, x. .y"},
		{"SELECT -. 0000000A, t.1abc", "SELECT -. 0000000A, t. 1abc"}, // a dot never glues to a digit
	}
	for _, tt := range tests {
		got := Digest([]byte(tt.q), sqltext.Mode{})
		if got != tt.want {
			t.Errorf("Digest(%q) = %q, want %q", tt.q, got, tt.want)
		}
		if again := Digest([]byte(got), sqltext.Mode{}); again != got {
			t.Errorf("Digest(Digest(%q)) = %q, want %q", tt.q, again, got)
		}
	}
}

func TestDigestSame(t *testing.T) {
	groups := [][]string{
		{
			"SELECT * FROM users WHERE id = 1 AND name = 'a'",
			"select * from users where id=2 and name=\"b\"",
			"SELECT  *  FROM `users` /* x */ WHERE id = -3 AND name = ?  -- y",
			"/*!SELECT*/ * FROM users WHERE `id` = 0x10 AND name = 'c' 'd';",
		},
		{
			"SELECT a FROM t WHERE b IN (1)",
			"SELECT a FROM t WHERE b IN (1, 2, 3, 4, 5)",
			"select a from t where b in ('x','y')",
		},
		{
			"INSERT INTO t VALUES (1, 2)",
			"INSERT INTO t VALUES (3, 4), (5, 6), (7, 8)",
			"insert into t values (?, ?)",
		},
	}
	for _, g := range groups {
		want := Digest([]byte(g[0]), sqltext.Mode{})
		for _, q := range g[1:] {
			if got := Digest([]byte(q), sqltext.Mode{}); got != want {
				t.Errorf("Digest(%q) = %q, want %q (as for %q)", q, got, want, g[0])
			}
			if DigestHash([]byte(q), sqltext.Mode{}) != DigestHash([]byte(g[0]), sqltext.Mode{}) {
				t.Errorf("DigestHash(%q) differs from DigestHash(%q)", q, g[0])
			}
		}
	}
}

func TestDigestDifferent(t *testing.T) {
	pairs := [][2]string{
		{"SELECT * FROM users WHERE id = 1", "SELECT * FROM orders WHERE id = 1"},
		{"SELECT * FROM t WHERE a = 1", "SELECT * FROM t WHERE b = 1"},
		{"SELECT a FROM t", "SELECT b FROM t"},
		{"SELECT * FROM db1.t", "SELECT * FROM db2.t"},
		{"DELETE FROM t WHERE a = 1", "UPDATE t SET b = 1 WHERE a = 1"},
		{"SELECT * FROM t WHERE a = 1", "SELECT * FROM t WHERE a > 1"},
		{"SELECT * FROM t WHERE a IN (1, 2)", "SELECT * FROM t WHERE a IN (b, 2)"},
		{"SELECT * FROM `a b`", "SELECT * FROM `a` `b`"},
		{"SELECT 1", "SELECT 1; SELECT 2"},
		{"SELECT @a", "SELECT @b"},
	}
	for _, p := range pairs {
		if a, b := Digest([]byte(p[0]), sqltext.Mode{}), Digest([]byte(p[1]), sqltext.Mode{}); a == b {
			t.Errorf("Digest(%q) == Digest(%q) == %q", p[0], p[1], a)
		}
		if DigestHash([]byte(p[0]), sqltext.Mode{}) == DigestHash([]byte(p[1]), sqltext.Mode{}) {
			t.Errorf("DigestHash(%q) == DigestHash(%q)", p[0], p[1])
		}
	}
}

func TestHashDigest(t *testing.T) {
	for _, s := range []string{"", "a", "SELECT * FROM t WHERE id = ?"} {
		h := fnv.New64a()
		h.Write([]byte(s))
		if got, want := HashDigest(s), h.Sum64(); got != want {
			t.Errorf("HashDigest(%q) = %x, want FNV-1a %x", s, got, want)
		}
	}
	q := []byte("select * from t where a = 5")
	if DigestHash(q, sqltext.Mode{}) != HashDigest(Digest(q, sqltext.Mode{})) {
		t.Error("DigestHash(q) != HashDigest(Digest(q))")
	}
}

// TestDigestLong checks a long multi-row insert digests in linear time to
// the same short text as a one-row insert.
func TestDigestLong(t *testing.T) {
	var b strings.Builder
	b.WriteString("INSERT INTO t VALUES (0, 'x')")
	for i := range 20000 {
		b.WriteString(", (")
		b.WriteString(strings.Repeat("9", i%7+1))
		b.WriteString(", 'abc')")
	}
	if got, want := Digest([]byte(b.String()), sqltext.Mode{}), "INSERT INTO t VALUES (...)"; got != want {
		t.Errorf("long insert digest = %.80q, want %q", got, want)
	}
}

func BenchmarkDigest(b *testing.B) {
	q := []byte("/* app=web */ SELECT id, name FROM users WHERE id = 42 AND status IN ('a', 'b')")
	b.ReportAllocs()
	for b.Loop() {
		Digest(q, sqltext.Mode{})
	}
}

// FuzzDigest checks that Digest never panics, is idempotent, hashes as
// documented, and keeps what the classifier sees: a digest classifies as
// its statement does.
func FuzzDigest(f *testing.F) {
	for _, s := range []string{
		"SELECT * FROM t WHERE id = 1", "INSERT INTO t VALUES (1, 'a'), (2, 'b')",
		"SELECT a FROM t WHERE b IN (1, -2, 'x' 'y', NULL, ?)", "/*!40101 SET @a = @@b.c */;",
		"SELECT `a``b`, `select`, x. .y, a...b", "SELECT 1--1; -- x\n#y\nSELECT .5e-3",
		"CREATE DEFINER='u'@'%' PROCEDURE p() BEGIN IF (a) THEN SELECT 1; END IF; END",
		"WITH a AS (SELECT 1) UPDATE t SET x = -1", "SELECT 'unterminated",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, q []byte) {
		d := Digest(q, sqltext.Mode{})
		if d2 := Digest([]byte(d), sqltext.Mode{}); d2 != d {
			t.Fatalf("Digest(%q) = %q, but Digest of that = %q", q, d, d2)
		}
		if DigestHash(q, sqltext.Mode{}) != HashDigest(d) {
			t.Fatalf("DigestHash(%q) != HashDigest(Digest)", q)
		}
		c1, m1 := ClassifyQuery(q)
		c2, m2 := ClassifyQuery([]byte(d))
		if c1 != c2 || m1 != m2 {
			t.Fatalf("ClassifyQuery(%q) = %v, %v but ClassifyQuery(Digest = %q) = %v, %v", q, c1, m1, d, c2, m2)
		}
	})
}
