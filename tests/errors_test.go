package tests

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// adminStatements are the statements a proxy sends to rgserver's
// ResourceGroupService; each must answer a readable MySQL error when
// rgserver cannot or will not take it.
var adminStatements = []string{
	"CREATE RESOURCE GROUP err_new RU_PER_SEC = 10",
	"ALTER RESOURCE GROUP err_rg RU_PER_SEC = 20",
	"DROP RESOURCE GROUP err_rg",
	"QUERY WATCH ADD RESOURCE GROUP err_rg ACTION KILL SQL TEXT EXACT TO 'SELECT 1'",
}

// wantReadable fails unless err is a 1105 holding every want and no gRPC
// text.
func wantReadable(t *testing.T, stmt string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", stmt)
		return
	}
	msg := err.Error()
	t.Logf("%s → %s", stmt, msg)
	if mysqlErrNo(err) != 1105 {
		t.Errorf("%s: %v, want 1105", stmt, err)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: %q lacks %q", stmt, msg, w)
		}
	}
	for _, bad := range []string{"rpc error", "code =", "desc ="} {
		if strings.Contains(msg, bad) {
			t.Errorf("%s: gRPC text reaches the client: %q", stmt, msg)
		}
	}
}

// Group DDL while rgserver is down answers 1105 naming rgserver's address,
// why it failed and that nothing was applied, not gRPC's text.
func TestRgserverDownDDLIsReadable(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	db := openDB(t, px.Addr)
	if _, err := db.Exec("CREATE RESOURCE GROUP err_rg RU_PER_SEC = 100"); err != nil {
		t.Fatal(err)
	}
	if err := ts.stop(10 * time.Second); err != nil {
		t.Logf("rgserver exited: %v", err)
	}
	for _, stmt := range adminStatements {
		_, err := db.Exec(stmt)
		wantReadable(t, stmt, err, "rgserver at "+ts.Addr+" is unreachable: connection refused", "the statement was not applied")
	}
	// Reads still come from the proxy's cache.
	var name string
	if err := db.QueryRow("SELECT NAME FROM information_schema.resource_groups WHERE NAME = 'err_rg'").Scan(&name); err != nil {
		t.Fatalf("reads while rgserver is down: %v", err)
	}
}

