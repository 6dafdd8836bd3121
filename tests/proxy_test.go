package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestFlagsVersionAndHelpDocumented(t *testing.T) {
	out, err := exec.Command(filepath.Join(binDir, "rgproxy"), "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "rgproxy ") {
		t.Fatalf("--version: %v %q", err, out)
	}
	help, _ := exec.Command(filepath.Join(binDir, "rgproxy"), "--help").CombinedOutput()
	readme, err := os.ReadFile("../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	flags := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(help), -1)
	if len(flags) < 10 {
		t.Fatalf("--help lists %d flags:\n%s", len(flags), help)
	}
	for _, f := range flags {
		if !strings.Contains(string(readme), "--"+f[1]) {
			t.Errorf("flag --%s is not documented in docs/flags.md", f[1])
		}
	}
	for _, want := range []string{"-listen", "-backend", "-status-addr", "-config", "-tls-cert", "-backend-tls", "-backend-proxy-protocol", "-max-connections", "-shutdown-timeout"} {
		if !strings.Contains(string(help), want) {
			t.Errorf("--help misses %s", want)
		}
	}
}

func TestConfigFileMirrorsFlagsAndFlagsWin(t *testing.T) {
	listen, fileStatus, flagStatus := freeAddr(t), freeAddr(t), freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "rgproxy.toml")
	body := fmt.Sprintf("listen = %q\nstatus-addr = %q\nbackend = %q\nmax-connections = 7\n", listen, fileStatus, backendAddr)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, "rgproxy", "--config", cfg, "--status-addr", flagStatus)
	waitListening(t, listen, p)
	waitListening(t, flagStatus, p)
	db := openDB(t, listen)
	var one int
	if err := db.QueryRow("SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 through a config-file proxy: %v", err)
	}

	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("listne = \"x\"\n"), 0o600)
	out, err := exec.Command(filepath.Join(binDir, "rgproxy"), "--config", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `unknown key "listne"`) {
		t.Fatalf("a misspelt key must be refused: %v %s", err, out)
	}
}

