package tests

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeRoute is one way of writing 1 MiB to a table (issue 22, Why 4):
// its statements, run in order on one session through rgproxy.
type writeRoute struct {
	name  string
	stmts []string
	// binary: the last statement runs as a prepared statement of the
	// binary protocol with a 1 MiB parameter.
	binary bool
	// factor: how many MiB the route writes (a copying trigger: 2).
	factor float64
	// estimate says what the estimate (without a binary log) charges:
	// "" = affected rows × the written table's AVG_ROW_LENGTH (the
	// table named last in the statement); "packet" = nothing beyond the
	// statements' own bytes (the route names no table).
	estimate string
	table    string // the table whose average row length the estimate uses
}

const oneMiB = 1 << 20

// writeRoutes are the routes of issue 22's Why 4 and the lead's list, into
// tables t (id, b LONGBLOB) and tt (whose trigger copies each row into c).
func writeRoutes() []writeRoute {
	lit := strings.Repeat("x", oneMiB)
	return []writeRoute{
		{name: "literal INSERT", stmts: []string{"INSERT INTO t (b) VALUES ('" + lit + "')"}, factor: 1, table: "t"},
		{name: "SET @v then INSERT VALUES (@v)", stmts: []string{"SET @v = '" + lit + "'", "INSERT INTO t (b) VALUES (@v)"}, factor: 1, table: "t"},
		{name: "EXECUTE IMMEDIATE", stmts: []string{"EXECUTE IMMEDIATE 'INSERT INTO t (b) VALUES (''" + lit + "'')'"}, factor: 1, table: "t"},
		{name: "PREPARE ... EXECUTE ... USING @w", stmts: []string{"SET @w = '" + lit + "'", "PREPARE s FROM 'INSERT INTO t (b) VALUES (?)'",
			"EXECUTE s USING @w", "DEALLOCATE PREPARE s"}, factor: 1, table: "t"},
		{name: "INSERT ... SELECT REPEAT", stmts: []string{"INSERT INTO t (b) SELECT REPEAT('x', 1048576)"}, factor: 1, table: "t"},
		{name: "stored procedure", stmts: []string{"CALL fill()"}, factor: 1, estimate: "packet"},
		{name: "trigger copying the row", stmts: []string{"INSERT INTO tt (b) SELECT REPEAT('x', 1048576)"}, factor: 2, table: "tt"},
		{name: "transaction", stmts: []string{"BEGIN", "INSERT INTO t (b) SELECT REPEAT('x', 1048576)", "COMMIT"}, factor: 1, table: "t"},
		{name: "binary-protocol prepared INSERT", stmts: []string{"INSERT INTO t (b) VALUES (?)"}, binary: true, factor: 1, table: "t"},
		{name: "UPDATE to 1 MiB", stmts: []string{"UPDATE t SET b = REPEAT('y', 1048576) WHERE id = 1"}, factor: 1, table: "t"},
	}
}

// writeSchema is the routes' tables. The statistics of t and tt are
// persistent and not recalculated automatically, so that the estimate's
// AVG_ROW_LENGTH stays what the test reads while the routes add rows.
func writeSchema(db string) []string {
	return []string{
		"DROP DATABASE IF EXISTS " + db,
		"CREATE DATABASE " + db,
		"CREATE TABLE " + db + ".t (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB) STATS_PERSISTENT = 1 STATS_AUTO_RECALC = 0",
		"CREATE TABLE " + db + ".tt (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB) STATS_PERSISTENT = 1 STATS_AUTO_RECALC = 0",
		"CREATE TABLE " + db + ".c (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)",
		"CREATE TABLE " + db + ".small (id INT AUTO_INCREMENT PRIMARY KEY, b VARCHAR(20))",
		"INSERT INTO " + db + ".small (b) VALUES ('0123456789')",
		"CREATE TRIGGER " + db + ".copy AFTER INSERT ON " + db + ".tt FOR EACH ROW INSERT INTO " + db + ".c (b) VALUES (NEW.b)",
		"CREATE PROCEDURE " + db + ".fill() INSERT INTO " + db + ".t (b) VALUES (REPEAT('x', 1048576))",
		// Four 1 MiB rows each, and statistics, for the estimate.
		"INSERT INTO " + db + ".t (b) SELECT REPEAT('s', 1048576) FROM seq_1_to_4",
		"INSERT INTO " + db + ".tt (b) SELECT REPEAT('s', 1048576) FROM seq_1_to_4",
		"ANALYZE TABLE " + db + ".t, " + db + ".tt, " + db + ".small",
	}
}

// routeCost runs a route on conn and returns the WRU its statements were
// charged (SHOW LAST STATEMENT RU after each, which waits for a binary-log
// claim) and the WRU_SOURCE of each.
func routeCost(t *testing.T, conn *sql.Conn, r writeRoute) (float64, []string) {
	t.Helper()
	ctx := context.Background()
	var wru float64
	var sources []string
	for i, q := range r.stmts {
		var err error
		if r.binary && i == len(r.stmts)-1 {
			_, err = conn.ExecContext(ctx, q, []byte(strings.Repeat("z", oneMiB)))
		} else {
			_, err = conn.ExecContext(ctx, q)
		}
		if err != nil {
			t.Fatalf("%s: %.60s: %v", r.name, q, err)
		}
		row := lastStatementRU(t, conn)
		wru += num(t, row["WRU"])
		sources = append(sources, row["WRU_SOURCE"])
	}
	return wru, sources
}

