package tests

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serviceAccount creates rgproxy's service account on the shared MariaDB
// and returns the rgproxy flags that use it.
func serviceAccount(t testing.TB) []string {
	t.Helper()
	rootExec(t,
		"CREATE USER IF NOT EXISTS 'rgsvc'@'%' IDENTIFIED BY 'svcpw'",
		"GRANT CONNECTION ADMIN ON *.* TO 'rgsvc'@'%'")
	f := filepath.Join(t.TempDir(), "svc.pw")
	if err := os.WriteFile(f, []byte("svcpw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--admin-user", "rgsvc", "--admin-password-file", f}
}

func TestRunawayKillIsInterruptedAndSessionSurvives(t *testing.T) {
	ts := startTokenServer(t)
	bare := startMeteredProxy(t, ts)
	// A KILL rule needs the service account: refused at CREATE time.
	_, err := openDB(t, bare.Addr).Exec("CREATE RESOURCE GROUP rg_kill RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL)")
	if mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "--admin-user") {
		t.Fatalf("a KILL rule without a service account: %v", err)
	}
	// While it is live, rgserver refuses the rule through any proxy
	// (TestKillRuleEnforcedOnEveryProxy): it goes first.
	if err := bare.stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}

	px := startMeteredProxy(t, ts, serviceAccount(t)...)
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_kill",
		"CREATE RESOURCE GROUP rg_kill RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL)")
	db := openDB(t, px.Addr)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var backendID int64
	conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&backendID)
	if _, err := conn.ExecContext(ctx, "SET RESOURCE GROUP rg_kill"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = conn.ExecContext(ctx, "SELECT SLEEP(5)")
	took := time.Since(start)
	t.Logf("SELECT SLEEP(5) under EXEC_ELAPSED='1s' ACTION=KILL: %v after %v", err, took.Round(time.Millisecond))
	if mysqlErrNo(err) != 8253 || !strings.Contains(err.Error(), "runaway") {
		t.Fatalf("want 8253 (runaway query interrupted), got %v", err)
	}
	if took > 1500*time.Millisecond {
		t.Fatalf("the runaway statement ended after %v, want within 1.5 s", took)
	}
	var command string
	rootDB := openDB(t, backendAddr)
	if err := rootDB.QueryRow("SELECT COMMAND FROM information_schema.PROCESSLIST WHERE ID = ?", backendID).Scan(&command); err != nil || command != "Sleep" {
		t.Fatalf("backend connection %d after the kill: %q %v, want Sleep", backendID, command, err)
	}
	var one int
	if err := conn.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("session after the kill: %v", err)
	}
}

func TestRunawayDryRunAndSwitchGroup(t *testing.T) {
	ts := startTokenServer(t)
	// SLEEP's backend time is what these limits measure: wall time (with
	// the backend thread's CPU time, a sleep costs nothing).
	px := startMeteredProxy(t, ts, "--cpu-source", "wall")
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_dry", "DROP RESOURCE GROUP IF EXISTS rg_from", "DROP RESOURCE GROUP IF EXISTS rg_to",
		"CREATE RESOURCE GROUP rg_dry RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '300ms', ACTION = DRYRUN)",
		"CREATE RESOURCE GROUP rg_to RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP rg_from RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '300ms', ACTION = SWITCH_GROUP(rg_to))")
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(1)
	// DRYRUN records the event and lets the statement run.
	if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(rg_dry) */ SLEEP(0.6)"); err != nil {
		t.Fatalf("DRYRUN must let the statement run: %v", err)
	}
	if n := metricSum(t, px.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_dry"`, `action="DRYRUN"`); n != 1 {
		t.Fatalf("rgproxy_runaway_total for DRYRUN = %v, want 1", n)
	}
	// RU = 100: 0.5 s of backend time is 167 RU and crosses it while the
	// statement runs; 0.1 s (33 RU) does not.
	adminExec(t, px.Addr, "DROP RESOURCE GROUP IF EXISTS rg_ru",
		"CREATE RESOURCE GROUP rg_ru RU_PER_SEC = 100000 QUERY_LIMIT = (RU = 100, ACTION = DRYRUN)")
	for _, q := range []string{"SELECT /*+ RESOURCE_GROUP(rg_ru) */ SLEEP(0.1)", "SELECT /*+ RESOURCE_GROUP(rg_ru) */ SLEEP(0.5)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if n := metricSum(t, px.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_ru"`, `action="DRYRUN"`); n != 1 {
		t.Fatalf("RU = 100 fired %v times, want once (for the 0.5 s statement)", n)
	}
	// SWITCH_GROUP charges the rest of the statement to the target group:
	// 0.9 s of backend time is 300 RU.
	toBefore := serverRU(t, ts, "rg_to")
	if _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(rg_from) */ SLEEP(0.9)"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second) // one report period
	moved := serverRU(t, ts, "rg_to") - toBefore
	t.Logf("RU charged to rg_to after SWITCH_GROUP: %.1f", moved)
	if moved < 250 {
		t.Fatalf("SWITCH_GROUP moved %.1f RU to rg_to, want the statement's backend time (~300 RU)", moved)
	}
	if n := metricSum(t, px.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_from"`, `action="SWITCH_GROUP"`); n != 1 {
		t.Fatalf("rgproxy_runaway_total for SWITCH_GROUP = %v, want 1", n)
	}
}