// rowsOf reads every row of a query as strings (NULL as "<nil>") with
// the column types' database names, for exact comparisons.
func rowsOf(t testing.TB, q interface {
	Query(string, ...any) (*sql.Rows, error)
}, query string, args ...any) [][]string {
	t.Helper()
	rows, err := q.Query(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	defer rows.Close()
	return scanAll(t, rows)
}

func scanAll(t testing.TB, rows *sql.Rows) [][]string {
	t.Helper()
	cols, _ := rows.Columns()
	types, _ := rows.ColumnTypes()
	var out [][]string
	head := []string{}
	for i, c := range cols {
		head = append(head, c+":"+types[i].DatabaseTypeName())
	}
	out = append(out, head)
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			if v == nil {
				row[i] = "<nil>"
			} else {
				row[i] = string(v)
			}
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

const typesTable = `CREATE TABLE IF NOT EXISTS rgproxy_e2e.e2e_types (
	id INT PRIMARY KEY, ti TINYINT, si SMALLINT UNSIGNED, bi BIGINT, f FLOAT, d DOUBLE,
	dec1 DECIMAL(20,6), vc VARCHAR(40), tx TEXT, bl BLOB, dt DATETIME(6), da DATE, tm TIME(3),
	ts TIMESTAMP NULL, yr YEAR, bt BIT(9), js JSON, en ENUM('a','b'), nul INT NULL)`

func TestDriverResultsIdenticalToDirect(t *testing.T) {
	px := startProxy(t)
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.e2e_types", typesTable,
		`INSERT INTO rgproxy_e2e.e2e_types VALUES
		 (1, -128, 65535, -9223372036854775808, 1.5, 2.25, -12345678901234.123456, 'héllo', 'text', x'00ff10', '2024-02-29 23:59:59.123456', '2024-02-29', '-838:59:59.000', '2024-01-01 00:00:00', 2024, b'101010101', '{"a":[1,2]}', 'b', NULL),
		 (2, 127, 0, 9223372036854775807, -0.0, 1e308, 0, '', '', '', '1000-01-01 00:00:00', '9999-12-31', '00:00:00.5', NULL, 1901, b'0', 'null', 'a', 7)`)
	queries := []struct {
		q    string
		args []any
	}{
		{"SELECT * FROM rgproxy_e2e.e2e_types ORDER BY id", nil},
		{"SELECT * FROM rgproxy_e2e.e2e_types WHERE id = ?", []any{1}},
		{"SELECT id, vc, bl FROM rgproxy_e2e.e2e_types WHERE vc = ? OR bl = ?", []any{"héllo", []byte{}}},
		{"SELECT 1.5, 'x', NULL, CAST(3 AS UNSIGNED), NOW() - NOW(), REPEAT('a', 70000)", nil},
		{"SHOW VARIABLES LIKE 'character_set_%'", nil},
	}
	for _, mode := range []string{"interpolateParams=true", "interpolateParams=false"} {
		direct := openDB(t, backendAddr, mode)
		via := openDB(t, px.Addr, mode)
		for _, q := range queries {
			want := rowsOf(t, direct, q.q, q.args...)
			got := rowsOf(t, via, q.q, q.args...)
			if !reflect.DeepEqual(want, got) {
				t.Errorf("%s %s:\n direct %q\n proxy  %q", mode, q.q, want, got)
			}
		}
	}
}

func TestTransactionsSessionStateAndMultiStatements(t *testing.T) {
	px := startProxy(t)
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.e2e_tx", "CREATE TABLE rgproxy_e2e.e2e_tx (id INT PRIMARY KEY, v INT) ENGINE=InnoDB",
		"DROP PROCEDURE IF EXISTS rgproxy_e2e.e2e_multi",
		"CREATE PROCEDURE rgproxy_e2e.e2e_multi() BEGIN SELECT 1 AS a; SELECT 2 AS b, 3 AS c; END")
	db := openDB(t, px.Addr, "multiStatements=true")
	db.SetMaxOpenConns(1)

	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO rgproxy_e2e.e2e_tx VALUES (1, 10)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, _ = db.Begin()
	tx.Exec("INSERT INTO rgproxy_e2e.e2e_tx VALUES (2, 20)")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var n int
	db.QueryRow("SELECT COUNT(*) FROM rgproxy_e2e.e2e_tx").Scan(&n)
	if n != 1 {
		t.Fatalf("after rollback+commit, %d rows, want 1", n)
	}

	// Session state lives on the dedicated backend connection.
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	conn.ExecContext(ctx, "SET @v = 42")
	conn.ExecContext(ctx, "CREATE TEMPORARY TABLE e2e_tmp (x INT)")
	conn.ExecContext(ctx, "INSERT INTO e2e_tmp VALUES (1),(2)")
	var v, cnt int
	if err := conn.QueryRowContext(ctx, "SELECT @v, (SELECT COUNT(*) FROM e2e_tmp)").Scan(&v, &cnt); err != nil || v != 42 || cnt != 2 {
		t.Fatalf("session state: %v %d %d", err, v, cnt)
	}

	// Multi-statements and several result sets (a CALL).
	rows, err := conn.QueryContext(ctx, "SELECT 1; SELECT 'two', 3; CALL rgproxy_e2e.e2e_multi()")
	if err != nil {
		t.Fatal(err)
	}
	var sets [][][]string
	for {
		sets = append(sets, scanAll(t, rows))
		if !rows.NextResultSet() {
			break
		}
	}
	rows.Close()
	want := [][][]string{
		{{"1:INT"}, {"1"}},
		{{"two:VARCHAR", "3:INT"}, {"two", "3"}},
		{{"a:INT"}, {"1"}},
		{{"b:INT", "c:INT"}, {"2", "3"}},
	}
	// The CALL's trailing OK yields no extra set in the driver.
	if len(sets) < len(want) || !reflect.DeepEqual(sets[:len(want)], want) {
		t.Fatalf("result sets:\n got %q\nwant %q", sets, want)
	}
	// A multi-statement whose second part fails reports the error.
	_, err = conn.ExecContext(ctx, "SELECT 1; SELECT * FROM test.no_such_table")
	if mysqlErrNo(err) != 1146 {
		t.Fatalf("error in a multi-statement: %v", err)
	}
	if err := conn.PingContext(ctx); err != nil {
		t.Fatalf("session unusable after an error: %v", err)
	}
}

