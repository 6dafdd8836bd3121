package mysqlproto

import (
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sqldriver "github.com/go-sql-driver/mysql"
)

const backendAddr = "127.0.0.1:3306"

// needBackend skips the test when no MariaDB answers on 127.0.0.1:3306.
func needBackend(t *testing.T) {
	t.Helper()
	if err := ProbeBackend(context.Background(), Config{BackendAddr: backendAddr, DialTimeout: time.Second}); err != nil {
		t.Skipf("no backend: %v", err)
	}
}

// testLogger sends logs to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// startProxy runs a Server on a random port and returns its address.
func startProxy(t *testing.T, cfg Config, tune ...func(*Server)) (*Server, string) {
	t.Helper()
	if cfg.BackendAddr == "" {
		cfg.BackendAddr = backendAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return s, ln.Addr().String()
}

// serveTCP listens on a free loopback port until the test ends, handing
// each connection it accepts to handle, in the accept loop.
func serveTCP(tb testing.TB, handle func(net.Conn)) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			handle(c)
		}
	}()
	return ln
}

func dsn(addr, params string) string {
	c := sqldriver.NewConfig()
	c.User = "root"
	c.Net = "tcp"
	c.Addr = addr
	c.DBName = "rgproxy_test"
	c.InterpolateParams = false
	c.AllowAllFiles = true
	c.MultiStatements = true
	c.Timeout = 5 * time.Second
	s := c.FormatDSN()
	if params != "" {
		s += "&" + params
	}
	return s
}

