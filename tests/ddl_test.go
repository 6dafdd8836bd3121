package tests

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ddlBackend is a private MariaDB keeping a row-based binary log as the
// one make run starts does, with the
// event scheduler on, rgproxy's service account (rgsvc, REPLICATION SLAVE)
// and a database w; rgserver; and a proxy with that account in front of
// it, following the log (--write-source auto: binlog). It returns the
// flags that start another such proxy.
func ddlBackend(t *testing.T, proxyFlags ...string) (*privateMariaDB, *tokenServer, *proxy, []string) {
	t.Helper()
	// The binary-log options are scripts/ensure-mariadb.sh's (make run's).
	m := startPrivateMariaDB(t, "--log-bin=mariadb-bin", "--binlog-format=ROW", "--server-id=1",
		"--binlog-expire-logs-seconds=259200", "--max-allowed-packet=64M", "--event-scheduler=ON")
	m.exec(t, "CREATE USER 'rgsvc'@'%' IDENTIFIED BY 'svcpw'", "GRANT REPLICATION SLAVE ON *.* TO 'rgsvc'@'%'",
		"CREATE DATABASE w")
	pw := filepath.Join(t.TempDir(), "svc.pw")
	if err := os.WriteFile(pw, []byte("svcpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	svc := []string{"--backend", m.Addr, "--admin-user", "rgsvc", "--admin-password-file", pw}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, append(svc, proxyFlags...)...)
	waitWriteSource(t, px, "binlog")
	return m, ts, px, svc
}

// eventCreate is what an attacker runs: an event writing 4 MiB a second.
const eventCreate = "CREATE EVENT w.fill ON SCHEDULE EVERY 1 SECOND DO INSERT INTO w.ev (b) VALUES (REPEAT('x', 4194304))"

// eventCount is how many events the private server holds in w.
func eventCount(t *testing.T, root *sql.DB) int {
	t.Helper()
	var n int
	if err := root.QueryRow("SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = 'w'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEventsRefusedInALimitedGroup: the event scheduler writes as the
// event's definer, outside any session rgproxy meters (issue 29: an event
// inserting 4 MiB every second wrote 29.4 MB for 164 B charged). In strict
// mode an account bound to a limited group may not create or alter one,
// by any route, and the error says why; DROP EVENT stays allowed; an
// administrator may create one, and so may anyone outside strict mode
// (unpriced, as docs/security.md says). On the code before, CREATE EVENT
// went through and what the event wrote was charged to no group.
func TestEventsRefusedInALimitedGroup(t *testing.T) {
	m, ts, px, svc := ddlBackend(t)
	direct, err := sql.Open("mysql", dsn(m.Addr, "db=w"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	m.exec(t, "CREATE TABLE w.ev (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)",
		"CREATE USER 'evt'@'%' IDENTIFIED BY 'apppw'", "GRANT ALL ON w.* TO 'evt'@'%'",
		// An event of the account's from before it was bound, disabled.
		"CREATE DEFINER = 'evt'@'%' EVENT w.old ON SCHEDULE EVERY 1 HOUR DISABLE DO SELECT 1")
	root := openDB(t, px.Addr, "db=w")
	for _, q := range []string{"CREATE RESOURCE GROUP rg_evt RU_PER_SEC = 1000", "ALTER USER 'evt'@'%' RESOURCE GROUP rg_evt"} {
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db := openDB(t, px.Addr, "db=w", "user=evt", "password=apppw", "multiStatements=true")
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wruBefore := metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_evt"`, `type="wru"`)
	routes := []string{
		eventCreate,
		"create or replace definer = current_user event w.fill on schedule every 1 second do insert into w.ev (b) values (repeat('x', 4194304))",
		"/*!50106 " + eventCreate + " */",
		"SELECT 1; " + eventCreate,
		"PREPARE s FROM '" + strings.ReplaceAll(eventCreate, "'", "''") + "'",
		"EXECUTE IMMEDIATE '" + strings.ReplaceAll(eventCreate, "'", "''") + "'",
		"SET @q = '" + strings.ReplaceAll(eventCreate, "'", "''") + "'", // allowed: sets the text for the next two
		"PREPARE s FROM @q",
		"EXECUTE IMMEDIATE @q",
		"ALTER EVENT w.old ENABLE",
		"ALTER EVENT w.old ON SCHEDULE EVERY 1 SECOND DO INSERT INTO w.ev (b) VALUES (REPEAT('x', 4194304))",
	}
	for _, q := range routes {
		_, err := conn.ExecContext(ctx, q)
		if strings.HasPrefix(q, "SET @q") {
			if err != nil {
				t.Fatalf("%.60s: %v", q, err)
			}
			continue
		}
		if err == nil {
			// The code before: the route went through. Let the event write
			// and say what it cost.
			time.Sleep(3 * time.Second)
			var written sql.NullFloat64
			_ = direct.QueryRow("SELECT SUM(LENGTH(b)) FROM w.ev").Scan(&written)
			wru := metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_evt"`, `type="wru"`) - wruBefore
			t.Fatalf("%.60s: went through; in 3 s the event wrote %.0f B, the group was charged %.1f WRU (~%.0f B)",
				q, written.Float64, wru, wru*1024)
		}
		if mysqlErrNo(err) != 1227 || !strings.Contains(err.Error(), "rg_evt") ||
			!strings.Contains(err.Error(), "runs later as its definer") {
			t.Errorf("%.60s: %v; want 1227 naming the group and why", q, err)
		}
	}
	if n := eventCount(t, direct); n != 1 {
		t.Errorf("%d events in w after the refused routes, want the 1 from before", n)
	}
	var status string
	if err := direct.QueryRow("SELECT STATUS FROM information_schema.EVENTS WHERE EVENT_NAME = 'old'").Scan(&status); err != nil || status != "DISABLED" {
		t.Errorf("the old event: %q, %v; want it still DISABLED", status, err)
	}
	// The session stays usable; DROP EVENT is allowed.
	if _, err := conn.ExecContext(ctx, "DROP EVENT w.old"); err != nil {
		t.Errorf("DROP EVENT: %v", err)
	}
	// An administrator may.
	if _, err := root.Exec("CREATE EVENT w.admin_ev ON SCHEDULE EVERY 1 HOUR DISABLE DO SELECT 1"); err != nil {
		t.Errorf("root's CREATE EVENT: %v", err)
	}
	// Outside strict mode the account may leave its group anyway: the
	// event is allowed (and unpriced).
	lax := startMeteredProxy(t, ts, append(svc, "--strict-resource-groups=false")...)
	laxDB := openDB(t, lax.Addr, "db=w", "user=evt", "password=apppw")
	if _, err := laxDB.Exec("CREATE EVENT w.lax ON SCHEDULE EVERY 1 HOUR DISABLE DO SELECT 1"); err != nil {
		t.Errorf("outside strict mode CREATE EVENT: %v", err)
	}
	if n := eventCount(t, direct); n != 2 {
		t.Errorf("%d events in w, want root's and the lax proxy's", n)
	}
}

// TestCopyingDDLPaysTheTableSize: an ALTER TABLE that copies or rebuilds
// a table, and OPTIMIZE TABLE, write the whole table while the binary log
// shows one statement (issue 29: ALTER TABLE ... FORCE, ALGORITHM=COPY of
// a 21 MB table cost 37 B). Each pays 0.9–1.1× the WRU of the table's rows
// written as literals; an ALTER that copies nothing pays its packet. On
// the code before, each cost a few WRU.
func TestCopyingDDLPaysTheTableSize(t *testing.T) {
	m, ts, px, svc := ddlBackend(t)
	direct, err := sql.Open("mysql", dsn(m.Addr, "db=w"))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	m.exec(t, "CREATE TABLE w.big (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)")
	db := openDB(t, px.Addr, "db=w")
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// 20 MiB as literals: what the same bytes cost written directly.
	const rows = 20
	var literal float64
	for i := range rows {
		if _, err := conn.ExecContext(ctx, "INSERT INTO big (b) VALUES ('"+strings.Repeat(string(rune('a'+i)), oneMiB)+"')"); err != nil {
			t.Fatal(err)
		}
		literal += num(t, lastStatementRU(t, conn)["WRU"])
	}
	size := func() float64 {
		var s float64
		if err := direct.QueryRow("SELECT DATA_LENGTH + INDEX_LENGTH FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'w' AND TABLE_NAME = 'big'").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Logf("%d rows of 1 MiB as literals: %.1f WRU; the table's statistics say %.0f B before any rebuild", rows, literal, size())
	for _, r := range []struct {
		q    string
		full bool // copies or rebuilds the table
	}{
		// First, while InnoDB's statistics still count a fraction of the rows.
		{"ALTER TABLE big FORCE, ALGORITHM=COPY", true},
		{"ALTER TABLE big ENGINE=InnoDB", true}, // in place, but a rebuild
		{"OPTIMIZE TABLE big", true},
		{"EXECUTE IMMEDIATE 'ALTER TABLE w.big FORCE'", true},
		{"ALTER TABLE big MODIFY b MEDIUMBLOB", true}, // a type change: the server copies (rows affected)
		{"ALTER TABLE big ADD COLUMN c INT", false},   // instant
		{"ALTER TABLE big COMMENT 'FORCE'", false},
	} {
		rows, err := conn.QueryContext(ctx, r.q) // OPTIMIZE answers a result set
		if err != nil {
			t.Fatalf("%s: %v", r.q, err)
		}
		for rows.Next() {
		}
		rows.Close()
		last := lastStatementRU(t, conn)
		wru := num(t, last["WRU"])
		t.Logf("%-45s %8.1f WRU (~%.0f B charged; the table holds %.0f B of data and index, %d B of rows)  %.3f× the literals'  (%s)",
			r.q, wru, (wru-2)*1024, size(), rows0(t, direct), wru/literal, last["WRU_SOURCE"])
		switch {
		case r.full && (wru < 0.9*literal || wru > 1.1*literal):
			t.Errorf("%s: %.1f WRU, want 0.9–1.1× the literals' %.1f", r.q, wru, literal)
		case !r.full && wru > 5:
			t.Errorf("%s: %.1f WRU, want its packet (a few WRU): it copies nothing", r.q, wru)
		}
	}
	// Without the binary log (the estimate) the same.
	est := startMeteredProxy(t, ts, append(svc, "--write-source", "estimate")...)
	econn, err := openDB(t, est.Addr, "db=w").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer econn.Close()
	if _, err := econn.ExecContext(ctx, "ALTER TABLE big FORCE"); err != nil {
		t.Fatal(err)
	}
	last := lastStatementRU(t, econn)
	wru := num(t, last["WRU"])
	t.Logf("%-45s %8.1f WRU  %.3f× the literals'  (%s)", "ALTER TABLE big FORCE (--write-source estimate)", wru, wru/literal, last["WRU_SOURCE"])
	if wru < 0.9*literal || wru > 1.1*literal || last["WRU_SOURCE"] != "estimate" {
		t.Errorf("without the binary log ALTER TABLE ... FORCE: %.1f WRU from %s, want 0.9–1.1× %.1f from the estimate", wru, last["WRU_SOURCE"], literal)
	}
}

// rows0 is the bytes of w.big's rows.
func rows0(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow("SELECT SUM(LENGTH(b)) FROM w.big").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