func TestLargePayloadsAndLoadDataLocal(t *testing.T) {
	rootExec(t, "SET GLOBAL max_allowed_packet = 67108864",
		"DROP TABLE IF EXISTS rgproxy_e2e.e2e_blob", "CREATE TABLE rgproxy_e2e.e2e_blob (id INT PRIMARY KEY, b LONGBLOB)",
		"DROP TABLE IF EXISTS rgproxy_e2e.e2e_load", "CREATE TABLE rgproxy_e2e.e2e_load (id INT, name VARCHAR(20))")
	px := startProxy(t)
	for _, mode := range []string{"interpolateParams=true", "interpolateParams=false"} {
		db := openDB(t, px.Addr, mode, "allowAllFiles=true")
		blob := make([]byte, 20<<20)
		rand.Read(blob)
		if _, err := db.Exec("REPLACE INTO rgproxy_e2e.e2e_blob VALUES (1, ?)", blob); err != nil {
			t.Fatalf("%s: 20 MiB insert: %v", mode, err)
		}
		var back []byte
		if err := db.QueryRow("SELECT b FROM rgproxy_e2e.e2e_blob WHERE id = 1").Scan(&back); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, blob) {
			t.Fatalf("%s: 20 MiB blob came back different (%d bytes)", mode, len(back))
		}
	}

	db := openDB(t, px.Addr, "allowAllFiles=true")
	var data strings.Builder
	for i := 0; i < 50000; i++ {
		fmt.Fprintf(&data, "%d\tname%d\n", i, i)
	}
	file := filepath.Join(t.TempDir(), "load.tsv")
	os.WriteFile(file, []byte(data.String()), 0o600)
	res, err := db.Exec(fmt.Sprintf("LOAD DATA LOCAL INFILE '%s' INTO TABLE rgproxy_e2e.e2e_load", file))
	if err != nil {
		t.Fatalf("LOAD DATA LOCAL INFILE: %v", err)
	}
	if n, _ := res.RowsAffected(); n != 50000 {
		t.Fatalf("LOAD DATA loaded %d rows", n)
	}
	mysql.RegisterReaderHandler("e2e", func() io.Reader { return strings.NewReader("1\tone\n2\ttwo\n") })
	if _, err := db.Exec("LOAD DATA LOCAL INFILE 'Reader::e2e' INTO TABLE rgproxy_e2e.e2e_load"); err != nil {
		t.Fatalf("LOAD DATA from a reader: %v", err)
	}
	var n int
	db.QueryRow("SELECT COUNT(*) FROM rgproxy_e2e.e2e_load").Scan(&n)
	if n != 50002 {
		t.Fatalf("table holds %d rows", n)
	}
}

