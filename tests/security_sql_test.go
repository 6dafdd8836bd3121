package tests

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The attacks of "No one lifts a quota they do not own" that go through
// rgproxy's SQL surface: SUPER read from text, SQL injection through the
// virtual tables, other users' statements in runaway_watches, a QUERY_LIMIT
// whose number overflows, and names that lie.

// secAccount creates, afresh, an account on the shared MariaDB with
// password apppw that may use the tests' database, then runs extra as root.
func secAccount(t testing.TB, user string, extra ...string) {
	t.Helper()
	t.Cleanup(func() { rootExec(t, fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user)) })
	rootExec(t, append([]string{
		fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user),
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'apppw'", user),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP ON rgproxy_e2e.* TO '%s'@'%%'", user),
	}, extra...)...)
}

// spoofColumns are column names built to read as a privilege list in the
// text of SHOW GRANTS, and seeded random names over the characters that
// matter there (quotes, parentheses, commas, dots, stars, the words).
func spoofColumns() []string {
	cols := []string{"`), SUPER ON *.* TO x`", "), SUPER ON *.* TO x", "SUPER", "ALL PRIVILEGES", "x`, SUPER",
		"'), SUPER ON *.* TO x --", "\"), ALL ON *.* TO x"}
	r := rand.New(rand.NewPCG(22, 1))
	alphabet := []string{"`", "'", "\"", "(", ")", ",", ".", "*", " ", "SUPER", "ALL", " ON ", " TO ", "*.*", "\\", "x", "GRANT "}
	seen := map[string]bool{}
	for _, c := range cols {
		seen[strings.ToLower(c)] = true
	}
	for len(cols) < 40 {
		var b strings.Builder
		for n := 1 + r.IntN(8); n > 0; n-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		c := strings.TrimRight(b.String(), " ") // MariaDB refuses a trailing space
		if c == "" || len(c) > 64 || seen[strings.ToLower(c)] {
			continue
		}
		seen[strings.ToLower(c)] = true
		cols = append(cols, c)
	}
	return cols
}

func quoteBackend(id string) string { return "`" + strings.ReplaceAll(id, "`", "``") + "`" }

