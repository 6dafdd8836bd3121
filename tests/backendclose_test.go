package tests

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// goSQLDriverModule is the go-sql-driver version whose own test suite must
// pass through rgproxy exactly as it passes directly.
const goSQLDriverModule = "github.com/go-sql-driver/mysql@v1.9.3"

// TestGoSQLDriverSuiteDirectAndThroughProxy runs go-sql-driver's own test
// suite, from the module cache, once against MariaDB and once through
// rgproxy, and requires the same tests to pass and fail. Its
// TestStaleConnectionChecks (wait_timeout = 2, sleep 3 s, BEGIN) needs
// rgproxy to pass the backend's close of an idle session on to the client.
// TestConnectorReturnsTimeout is left out in both runs: it dials 1.1.1.1,
// the Internet, not the server.
//
// The backend's max_allowed_packet is set to 64 MiB first, as the other
// large-payload tests set it, so the result does not depend on which ran
// before: at MariaDB's default of 16 MiB, TestLongData/compress (a 16 MiB
// blob over the compressed protocol) gets 1153 directly, while through
// rgproxy, which offers no compression, the session is uncompressed and
// passes.
func TestGoSQLDriverSuiteDirectAndThroughProxy(t *testing.T) {
	dir := driverSuiteDir(t)
	const db = "rgproxy_e2e_gosqldriver" // the suite creates tables named test, ...
	rootExec(t, "CREATE DATABASE IF NOT EXISTS "+db, "SET GLOBAL max_allowed_packet = 67108864")
	px := startProxy(t)
	direct, directOut := runDriverSuite(t, dir, backendAddr, db, "")
	proxied, proxiedOut := runDriverSuite(t, dir, px.Addr, db, "")
	// A test whose result differs runs again, both ways: only a difference
	// that repeats fails.
	if differ := differingTests(direct, proxied); len(differ) != 0 {
		for _, name := range differ {
			t.Logf("%s differs: %s directly, %q through rgproxy; output directly:\n%s\nthrough rgproxy:\n%s", name,
				direct[name], proxied[name], strings.Join(directOut[name], ""), strings.Join(proxiedOut[name], ""))
		}
		run := "^(" + strings.Join(topLevel(differ), "|") + ")$"
		d2, _ := runDriverSuite(t, dir, backendAddr, db, run)
		p2, _ := runDriverSuite(t, dir, px.Addr, db, run)
		for name := range d2 {
			direct[name], proxied[name] = d2[name], p2[name]
		}
	}
	for _, name := range differingTests(direct, proxied) {
		t.Errorf("%s: %q directly (\"\": not run), %q through rgproxy", name, direct[name], proxied[name])
	}
	passed := 0
	for _, r := range direct {
		if r == "pass" {
			passed++
		}
	}
	if passed < 300 || direct["TestStaleConnectionChecks"] != "pass" {
		t.Fatalf("the suite did not run as expected directly: %d tests passed, TestStaleConnectionChecks %q", passed, direct["TestStaleConnectionChecks"])
	}
	var failed []string
	for name, r := range direct {
		if r == "fail" {
			failed = append(failed, name)
		}
	}
	sort.Strings(failed)
	t.Logf("%d results, %d passed both ways; failing both ways (the shared MariaDB has no TLS, ...): %v", len(direct), passed, failed)
}

// driverSuiteDir copies go-sql-driver's module from the module cache to a
// writable directory whose go.mod uses this module's (cached) version of
// its one dependency, so that the suite builds offline.
func driverSuiteDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), goSQLDriverModule)
	if _, err := os.Stat(src); err != nil {
		t.Fatalf("%s is not in the module cache (go mod download): %v", goSQLDriverModule, err)
	}
	dir := filepath.Join(t.TempDir(), "driver")
	if out, err := exec.Command("cp", "-r", src, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v\n%s", err, out)
	}
	if out, err := exec.Command("chmod", "-R", "u+w", dir).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v\n%s", err, out)
	}
	sum, err := os.ReadFile("../go.sum")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	version := ""
	for _, l := range strings.Split(string(sum), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "filippo.io/edwards25519" {
			lines = append(lines, l)
			version = strings.TrimSuffix(f[1], "/go.mod")
		}
	}
	if version == "" {
		t.Fatal("filippo.io/edwards25519 is not in go.sum")
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	edit := exec.Command("go", "mod", "edit", "-require=filippo.io/edwards25519@"+version)
	edit.Dir = dir
	if out, err := edit.CombinedOutput(); err != nil {
		t.Fatalf("go mod edit: %v\n%s", err, out)
	}
	return dir
}