func TestMariadbCLIOutputIdentical(t *testing.T) {
	requireTool(t, "mariadb", "mariadb-client")
	px := startProxy(t)
	_, port, _ := strings.Cut(px.Addr, ":")
	script := "SELECT 1, 'two', NULL; SHOW DATABASES LIKE 'test'; SELECT @@version_comment LIKE '%'; USE test; SELECT DATABASE(); STATUS;"
	run := func(p string) string {
		out, err := exec.Command("mariadb", "-h127.0.0.1", "-P"+p, "-uroot", "--table", "-e", script).CombinedOutput()
		if err != nil {
			t.Fatalf("mariadb -P%s: %v\n%s", p, err, out)
		}
		// STATUS names the port and connection id, which differ by design.
		var keep []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "TCP port") || strings.Contains(l, "Connection id") || strings.Contains(l, "Uptime") || strings.Contains(l, "Threads:") || strings.Contains(l, "Connection:") {
				continue
			}
			keep = append(keep, l)
		}
		return strings.Join(keep, "\n")
	}
	if want, got := run("3306"), run(port); want != got {
		t.Fatalf("mariadb CLI output differs:\n direct:\n%s\n proxy:\n%s", want, got)
	}
	out, err := exec.Command("mariadb", "-h127.0.0.1", "-P"+port, "-uroot", "-pwrong-password", "-e", "SELECT 1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ERROR 1045") {
		t.Fatalf("a wrong password must get the backend's 1045: %v %s", err, out)
	}
}

func TestSysbenchReadWriteNoErrors(t *testing.T) {
	requireTool(t, "sysbench", "sysbench")
	rootExec(t, "CREATE DATABASE IF NOT EXISTS sbtest_e2e")
	px := startProxy(t)
	host, port, _ := strings.Cut(px.Addr, ":")
	// Uniform keys over 4 × 10,000 rows keep InnoDB deadlocks (which
	// sysbench retries and counts as "ignored errors") out of the picture,
	// so any error at all is the proxy's.
	common := []string{"oltp_read_write", "--db-driver=mysql", "--mysql-host=" + host, "--mysql-port=" + port,
		"--mysql-user=root", "--mysql-db=sbtest_e2e", "--tables=4", "--table-size=10000", "--rand-type=uniform"}
	if out, err := exec.Command("sysbench", append(common, "cleanup")...).CombinedOutput(); err != nil {
		t.Fatalf("sysbench cleanup: %v\n%s", err, out)
	}
	if out, err := exec.Command("sysbench", append(common, "prepare")...).CombinedOutput(); err != nil {
		t.Fatalf("sysbench prepare: %v\n%s", err, out)
	}
	out, err := exec.Command("sysbench", append(common, "--threads=4", "--time=10", "run")...).CombinedOutput()
	if err != nil {
		t.Fatalf("sysbench run: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`ignored errors:\s+(\d+)`).FindStringSubmatch(string(out))
	q := regexp.MustCompile(`transactions:\s+(\d+)`).FindStringSubmatch(string(out))
	if m == nil || q == nil {
		t.Fatalf("unexpected sysbench output:\n%s", out)
	}
	if m[1] != "0" || q[1] == "0" || strings.Contains(string(out), "FATAL") {
		t.Fatalf("sysbench through rgproxy: %s errors, %s transactions\n%s", m[1], q[1], out)
	}
	t.Logf("sysbench oltp_read_write 10 s, 4 threads: %s transactions, 0 errors", q[1])
}

// rssKiB reads a process's resident set size from /proc.
func rssKiB(t testing.TB, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	var kb int64
	fmt.Sscan(string(m[1]), &kb)
	return kb
}

func TestStreamingGiBResultBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB transfer")
	}
	px := startProxy(t)
	db := openDB(t, px.Addr)
	var one int
	db.QueryRow("SELECT 1").Scan(&one)
	base := rssKiB(t, px.cmd.Process.Pid)
	var peak int64
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			r := rssKiB(t, px.cmd.Process.Pid)
			mu.Lock()
			if r > peak {
				peak = r
			}
			mu.Unlock()
		}
	}()
	// 1024 rows of 1 MiB each from MariaDB's sequence engine.
	rows, err := db.Query("SELECT seq, REPEAT('x', 1048576) FROM seq_1_to_1024")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	var seq int
	var payload sql.RawBytes
	for rows.Next() {
		if err := rows.Scan(&seq, &payload); err != nil {
			t.Fatal(err)
		}
		total += int64(len(payload))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if total != 1<<30 {
		t.Fatalf("received %d bytes, want 1 GiB", total)
	}
	growth := (peak - base) / 1024
	t.Logf("1 GiB result: proxy RSS %d KiB at start, peak %d KiB (+%d MiB)", base, peak, growth)
	if growth >= 64 {
		t.Fatalf("proxy RSS grew by %d MiB streaming 1 GiB (limit 64 MiB)", growth)
	}
}