// A proxy whose credential rgserver refuses for group changes gets 1105
// saying so and which flag to check: a proxy credential (PermissionDenied)
// and an admin token rgserver does not know (Unauthenticated).
func TestRgserverRefusedCredentialIsReadable(t *testing.T) {
	s := startAuthedServer(t, "px1 px1-token-0123456789abc 4")
	admin := s.honestProxy(t, "px1")
	adb := openDB(t, admin.Addr)
	if _, err := adb.Exec("CREATE RESOURCE GROUP err_rg RU_PER_SEC = 100"); err != nil {
		t.Fatal(err)
	}

	proxyOnly := startMeteredProxy(t, s.tokenServer, "--token-server-proxy-token-file", s.proxyTokenFile(t, "px1"))
	wrong := filepath.Join(s.dir, "wrong-admin.token")
	if err := os.WriteFile(wrong, []byte("not-the-admin-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badAdmin := startMeteredProxy(t, s.tokenServer, "--token-server-proxy-token-file", s.proxyTokenFile(t, "px1"),
		"--token-server-token-file", wrong)

	cases := []struct {
		name string
		db   *sql.DB
		want []string
	}{
		{"proxy credential", openDB(t, proxyOnly.Addr), []string{
			"rgserver at " + s.Addr + " does not let this proxy's credential change resource groups",
			"set --token-server-token-file to a token of rgserver's --admin-token-file", "the statement was not applied"}},
		{"unknown admin token", openDB(t, badAdmin.Addr), []string{
			"rgserver at " + s.Addr + " refused this proxy's credential (rgserver does not know this bearer token (a credential revoked by a reload is no longer known))",
			"check --token-server-token-file", "the statement was not applied"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, stmt := range adminStatements {
				_, err := tc.db.Exec(stmt)
				wantReadable(t, stmt, err, tc.want...)
			}
		})
	}
	// Nothing was applied.
	var ru string
	if err := adb.QueryRow("SELECT RU_PER_SEC FROM information_schema.resource_groups WHERE NAME = 'err_rg'").Scan(&ru); err != nil || ru != "100" {
		t.Fatalf("err_rg after refused statements: %q %v, want 100", ru, err)
	}
}

// SHOW CREATE RESOURCE GROUP and information_schema.resource_groups show a
// QUERY_LIMIT in one syntax, and SHOW CREATE's text replays, under
// ANSI_QUOTES too, to the same group.
func TestQueryLimitSameInShowCreateAndResourceGroups(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(1)
	limits := map[string]string{
		"ql_cool":   "QUERY_LIMIT = (EXEC_ELAPSED = '60s', ACTION = COOLDOWN, WATCH = SIMILAR DURATION = '10m')",
		"ql_ru":     "QUERY_LIMIT = (RU = 500 ACTION = DRYRUN)",
		"ql_switch": "QUERY_LIMIT = (EXEC_ELAPSED = '1500ms', ACTION = SWITCH_GROUP(ql_target), WATCH = EXACT)",
	}
	if _, err := db.Exec("CREATE RESOURCE GROUP ql_target RU_PER_SEC = 100"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ql_ru", "ql_cool", "ql_switch"} {
		if _, err := db.Exec("CREATE RESOURCE GROUP " + name + " RU_PER_SEC = 100 " + limits[name]); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) (create, infoSchema string) {
		t.Helper()
		var g string
		if err := db.QueryRow("SHOW CREATE RESOURCE GROUP "+name).Scan(&g, &create); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow("SELECT QUERY_LIMIT FROM information_schema.resource_groups WHERE NAME = '" + name + "'").Scan(&infoSchema); err != nil {
			t.Fatal(err)
		}
		return create, infoSchema
	}
	for _, name := range []string{"ql_cool", "ql_ru", "ql_switch"} {
		create, is := read(name)
		t.Logf("%s: SHOW CREATE %s; information_schema %s", name, create, is)
		_, inside, ok := strings.Cut(create, " QUERY_LIMIT=(")
		if !ok {
			t.Fatalf("%s: no QUERY_LIMIT in %q", name, create)
		}
		inside = inside[:strings.LastIndexByte(inside, ')')]
		if inside != is {
			t.Errorf("%s: SHOW CREATE's QUERY_LIMIT=(%s), information_schema's %s", name, inside, is)
		}
		// The text replays to the same group, whatever the session's quotes.
		for _, mode := range []string{"", "ANSI_QUOTES"} {
			if _, err := db.Exec("SET SESSION sql_mode = '" + mode + "'"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("DROP RESOURCE GROUP " + name); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(create); err != nil {
				t.Fatalf("replaying %q under sql_mode %q: %v", create, mode, err)
			}
			if again, is2 := read(name); again != create || is2 != is {
				t.Errorf("%s under sql_mode %q: replayed to %q / %q", name, mode, again, is2)
			}
		}
	}
}

// A syntax error in rgproxy's own statements is 1064 saying why, through
// the wire, after MySQL's usual text.
func TestSyntaxErrorSaysWhy(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	db := openDB(t, px.Addr)
	tests := []struct{ sql, want string }{
		{"CREATE RESOURCE GROUP t6", "near '' at line 1: CREATE RESOURCE GROUP needs at least one option (RU_PER_SEC, PRIORITY, BURSTABLE, QUERY_LIMIT, MODE, MAX_CONCURRENCY, BUDGET, PARENT, BACKGROUND) after `t6`"},
		{"ALTER RESOURCE GROUP t6", "ALTER RESOURCE GROUP needs at least one option"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SECOND = 10", "unknown option 'RU_PER_SECOND'; the options are RU_PER_SEC, PRIORITY"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = '100'", "RU_PER_SEC is a whole number or UNLIMITED without quotes, not '100'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 PRIORITY = URGENT", "PRIORITY is LOW, MEDIUM or HIGH, not 'URGENT'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 RU_PER_SEC = 200", "RU_PER_SEC is given twice"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 QUERY_LIMIT = (EXEC_ELAPSED = 60, ACTION = KILL)", "EXEC_ELAPSED is a quoted duration such as '60s'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 QUERY_LIMIT = (EXEC_ELAPSED = '60s', ACTION = STOP)", "ACTION is DRYRUN, COOLDOWN, KILL or SWITCH_GROUP(group), not 'STOP'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 QUERY_LIMIT = (ELAPSED = '60s', ACTION = KILL)", "unknown QUERY_LIMIT option 'ELAPSED'"},
		{"CREATE RESOURCE GROUP t6 RU_PER_SEC = 100 QUERY_LIMIT = EXEC_ELAPSED = '60s'", "QUERY_LIMIT is NULL or ("},
		{"CREATE RESOURCE GROUP BINDING FOR TAG route '/report' TO t6", "expected '=', not '/report'"},
		{"CREATE RESOURCE GROUP 't6' RU_PER_SEC = 100", "expected a resource group name, not the string 't6'"},
		{"SET RESOURCE GROUP rg1 rg2", "expected the end of the statement, not 'rg2'"},
	}
	for _, tc := range tests {
		_, err := db.Exec(tc.sql)
		t.Logf("%s → %v", tc.sql, err)
		if mysqlErrNo(err) != 1064 || !strings.Contains(err.Error(), "You have an error in your SQL syntax") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want 1064 with %q", tc.sql, err, tc.want)
		}
	}
}

// SHOW LAST STATEMENT RU after a statement rgproxy refused (8252), killed
// (8253) or quarantined (8254) shows that statement, with its error and
// what it was or would have been charged up front.
func TestLastStatementRUAfterRefusals(t *testing.T) {
	rootExec(t, "CREATE TABLE IF NOT EXISTS rgproxy_e2e.lsr (b LONGBLOB)")
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, append(serviceAccount(t), "--max-wait", "2s")...)
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS lsr_tiny", "DROP RESOURCE GROUP IF EXISTS lsr_kill",
		"CREATE RESOURCE GROUP lsr_tiny RU_PER_SEC = 2",
		"CREATE RESOURCE GROUP lsr_kill RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '500ms', ACTION = KILL)")
	db := openDB(t, px.Addr)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "QUERY WATCH ADD RESOURCE GROUP lsr_kill ACTION KILL SQL TEXT EXACT TO 'SELECT 4242'"); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		group, stmt string
		code        uint16
	}{
		{"lsr_tiny", "INSERT INTO rgproxy_e2e.lsr VALUES ('" + strings.Repeat("x", 200<<10) + "')", 8252},
		{"lsr_kill", "SELECT SLEEP(3)", 8253},
		{"lsr_kill", "SELECT 4242", 8254},
	}
	for _, tc := range cases {
		if _, err := conn.ExecContext(ctx, "SET RESOURCE GROUP "+tc.group); err != nil {
			t.Fatal(err)
		}
		_, err := conn.ExecContext(ctx, tc.stmt)
		if mysqlErrNo(err) != tc.code {
			t.Fatalf("%.40s: %v, want %d", tc.stmt, err, tc.code)
		}
		row := lastStatementRU(t, conn)
		t.Logf("%d: %v; SHOW LAST STATEMENT RU: RESOURCE_GROUP=%s ERROR=%s ESTIMATED_RU=%s RRU=%s WRU=%s THROTTLE_WAIT_MS=%s",
			tc.code, err, row["RESOURCE_GROUP"], row["ERROR"], row["ESTIMATED_RU"], row["RRU"], row["WRU"], row["THROTTLE_WAIT_MS"])
		if row["RESOURCE_GROUP"] != tc.group || row["ERROR"] != strconv.Itoa(int(tc.code)) {
			t.Errorf("%d: SHOW LAST STATEMENT RU %v", tc.code, row)
		}
		if _, ok := row["ESTIMATED_RU"]; !ok {
			t.Fatalf("%d: no ESTIMATED_RU column: %v", tc.code, row)
		}
		if est := num(t, row["ESTIMATED_RU"]); est <= 0 {
			t.Errorf("%d: ESTIMATED_RU %v, want the statement's estimate", tc.code, est)
		}
		if tc.code == 8252 {
			// The estimate the refusal named.
			if !strings.Contains(err.Error(), "the statement's estimate "+row["ESTIMATED_RU"]+" RU can never fit") {
				t.Errorf("8252: ESTIMATED_RU %s, the error says %v", row["ESTIMATED_RU"], err)
			}
		}
	}
}

