package tests

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// connectorJJar is MariaDB Connector/J as Debian's libmariadb-java installs it.
const connectorJJar = "/usr/share/java/mariadb-java-client.jar"

// requireConnectorJ returns the command line that runs testdata/CapsClient.java
// with MariaDB Connector/J. It fails under CI and skips elsewhere when java
// or the connector is missing (scripts/test-deps.sh installs both).
func requireConnectorJ(t *testing.T) []string {
	t.Helper()
	java := requireTool(t, "java", "default-jre-headless")
	if _, err := os.Stat(connectorJJar); err != nil {
		msg := fmt.Sprintf("MariaDB Connector/J is not installed (apt-get install libmariadb-java; `make test` installs it): %v", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	src, err := filepath.Abs("testdata/CapsClient.java")
	if err != nil {
		t.Fatal(err)
	}
	return []string{java, "-cp", connectorJJar, src}
}

// connectorJ runs CapsClient in mode against addr and returns its output.
func connectorJ(t *testing.T, cmd []string, mode, addr, table string, rows int) string {
	t.Helper()
	args := append(cmd[1:len(cmd):len(cmd)], mode, addr, table, strconv.Itoa(rows))
	out, err := exec.Command(cmd[0], args...).CombinedOutput()
	if err != nil {
		t.Fatalf("CapsClient %s via %s: %v\n%s", mode, addr, err, out)
	}
	return string(out)
}

// TestConnectorJBulkAndPreparedIdenticalToDirect: MariaDB Connector/J's
// executeBatch is one COM_STMT_BULK_EXECUTE (update counts -2,
// SUCCESS_NO_INFO) through rgproxy as directly, and a server-side prepared
// statement executed twice returns the same rows and metadata.
func TestConnectorJBulkAndPreparedIdenticalToDirect(t *testing.T) {
	cj := requireConnectorJ(t)
	px := startProxy(t)
	direct := connectorJ(t, cj, "check", backendAddr, "caps_cj_check", 50)
	proxied := connectorJ(t, cj, "check", px.Addr, "caps_cj_check", 50)
	if proxied != direct {
		t.Fatalf("Connector/J through rgproxy:\n%s\ndirectly:\n%s", proxied, direct)
	}
	if !strings.Contains(direct, "batch 50 rows, update counts [-2]") || strings.Count(direct, "  row: ") != 10 {
		t.Fatalf("Connector/J did not run a bulk insert and two executes:\n%s", direct)
	}
	t.Logf("identical:\n%s", direct)
}

// TestBulkExecuteMetered: a bulk insert of 1000 rows is one write
// statement whose written bytes are the bulk's payload (base cost 2 WRU
// once, then 1 WRU per KiB), as SHOW LAST STATEMENT RU reports on the
// same connection.
func TestBulkExecuteMetered(t *testing.T) {
	cj := requireConnectorJ(t)
	px := startMeteredProxy(t, startTokenServer(t))
	out := connectorJ(t, cj, "ru", px.Addr, "caps_cj_ru", 1000)
	if !strings.Contains(out, "batch 1000 rows, update counts [-2]") {
		t.Fatalf("not a bulk insert:\n%s", out)
	}
	m := regexp.MustCompile(`(?m)^  row: (.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no SHOW LAST STATEMENT RU row:\n%s", out)
	}
	var f []string
	for _, v := range strings.Split(m[1], " | ") {
		f = append(f, strings.TrimPrefix(v, "String:"))
	}
	if len(f) < 8 {
		t.Fatalf("row %q", m[1])
	}
	num := func(i int) float64 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			t.Fatalf("column %d of %q: %v", i, m[1], err)
		}
		return v
	}
	group, wru, writeBytes := f[0], num(2), num(4)
	t.Logf("bulk insert of 1000 rows: %s", m[1])
	// Each row carries about 100 bytes of parameters.
	if group != "default" || writeBytes < 80_000 || writeBytes > 200_000 || f[7] != "NULL" && f[7] != "" {
		t.Fatalf("SHOW LAST STATEMENT RU: %q", m[1])
	}
	if want := 2 + writeBytes/1024; math.Abs(wru-want) > 0.01 {
		t.Fatalf("WRU %.3f, want %.3f (base 2, once, and 1 per KiB of the bulk's payload)", wru, want)
	}
}

// mysql2ExtendedTypes is a node script that reads JSON, UUID, INET4 and
// INET6 columns with mysql2 by query (text protocol) and by execute
// (binary protocol, twice) and prints the rows and each field's type.
const mysql2ExtendedTypes = `const mysql = require(process.argv[2] + '/promise');
const [host, port, table] = [process.argv[3], +process.argv[4], process.argv[5]];
(async () => {
  const c = await mysql.createConnection({host, port, user: 'root', database: 'rgproxy_e2e'});
  const out = [];
  const show = (label, [rows, fields]) => out.push({label, rows, fields: fields.map(f => ({
    name: f.name, type: f.columnType, typeName: f.extendedTypeName || null, format: f.extendedFormat || null}))});
  await c.query('DROP TABLE IF EXISTS ' + table);
  await c.query('CREATE TABLE ' + table + ' (id INT PRIMARY KEY, j JSON, u UUID, i6 INET6, i4 INET4)');
  await c.query('INSERT INTO ' + table + " VALUES (1, '{\"test\": true}', 'e2f5f6a0-1111-2222-3333-444455556666', '::1', '10.0.0.1'), " +
    "(2, '[\"😂\", 2]', NULL, '2001:db8::8a2e:370:7334', NULL)");
  const sql = "SELECT id, j, u, i6, i4, JSON_EXTRACT(j, '$[0]') AS e, JSON_OBJECT('k', id) AS o FROM " + table + ' WHERE id >= ? ORDER BY id';
  show('query', await c.query(sql, [1]));
  show('execute', await c.execute(sql, [1]));
  show('execute again', await c.execute(sql, [2]));
  await c.query('DROP TABLE ' + table);
  await c.end();
  console.log(JSON.stringify(out));
})().catch(e => { console.log('error ' + e.errno + ': ' + e.message); process.exit(1); });
`

// TestMysql2ExtendedTypesIdenticalToDirect: node's mysql2 asks MariaDB for
// extended type info and, with it, parses a JSON column into an object and
// names UUID and INET columns; through rgproxy it returns the same, by
// query and by execute.
func TestMysql2ExtendedTypesIdenticalToDirect(t *testing.T) {
	requireMysql2(t)
	module, err := filepath.Abs("../.cache/node/node_modules/mysql2")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(t.TempDir(), "types.js")
	if err := os.WriteFile(script, []byte(mysql2ExtendedTypes), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		out, err := exec.Command("node", script, module, host, port, "caps_mysql2").CombinedOutput()
		if err != nil {
			t.Fatalf("node via %s: %v\n%s", addr, err, out)
		}
		return string(out)
	}
	px := startProxy(t)
	direct, proxied := run(backendAddr), run(px.Addr)
	if proxied != direct {
		t.Fatalf("mysql2 through rgproxy:\n%s\ndirectly:\n%s", proxied, direct)
	}
	var sets []struct {
		Label  string
		Rows   []map[string]any
		Fields []struct{ Name, TypeName, Format string }
	}
	if err := json.Unmarshal([]byte(direct), &sets); err != nil || len(sets) != 3 {
		t.Fatalf("output %s: %v", direct, err)
	}
	for _, s := range sets {
		if j, ok := s.Rows[0]["j"].(map[string]any); s.Label != "execute again" && (!ok || j["test"] != true) {
			t.Errorf("%s: JSON column read as %#v, want an object", s.Label, s.Rows[0]["j"])
		}
		names := map[string]string{}
		for _, f := range s.Fields {
			names[f.Name] = f.TypeName + f.Format
		}
		if names["j"] != "json" || names["u"] != "uuid" || names["i6"] != "inet6" || names["i4"] != "inet4" || names["e"] != "json" {
			t.Errorf("%s: extended types %v", s.Label, names)
		}
	}
	if e := sets[2].Rows[0]["e"]; e != "😂" {
		t.Errorf("JSON_EXTRACT read as %#v, want the string 😂", e)
	}
	t.Logf("identical: %s", direct)
}

// TestProgressReportsThroughCLI: the mariadb CLI, interactive (on a
// pseudo-terminal) with --progress-reports, shows MariaDB's progress
// reports of a long ALTER TABLE through rgproxy as it does directly, and
// the same result.
func TestProgressReportsThroughCLI(t *testing.T) {
	requireTool(t, "mariadb", "mariadb-client")
	script := requireTool(t, "script", "bsdutils")
	const table = "rgproxy_e2e.caps_progress"
	rootExec(t, "DROP TABLE IF EXISTS "+table,
		"CREATE TABLE "+table+" (id INT PRIMARY KEY, v VARCHAR(64)) ENGINE=InnoDB",
		"INSERT INTO "+table+" SELECT seq, 'x' FROM seq_1_to_50000")
	t.Cleanup(func() { rootExec(t, "DROP TABLE IF EXISTS "+table) })
	// The ALTER copies the table and computes a stored column that hashes
	// work kilobytes per row: a long statement from a small table.
	var work int
	run := func(addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		cmd := exec.Command(script, "-qec", fmt.Sprintf("mariadb --no-defaults -h%s -P%s -uroot -A --progress-reports", host, port), "/dev/null")
		cmd.Stdin = strings.NewReader(fmt.Sprintf("SET SESSION progress_report_time = 1;\n"+
			"ALTER TABLE %s ADD COLUMN h VARCHAR(128) AS (SHA2(REPEAT(v, %d), 512)) STORED, ALGORITHM=COPY;\n"+
			"ALTER TABLE %s DROP COLUMN h;\nexit\n", table, work*1000, table))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("mariadb CLI via %s: %v\n%s", addr, err, out)
		}
		return string(out)
	}
	stages := regexp.MustCompile(`Stage: (\d+) of (\d+) '([^']*)'`)
	took := regexp.MustCompile(`Query OK, 50000 rows affected \((\d+\.\d+) sec\)`)
	seconds := func(out string) float64 {
		m := took.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("the ALTER did not end well:\n%s", out)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	// More work per row until the ALTER runs over 2 s directly: MariaDB
	// reports its progress after the first second, so it surely reports
	// through rgproxy too.
	var direct string
	for work = 10; ; work *= 2 {
		if direct = run(backendAddr); seconds(direct) >= 2 || work >= 160 {
			break
		}
	}
	if !stages.MatchString(direct) {
		t.Fatalf("no progress reports directly with %d KB per row:\n%s", work, direct)
	}
	px := startProxy(t)
	proxied := run(px.Addr)
	t.Logf("%d KB hashed per row; directly: %q; through rgproxy: %q", work, stages.FindAllString(direct, -1), stages.FindAllString(proxied, -1))
	if !strings.Contains(proxied, "Stage: 1 of 2 'copy to tmp table'") {
		t.Fatalf("no progress reports through rgproxy:\n%s", proxied)
	}
	// Apart from the reports (their number and percentages depend on
	// timing), the connection id and the timings, the sessions read alike.
	normalize := func(s string) string {
		s = regexp.MustCompile(`Stage: [^\r\n]*?done *`).ReplaceAllString(s, "")
		// Each report ends with a carriage return: one more report leaves
		// one more.
		s = regexp.MustCompile(`\r+`).ReplaceAllString(s, "\r")
		s = regexp.MustCompile(`connection id is \d+`).ReplaceAllString(s, "connection id is N")
		s = regexp.MustCompile(`\(\d+\.\d+ sec\)`).ReplaceAllString(s, "(T)")
		return regexp.MustCompile(`[ \r]+\n`).ReplaceAllString(s, "\n")
	}
	if normalize(proxied) != normalize(direct) {
		t.Fatalf("the sessions differ:\nthrough rgproxy:\n%s\ndirectly:\n%s", normalize(proxied), normalize(direct))
	}
	if want := "Query OK, 50000 rows affected"; !strings.Contains(proxied, want) {
		t.Fatalf("no %q through rgproxy:\n%s", want, proxied)
	}
}

// TestCompressionAskedGetsPlainSession: rgproxy does not offer
// compression (it must read statements in clear to meter them); the
// mariadb CLI asking for it with --compress gets an uncompressed session
// that works, where directly it would be compressed.
func TestCompressionAskedGetsPlainSession(t *testing.T) {
	requireTool(t, "mariadb", "mariadb-client")
	px := startProxy(t)
	run := func(addr string) string {
		host, port, _ := strings.Cut(addr, ":")
		out, err := exec.Command("mariadb", "--no-defaults", "--compress", "-h"+host, "-P"+port, "-uroot", "-N", "-B",
			"-e", "SHOW SESSION STATUS LIKE 'Compression'; SELECT REPEAT('z', 100000) = REPEAT('z', 100000)").CombinedOutput()
		if err != nil {
			t.Fatalf("mariadb --compress via %s: %v\n%s", addr, err, out)
		}
		return string(out)
	}
	if got := run(backendAddr); got != "Compression\tON\n1\n" {
		t.Fatalf("directly: %q", got)
	}
	if got := run(px.Addr); got != "Compression\tOFF\n1\n" {
		t.Fatalf("through rgproxy: %q", got)
	}
}