// runDriverSuite runs the suite against addr and returns each test's
// result (pass, fail or skip).
func runDriverSuite(t *testing.T, dir, addr, db, run string) (results map[string]string, output map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"test", "-count=1", "-json", "-skip", "^TestConnectorReturnsTimeout$"}
	if run != "" {
		args = append(args, "-run", run)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MYSQL_TEST_ADDR="+addr, "MYSQL_TEST_DBNAME="+db, "MYSQL_TEST_USER=root",
		"MYSQL_TEST_PASS=", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	out, _ := cmd.CombinedOutput() // failing tests are expected; the results say
	results, output = map[string]string{}, map[string][]string{}
	for _, l := range bytes.Split(out, []byte("\n")) {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(l, &ev) != nil || ev.Test == "" {
			continue
		}
		switch ev.Action {
		case "pass", "fail", "skip":
			results[ev.Test] = ev.Action
		case "output":
			output[ev.Test] = append(output[ev.Test], ev.Output)
		}
	}
	if len(results) == 0 {
		t.Fatalf("go-sql-driver's suite against %s gave no results:\n%s", addr, out)
	}
	return results, output
}

// differingTests lists the tests whose results differ between a and b,
// sorted.
func differingTests(a, b map[string]string) []string {
	var out []string
	for name, r := range a {
		if b[name] != r {
			out = append(out, name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// topLevel maps test names (TestA/sub) to their top-level tests' names,
// without repeats, quoted for a -run pattern.
func topLevel(names []string) []string {
	var out []string
	for _, n := range names {
		top, _, _ := strings.Cut(n, "/")
		if top = regexp.QuoteMeta(top); !slices.Contains(out, top) {
			out = append(out, top)
		}
	}
	return out
}

// TestWaitTimeoutClosesClient: when MariaDB ends an idle session on
// wait_timeout, rgproxy closes the client at once, as MariaDB does, so
// that go-sql-driver's pool replaces the connection and the mariadb CLI
// says exactly what it says directly.
func TestWaitTimeoutClosesClient(t *testing.T) {
	t.Run("go-sql-driver", func(t *testing.T) {
		px := startProxy(t)
		db := openDB(t, px.Addr)
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		if _, err := db.Exec("SET @@SESSION.wait_timeout = 1"); err != nil {
			t.Fatal(err)
		}
		var before, after int64
		if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&before); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for metricSum(t, px.StatusAddr, "rgproxy_connections") != 0 {
			if time.Since(start) > 5*time.Second {
				t.Fatal("the client connection is still open 5 s after a 1 s wait_timeout")
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("rgproxy closed the client %v after the session went idle (wait_timeout 1 s)", time.Since(start).Round(10*time.Millisecond))
		tx, err := db.Begin()
		if err != nil {
			t.Fatalf("BEGIN after wait_timeout: %v", err)
		}
		if err := tx.QueryRow("SELECT CONNECTION_ID()").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Fatal("the pool kept the timed-out connection")
		}
	})
	t.Run("mariadb CLI", func(t *testing.T) {
		requireTool(t, "mariadb", "mariadb-client")
		px := startProxy(t)
		_, port, _ := strings.Cut(px.Addr, ":")
		run := func(port string) string {
			cmd := exec.Command("mariadb", "-h127.0.0.1", "-P"+port, "-uroot")
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			io.WriteString(in, "SET SESSION wait_timeout = 1;\nSELECT 1;\n")
			time.Sleep(2500 * time.Millisecond)
			io.WriteString(in, "SELECT 2;\n")
			in.Close()
			err = cmd.Wait()
			return fmt.Sprintf("%s(exit: %v)", out.String(), err)
		}
		direct, proxied := run("3306"), run(port)
		if direct != proxied {
			t.Fatalf("mariadb CLI after wait_timeout:\n direct:\n%s\n through rgproxy:\n%s", direct, proxied)
		}
		if !strings.Contains(direct, "ERROR 2006") {
			t.Fatalf("unexpected direct output:\n%s", direct)
		}
		t.Logf("both ways:\n%s", proxied)
	})
}

// TestHandshakeStallersClosed: 50 clients that connect and never answer
// the greeting are closed after --handshake-timeout, with their backend
// connections; and when the backend gives up first (its connect_timeout),
// at that moment.
func TestHandshakeStallersClosed(t *testing.T) {
	db := startPrivateMariaDB(t, "--connect-timeout=3")
	admin, err := sql.Open("mysql", dsn(db.Addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	threads := func() int {
		var name string
		var n int
		if err := admin.QueryRow("SHOW STATUS LIKE 'Threads_connected'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := threads()
	for _, tc := range []struct {
		name, timeout string
		min, max      time.Duration
	}{
		{"rgproxy's handshake timeout", "1s", 800 * time.Millisecond, 2500 * time.Millisecond},
		{"the backend's connect_timeout", "60s", 2500 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 50 silent clients from one address: above the default
			// bound of connections that have not logged in, lifted here.
			px := startProxy(t, "--backend", db.Addr, "--handshake-timeout", tc.timeout,
				"--max-unauthenticated", "64", "--max-unauthenticated-per-host", "64")
			conns := make([]net.Conn, 50)
			// Each client's time is counted from its own dial: rgproxy's
			// timer starts at its accept, later, while the test dials
			// the other 49 (a loaded machine took 220 ms for them).
			dialed := make([]time.Time, len(conns))
			for i := range conns {
				dialed[i] = time.Now()
				c, err := net.DialTimeout("tcp", px.Addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				var hdr [4]byte
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					t.Fatalf("greeting: %v", err)
				}
				conns[i] = c
			}
			if n := threads(); n < base+50 {
				t.Fatalf("%d backend connections, want %d", n, base+50)
			}
			var wg sync.WaitGroup
			closedAfter := make([]time.Duration, len(conns))
			for i, c := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
					io.Copy(io.Discard, c) // the rest of the greeting, then EOF or a reset
					closedAfter[i] = time.Since(dialed[i])
				}()
			}
			wg.Wait()
			fastest, slowest := slices.Min(closedAfter), slices.Max(closedAfter)
			t.Logf("50 silent clients closed %v to %v after their dial", fastest.Round(10*time.Millisecond), slowest.Round(10*time.Millisecond))
			if slowest > tc.max || fastest < tc.min {
				t.Fatalf("clients closed between %v and %v after their dial, want between %v and %v", fastest, slowest, tc.min, tc.max)
			}
			deadline := time.Now().Add(5 * time.Second)
			for threads() > base || metricSum(t, px.StatusAddr, "rgproxy_connections") != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("backend connections %d (base %d), rgproxy_connections %v", threads(), base,
						metricSum(t, px.StatusAddr, "rgproxy_connections"))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// TestBackendErrorsReadableByClients: with the backend killed mid-statement
// and then down, the mariadb CLI, go-sql-driver and node's mysql2 all show
// rgproxy's error and its text (1927 and 9001: server-range codes), never
// libmariadb's "2027 Received malformed packet".
func TestBackendErrorsReadableByClients(t *testing.T) {
	requireTool(t, "mariadb", "mariadb-client")
	mysql2 := requireMysql2(t)
	db := startPrivateMariaDB(t)
	px := startProxy(t, "--backend", db.Addr)
	host, port, _ := strings.Cut(px.Addr, ":")
	cli := func(q string) string {
		out, _ := exec.Command("mariadb", "-h"+host, "-P"+port, "-uroot", "-e", q).CombinedOutput()
		return string(out)
	}
	node := func(q string) string {
		out, err := exec.Command("node", mysql2, host, port, q).CombinedOutput()
		if err != nil {
			t.Errorf("node: %v\n%s", err, out)
		}
		return string(out)
	}
	goDriver := func(q string) string {
		d, err := sql.Open("mysql", dsn(px.Addr, "db=mysql"))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		_, err = d.Exec(q)
		return fmt.Sprintf("%d %v", mysqlErrNo(err), err)
	}
	clients := []struct {
		name string
		run  func(string) string
	}{{"mariadb CLI", cli}, {"go-sql-driver", goDriver}, {"mysql2", node}}

	// Mid-statement: every client runs SELECT SLEEP(30) when the backend dies.
	got := make([]string, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = c.run("SELECT SLEEP(30)") }()
	}
	waitSleepers(t, db.Addr, len(clients))
	db.process.cmd.Process.Signal(syscall.SIGKILL)
	<-db.process.done
	wg.Wait()
	for i, c := range clients {
		t.Logf("%s, backend killed mid-statement: %s", c.name, strings.TrimSpace(got[i]))
		checkReadable(t, c.name, got[i], "1927", "Lost connection to backend")
	}
	// Down: every client's connection attempt.
	for _, c := range clients {
		out := c.run("SELECT 1")
		t.Logf("%s, backend down: %s", c.name, strings.TrimSpace(out))
		checkReadable(t, c.name, out, "9001", "cannot connect to backend "+db.Addr)
	}
	if !strings.Contains(cli("SELECT 1"), "ERROR 9001 (HY000): rgproxy: cannot connect to backend") {
		t.Error("the mariadb CLI does not print ERROR 9001 (HY000) as it is")
	}
}

func checkReadable(t *testing.T, client, out, code, text string) {
	t.Helper()
	if !strings.Contains(out, code) || !strings.Contains(out, text) || strings.Contains(out, "2027") || strings.Contains(out, "malformed") {
		t.Errorf("%s printed %q, want error %s with %q", client, out, code, text)
	}
}

// waitSleepers waits until n sessions run SLEEP on the server at addr.
func waitSleepers(t *testing.T, addr string, n int) {
	t.Helper()
	d, err := sql.Open("mysql", dsn(addr, "db=mysql"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for deadline := time.Now().Add(15 * time.Second); ; {
		var k int
		if err := d.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(30)%'").Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d clients' statements reached the backend", k, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mysql2Version is the node mysql2 driver the tests install
// (scripts/test-deps.sh does too).
const mysql2Version = "3.24.6"

// requireMysql2 makes sure node's mysql2 is installed under .cache/node
// (npm, once) and returns a script that runs one query with it and prints
// the error's errno, SQLSTATE and message, or the rows. It fails under CI
// and skips elsewhere when node, npm or the registry is missing.
func requireMysql2(t *testing.T) string {
	t.Helper()
	requireTool(t, "node", "nodejs")
	dir, err := filepath.Abs("../.cache/node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "mysql2", "package.json")); err != nil {
		requireTool(t, "npm", "npm")
		out, err := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", dir, "mysql2@"+mysql2Version).CombinedOutput()
		if err != nil {
			msg := fmt.Sprintf("npm install mysql2@%s: %v\n%s", mysql2Version, err, out)
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	script := filepath.Join(t.TempDir(), "query.js")
	js := `const mysql = require(` + fmt.Sprintf("%q", filepath.Join(dir, "node_modules", "mysql2")) + `);
const [host, port, sql] = [process.argv[2], +process.argv[3], process.argv[4]];
const c = mysql.createConnection({host, port, user: 'root'});
c.on('error', () => {});
c.query(sql, (err, rows) => {
  if (err) console.log('errno ' + err.errno + ' sqlState ' + err.sqlState + ': ' + err.message);
  else console.log(JSON.stringify(rows));
  c.destroy();
});
`
	if err := os.WriteFile(script, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	return script
}

// TestRefusedSessionOutlivesWaitTimeout: a session whose statements are
// refused (8252) for longer than the backend's wait_timeout keeps its
// backend connection — rgproxy pings it while it answers the client
// itself — so the statement finally admitted runs, with the session's
// state intact.
func TestRefusedSessionOutlivesWaitTimeout(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "10ms", "--cpu-source", "wall")
	appUser(t, "wtu")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_wt",
		"CREATE RESOURCE GROUP rg_wt RU_PER_SEC = 5", "ALTER USER 'wtu'@'%' RESOURCE GROUP rg_wt")
	time.Sleep(300 * time.Millisecond)
	db := openDB(t, px.Addr, "user=wtu", "password=apppw")
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	// Session state that a reconnect would lose (retried past refusals of
	// the group's first statements, before its first grant).
	for {
		_, err := conn.ExecContext(ctx, "SET @marker = 42, SESSION wait_timeout = 2")
		if mysqlErrNo(err) == 8252 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	// 30 ms of wall time is about 10 RU: 2 s of the group's rate in debt.
	conn.ExecContext(ctx, "SELECT SLEEP(0.03)")
	refused, start := 0, time.Now()
	for time.Since(start) < 6*time.Second {
		_, err := conn.ExecContext(ctx, "SELECT SLEEP(0.03)")
		if mysqlErrNo(err) == 8252 {
			refused++
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("after %d refusals over %v: %v", refused, time.Since(start), err)
		}
	}
	if refused == 0 {
		t.Fatal("no statement was refused: the test proves nothing")
	}
	var marker int
	for {
		err := conn.QueryRowContext(ctx, "SELECT @marker").Scan(&marker)
		if mysqlErrNo(err) == 8252 {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err != nil || marker != 42 {
			t.Fatalf("the session after %d refusals in %v, past a 2 s wait_timeout: %d, %v", refused, time.Since(start), marker, err)
		}
		break
	}
	t.Logf("%d refusals over %v past wait_timeout 2s; the session kept its state", refused, time.Since(start).Round(time.Millisecond))
}
