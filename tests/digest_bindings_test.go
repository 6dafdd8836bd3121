package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A statement shape bound to a group by its digest, copied from
// statements_summary, is charged there whether the application sends it
// as text or prepares it (COM_STMT_PREPARE / COM_STMT_EXECUTE through
// go-sql-driver's binary protocol): in strict mode as a second group whose
// limit it must pass too, its own group kept; outside strict mode in the
// bound group alone. Another shape is not; the binding reaches a second
// proxy; hostile input gets clear errors; rgserver bounds the count.
func TestDigestBindingsMoveTextAndPreparedStatements(t *testing.T) {
	ts := startTokenServer(t, "--max-digest-bindings", "3")
	px := startMeteredProxy(t, ts, "--max-wait", "100ms")
	px2 := startMeteredProxy(t, ts)
	loose := startMeteredProxy(t, ts, "--strict-resource-groups=false")
	appUser(t, "digapp")
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.dig_orders",
		"CREATE TABLE rgproxy_e2e.dig_orders (id INT PRIMARY KEY, day INT, amount INT)",
		"INSERT INTO rgproxy_e2e.dig_orders VALUES (1, 1, 10), (2, 1, 20), (3, 2, 30), (4, 3, 40)")
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP rg_dig_user RU_PER_SEC = 1000000",
		"CREATE RESOURCE GROUP rg_dig_night RU_PER_SEC = 1000000",
		"ALTER USER 'digapp'@'%' RESOURCE GROUP rg_dig_user")

	const report = "SELECT SUM(amount) FROM dig_orders WHERE day = ?"
	const other = "SELECT amount FROM dig_orders WHERE id = ?"
	ctx := context.Background()
	appConn := func(addr string) *sql.Conn {
		t.Helper()
		c, err := openDB(t, addr, "user=digapp", "password=apppw").Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// text runs q as a COM_QUERY (no arguments) and returns SHOW LAST
	// STATEMENT RU's groups: "own" or "own+shape".
	groupsOf := func(last map[string]string) string {
		if s := last["SHAPE_RESOURCE_GROUP"]; s != "" {
			return last["RESOURCE_GROUP"] + "+" + s
		}
		return last["RESOURCE_GROUP"]
	}
	text := func(conn *sql.Conn, q string) (string, error) {
		t.Helper()
		rows, err := conn.QueryContext(ctx, q)
		if err != nil {
			return "", err
		}
		for rows.Next() {
		}
		if err := rows.Close(); err != nil {
			return "", err
		}
		return groupsOf(lastStatementRU(t, conn)), nil
	}
	// prepared prepares q (COM_STMT_PREPARE), executes it once per
	// argument (COM_STMT_EXECUTE, binary protocol) and returns each
	// execution's groups.
	prepared := func(conn *sql.Conn, q string, args ...int) []string {
		t.Helper()
		stmt, err := conn.PrepareContext(ctx, q)
		if err != nil {
			t.Fatalf("prepare %s: %v", q, err)
		}
		defer stmt.Close()
		var out []string
		for _, a := range args {
			rows, err := stmt.QueryContext(ctx, a)
			if err != nil {
				t.Fatalf("execute %s (%d): %v", q, a, err)
			}
			for rows.Next() {
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			out = append(out, groupsOf(lastStatementRU(t, conn)))
		}
		return out
	}
	mustText := func(conn *sql.Conn, q string) string {
		t.Helper()
		g, err := text(conn, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return g
	}

	conn := appConn(px.Addr)
	if got := mustText(conn, "SELECT SUM(amount) FROM dig_orders WHERE day = 1"); got != "rg_dig_user" {
		t.Fatalf("before any binding the report ran in %s", got)
	}
	// The operator copies the shape's DIGEST from statements_summary.
	root := openDB(t, px.Addr)
	var digest string
	if err := root.QueryRow("SELECT DIGEST FROM information_schema.statements_summary WHERE RESOURCE_GROUP = 'rg_dig_user' AND DIGEST_TEXT LIKE 'SELECT SUM(amount)%dig_orders%'").Scan(&digest); err != nil {
		t.Fatalf("the report's digest in statements_summary: %v", err)
	}
	if len(digest) != 16 {
		t.Fatalf("DIGEST %q", digest)
	}
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP BINDING FOR DIGEST '"+strings.ToUpper(digest)+"' TO rg_dig_night")

	// Strict mode (the default): the bound shape keeps its group and is
	// charged to the binding's too, text and prepared alike; another
	// shape is not.
	if got := mustText(conn, "SELECT SUM(amount) FROM dig_orders WHERE day = 2"); got != "rg_dig_user+rg_dig_night" {
		t.Errorf("text report: %s, want rg_dig_user+rg_dig_night", got)
	}
	if got := strings.Join(prepared(conn, report, 1, 3), " "); got != "rg_dig_user+rg_dig_night rg_dig_user+rg_dig_night" {
		t.Errorf("prepared report: %s, want it in both groups twice", got)
	}
	if got := mustText(conn, "SELECT amount FROM dig_orders WHERE id = 4"); got != "rg_dig_user" {
		t.Errorf("text of another shape: %s", got)
	}
	if got := strings.Join(prepared(conn, other, 1), " "); got != "rg_dig_user" {
		t.Errorf("prepared statement of another shape: %s", got)
	}
	// statements_summary counts the three executions since the binding
	// in the bound group, the four in all in the account's; the bound
	// group's RU counter moved.
	var rows []string
	for _, r := range rowsOf(t, root, "SELECT RESOURCE_GROUP, EXEC_COUNT FROM information_schema.statements_summary WHERE DIGEST = '"+digest+"' ORDER BY RESOURCE_GROUP")[1:] {
		rows = append(rows, r[0]+"="+r[1])
	}
	if got := strings.Join(rows, " "); got != "rg_dig_night=3 rg_dig_user=4" {
		t.Errorf("statements_summary of the shape: %s, want rg_dig_night=3 rg_dig_user=4", got)
	}
	if ru := metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_dig_night"`); ru <= 0 {
		t.Errorf("rgproxy_ru_consumed_total of the bound group: %v", ru)
	}
	// The binding does not let the account name the bound group.
	if _, err := text(conn, "SELECT /*+ RESOURCE_GROUP(rg_dig_night) */ SUM(amount) FROM dig_orders WHERE day = 1"); mysqlErrNo(err) != 1227 {
		t.Errorf("hinting the bound group without SUPER: %v, want 1227", err)
	}

	// The binding reached the other proxies.
	conn2 := appConn(px2.Addr)
	deadline := time.Now().Add(5 * time.Second)
	for mustText(conn2, "SELECT SUM(amount) FROM dig_orders WHERE day = 3") != "rg_dig_user+rg_dig_night" {
		if time.Now().After(deadline) {
			t.Fatal("the digest binding did not reach the second proxy within 5s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := strings.Join(prepared(conn2, report, 2), " "); got != "rg_dig_user+rg_dig_night" {
		t.Errorf("prepared report on the second proxy: %s", got)
	}
	// Outside strict mode the binding moves the statement: the bound
	// group alone, text and prepared.
	conn3 := appConn(loose.Addr)
	deadline = time.Now().Add(5 * time.Second)
	for mustText(conn3, "SELECT SUM(amount) FROM dig_orders WHERE day = 3") != "rg_dig_night" {
		if time.Now().After(deadline) {
			t.Fatal("outside strict mode the bound text statement did not move to rg_dig_night within 5s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := strings.Join(prepared(conn3, report, 1, 2), " "); got != "rg_dig_night rg_dig_night" {
		t.Errorf("prepared report outside strict mode: %s, want rg_dig_night twice", got)
	}
	if got := strings.Join(prepared(conn3, other, 1), " "); got != "rg_dig_user" {
		t.Errorf("another shape outside strict mode: %s", got)
	}

	// Listed, to root and to the user (a digest is no secret).
	const listing = "SELECT RESOURCE_GROUP, DIGEST FROM information_schema.resource_group_bindings WHERE DIGEST IS NOT NULL"
	want := fmt.Sprint([][]string{{"rg_dig_night", digest}})
	if got := fmt.Sprint(rowsOf(t, root, listing)[1:]); got != want {
		t.Errorf("digest bindings listed to root: %s, want %s", got, want)
	}
	if got := fmt.Sprint(connRows(t, conn, listing)[1:]); got != want {
		t.Errorf("digest bindings listed to the user: %s, want %s", got, want)
	}

	// Strict mode adds the bound group's limit: bound to a group of 1
	// RU/s (new, so that no proxy holds its tokens yet) the report is
	// refused (8252 within --max-wait 100ms) while another shape of the
	// same account runs. The statement prepared before the binding
	// changed follows it: the binding is looked up at each execution.
	stmt, err := conn.PrepareContext(ctx, report)
	if err != nil {
		t.Fatal(err)
	}
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP rg_dig_slow RU_PER_SEC = 1",
		"CREATE RESOURCE GROUP BINDING FOR DIGEST '"+digest+"' TO rg_dig_slow")
	refused, otherErrs := 0, 0
	for i := range 20 {
		if _, err := text(conn, fmt.Sprintf("SELECT SUM(amount) FROM dig_orders WHERE day = %d", i)); mysqlErrNo(err) == 8252 {
			refused++
		} else if err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
		if _, err := text(conn, fmt.Sprintf("SELECT amount FROM dig_orders WHERE id = %d", i)); err != nil {
			otherErrs++
		}
	}
	preparedRefused := 0
	for i := range 20 {
		if _, err := stmt.ExecContext(ctx, i); mysqlErrNo(err) == 8252 {
			preparedRefused++
		} else if err != nil {
			t.Fatalf("prepared report %d: %v", i, err)
		}
	}
	stmt.Close()
	t.Logf("at 1 RU/s: %d of 20 text reports and %d of 20 prepared ones refused, %d errors of another shape", refused, preparedRefused, otherErrs)
	if refused == 0 || preparedRefused == 0 || otherErrs != 0 {
		t.Errorf("at 1 RU/s the bound group's limit did not hold: %d of 20 text and %d of 20 prepared reports refused; %d errors of another shape (want 0)",
			refused, preparedRefused, otherErrs)
	}
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP BINDING FOR DIGEST '"+digest+"' TO rg_dig_night")

	// Hostile input.
	for _, tc := range []struct {
		db   *sql.DB
		q    string
		code uint16
		msg  string
	}{
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST 'abc' TO rg_dig_night", 1105, "the digest is 3 bytes long; a digest is the 16 hex digits of information_schema.statements_summary's DIGEST column"},
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef789z' TO rg_dig_night", 1105, "the digest holds 'z' (U+007A) at character 16"},
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST ''' OR 1=1 -- x' TO rg_dig_night", 1105, "invalid digest binding"},
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST 00ab34cd56ef7890 TO rg_dig_night", 1064, "expected the digest as a quoted string of 16 hex digits"},
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890' TO rg_nope", 8249, "rg_nope"},
		{root, "CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890' TO default", 1105, "cannot be bound to resource group 'default'"},
		{root, "DROP RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890'", 1105, "digest '00ab34cd56ef7890' has no resource group binding"},
		{openDB(t, px.Addr, "user=digapp", "password=apppw"), "CREATE RESOURCE GROUP BINDING FOR DIGEST '00ab34cd56ef7890' TO rg_dig_user", 1227, "CREATE RESOURCE GROUP BINDING"},
	} {
		_, err := tc.db.Exec(tc.q)
		if mysqlErrNo(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %d with %q", tc.q, err, tc.code, tc.msg)
		}
	}
	rconn, err := root.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close()
	if _, err := rconn.ExecContext(ctx, "DROP RESOURCE GROUP BINDING IF EXISTS FOR DIGEST '00ab34cd56ef7890'"); err != nil {
		t.Fatalf("DROP ... IF EXISTS of a missing digest binding: %v", err)
	}
	if w := connRows(t, rconn, "SHOW WARNINGS"); len(w) != 2 || w[1][1] != "1105" {
		t.Errorf("the note of DROP ... IF EXISTS: %v", w)
	}
	// rgserver keeps at most --max-digest-bindings (3); replacing one
	// takes no room.
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP BINDING FOR DIGEST '1111111111111111' TO rg_dig_night",
		"CREATE RESOURCE GROUP BINDING FOR DIGEST '2222222222222222' TO rg_dig_night",
		"CREATE RESOURCE GROUP BINDING FOR DIGEST '2222222222222222' TO rg_dig_user")
	if _, err := root.Exec("CREATE RESOURCE GROUP BINDING FOR DIGEST '3333333333333333' TO rg_dig_night"); mysqlErrNo(err) != 1105 ||
		!strings.Contains(err.Error(), "3 digests are bound already, the most rgserver keeps (--max-digest-bindings)") {
		t.Errorf("a fourth digest binding: %v, want 1105 naming the bound", err)
	}

	// Dropped: the report is its account's again, text and prepared.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP BINDING FOR DIGEST '"+digest+"'")
	if got := mustText(conn, "SELECT SUM(amount) FROM dig_orders WHERE day = 1"); got != "rg_dig_user" {
		t.Errorf("after DROP the text report ran in %s", got)
	}
	if got := strings.Join(prepared(conn, report, 1), " "); got != "rg_dig_user" {
		t.Errorf("after DROP the prepared report ran in %s", got)
	}

	// TiDB's form binds the FOR statement's shape, the same digest: the
	// prepared report is charged to the hint's group again, and the
	// binding's DIGEST is statements_summary's.
	adminExec(t, px.Addr, "CREATE GLOBAL BINDING FOR SELECT SUM(amount) FROM dig_orders WHERE day = 1 "+
		"USING SELECT /*+ RESOURCE_GROUP(rg_dig_night) */ SUM(amount) FROM dig_orders WHERE day = 1")
	if got := strings.Join(prepared(conn, report, 1), " "); got != "rg_dig_user+rg_dig_night" {
		t.Errorf("after CREATE GLOBAL BINDING the prepared report ran in %s", got)
	}
	if got := fmt.Sprint(rowsOf(t, root, "SELECT RESOURCE_GROUP FROM information_schema.resource_group_bindings WHERE DIGEST = '"+digest+"'")[1:]); got != "[[rg_dig_night]]" {
		t.Errorf("CREATE GLOBAL BINDING: the DIGEST %s is bound to %s, want rg_dig_night", digest, got)
	}
	for _, tc := range []struct {
		q    string
		code uint16
		msg  string
	}{
		{"CREATE GLOBAL BINDING FOR SELECT 1 USING SELECT /*+ USE_INDEX(t, a) */ 1", 1105, "carries no /*+ RESOURCE_GROUP(g) */ hint"},
		{"CREATE GLOBAL BINDING FOR SELECT a FROM t USING SELECT /*+ RESOURCE_GROUP(rg_dig_night) */ b FROM t", 1105, "not the same statement"},
		{"CREATE SESSION BINDING FOR SELECT 1 USING SELECT /*+ RESOURCE_GROUP(rg_dig_night) */ 1", 1235, "SESSION bindings"},
		{"CREATE BINDING FOR SELECT 1", 1064, "CREATE BINDING needs USING"},
	} {
		if _, err := root.Exec(tc.q); mysqlErrNo(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %d with %q", tc.q, err, tc.code, tc.msg)
		}
	}
	adminExec(t, px.Addr, "DROP GLOBAL BINDING FOR SELECT SUM(amount) FROM dig_orders WHERE day = 7")
	if got := strings.Join(prepared(conn, report, 1), " "); got != "rg_dig_user" {
		t.Errorf("after DROP GLOBAL BINDING the prepared report ran in %s", got)
	}
}