// TestRunawayWatchSharedBetweenProxies: a KILL with WATCH = SIMILAR on one
// proxy quarantines its like on every proxy: a second SELECT SLEEP(6)
// through another proxy gets 8254 at once, before touching the backend.
func TestRunawayWatchSharedBetweenProxies(t *testing.T) {
	ts := startTokenServer(t)
	svc := serviceAccount(t)
	a, b := startMeteredProxy(t, ts, svc...), startMeteredProxy(t, ts, svc...)
	adminExec(t, a.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_watch",
		"CREATE RESOURCE GROUP rg_watch RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL, WATCH = SIMILAR DURATION = '1m')")
	settingsReach(t, a, b) // b's SET RESOURCE GROUP needs the group
	da, db := openDB(t, a.Addr), openDB(t, b.Addr)
	da.SetMaxOpenConns(1)
	db.SetMaxOpenConns(1)
	for _, d := range []*sql.DB{da, db} {
		if _, err := d.Exec("SET RESOURCE GROUP rg_watch"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := da.Exec("SELECT SLEEP(5)"); mysqlErrNo(err) != 8253 {
		t.Fatalf("first runaway: want 8253, got %v", err)
	}
	// The watch reaches proxy b within 1 s; then a similar statement is
	// quarantined at once.
	deadline := time.Now().Add(time.Second)
	for {
		rows := rowsOf(t, db, "SELECT * FROM information_schema.runaway_watches")
		if len(rows) > 1 {
			t.Logf("watch list through proxy b: %q", rows)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not reach proxy b within 1 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	_, err := db.Exec("SELECT SLEEP(6)")
	took := time.Since(start)
	if mysqlErrNo(err) != 8254 || took > 200*time.Millisecond {
		t.Fatalf("a similar statement through proxy b: %v after %v, want 8254 at once", err, took)
	}
	if n := metricSum(t, b.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_watch"`, `action="KILL"`); n != 1 {
		t.Fatalf("proxy b counted %v runaway KILLs, want 1", n)
	}
	// Another statement of the group still runs.
	if _, err := db.Exec("SELECT 1"); err != nil {
		t.Fatalf("an unwatched statement: %v", err)
	}
}

// TestQueryWatchStatements: QUERY WATCH ADD / REMOVE and
// information_schema.runaway_watches, answered by the proxy.
func TestQueryWatchStatements(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_qw",
		"CREATE RESOURCE GROUP rg_qw RU_PER_SEC = 100000")
	root := openDB(t, px.Addr)
	root.SetMaxOpenConns(1)
	var id int64
	if err := root.QueryRow("QUERY WATCH ADD RESOURCE GROUP rg_qw ACTION KILL SQL TEXT EXACT TO 'SELECT 42'").Scan(&id); err != nil || id == 0 {
		t.Fatalf("QUERY WATCH ADD: %v %d", err, id)
	}
	rows := rowsOf(t, root, "SELECT * FROM information_schema.runaway_watches")
	if len(rows) != 2 || rows[1][1] != "rg_qw" || rows[1][4] != "EXACT" || rows[1][5] != "SELECT 42" || rows[1][7] != "KILL" {
		t.Fatalf("runaway_watches: %q", rows)
	}
	root.Exec("SET RESOURCE GROUP rg_qw")
	if _, err := root.Exec("SELECT 42"); mysqlErrNo(err) != 8254 {
		t.Fatalf("a watched statement: want 8254, got %v", err)
	}
	if _, err := root.Exec("SELECT 43"); err != nil {
		t.Fatalf("an unwatched statement: %v", err)
	}
	appUser(t, "rgqw")
	if _, err := openDB(t, px.Addr, "user=rgqw", "password=apppw").Exec("QUERY WATCH REMOVE " + fmt.Sprint(id)); mysqlErrNo(err) != 1227 {
		t.Fatalf("QUERY WATCH REMOVE without SUPER: %v", err)
	}
	if _, err := root.Exec("QUERY WATCH REMOVE " + fmt.Sprint(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.Exec("SELECT 42"); err != nil {
		t.Fatalf("after QUERY WATCH REMOVE: %v", err)
	}
}

// TestRunawayCooldownSerializesWatchedStatements: after a COOLDOWN rule
// with WATCH fires, statements like it run one at a time on a proxy.
func TestRunawayCooldownSerializesWatchedStatements(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts)
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS rg_cool",
		"CREATE RESOURCE GROUP rg_cool RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '200ms', ACTION = COOLDOWN, WATCH = EXACT DURATION = '1m')")
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(4)
	const q = "SELECT /*+ RESOURCE_GROUP(rg_cool) */ SLEEP(0.5)"
	if _, err := db.Exec(q); err != nil { // crosses EXEC_ELAPSED: the watch is added
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Second)
	for len(rowsOf(t, db, "SELECT * FROM information_schema.runaway_watches")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no watch after the COOLDOWN rule fired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { _, err := db.Exec(q); errs <- err }()
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	t.Logf("two watched statements of 0.5 s each under COOLDOWN took %v together", took.Round(time.Millisecond))
	if took < 950*time.Millisecond {
		t.Fatalf("two COOLDOWN statements ran side by side (%v for two 0.5 s sleeps)", took)
	}
	// Unwatched statements of the group still run side by side.
	start = time.Now()
	for i := 0; i < 2; i++ {
		go func() { _, err := db.Exec("SELECT /*+ RESOURCE_GROUP(rg_cool) */ SLEEP(0.15)"); errs <- err }()
	}
	<-errs
	<-errs
	if took := time.Since(start); took > 290*time.Millisecond {
		t.Fatalf("unwatched statements were serialized too (%v)", took)
	}
}