// TestSecuritySuperSpoofRefused: a user granted SELECT on columns (and a
// role) whose names read as "SUPER ON *.*" in SHOW GRANTS gets 1227 for
// every resource-group change, including unbinding itself and leaving its
// group; SUPER held by the account, and the rgproxy_admin role once
// enabled (SET ROLE, a default role, or nested in an enabled role), are
// administrators.
func TestSecuritySuperSpoofRefused(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	cols := spoofColumns()
	var defs, quoted []string
	for _, c := range cols {
		defs = append(defs, quoteBackend(c)+" INT")
		quoted = append(quoted, quoteBackend(c))
	}
	t.Cleanup(func() {
		rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.sec_spoof", "DROP ROLE IF EXISTS `sec_r, SUPER ON *.* TO y`",
			"DROP ROLE IF EXISTS sec_dba", "DROP ROLE IF EXISTS rgproxy_admin")
	})
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.sec_spoof",
		"CREATE TABLE rgproxy_e2e.sec_spoof ("+strings.Join(defs, ", ")+")",
		"DROP ROLE IF EXISTS `sec_r, SUPER ON *.* TO y`", "CREATE ROLE `sec_r, SUPER ON *.* TO y`",
		"CREATE ROLE IF NOT EXISTS rgproxy_admin",
		"DROP ROLE IF EXISTS sec_dba", "CREATE ROLE sec_dba", "GRANT rgproxy_admin TO sec_dba")
	secAccount(t, "sec_spoof",
		"GRANT SELECT ("+strings.Join(quoted, ", ")+") ON rgproxy_e2e.sec_spoof TO 'sec_spoof'@'%'",
		"GRANT `sec_r, SUPER ON *.* TO y` TO 'sec_spoof'@'%'",
		"SET DEFAULT ROLE `sec_r, SUPER ON *.* TO y` FOR 'sec_spoof'@'%'")
	secAccount(t, "sec_super", "GRANT SUPER ON *.* TO 'sec_super'@'%'")
	secAccount(t, "sec_roleu", "GRANT rgproxy_admin TO 'sec_roleu'@'%'")
	secAccount(t, "sec_defrole", "GRANT rgproxy_admin TO 'sec_defrole'@'%'", "SET DEFAULT ROLE rgproxy_admin FOR 'sec_defrole'@'%'")
	secAccount(t, "sec_nested", "GRANT sec_dba TO 'sec_nested'@'%'", "SET DEFAULT ROLE sec_dba FOR 'sec_nested'@'%'")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP sec_spoofg RU_PER_SEC = 10",
		"ALTER USER 'sec_spoof'@'%' RESOURCE GROUP sec_spoofg")
	time.Sleep(300 * time.Millisecond)

	ctx := context.Background()
	spoof := openDB(t, px.Addr, "user=sec_spoof", "password=apppw")
	spoof.SetMaxOpenConns(1)
	var grants []string
	for _, r := range rowsOf(t, openDB(t, backendAddr), "SHOW GRANTS FOR 'sec_spoof'@'%'")[1:] {
		grants = append(grants, r[0])
	}
	t.Logf("SHOW GRANTS of the spoofing user:\n%s", strings.Join(grants, "\n"))
	attempts := []string{
		"CREATE RESOURCE GROUP sec_new RU_PER_SEC = 10",
		"ALTER RESOURCE GROUP sec_spoofg MODE = OFF MAX_CONCURRENCY = 1000",
		"CREATE RESOURCE GROUP BINDING FOR TAG sec_app = 'x' TO sec_spoofg",
		"DROP RESOURCE GROUP BINDING IF EXISTS FOR TAG sec_app = 'x'",
		"ALTER USER 'sec_spoof'@'%' RESOURCE GROUP default",
		"SET RESOURCE GROUP default",
		"SELECT /*+ RESOURCE_GROUP(default) */ 1",
		"QUERY WATCH ADD RESOURCE GROUP sec_spoofg ACTION KILL SQL TEXT EXACT TO 'SELECT 2'",
	}
	for _, q := range attempts {
		_, err := spoof.ExecContext(ctx, q)
		if c := mysqlErrNo(err); c != 1227 {
			t.Errorf("spoofing user: %s = %v, want 1227", q, err)
		} else {
			t.Logf("spoofing user: %s: 1227", q)
		}
	}
	var g string
	if err := spoof.QueryRowContext(ctx, "SELECT CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "sec_spoofg" {
		t.Errorf("the spoofing user's group: %q %v, want sec_spoofg", g, err)
	}

	// Real administrators.
	admin := func(user string, setup ...string) error {
		db := openDB(t, px.Addr, "user="+user, "password=apppw")
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, s := range setup {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				t.Fatalf("%s: %s: %v", user, s, err)
			}
		}
		_, err = conn.ExecContext(ctx, "CREATE RESOURCE GROUP IF NOT EXISTS sec_by_"+user+" RU_PER_SEC = 10")
		return err
	}
	if err := admin("sec_super"); err != nil {
		t.Errorf("SUPER held by the account: %v", err)
	}
	if err := admin("sec_roleu"); mysqlErrNo(err) != 1227 {
		t.Errorf("rgproxy_admin granted but not enabled: %v, want 1227", err)
	}
	if err := admin("sec_roleu", "SET ROLE rgproxy_admin"); err != nil {
		t.Errorf("rgproxy_admin enabled by SET ROLE: %v", err)
	}
	if err := admin("sec_defrole"); err != nil {
		t.Errorf("rgproxy_admin as the default role: %v", err)
	}
	if err := admin("sec_nested"); err != nil {
		t.Errorf("rgproxy_admin granted to the enabled default role: %v", err)
	}
}