func openDB(t *testing.T, addr string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn(addr, ""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

var setupOnce sync.Once

// setupSchema creates the test database directly on the backend.
func setupSchema(t *testing.T) {
	t.Helper()
	needBackend(t)
	var err error
	setupOnce.Do(func() {
		c := sqldriver.NewConfig()
		c.User, c.Net, c.Addr, c.MultiStatements = "root", "tcp", backendAddr, true
		var db *sql.DB
		db, err = sql.Open("mysql", c.FormatDSN())
		if err != nil {
			return
		}
		defer db.Close()
		_, err = db.Exec(`CREATE DATABASE IF NOT EXISTS rgproxy_test;
			SET GLOBAL max_allowed_packet = 67108864;
			SET GLOBAL local_infile = 1;
			CREATE USER IF NOT EXISTS 'rgp_user'@'%' IDENTIFIED BY 'secret1';
			GRANT ALL ON rgproxy_test.* TO 'rgp_user'@'%';
			DROP PROCEDURE IF EXISTS rgproxy_test.two_sets;
			CREATE PROCEDURE rgproxy_test.two_sets() BEGIN SELECT 1 AS a; SELECT 2 AS b, 'x' AS c; END`)
	})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
}

func mustExec(t *testing.T, db *sql.DB, q string, args ...any) sql.Result {
	t.Helper()
	r, err := db.Exec(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return r
}

func TestLoginAndQuery(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	db := openDB(t, addr)
	var v int
	if err := db.QueryRow("SELECT 1+1").Scan(&v); err != nil || v != 2 {
		t.Fatalf("SELECT 1+1 = %d, %v", v, err)
	}
}

func TestWrongPassword(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	c := sqldriver.NewConfig()
	c.User, c.Passwd, c.Net, c.Addr = "rgp_user", "wrong", "tcp", addr
	db, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Ping()
	var me *sqldriver.MySQLError
	if !errors.As(err, &me) || me.Number != 1045 {
		t.Fatalf("got %v, want error 1045", err)
	}
	c.Passwd = "secret1"
	db2, _ := sql.Open("mysql", c.FormatDSN())
	defer db2.Close()
	var u string
	if err := db2.QueryRow("SELECT CURRENT_USER()").Scan(&u); err != nil || u != "rgp_user@%" {
		t.Fatalf("CURRENT_USER() = %q, %v", u, err)
	}
}

func TestDriverFeatures(t *testing.T) {
	setupSchema(t)
	_, addr := startProxy(t, Config{})
	db := openDB(t, addr)
	direct := openDB(t, backendAddr)
	mustExec(t, db, `DROP TABLE IF EXISTS feat; CREATE TABLE feat (id INT PRIMARY KEY, d DECIMAL(10,3), f DOUBLE, s VARCHAR(20), b BLOB, t DATETIME(6), n INT NULL)`)
	mustExec(t, db, `INSERT INTO feat VALUES (1, 12.5, 1.25e10, 'héllo', x'00ff10', '2024-02-29 12:34:56.789', NULL), (2, -3, -0.5, '', '', '1999-12-31 23:59:59', 7)`)

	t.Run("prepared rows match direct", func(t *testing.T) {
		q := "SELECT id, d, f, s, b, t, n FROM feat WHERE id >= ? ORDER BY id"
		got := scanAll(t, db, q, 0)
		want := scanAll(t, direct, q, 0)
		if len(got) != 2 || !equalRows(got, want) {
			t.Fatalf("proxy %q\ndirect %q", got, want)
		}
	})
	t.Run("multi statements and CALL", func(t *testing.T) {
		rows, err := db.Query("SELECT 1; SELECT 'a', 'b'; CALL two_sets()")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var sets [][]string
		for {
			cols, _ := rows.Columns()
			var set []string
			for rows.Next() {
				vals := make([]sql.RawBytes, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				for _, v := range vals {
					set = append(set, string(v))
				}
			}
			sets = append(sets, set)
			if !rows.NextResultSet() {
				break
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := [][]string{{"1"}, {"a", "b"}, {"1"}, {"2", "x"}}
		if len(sets) < len(want) {
			t.Fatalf("sets %q, want %q", sets, want)
		}
		for i := range want {
			if strings.Join(sets[i], ",") != strings.Join(want[i], ",") {
				t.Fatalf("sets %q, want %q", sets, want)
			}
		}
	})
	t.Run("transaction", func(t *testing.T) {
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec("UPDATE feat SET n = 9 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		var n sql.NullInt64
		if err := db.QueryRow("SELECT n FROM feat WHERE id = 1").Scan(&n); err != nil || n.Valid {
			t.Fatalf("after rollback n = %v, %v", n, err)
		}
	})
	t.Run("LOAD DATA LOCAL INFILE", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "rows.csv")
		var sb strings.Builder
		for i := 100; i < 1100; i++ {
			fmt.Fprintf(&sb, "%d,%d.5,row %d\n", i, i, i)
		}
		if err := os.WriteFile(f, []byte(sb.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		r := mustExec(t, db, fmt.Sprintf("LOAD DATA LOCAL INFILE '%s' INTO TABLE feat FIELDS TERMINATED BY ',' (id, d, s)", f))
		if n, _ := r.RowsAffected(); n != 1000 {
			t.Fatalf("loaded %d rows", n)
		}
		var c int
		if err := db.QueryRow("SELECT COUNT(*) FROM feat").Scan(&c); err != nil || c != 1002 {
			t.Fatalf("count %d, %v", c, err)
		}
	})
	t.Run("20 MiB blob", func(t *testing.T) {
		db2, err := sql.Open("mysql", dsn(addr, "maxAllowedPacket=0"))
		if err != nil {
			t.Fatal(err)
		}
		defer db2.Close()
		blob := make([]byte, 20<<20)
		for i := range blob {
			blob[i] = byte(i * 7)
		}
		mustExec(t, db2, "DROP TABLE IF EXISTS big; CREATE TABLE big (id INT PRIMARY KEY, b LONGBLOB)")
		mustExec(t, db2, "INSERT INTO big VALUES (1, ?)", blob)
		var got []byte
		if err := db2.QueryRow("SELECT b FROM big WHERE id = ?", 1).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, blob) {
			t.Fatalf("blob differs: %d bytes back", len(got))
		}
		if err := db2.QueryRow("SELECT b FROM big WHERE id = 1").Scan(&got); err != nil || !bytes.Equal(got, blob) {
			t.Fatalf("text protocol blob: %d bytes, %v", len(got), err)
		}
	})
}

func scanAll(t *testing.T, db *sql.DB, q string, args ...any) [][]string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out [][]string
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var r []string
		for _, v := range vals {
			if v == nil {
				r = append(r, "NULL")
			} else {
				r = append(r, string(v))
			}
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func equalRows(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], "\x00") != strings.Join(b[i], "\x00") {
			return false
		}
	}
	return true
}

func TestNewServerConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"bad address", Config{BackendAddr: "no-port"}, false},
		{"negative max connections", Config{MaxConnections: -1}, false},
		{"TLS required without a certificate", Config{RequireTLS: true}, false},
	}
	for _, tt := range tests {
		s, err := NewServer(tt.cfg)
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
		if err == nil {
			c := s.cfg
			if c.BackendAddr != "127.0.0.1:3306" || c.DialTimeout != 5*time.Second || c.MaxPacketPayload != 1<<30 ||
				c.WriteBufferSize != 64<<10 || c.Policy == nil || c.Logger == nil || !s.passThrough {
				t.Errorf("%s: defaults %+v", tt.name, c)
			}
		}
	}
	s, _ := NewServer(Config{BackendTLS: &tls.Config{}, BackendAddr: "db.example:3306"})
	if s.cfg.BackendTLS.ServerName != "db.example" {
		t.Errorf("backend TLS server name %q", s.cfg.BackendTLS.ServerName)
	}
}

func TestProbeBackend(t *testing.T) {
	needBackend(t)
	if err := ProbeBackend(context.Background(), Config{BackendAddr: backendAddr}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ProbeBackend(ctx, Config{BackendAddr: backendAddr}); err == nil {
		t.Error("probe with a cancelled context succeeded")
	}
}
