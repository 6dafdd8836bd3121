package tests

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// conservationGroups are the groups TestRUConservation loads, and what
// each one's statements do. default is left out: the administrator's
// reads of statements_summary are charged there while the test reads.
var conservationGroups = []string{"rg_cons_r", "rg_cons_w", "rg_cons_tiny", "rg_cons_debt", "rg_cons_t", "rg_cons_tb", "rg_cons_warn"}

// TestRUConservation: a statement's RU is counted alike everywhere it is
// reported. A mixed load — reads, writes charged late from a row-based
// binary log (alone and inside transactions), refusals (8252), failed
// writes whose bytes are refunded, a transaction run on debt and repaid,
// a strict-mode tag charging two groups, statements of a MODE WARN group
// — leaves, per group, rgproxy_ru_consumed_total (over its labels),
// rgserver's rgserver_ru_consumed_total and the sum over
// information_schema.statements_summary (read through the proxy) within
// 0.5% of each other.
func TestRUConservation(t *testing.T) {
	start := time.Now()
	m := startPrivateMariaDB(t, "--log-bin", "--binlog-format=ROW", "--server-id=1", "--max-allowed-packet=64M")
	m.exec(t, "CREATE USER 'rgsvc'@'%' IDENTIFIED BY 'svcpw'", "GRANT REPLICATION SLAVE ON *.* TO 'rgsvc'@'%'",
		"CREATE DATABASE c",
		"CREATE TABLE c.t (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)",
		"CREATE TABLE c.k (id INT PRIMARY KEY, b LONGBLOB)",
		"INSERT INTO c.k VALUES (1, 'one')")
	users := map[string]string{"u_r": "rg_cons_r", "u_w": "rg_cons_w", "u_tiny": "rg_cons_tiny",
		"u_debt": "rg_cons_debt", "u_t": "rg_cons_t", "u_warn": "rg_cons_warn"}
	for u := range users {
		m.exec(t, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'apppw'", u),
			fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON c.* TO '%s'@'%%'", u))
	}
	pw := filepath.Join(t.TempDir(), "svc.pw")
	if err := os.WriteFile(pw, []byte("svcpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--backend", m.Addr, "--admin-user", "rgsvc", "--admin-password-file", pw,
		"--max-wait", "3s", "--max-wait-in-txn", "100ms", "--strict-resource-groups=true")
	waitWriteSource(t, px, "binlog")
	admin := []string{
		"CREATE RESOURCE GROUP rg_cons_r RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP rg_cons_w RU_PER_SEC = 100000",
		// 2 RU/s: an 8 KiB write (about 10 RU) can never be granted within
		// the wait, a SELECT can.
		"CREATE RESOURCE GROUP rg_cons_tiny RU_PER_SEC = 2",
		"CREATE RESOURCE GROUP rg_cons_debt RU_PER_SEC = 60",
		"CREATE RESOURCE GROUP rg_cons_t RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP rg_cons_tb RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP rg_cons_warn RU_PER_SEC = 1 MODE = WARN",
		"CREATE RESOURCE GROUP BINDING FOR TAG route = '/cons' TO rg_cons_tb",
	}
	for u, g := range users {
		admin = append(admin, fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP %s", u, g))
	}
	ctx := context.Background()
	root, err := openDB(t, px.Addr, "db=c").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, q := range admin {
		mustExec(t, root, q)
	}
	session := func(user string) *sql.Conn {
		db := openDB(t, px.Addr, "user="+user, "password=apppw", "db=c")
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	run := func(conn *sql.Conn, q string, wantErr uint16) {
		t.Helper()
		err := sqlRun(conn, q)
		if got := mysqlErrNo(err); got != wantErr || (wantErr == 0 && err != nil) {
			t.Fatalf("%.60s: %v, want error %d", q, err, wantErr)
		}
	}
	kib := func(n int) string { return strings.Repeat("x", n<<10) }

	// Reads.
	r := session("u_r")
	for i := range 40 {
		run(r, fmt.Sprintf("SELECT id, LENGTH(b) FROM t WHERE id > %d", i), 0)
		run(r, "SELECT SUM(seq) FROM seq_1_to_20000", 0)
	}

	// Writes charged late from the binary log, alone and inside a
	// transaction, and failed writes whose bytes are refunded.
	w := session("u_w")
	for i := range 10 {
		run(w, fmt.Sprintf("INSERT INTO t (b) SELECT REPEAT('w', %d)", 64<<10+i), 0)
		run(w, "INSERT INTO t (b) VALUES ('"+kib(4)+"')", 0)
		run(w, "INSERT INTO k VALUES (1, '"+kib(16)+"')", 1062) // refunded bytes
	}
	for range 3 {
		run(w, "BEGIN", 0)
		run(w, "INSERT INTO t (b) SELECT REPEAT('v', 100000)", 0)
		run(w, "UPDATE t SET b = REPEAT('u', 50000) ORDER BY id DESC LIMIT 1", 0)
		run(w, "COMMIT", 0)
	}
	lastStatementRU(t, w) // waits for the last claim
	// COMMIT never waits: its cost is the session's debt until a
	// statement outside a transaction repays it.
	run(w, "SELECT 1", 0)

	// Refusals: an 8 KiB write in a 2 RU/s group can never be granted.
	tiny := session("u_tiny")
	for range 5 {
		run(tiny, "SELECT 1", 0)
		run(tiny, "INSERT INTO t (b) VALUES ('"+kib(8)+"')", 8252)
	}

	// A transaction on debt, repaid: the bucket is drained outside the
	// transaction, then a 40 KiB write inside it cannot get its tokens
	// within --max-wait-in-txn and runs on the session's debt, which the
	// next statement outside the transaction repays.
	debt := session("u_debt")
	run(debt, "INSERT INTO t (b) VALUES ('"+kib(40)+"')", 0)
	run(debt, "BEGIN", 0)
	run(debt, "INSERT INTO t (b) VALUES ('"+kib(40)+"')", 0)
	run(debt, "COMMIT", 0)
	repayStart := time.Now()
	run(debt, "SELECT 1", 0)
	if waited := lastStatementRU(t, debt)["WAITED"]; time.Since(repayStart) < 300*time.Millisecond {
		t.Errorf("the statement after the transaction on debt took %v (WAITED %s): it repaid nothing", time.Since(repayStart), waited)
	}

	// A strict-mode tag: both groups are charged.
	tag := session("u_t")
	for i := range 20 {
		run(tag, fmt.Sprintf("SELECT %d /*route='%%2Fcons'*/", i), 0)
		run(tag, "INSERT INTO t (b) VALUES ('"+kib(2)+"') /*route='%2Fcons'*/", 0)
	}
	if last := lastStatementRU(t, tag); last["TAG_RESOURCE_GROUP"] != "rg_cons_tb" {
		t.Errorf("SHOW LAST STATEMENT RU after a tagged statement: %v", last)
	}

	// MODE WARN: ENFORCE would have refused these; they run.
	warn := session("u_warn")
	for range 5 {
		run(warn, "SELECT SUM(seq) FROM seq_1_to_10000", 0)
		run(warn, "INSERT INTO t (b) VALUES ('"+kib(8)+"')", 0)
	}
	if v := metricSum(t, px.StatusAddr, "rgproxy_would_throttle_total", `resource_group="rg_cons_warn"`); v < 1 {
		t.Errorf("rgproxy_would_throttle_total{rg_cons_warn} = %v: the WARN group was never shadow-refused", v)
	}
	for _, c := range []*sql.Conn{r, w, tiny, debt, tag, warn} {
		c.Close() // sessions end: their purses are settled
	}

	// Wait until rgserver has what the proxy reported: the three sums
	// agree, or rgserver's stopped changing for longer than a report
	// period (then they disagree for good).
	type sums struct{ proxy, server, summary float64 }
	read := func() map[string]sums {
		out := map[string]sums{}
		for _, row := range connRows(t, root, "SELECT RESOURCE_GROUP, SUM((AVG_REQUEST_UNIT_READ + AVG_REQUEST_UNIT_WRITE) * EXEC_COUNT) "+
			"FROM information_schema.statements_summary GROUP BY RESOURCE_GROUP")[1:] {
			v, _ := strconv.ParseFloat(row[1], 64)
			s := out[row[0]]
			s.summary = v
			out[row[0]] = s
		}
		for _, g := range conservationGroups {
			s := out[g]
			s.proxy = metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+g+`"`)
			s.server = metricSum(t, ts.StatusAddr, "rgserver_ru_consumed_total", `resource_group="`+g+`"`)
			out[g] = s
		}
		return out
	}
	agree := func(s sums) bool {
		hi := max(s.proxy, s.server, s.summary)
		return hi > 0 && min(s.proxy, s.server, s.summary) >= hi*(1-0.005)
	}
	const stable = 7 * time.Second // rgproxy reports within 5 s
	var got map[string]sums
	lastServer, changed := map[string]float64{}, time.Now()
	for deadline := time.Now().Add(60 * time.Second); ; {
		got = read()
		all := true
		for _, g := range conservationGroups {
			if got[g].server != lastServer[g] {
				lastServer[g], changed = got[g].server, time.Now()
			}
			all = all && agree(got[g])
		}
		if all || time.Since(changed) > stable || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, g := range conservationGroups {
		s := got[g]
		t.Logf("%-13s rgproxy %10.3f  rgserver %10.3f  statements_summary %10.3f RU", g, s.proxy, s.server, s.summary)
		if !agree(s) {
			// Which part disagrees: RRU or WRU, and the written bytes by source.
			for _, typ := range []string{"rru", "wru"} {
				t.Logf("%s %s: rgproxy %.3f rgserver %.3f", g, typ,
					metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+g+`"`, `type="`+typ+`"`),
					metricSum(t, ts.StatusAddr, "rgserver_ru_consumed_total", `resource_group="`+g+`"`, `type="`+typ+`"`))
			}
			for _, src := range []string{"packet", "binlog", "estimate"} {
				t.Logf("%s written bytes from %s: %.0f", g, src,
					metricSum(t, px.StatusAddr, "rgproxy_written_bytes_total", `resource_group="`+g+`"`, `source="`+src+`"`))
			}
			t.Errorf("%s: rgproxy_ru_consumed_total %.3f, rgserver_ru_consumed_total %.3f, statements_summary %.3f: "+
				"not within 0.5%% (%.2f%% apart)", g, s.proxy, s.server, s.summary,
				100*(max(s.proxy, s.server, s.summary)-min(s.proxy, s.server, s.summary))/math.Max(max(s.proxy, s.server, s.summary), 1e-9))
		}
	}
	t.Logf("run time %v", time.Since(start).Round(time.Millisecond))
}
