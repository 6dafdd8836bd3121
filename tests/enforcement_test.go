package tests

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestKillRuleEnforcedOnEveryProxy: a QUERY_LIMIT ACTION = KILL is the
// same on every proxy, or says where it is not. CREATE through a proxy
// with the service account is refused while another live proxy has none,
// naming it; accepted once that proxy is gone. A proxy without the service
// account that joins later logs an ERROR naming the group, shows it in
// /readyz and rgproxy_query_limit_unenforced, and counts a runaway of the
// group as KILL_UNENFORCED (with an ERROR), never as a KILL that did not
// kill.
func TestKillRuleEnforcedOnEveryProxy(t *testing.T) {
	ts := startTokenServer(t)
	a := startMeteredProxy(t, ts, serviceAccount(t)...)
	b := startMeteredProxy(t, ts)
	const create = "CREATE RESOURCE GROUP rg_enf RU_PER_SEC = 100000 QUERY_LIMIT = (EXEC_ELAPSED = '1s', ACTION = KILL)"
	adminExec(t, a.Addr, "DROP RESOURCE GROUP IF EXISTS rg_enf")
	da := openDB(t, a.Addr)

	// Both proxies stream tokens to rgserver from their start;
	// rgserver_proxies_without_kill counts B.
	waitGauge(t, ts.StatusAddr, "rgserver_proxies_without_kill", 1)
	start := time.Now()
	_, err := da.Exec(create)
	took := time.Since(start)
	t.Logf("CREATE ... ACTION = KILL through A with B live: %v after %v", err, took.Round(time.Millisecond))
	if mysqlErrNo(err) != 1105 {
		t.Fatalf("want 1105 refusing the KILL rule, got %v", err)
	}
	for _, want := range []string{"rg_enf", "1 of 2 live rgproxy instances", b.Addr, "--admin-user"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), a.Addr) {
		t.Errorf("the refusal names A, which can kill: %v", err)
	}
	if strings.Contains(err.Error(), "rpc error") {
		t.Errorf("the refusal carries gRPC text: %v", err)
	}
	// The first answer waited out the new leader's capability window
	// (3 s from its election); later ones come at once.
	start = time.Now()
	if _, err := da.Exec(create); mysqlErrNo(err) != 1105 {
		t.Fatalf("CREATE again: %v", err)
	}
	t.Logf("refused again after %v", time.Since(start).Round(time.Millisecond))

	// B stops: its stream ends with it, and the rule is accepted.
	if err := b.stop(10 * time.Second); err != nil {
		t.Fatalf("B did not stop cleanly: %v", err)
	}
	waitGauge(t, ts.StatusAddr, "rgserver_proxies_without_kill", 0)
	start = time.Now()
	if _, err := da.Exec(create); err != nil {
		t.Fatalf("CREATE with every live proxy able to kill: %v", err)
	}
	t.Logf("CREATE accepted %v after B stopped", time.Since(start).Round(time.Millisecond))

	// C joins without the service account: the rule predates it.
	c := startMeteredProxy(t, ts, "--cpu-source", "wall")
	logged := waitLog(t, c.process, 0, "cannot enforce QUERY_LIMIT ACTION=KILL")
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, "rg_enf") {
		t.Fatalf("C's log does not name rg_enf at ERROR:\n%s", logged)
	}
	if v := metricSum(t, c.StatusAddr, "rgproxy_query_limit_unenforced", `resource_group="rg_enf"`); v != 1 {
		t.Fatalf("rgproxy_query_limit_unenforced{rg_enf} on C = %v, want 1", v)
	}
	if v := metricSum(t, a.StatusAddr, "rgproxy_query_limit_unenforced"); v != 0 {
		t.Fatalf("rgproxy_query_limit_unenforced on A = %v, want 0", v)
	}
	code, body := httpGet(t, "http://"+c.StatusAddr+"/readyz")
	var ready struct {
		Health     string   `json:"health"`
		Unenforced []string `json:"query_limit_unenforced"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != 200 || ready.Health != "true" ||
		len(ready.Unenforced) != 1 || ready.Unenforced[0] != "rg_enf" {
		t.Fatalf("C's /readyz %d %s (%v), want 200 listing rg_enf", code, body, err)
	}
	t.Logf("C's /readyz: %s", strings.TrimSpace(body))
	if _, body := httpGet(t, "http://"+a.StatusAddr+"/readyz"); strings.Contains(body, "query_limit_unenforced") {
		t.Fatalf("A's /readyz lists unenforced groups: %s", body)
	}
	// rgserver, too, now counts C.
	waitGauge(t, ts.StatusAddr, "rgserver_proxies_without_kill", 1)

	// A runaway on C: not killed, and said so.
	skip := len(c.log.String())
	conn, err := openDB(t, c.Addr).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), "SET RESOURCE GROUP rg_enf"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = conn.ExecContext(context.Background(), "SELECT SLEEP(2)")
	took = time.Since(start)
	t.Logf("SELECT SLEEP(2) on C under EXEC_ELAPSED='1s' ACTION=KILL: %v after %v", err, took.Round(time.Millisecond))
	if err != nil || took < 2*time.Second {
		t.Fatalf("C cannot kill: the statement should run to its end, got %v after %v", err, took)
	}
	if v := metricSum(t, c.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_enf"`, `action="KILL_UNENFORCED"`); v != 1 {
		t.Fatalf(`rgproxy_runaway_total{action="KILL_UNENFORCED"} = %v, want 1`, v)
	}
	if v := metricSum(t, c.StatusAddr, "rgproxy_runaway_total", `resource_group="rg_enf"`, `action="KILL"`); v != 0 {
		t.Fatalf(`rgproxy_runaway_total{action="KILL"} = %v on a proxy that cannot kill, want 0`, v)
	}
	logged = waitLog(t, c.process, skip, "runaway statement not killed")
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, "resource_group=rg_enf") {
		t.Fatalf("the runaway on C is not logged at ERROR with its group:\n%s", logged)
	}
}

// waitMetric waits (at most 10 s) until a metric's sum is want.
func waitGauge(t testing.TB, statusAddr, name string, want float64, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := metricSum(t, statusAddr, name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after 10s, want %v", name, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
