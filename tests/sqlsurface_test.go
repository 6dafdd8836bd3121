package tests

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestVirtualTablesAnyQueryShape: the query shapes GUI tools and ORMs send
// to information_schema.resource_groups, CURRENT_RESOURCE_GROUP() and SHOW
// RESOURCE GROUP USAGE are answered, and each answers exactly what the same
// query answers on a real table holding the same rows.
func TestVirtualTablesAnyQueryShape(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS vt_a", "DROP RESOURCE GROUP IF EXISTS vt_b", "DROP RESOURCE GROUP IF EXISTS vt_c",
		"CREATE RESOURCE GROUP vt_a RU_PER_SEC = 100",
		"CREATE RESOURCE GROUP vt_b RU_PER_SEC = 200 PRIORITY = HIGH",
		"CREATE RESOURCE GROUP vt_c RU_PER_SEC = 300 BURSTABLE QUERY_LIMIT = (EXEC_ELAPSED = '10s', ACTION = DRYRUN)")
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(1)
	// The same rows in a real table.
	all := rowsOf(t, db, "SELECT * FROM information_schema.resource_groups")
	cols := all[0]
	var defs []string
	for _, c := range cols {
		defs = append(defs, "`"+strings.Split(c, ":")[0]+"` VARCHAR(300)")
	}
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.vt_groups", "CREATE TABLE rgproxy_e2e.vt_groups ("+strings.Join(defs, ", ")+")",
		"DROP TABLE IF EXISTS rgproxy_e2e.vt_owner", "CREATE TABLE rgproxy_e2e.vt_owner (grp VARCHAR(32), team VARCHAR(32))",
		"INSERT INTO rgproxy_e2e.vt_owner VALUES ('vt_a', 'billing'), ('vt_b', 'reports'), ('nope', 'x')")
	real := openDB(t, backendAddr)
	for _, r := range all[1:] {
		args := make([]any, len(r))
		marks := make([]string, len(r))
		for i, v := range r {
			marks[i] = "?"
			if v == "<nil>" {
				args[i] = nil
			} else {
				args[i] = v
			}
		}
		if _, err := real.Exec("INSERT INTO rgproxy_e2e.vt_groups VALUES ("+strings.Join(marks, ",")+")", args...); err != nil {
			t.Fatal(err)
		}
	}
	shapes := []string{
		"SELECT * FROM %s WHERE NAME LIKE 'vt\\_%%' ORDER BY NAME",
		"SELECT NAME, RU_PER_SEC FROM %s WHERE NAME IN ('vt_a', 'vt_c') ORDER BY NAME DESC",
		"SELECT COUNT(*) FROM %s",
		"SELECT COUNT(*), MAX(NAME) FROM %s WHERE NAME <> 'default'",
		"SELECT g.NAME AS n, g.PRIORITY FROM %s AS g WHERE g.NAME LIKE 'vt%%' ORDER BY g.PRIORITY, n LIMIT 2",
		"SELECT PRIORITY, COUNT(*) AS c FROM %s GROUP BY PRIORITY ORDER BY PRIORITY",
		"SELECT o.team, g.BURSTABLE FROM rgproxy_e2e.vt_owner o JOIN %s g ON g.NAME = o.grp ORDER BY o.team",
		"SELECT NAME FROM %s WHERE QUERY_LIMIT IS NOT NULL",
		"SELECT * FROM (SELECT NAME FROM %s) x WHERE x.NAME = 'vt_b'",
	}
	values := func(rows [][]string) [][]string { return rows[1:] }
	for _, shape := range shapes {
		got := values(rowsOf(t, db, fmt.Sprintf(shape, "information_schema.resource_groups")))
		want := values(rowsOf(t, real, fmt.Sprintf(shape, "rgproxy_e2e.vt_groups")))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n through rgproxy %v\n on a real table %v", shape, got, want)
		}
	}
	// Column names as written.
	if got := rowsOf(t, db, "SELECT NAME AS `the name` FROM information_schema.resource_groups WHERE NAME = 'vt_a'")[0][0]; !strings.HasPrefix(got, "the name:") {
		t.Errorf("alias: column %q", got)
	}
	// USE information_schema, then the bare table name.
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "USE information_schema"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM resource_groups WHERE NAME LIKE 'vt%'").Scan(&n); err != nil || n != 3 {
		t.Errorf("USE information_schema; SELECT ... FROM resource_groups: %d, %v", n, err)
	}
	conn.ExecContext(ctx, "USE rgproxy_e2e")
	// CURRENT_RESOURCE_GROUP() in any position, and the statement's group.
	var g string
	if err := conn.QueryRowContext(ctx, "SELECT CURRENT_RESOURCE_GROUP() AS g").Scan(&g); err != nil || g != "default" {
		t.Errorf("SELECT CURRENT_RESOURCE_GROUP() AS g: %q %v", g, err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT /*+ RESOURCE_GROUP(vt_b) */ CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "vt_b" {
		t.Errorf("the hint's group: %q %v", g, err)
	}
	rows, err := conn.QueryContext(ctx, "SELECT CURRENT_RESOURCE_GROUP()")
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := rows.Columns(); len(c) != 1 || c[0] != "CURRENT_RESOURCE_GROUP()" {
		t.Errorf("column name %v", c)
	}
	rows.Close()
	if err := conn.QueryRowContext(ctx, "SELECT team FROM vt_owner WHERE grp <> CURRENT_RESOURCE_GROUP() AND grp = 'vt_a'").Scan(&g); err != nil || g != "billing" {
		t.Errorf("CURRENT_RESOURCE_GROUP() in WHERE: %q %v", g, err)
	}
	conn.Close() // db has one connection
	// SHOW RESOURCE GROUP USAGE LIKE / WHERE.
	usage := rowsOf(t, db, "SHOW RESOURCE GROUP USAGE LIKE 'vt%'")
	if len(usage) != 4 || usage[1][0] != "vt_a" || usage[3][0] != "vt_c" {
		t.Errorf("SHOW RESOURCE GROUP USAGE LIKE 'vt%%': %v", usage)
	}
	usage = rowsOf(t, db, "SHOW RESOURCE GROUP USAGE WHERE NAME = 'default' AND THROTTLED = 0")
	if len(usage) != 2 || usage[1][0] != "default" {
		t.Errorf("SHOW RESOURCE GROUP USAGE WHERE: %v", usage)
	}
	// runaway_watches: empty, typed, any shape.
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.runaway_watches WHERE ID > 0").Scan(&n); err != nil || n != 0 {
		t.Errorf("runaway_watches: %d %v", n, err)
	}
}