func waitWriteSource(t *testing.T, px *proxy, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, body := httpGet(t, "http://"+px.StatusAddr+"/readyz")
		var h struct {
			WriteSource string `json:"write_source"`
		}
		_ = json.Unmarshal([]byte(body), &h)
		if h.WriteSource == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz write_source never became %s: %s", want, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWritesPayWhatTheBinlogShows: against a backend with a row-based
// binary log, 1 MiB written by each route costs 0.9–1.1× the WRU of the
// same 1 MiB as a literal (a copying trigger, which writes it twice, 2×),
// whatever route the bytes took; on the code before it the routes cost 0
// to 4 WRU against the literal's 1,026.
func TestWritesPayWhatTheBinlogShows(t *testing.T) {
	m := startPrivateMariaDB(t, "--log-bin", "--binlog-format=ROW", "--server-id=1", "--max-allowed-packet=64M")
	// The service account reads the binary log with REPLICATION SLAVE
	// alone (CONNECTION ADMIN is for KILL QUERY).
	m.exec(t, append([]string{"CREATE USER 'rgsvc'@'%' IDENTIFIED BY 'svcpw'", "GRANT REPLICATION SLAVE ON *.* TO 'rgsvc'@'%'"},
		writeSchema("w")...)...)
	pw := filepath.Join(t.TempDir(), "svc.pw")
	if err := os.WriteFile(pw, []byte("svcpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--backend", m.Addr, "--admin-user", "rgsvc", "--admin-password-file", pw)
	waitWriteSource(t, px, "binlog")
	db := openDB(t, px.Addr, "db=w")
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wruBefore := metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="default"`, `type="wru"`)

	var literal, total float64
	for _, r := range writeRoutes() {
		wru, sources := routeCost(t, conn, r)
		source := sources[len(sources)-1] // the statement that committed
		if strings.HasPrefix(r.stmts[len(r.stmts)-1], "DEALLOCATE") {
			source = sources[len(sources)-2]
		}
		total += wru
		if r.name == "literal INSERT" {
			literal = wru
		}
		ratio := wru / (literal * r.factor)
		t.Logf("%-34s %8.1f WRU  %.3f× the literal's%s  (%s)", r.name, wru, ratio, map[bool]string{true: " per MiB", false: ""}[r.factor != 1], source)
		if ratio < 0.9 || ratio > 1.1 || source != "binlog" {
			t.Errorf("%s: %.1f WRU from %s, want 0.9–1.1× %.0f × %.1f WRU from the binlog", r.name, wru, source, r.factor, literal)
		}
	}
	if literal < 1000 || literal > 1100 {
		t.Errorf("the literal costs %.1f WRU, want ~1,026 (2 + 1 per KiB)", literal)
	}
	// The late charges reach the group's counters as well.
	got := metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="default"`, `type="wru"`) - wruBefore
	if math.Abs(got-total) > 0.01*total {
		t.Errorf("rgproxy_ru_consumed_total{type=wru} grew %.1f, the routes were shown %.1f", got, total)
	}
	if b := metricSum(t, px.StatusAddr, "rgproxy_written_bytes_total", `resource_group="default"`, `source="binlog"`); b < 7*oneMiB {
		t.Errorf("rgproxy_written_bytes_total{source=binlog} %.0f, want the routes' bytes beyond their packets", b)
	}

	// The query that names the transaction leaves the statement's
	// warnings for SHOW WARNINGS.
	ctx := context.Background()
	if _, err := conn.ExecContext(ctx, "CREATE TABLE n (a TINYINT)"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "SET sql_mode = ''"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "INSERT INTO n VALUES (1000)"); err != nil {
		t.Fatal(err)
	}
	var level, msg string
	var code int
	if err := conn.QueryRowContext(ctx, "SHOW WARNINGS").Scan(&level, &code, &msg); err != nil || code != 1264 {
		t.Errorf("SHOW WARNINGS after a write: %d %q, %v; want 1264", code, msg, err)
	}
	// ROW_COUNT(), which that query sets to -1, is given back to the
	// statement that follows a DML statement.
	if _, err := conn.ExecContext(ctx, "INSERT INTO n VALUES (1), (2), (3)"); err != nil {
		t.Fatal(err)
	}
	var rc int
	var name []string
	rows, err := conn.QueryContext(ctx, "SELECT ROW_COUNT()")
	if err == nil {
		name, _ = rows.Columns()
		for rows.Next() {
			err = rows.Scan(&rc)
		}
		rows.Close()
	}
	if err != nil || rc != 3 || len(name) != 1 || name[0] != "ROW_COUNT()" {
		t.Errorf("SELECT ROW_COUNT() after a 3-row INSERT: %v %d, %v; want ROW_COUNT() 3", name, rc, err)
	}
	conn.Close()

	// The backend restarts: the reader follows it again, and the routes
	// pay again.
	if err := m.process.stop(20 * time.Second); err != nil {
		t.Logf("mariadbd stopped: %v", err)
	}
	m.start(t)
	waitWriteSource(t, px, "binlog")
	conn, err = db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if wru, sources := routeCost(t, conn, writeRoutes()[4]); wru/literal < 0.9 || wru/literal > 1.1 || sources[0] != "binlog" {
		t.Errorf("after the backend's restart, INSERT ... SELECT costs %.1f WRU (%v), want ~%.0f from the binlog", wru, sources, literal)
	}

	// A service account without REPLICATION SLAVE cannot read the log:
	// auto falls back to the estimate, and the log says why.
	m.exec(t, "CREATE USER 'rgnorepl'@'%' IDENTIFIED BY 'svcpw'")
	px2 := startMeteredProxy(t, ts, "--backend", m.Addr, "--admin-user", "rgnorepl", "--admin-password-file", pw)
	waitWriteSource(t, px2, "estimate")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(px2.log.String(), "not following the backend's binary log") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about the missing grant:\n%s", px2.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(px2.log.String(), "REPLICATION SLAVE") {
		t.Errorf("the warning does not name the missing privilege:\n%s", px2.log.String())
	}
}

