package tests

import (
	"context"
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
	px := startMeteredProxy(t, ts)
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