// A statement that cost far more than it prepaid puts its group in debt;
// every statement after it, even SELECT 1, gets 8252 saying so: what the
// group owes and when its RU_PER_SEC clears it, not a wait for 0.625 RU.
// The console shows the same debt and clear time.
func TestThrottledByDebtSaysSo(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "30s")
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS debt_e2e", "CREATE RESOURCE GROUP debt_e2e RU_PER_SEC = 5")
	ctx := context.Background()
	conn, err := openDB(t, px.Addr).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET RESOURCE GROUP debt_e2e"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT BENCHMARK(8000000, MD5('x'))"); err != nil {
		t.Fatalf("the expensive statement (its base cost fits): %v", err)
	}
	row := lastStatementRU(t, conn)
	cost := num(t, row["RRU"]) + num(t, row["WRU"])
	t.Logf("SELECT BENCHMARK(8000000, MD5('x')) cost %.1f RU", cost)
	if cost < 200 {
		t.Fatalf("the expensive statement cost %.1f RU: not enough to owe more than --max-wait pays at 5 RU/s", cost)
	}
	_, err = conn.ExecContext(ctx, "SELECT 1")
	re := regexp.MustCompile(`^Error 8252 \(HY000\): Exceeded resource group quota limitation \(resource group debt_e2e\): ` +
		`the group owes ([0-9.]+) RU and clears in about ([0-9]+)s at its RU_PER_SEC 5; ` +
		`the statement's 0\.625 RU cannot wait that long \(waited 0s of --max-wait 30s\)$`)
	m := re.FindStringSubmatch(fmt.Sprint(err))
	if m == nil {
		t.Fatalf("SELECT 1 in debt: %v, want 8252 naming the debt and its clear time", err)
	}
	t.Logf("SELECT 1: %v", err)
	owed, clears := num(t, m[1]), num(t, m[2])
	if owed > cost || owed < cost-100 || clears != math.Ceil(owed/5) {
		t.Errorf("owes %v RU (the statement cost %.1f), clears in %vs (want ⌈owed ÷ 5⌉)", owed, cost, clears)
	}
	var pc struct {
		Groups []struct {
			Name            string   `json:"name"`
			OwedRU          float64  `json:"owed_ru"`
			ClearsInSeconds *float64 `json:"clears_in_seconds"`
		} `json:"groups"`
	}
	getJSON(t, "http://"+px.ConsoleAddr+"/api/console", &pc)
	for _, g := range pc.Groups {
		if g.Name != "debt_e2e" {
			continue
		}
		if g.OwedRU <= 0 || g.OwedRU > owed+1 || g.ClearsInSeconds == nil || math.Abs(*g.ClearsInSeconds-g.OwedRU/5) > 0.01 {
			t.Errorf("the console: debt_e2e owes %v RU, clears in %v s; the error said %v RU", g.OwedRU, g.ClearsInSeconds, owed)
		}
		// The page says it in the group's tokens cell.
		if chromium, err := exec.LookPath("chromium"); err == nil {
			dom := browse(t, chromium, "http://"+px.ConsoleAddr+"/", filepath.Join(t.TempDir(), "debt.png"))
			cell := domRows(t, dom, "groups")["debt_e2e"]
			if len(cell) < 5 || !regexp.MustCompile(`^-[0-9,.]+ owes [0-9,.]+ RU, clears in about [0-9,]+ s$`).MatchString(cell[4]) {
				t.Errorf("the console's page: debt_e2e's row %q, want its tokens cell to say what it owes and when it clears", cell)
			}
		}
		return
	}
	t.Errorf("the console does not list debt_e2e: %+v", pc.Groups)
}