// TestStrictModeNoEscape: a bound user without SUPER cannot leave its
// group — not to default, not to another group, by hint or SET — and
// trying does not change its throughput; SUPER may switch.
func TestStrictModeNoEscape(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "500ms", "--cpu-source", "wall")
	appUser(t, "strictu")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_strict", "DROP RESOURCE GROUP IF EXISTS rg_other",
		"CREATE RESOURCE GROUP rg_strict RU_PER_SEC = 20", "CREATE RESOURCE GROUP rg_other RU_PER_SEC = 100000",
		"ALTER USER 'strictu'@'%' RESOURCE GROUP rg_strict")
	time.Sleep(300 * time.Millisecond)
	app := openDB(t, px.Addr, "user=strictu", "password=apppw")
	app.SetMaxOpenConns(1)
	for _, q := range []string{
		"SELECT /*+ RESOURCE_GROUP(default) */ 1", "SELECT /*+ RESOURCE_GROUP(rg_other) */ 1",
		"SET RESOURCE GROUP default", "SET RESOURCE GROUP rg_other",
	} {
		if _, err := app.Exec(q); mysqlErrNo(err) != 1227 {
			t.Errorf("%s as a bound user without SUPER: %v, want 1227", q, err)
		}
	}
	// 20 statements of ~17 RU each (50 ms of wall time) at 20 RU/s with a
	// 500 ms wait: a few run, most are refused, hinted or not.
	run := func(q string) (ok, refused int) {
		for range 20 {
			_, err := app.Exec(q)
			switch {
			case err == nil:
				ok++
			case mysqlErrNo(err) == 8252 || mysqlErrNo(err) == 1227:
				refused++
			default:
				t.Fatalf("%s: %v", q, err)
			}
		}
		return ok, refused
	}
	plainOK, _ := run("SELECT SLEEP(0.05)")
	hintOK, _ := run("SELECT /*+ RESOURCE_GROUP(default) */ SLEEP(0.05)")
	t.Logf("20 statements at 20 RU/s: %d ran plain, %d with a hint naming default", plainOK, hintOK)
	if plainOK == 0 || plainOK > 10 || hintOK > plainOK+2 {
		t.Errorf("a throttled user ran %d plain and %d hinted statements of 20: the quota leaks", plainOK, hintOK)
	}
	// SUPER may switch, by hint and by SET.
	rootExec(t, "CREATE USER IF NOT EXISTS 'strictsuper'@'%' IDENTIFIED BY 'apppw'", "GRANT ALL PRIVILEGES ON *.* TO 'strictsuper'@'%'")
	adminExec(t, px.Addr, "ALTER USER 'strictsuper'@'%' RESOURCE GROUP rg_strict")
	root := openDB(t, px.Addr, "user=strictsuper", "password=apppw")
	root.SetMaxOpenConns(1)
	var g string
	if err := root.QueryRow("SELECT /*+ RESOURCE_GROUP(rg_other) */ CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "rg_other" {
		t.Errorf("SUPER's hint: %q %v", g, err)
	}
	conn, _ := root.Conn(context.Background())
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "SET RESOURCE GROUP default"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(context.Background(), "SELECT CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "default" {
		t.Errorf("SUPER's SET default: %q %v", g, err)
	}
}