// injectionPayload is text that, quoted by escaping for a session in
// charset, closes its string literal: a character whose last byte is a
// lead byte of charset swallows the escaping backslash. What follows
// completes a derived table of cols columns whose col-th is the payload,
// then grants ALL PRIVILEGES to sec_att. It is valid UTF-8.
func injectionPayload(charset string, col, cols int) string {
	lead := map[string]string{"gbk": "中", "big5": "中", "sjis": "丁", "cp932": "丁", "utf8mb4": ""}[charset]
	rest := ""
	for c := col + 1; c <= cols; c++ {
		rest += fmt.Sprintf(", %d AS c%d", c, c)
	}
	return lead + `\' AS x` + rest + ") t; GRANT ALL PRIVILEGES ON *.* TO sec_att WITH GRANT OPTION; # " + charset
}

const injectionMarker = "GRANT ALL PRIVILEGES ON *.* TO sec_att"

// TestSecurityVirtualTablesInjection: an attacker puts payloads that break
// charset-unaware escaping into a runaway watch's text, a statement's
// digest text and a tag value; root then reads every virtual table through
// rgproxy in gbk, big5, sjis, cp932 and utf8mb4 sessions with
// multi-statements on (as the mariadb client does). Each payload comes
// back as data, and the attacker's grants do not change.
func TestSecuritySQLVirtualTablesInjection(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--cpu-source", "wall")
	secAccount(t, "sec_att")
	charsets := []string{"gbk", "big5", "sjis", "cp932", "utf8mb4"}
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP sec_inj RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN, WATCH = EXACT DURATION = '10m')",
		"ALTER USER 'sec_att'@'%' RESOURCE GROUP sec_inj")
	root := openDB(t, px.Addr)
	for _, cs := range charsets {
		// A tag value is the administrator's, copied from an application:
		// resource_group_bindings' TAG_VALUE is its 5th of 6 columns.
		q := "CREATE RESOURCE GROUP BINDING FOR TAG sec_" + cs + " = '" +
			strings.ReplaceAll(strings.ReplaceAll(injectionPayload(cs, 5, 6), `\`, `\\`), "'", "''") + "' TO sec_inj"
		if _, err := root.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	att := openDB(t, px.Addr, "user=sec_att", "password=apppw")
	att.SetMaxOpenConns(1)
	for _, cs := range charsets {
		// runaway_watches: WATCH_TEXT is the 6th of 8 columns; the text
		// is the whole statement, comment included.
		if _, err := att.Exec("SELECT SLEEP(0.15) /* " + injectionPayload(cs, 6, 8) + " */"); err != nil {
			t.Fatal(err)
		}
		// statements_summary: DIGEST_TEXT is the 3rd of 17 columns; an
		// alias keeps its text in the digest.
		if _, err := att.Exec("SELECT 1 AS `" + injectionPayload(cs, 3, 17) + "`"); err != nil {
			t.Fatal(err)
		}
	}
	rootPlain := openDB(t, px.Addr)
	watchWaitUntil(t, "the attacker's watches", 5*time.Second, func() bool {
		var n int
		rootPlain.QueryRow("SELECT COUNT(*) FROM information_schema.runaway_watches WHERE RESOURCE_GROUP_NAME = 'sec_inj'").Scan(&n)
		return n == len(charsets)
	})

	backend := openDB(t, backendAddr)
	attackerGrants := func() string {
		var all []string
		for _, r := range rowsOf(t, backend, "SHOW GRANTS FOR 'sec_att'@'%'")[1:] {
			all = append(all, r[0])
		}
		return strings.Join(all, "\n")
	}
	before := attackerGrants()
	// runaway_queries: the SLEEP statements crossed the DRYRUN limit;
	// they share one digest (comments are not part of it), so they are
	// one row per instance whose SAMPLE_SQL is the first one's text.
	watchWaitUntil(t, "the attacker's runaway history", 5*time.Second, func() bool {
		var n int
		rootPlain.QueryRow("SELECT COUNT(*) FROM information_schema.runaway_queries WHERE RESOURCE_GROUP_NAME = 'sec_inj'").Scan(&n)
		return n > 0
	})
	reads := []struct {
		table, query string
		want         int // values that hold a payload as data, at least
	}{
		{"runaway_watches", "SELECT * FROM information_schema.runaway_watches", len(charsets)},
		{"statements_summary", "SELECT * FROM information_schema.statements_summary", len(charsets)},
		{"resource_group_bindings", "SELECT * FROM information_schema.resource_group_bindings", len(charsets)},
		{"runaway_queries", "SELECT * FROM information_schema.runaway_queries", 1},
	}
	for _, cs := range charsets {
		db := openDB(t, px.Addr, "charset="+cs, "multiStatements=true")
		db.SetMaxOpenConns(1)
		for _, rd := range reads {
			rows, err := db.Query(rd.query)
			if err != nil {
				t.Errorf("%s session: %s: %v", cs, rd.query, err)
				continue
			}
			data := 0
			for _, r := range scanAll(t, rows)[1:] {
				for _, v := range r {
					if strings.Contains(v, injectionMarker) {
						data++
					}
				}
			}
			rows.Close()
			// Every payload of every charset is a row's value (the
			// summary's digests drop nothing the alias holds).
			if data < rd.want {
				t.Errorf("%s session: %s: %d values hold the payload as data, want %d", cs, rd.table, data, rd.want)
			} else {
				t.Logf("%s session: %s: %d payloads came back as data", cs, rd.table, data)
			}
			if after := attackerGrants(); after != before {
				t.Errorf("%s session: reading %s ran the payload: the attacker's grants are now %q", cs, rd.table, after)
				rootExec(t, "REVOKE ALL PRIVILEGES, GRANT OPTION FROM 'sec_att'@'%'",
					"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP ON rgproxy_e2e.* TO 'sec_att'@'%'")
			}
		}
		var g string
		if err := db.QueryRow("SELECT CURRENT_RESOURCE_GROUP()").Scan(&g); err != nil || g != "default" {
			t.Errorf("%s session: CURRENT_RESOURCE_GROUP() = %q %v", cs, g, err)
		}
		if n := len(rowsOf(t, db, "SHOW RESOURCE GROUP USAGE LIKE 'sec%'")); n != 2 {
			t.Errorf("%s session: SHOW RESOURCE GROUP USAGE LIKE 'sec%%': %d rows, want sec_inj's", cs, n-1)
		}
	}
	t.Logf("the attacker's grants after every read:\n%s", attackerGrants())

	// The hex literals compare, sort and join like quoted text: with
	// literals and with columns of other character sets and collations,
	// in sessions of every character set.
	t.Cleanup(func() { rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.sec_coll") })
	rootExec(t, "DROP TABLE IF EXISTS rgproxy_e2e.sec_coll",
		"CREATE TABLE rgproxy_e2e.sec_coll (l VARCHAR(32) CHARACTER SET latin1, g VARCHAR(32) CHARACTER SET gbk, "+
			"s VARCHAR(32) CHARACTER SET sjis, u VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci, "+
			"b VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)",
		"INSERT INTO rgproxy_e2e.sec_coll VALUES ('sec_inj', 'sec_inj', 'sec_inj', 'SEC_INJ', 'sec_inj')")
	shapes := []struct {
		query string
		want  string
	}{
		{"SELECT COUNT(*) FROM information_schema.resource_groups g JOIN rgproxy_e2e.sec_coll c ON g.NAME = c.l AND g.NAME = c.g AND g.NAME = c.s AND g.NAME = c.u AND g.NAME = c.b", "1"},
		{"SELECT MAX(NAME) FROM information_schema.resource_groups WHERE NAME LIKE 'SEC\\_%' ORDER BY NAME DESC", "sec_inj"},
		{"SELECT COUNT(*) FROM information_schema.runaway_watches w JOIN rgproxy_e2e.sec_coll c ON w.RESOURCE_GROUP_NAME = c.u WHERE w.WATCH_TEXT LIKE '%sec_att%'", "5"},
		{"SELECT COUNT(*) FROM information_schema.statements_summary WHERE RESOURCE_GROUP IN (SELECT l FROM rgproxy_e2e.sec_coll) AND DIGEST_TEXT LIKE '%GRANT%'", "5"},
		{"SELECT COUNT(*) FROM information_schema.resource_group_bindings WHERE TAG_KEY LIKE 'sec\\_%' AND RESOURCE_GROUP = 'SEC_INJ'", "5"},
		{"SELECT /*+ RESOURCE_GROUP(sec_inj) */ COUNT(*) FROM rgproxy_e2e.sec_coll WHERE l = CURRENT_RESOURCE_GROUP() AND g = CURRENT_RESOURCE_GROUP() AND u = CURRENT_RESOURCE_GROUP() AND b = CURRENT_RESOURCE_GROUP()", "1"},
		{"SELECT GROUP_CONCAT(NAME ORDER BY NAME) FROM information_schema.resource_groups WHERE NAME IN ('default', 'sec_inj')", "default,sec_inj"},
	}
	for _, cs := range append([]string{"latin1"}, charsets...) {
		db := openDB(t, px.Addr, "charset="+cs)
		db.SetMaxOpenConns(1)
		for _, sh := range shapes {
			var got string
			if err := db.QueryRow(sh.query).Scan(&got); err != nil || got != sh.want {
				t.Errorf("%s session: %s = %q %v, want %s", cs, sh.query, got, err, sh.want)
			}
		}
	}
}

// TestSecurityNonSuperSeesOnlyItsGroups: a user sees in every virtual table
// only the groups it may use, and within its own group only the digest of
// another user's watched statement, never its literals.
func TestSecurityNonSuperSeesOnlyItsGroups(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--cpu-source", "wall")
	for _, u := range []string{"sec_ua", "sec_ub", "sec_uc"} {
		secAccount(t, u)
	}
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP sec_va RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '100ms', ACTION = DRYRUN, WATCH = EXACT)",
		"CREATE RESOURCE GROUP sec_vb RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP sec_vt RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP sec_vhidden RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP BINDING FOR TAG sec_route = '/shared' TO sec_vt",
		"ALTER USER 'sec_ua'@'%' RESOURCE GROUP sec_va",
		"ALTER USER 'sec_ub'@'%' RESOURCE GROUP sec_vb",
		"ALTER USER 'sec_uc'@'%' RESOURCE GROUP sec_va")
	time.Sleep(300 * time.Millisecond)
	const card = "4111-1111-1111-1111"
	ua := openDB(t, px.Addr, "user=sec_ua", "password=apppw")
	if _, err := ua.Exec("SELECT SLEEP(0.15), '" + card + "' AS card"); err != nil {
		t.Fatal(err)
	}
	root := openDB(t, px.Addr)
	root.SetMaxOpenConns(1)
	watchWaitUntil(t, "the watch", 5*time.Second, func() bool {
		var n int
		root.QueryRow("SELECT COUNT(*) FROM information_schema.runaway_watches WHERE WATCH_TEXT LIKE '%" + card + "%'").Scan(&n)
		return n == 1
	})

	names := func(db *sql.DB, q string) map[string]int {
		out := map[string]int{}
		for _, r := range rowsOf(t, db, q)[1:] {
			out[r[0]]++
		}
		return out
	}
	ub := openDB(t, px.Addr, "user=sec_ub", "password=apppw")
	ub.SetMaxOpenConns(1)
	checks := []struct{ what, query string }{
		{"runaway_watches", "SELECT RESOURCE_GROUP_NAME FROM information_schema.runaway_watches"},
		{"statements_summary", "SELECT RESOURCE_GROUP FROM information_schema.statements_summary"},
		{"resource_groups", "SELECT NAME FROM information_schema.resource_groups"},
		{"SHOW RESOURCE GROUP USAGE", "SHOW RESOURCE GROUP USAGE"},
		{"SHOW RESOURCE GROUP USAGE LIKE", "SHOW RESOURCE GROUP USAGE LIKE 'sec%'"},
		{"resource_group_bindings", "SELECT RESOURCE_GROUP FROM information_schema.resource_group_bindings"},
	}
	for _, c := range checks {
		got := names(ub, c.query)
		t.Logf("sec_ub (bound to sec_vb) in %s: %v", c.what, got)
		for g := range got {
			if g != "sec_vb" && g != "sec_vt" {
				t.Errorf("sec_ub sees group %s in %s", g, c.what)
			}
		}
		if all := names(root, c.query); c.what != "resource_group_bindings" && c.what != "statements_summary" &&
			c.what != "runaway_watches" && all["sec_vhidden"] == 0 {
			t.Errorf("root does not see sec_vhidden in %s: %v", c.what, all)
		}
	}
	if n := names(ub, "SELECT RESOURCE_GROUP_NAME FROM information_schema.runaway_watches")["sec_va"]; n != 0 {
		t.Errorf("sec_ub sees %d of sec_va's watches", n)
	}
	if _, err := ub.Exec("SHOW CREATE RESOURCE GROUP sec_va"); mysqlErrNo(err) != 1227 {
		t.Errorf("SHOW CREATE RESOURCE GROUP of another group: %v, want 1227", err)
	}
	// The same group: the watch, without the literal.
	uc := openDB(t, px.Addr, "user=sec_uc", "password=apppw")
	rows := rowsOf(t, uc, "SELECT RESOURCE_GROUP_NAME, WATCH, WATCH_TEXT FROM information_schema.runaway_watches")
	if len(rows) != 2 || rows[1][0] != "sec_va" || strings.Contains(rows[1][2], card) || !strings.Contains(rows[1][2], "SLEEP") {
		t.Errorf("sec_uc (bound to sec_va) reads runaway_watches as %v, want sec_va's watch without the card number", rows)
	} else {
		t.Logf("sec_uc reads the watch of its own group as %q", rows[1][2])
	}
	for _, r := range rowsOf(t, uc, "SELECT DIGEST_TEXT FROM information_schema.statements_summary")[1:] {
		if strings.Contains(r[0], card) {
			t.Errorf("statements_summary shows a literal: %q", r[0])
		}
	}
	if got := rowsOf(t, root, "SELECT WATCH_TEXT FROM information_schema.runaway_watches"); len(got) != 2 || !strings.Contains(got[1][0], card) {
		t.Errorf("root reads runaway_watches as %v, want the full text", got)
	}
}

// TestSecurityBoundedNumbers: a QUERY_LIMIT RU too large for a duration
// leaves a statement alone; every number and name beyond its documented
// range is refused with the field and the range in the message.
func TestSecurityBoundedNumbers(t *testing.T) {
	ts := startTokenServer(t)
	// Wall time: the guard's timer alone decides (with the backend
	// thread's CPU known, a timer that fired at once re-armed itself).
	px := startMeteredProxy(t, ts, append(serviceAccount(t), "--cpu-source", "wall")...)
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP sec_ru13 RU_PER_SEC = 100000 QUERY_LIMIT = (RU = 10000000000000, ACTION = KILL)",
		"CREATE RESOURCE GROUP sec_rumax RU_PER_SEC = 1000000000000000 QUERY_LIMIT = (RU = 1000000000000000, ACTION = KILL)")
	time.Sleep(300 * time.Millisecond)
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(1)
	for _, g := range []string{"sec_ru13", "sec_rumax"} {
		var one int
		if err := db.QueryRow("SELECT /*+ RESOURCE_GROUP(" + g + ") */ 1").Scan(&one); err != nil || one != 1 {
			t.Errorf("SELECT 1 in %s (QUERY_LIMIT RU, ACTION = KILL): %v", g, err)
		}
		if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(" + g + ") */ SLEEP(0.2)"); err != nil {
			t.Errorf("SELECT SLEEP(0.2) in %s (QUERY_LIMIT RU, ACTION = KILL): %v", g, err)
		}
		if n := metricSum(t, px.StatusAddr, "rgproxy_runaway_total", `resource_group="`+g+`"`); n != 0 {
			t.Errorf("%s: rgproxy_runaway_total = %v after SELECT 1 and SELECT SLEEP(0.2), want 0", g, n)
		} else {
			t.Logf("SELECT 1 and SELECT SLEEP(0.2) in %s: not runaway", g)
		}
	}
	refused := []struct{ sql, want string }{
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1000000000000001", "RU_PER_SEC"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 QUERY_LIMIT = (RU = 1000000000000001, ACTION = DRYRUN)", "QUERY_LIMIT RU"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1ns', ACTION = DRYRUN)", "EXEC_ELAPSED"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1500us', ACTION = DRYRUN)", "EXEC_ELAPSED"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '169h', ACTION = DRYRUN)", "EXEC_ELAPSED"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = DRYRUN, WATCH = EXACT DURATION = '8761h')", "DURATION"},
		{"CREATE RESOURCE GROUP sec_x RU_PER_SEC = 1 MAX_CONCURRENCY = 100001", "MAX_CONCURRENCY"},
		{"CREATE RESOURCE GROUP `sec x` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP `sec\x00x` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP `sec\nx` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP `sec\u202ex` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP `sec'x` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP `sec\"x` RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP " + strings.Repeat("s", 33) + " RU_PER_SEC = 1", "resource group name"},
		{"CREATE RESOURCE GROUP BINDING FOR TAG route = 'a\u202eb' TO sec_ru13", "tag"},
		{"CREATE RESOURCE GROUP BINDING FOR TAG `ro\tute` = 'ab' TO sec_ru13", "tag"},
	}
	for _, r := range refused {
		_, err := db.Exec(r.sql)
		if mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%q: %v, want 1105 naming %s", r.sql, err, r.want)
			continue
		}
		t.Logf("%q: %v", r.sql, err)
	}
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM information_schema.resource_groups WHERE NAME NOT IN ('default', 'sec_ru13', 'sec_rumax')").Scan(&n); err != nil || n != 0 {
		t.Errorf("refused groups exist: %d %v", n, err)
	}
}