// TestWritesEstimateWithoutBinlog: against the shared backend, which keeps
// no binary log, a route that names its table is charged what the
// estimate promises — max(its packet, affected rows × the table's
// AVG_ROW_LENGTH as information_schema.TABLES reports it, for a table of
// at least 1 MiB of data) — and a route that names none (CALL), or a
// write to a small table, its packet, as SHOW LAST STATEMENT RU's
// WRU_SOURCE says.
func TestWritesEstimateWithoutBinlog(t *testing.T) {
	rootExec(t, writeSchema("rgproxy_e2e_writes")...)
	t.Cleanup(func() { rootExec(t, "DROP DATABASE IF EXISTS rgproxy_e2e_writes") })
	avg := map[string]float64{}
	direct := openDB(t, backendAddr)
	for _, tbl := range []string{"t", "tt"} {
		var a float64
		if err := direct.QueryRow("SELECT AVG_ROW_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'rgproxy_e2e_writes' AND TABLE_NAME = ?", tbl).Scan(&a); err != nil {
			t.Fatal(err)
		}
		avg[tbl] = a
	}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts) // no --admin-user: auto is the estimate
	waitWriteSource(t, px, "estimate")
	db := openDB(t, px.Addr, "db=rgproxy_e2e_writes")
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var literal float64
	for _, r := range writeRoutes() {
		wru, sources := routeCost(t, conn, r)
		if r.name == "literal INSERT" {
			literal = wru
		}
		source := "packet" // what the route's statements show: estimate if any is
		for _, s := range sources {
			if s != "packet" {
				source = s
			}
		}
		// Each write statement pays 2 WRU and 1 per KiB of its own
		// payload; a statement naming the table (INSERT, UPDATE, and
		// EXECUTE of one) pays max(that payload, 1 row × AVG_ROW_LENGTH)
		// instead.
		var want float64
		for i, q := range r.stmts {
			verb := strings.Fields(strings.ToUpper(q))[0]
			var packet float64
			switch verb {
			case "INSERT", "UPDATE", "CALL", "COMMIT":
				want += 2
				packet = float64(len(q) + 1)
				if r.binary && i == len(r.stmts)-1 {
					packet = oneMiB + float64(len(q)) // roughly: the parameter; the estimate is larger
				}
			}
			switch {
			case r.estimate == "" && (verb == "INSERT" || verb == "UPDATE" || verb == "EXECUTE"):
				want += math.Max(packet, avg[r.table]) / 1024
			default:
				want += packet / 1024
			}
		}
		wantSource := "estimate"
		if r.estimate != "" {
			wantSource = "packet"
		}
		t.Logf("%-34s %8.1f WRU  %.3f× the literal's  (%s; AVG_ROW_LENGTH %s)", r.name, wru, wru/literal, source,
			fmt.Sprint(avg[r.table]))
		if math.Abs(wru-want) > 0.01 || source != wantSource {
			t.Errorf("%s: %.3f WRU from %s, want %.3f from %s", r.name, wru, source, want, wantSource)
		}
	}
	// A small table's average row length is one page's rounding (one
	// 10-byte row reads 16,384): not used.
	q := "INSERT INTO small (b) VALUES ('0123456789')"
	if _, err := conn.ExecContext(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if row := lastStatementRU(t, conn); row["WRU_SOURCE"] != "packet" || math.Abs(num(t, row["WRU"])-(2+float64(len(q)+1)/1024)) > 0.001 {
		t.Errorf("an INSERT into a small table: %v, want its packet", row)
	}
}