// TestBindingsPerAccount: a binding is the account's, user@host as the
// backend matched it at login; ALTER USER of an account the backend does
// not have is 1396; the bindings are listed in
// information_schema.resource_group_bindings.
func TestBindingsPerAccount(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	rootExec(t,
		"DROP USER IF EXISTS 'acct'@'%'", "DROP USER IF EXISTS 'acct'@'10.255.255.%'",
		"CREATE USER 'acct'@'%' IDENTIFIED BY 'apppw'", "CREATE USER 'acct'@'10.255.255.%' IDENTIFIED BY 'apppw'",
		"GRANT SELECT ON rgproxy_e2e.* TO 'acct'@'%'")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_acct1", "DROP RESOURCE GROUP IF EXISTS rg_acct2",
		"CREATE RESOURCE GROUP rg_acct1 RU_PER_SEC = 1000", "CREATE RESOURCE GROUP rg_acct2 RU_PER_SEC = 1000")
	group := func() string {
		t.Helper()
		db := openDB(t, px.Addr, "user=acct", "password=apppw")
		defer db.Close()
		var g string
		if err := db.QueryRow("SELECT CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	// The session logs in as 'acct'@'%' (it does not come from 10.255.255.x).
	adminExec(t, px.Addr, "ALTER USER 'acct'@'10.255.255.%' RESOURCE GROUP rg_acct2")
	if g := group(); g != "default" {
		t.Fatalf("a binding of 'acct'@'10.255.255.%%' captured 'acct'@'%%': %s", g)
	}
	adminExec(t, px.Addr, "ALTER USER 'acct'@'%' RESOURCE GROUP rg_acct1")
	if g := group(); g != "rg_acct1" {
		t.Fatalf("'acct'@'%%' bound to rg_acct1 runs in %s", g)
	}
	root := openDB(t, px.Addr)
	if _, err := root.Exec("ALTER USER 'nobody'@'%' RESOURCE GROUP rg_acct1"); mysqlErrNo(err) != 1396 {
		t.Fatalf("ALTER USER of a missing account: %v, want 1396", err)
	}
	if _, err := root.Exec("ALTER USER 'acct'@'localhost' RESOURCE GROUP rg_acct1"); mysqlErrNo(err) != 1396 {
		t.Fatalf("ALTER USER of a missing host of an existing user: %v, want 1396", err)
	}
	if _, err := root.Exec("ALTER USER IF EXISTS 'nobody'@'%' RESOURCE GROUP rg_acct1"); err != nil {
		t.Fatalf("ALTER USER IF EXISTS of a missing account: %v", err)
	}
	rows := rowsOf(t, root, "SELECT USER, HOST, RESOURCE_GROUP FROM information_schema.resource_group_bindings WHERE USER = 'acct' ORDER BY HOST")
	if got := fmt.Sprint(rows[1:]); got != "[[acct % rg_acct1] [acct 10.255.255.% rg_acct2]]" {
		t.Fatalf("bindings listed: %s", got)
	}
	// Without SUPER: only its own account's row.
	app := openDB(t, px.Addr, "user=acct", "password=apppw")
	if got := fmt.Sprint(rowsOf(t, app, "SELECT USER, HOST, RESOURCE_GROUP FROM information_schema.resource_group_bindings")[1:]); got != "[[acct % rg_acct1]]" {
		t.Fatalf("bindings a user without SUPER sees: %s", got)
	}
}