// SUPER granted to an enabled role counts, as MariaDB counts it, when
// rgproxy has a service account that may read the grant tables (a session
// cannot read its roles' privileges); a role whose name reads like a grant
// but holds nothing does not.
func TestSecuritySuperThroughARole(t *testing.T) {
	ts := startTokenServer(t)
	svc := serviceAccount(t)
	rootExec(t, "GRANT SELECT ON mysql.user TO 'rgsvc'@'%'")
	withSvc := startMeteredProxy(t, ts, svc...)
	bare := startMeteredProxy(t, ts)
	t.Cleanup(func() {
		rootExec(t, "DROP ROLE IF EXISTS sec_superrole", "DROP ROLE IF EXISTS `sec_fake, SUPER ON *.* TO z`")
	})
	rootExec(t, "DROP ROLE IF EXISTS sec_superrole", "CREATE ROLE sec_superrole", "GRANT SUPER ON *.* TO sec_superrole",
		"DROP ROLE IF EXISTS `sec_fake, SUPER ON *.* TO z`", "CREATE ROLE `sec_fake, SUPER ON *.* TO z`")
	secAccount(t, "sec_viarole", "GRANT sec_superrole TO 'sec_viarole'@'%'", "SET DEFAULT ROLE sec_superrole FOR 'sec_viarole'@'%'")
	secAccount(t, "sec_fakerole", "GRANT `sec_fake, SUPER ON *.* TO z` TO 'sec_fakerole'@'%'",
		"SET DEFAULT ROLE `sec_fake, SUPER ON *.* TO z` FOR 'sec_fakerole'@'%'")
	create := func(px *proxy, user, group string) error {
		_, err := openDB(t, px.Addr, "user="+user, "password=apppw").Exec("CREATE RESOURCE GROUP IF NOT EXISTS " + group + " RU_PER_SEC = 10")
		return err
	}
	if err := create(withSvc, "sec_viarole", "sec_rolegrp"); err != nil {
		t.Fatalf("SUPER through an enabled role, with the service account: %v", err)
	}
	if err := create(bare, "sec_viarole", "sec_rolegrp2"); mysqlErrNo(err) != 1227 {
		t.Fatalf("SUPER through a role without a service account to read it: %v, want 1227", err)
	}
	if err := create(withSvc, "sec_fakerole", "sec_fakegrp"); mysqlErrNo(err) != 1227 {
		t.Fatalf("a role named like a grant: %v, want 1227", err)
	}
}