func TestStatusEndpoints(t *testing.T) {
	px := startProxy(t)
	db := openDB(t, px.Addr)
	db.Exec("SELECT 1")
	db.Exec("DO 1")
	if code, body := httpGet(t, "http://"+px.StatusAddr+"/healthz"); code != 200 || !strings.Contains(body, `"health":"true"`) {
		t.Fatalf("/healthz: %d %s", code, body)
	}
	if code, body := httpGet(t, "http://"+px.StatusAddr+"/readyz"); code != 200 || !strings.Contains(body, `"health":"true"`) {
		t.Fatalf("/readyz: %d %s", code, body)
	}
	_, metrics := httpGet(t, "http://"+px.StatusAddr+"/metrics")
	for _, name := range []string{"rgproxy_connections ", `rgproxy_statements_total{class="read"}`, `rgproxy_statements_total{class="other"}`,
		"rgproxy_statement_duration_seconds_bucket", "rgproxy_client_bytes_total", "rgproxy_backend_bytes_total", "rgproxy_backend_errors_total"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	dead := startProxy(t, "--backend", freeAddr(t))
	if code, body := httpGet(t, "http://"+dead.StatusAddr+"/readyz"); code != 503 || !strings.Contains(body, `"health":"false"`) {
		t.Fatalf("/readyz with no backend: %d %s", code, body)
	}
}

func TestBackendUnreachableGetsClearError(t *testing.T) {
	gone := freeAddr(t)
	px := startProxy(t, "--backend", gone)
	db, _ := sql.Open("mysql", dsn(px.Addr))
	defer db.Close()
	err := db.Ping()
	if err == nil || !strings.Contains(err.Error(), gone) {
		t.Fatalf("want an error naming backend %s, got %v", gone, err)
	}
}

func TestMaxConnections(t *testing.T) {
	px := startProxy(t, "--max-connections", "2")
	ctx := context.Background()
	db := openDB(t, px.Addr)
	// startProxy's readiness probe is a session too until rgproxy sees it
	// hang up: wait for the pool's one connection to be the only one.
	deadline := time.Now().Add(5 * time.Second)
	for metricSum(t, px.StatusAddr, "rgproxy_connections") != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	c1, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	extra, _ := sql.Open("mysql", dsn(px.Addr))
	defer extra.Close()
	if err := extra.Ping(); mysqlErrNo(err) != 1040 {
		t.Fatalf("third session: want 1040, got %v", err)
	}
	if err := c1.PingContext(ctx); err != nil {
		t.Fatalf("existing session hurt: %v", err)
	}
}

func TestSIGTERMLetsRunningStatementFinish(t *testing.T) {
	px := startProxy(t, "--shutdown-timeout", "10s")
	db := openDB(t, px.Addr)
	res := make(chan error, 1)
	go func() {
		var v int
		res <- db.QueryRow("SELECT SLEEP(1.5) + 1").Scan(&v)
	}()
	time.Sleep(300 * time.Millisecond) // let the statement reach the backend
	start := time.Now()
	px.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-res; err != nil {
		t.Fatalf("running statement cut by SIGTERM: %v", err)
	}
	select {
	case <-px.done:
	case <-time.After(12 * time.Second):
		t.Fatal("rgproxy did not exit after SIGTERM")
	}
	if px.err != nil {
		t.Fatalf("exit status after SIGTERM: %v", px.err)
	}
	t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}
