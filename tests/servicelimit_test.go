package tests

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// showResourceControl reads SHOW RESOURCE CONTROL through a proxy:
// column name → value.
func showResourceControl(t testing.TB, addr string, params ...string) map[string]string {
	t.Helper()
	rows, err := openDB(t, addr, params...).Query("SHOW RESOURCE CONTROL")
	if err != nil {
		t.Fatalf("SHOW RESOURCE CONTROL: %v", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]string, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if !rows.Next() {
		t.Fatal("SHOW RESOURCE CONTROL: no row")
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for i, c := range cols {
		out[c] = vals[i]
	}
	return out
}

// groupRUOnProxies is rgproxy_ru_consumed_total of group summed over pxs.
func groupRUOnProxies(t testing.TB, pxs []*proxy, group string) float64 {
	sum := 0.0
	for _, px := range pxs {
		sum += metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+group+`"`)
	}
	return sum
}

// TestServiceLimitSharedByPriorityAcrossThreeProxies is the service
// limit's "done when": four groups saturated through three proxies under
// ALTER RESOURCE CONTROL SERVICE LIMIT = 300 spend 300 RU/s together
// (±10%), shared by PRIORITY: the HIGH group its RU_PER_SEC, the two
// MEDIUM BURSTABLE = UNLIMITED groups their RU_PER_SEC and the rest
// between them, the LOW group (RU_PER_SEC = UNLIMITED: it would otherwise
// never be throttled) next to nothing.
func TestServiceLimitSharedByPriorityAcrossThreeProxies(t *testing.T) {
	const limit = 300.0
	ts := startTokenServer(t)
	pxs := []*proxy{
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
	}
	groups := []struct {
		name, def string
		user      string
	}{
		{"rg_sl_hi", "RU_PER_SEC = 100 PRIORITY = HIGH", "sl_hi"},
		{"rg_sl_m1", "RU_PER_SEC = 50 PRIORITY = MEDIUM BURSTABLE = UNLIMITED", "sl_m1"},
		{"rg_sl_m2", "RU_PER_SEC = 100 PRIORITY = MEDIUM BURSTABLE = UNLIMITED", "sl_m2"},
		{"rg_sl_lo", "RU_PER_SEC = UNLIMITED PRIORITY = LOW", "sl_lo"},
	}
	stmts := []string{fmt.Sprintf("ALTER RESOURCE CONTROL SERVICE LIMIT = %d", int(limit))}
	for _, g := range groups {
		appUser(t, g.user)
		stmts = append(stmts, "DROP RESOURCE GROUP IF EXISTS "+g.name, "CREATE RESOURCE GROUP "+g.name+" "+g.def,
			fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP %s", g.user, g.name))
	}
	adminExec(t, pxs[0].Addr, stmts...)
	time.Sleep(time.Second) // the bindings reach every proxy's settings cache
	if got := showResourceControl(t, pxs[1].Addr); got["SERVICE_LIMIT"] != "300" || got["SOURCE"] != "SQL" || got["RU_PER_SEC_SUM"] != "250.0" {
		t.Fatalf("SHOW RESOURCE CONTROL through another proxy: %v", got)
	}

	// Saturating load: 3 sessions per group on each proxy, closed loop.
	const warm, measure = 6 * time.Second, 18 * time.Second
	done := make(chan *loadResult, len(groups))
	for _, g := range groups {
		go func() { done <- runLoad(t, pxs, []int{3, 3, 3}, g.user, "SELECT 1", warm+measure+time.Second) }()
	}
	proxyRU := func(group string) float64 { return groupRUOnProxies(t, pxs, group) }
	time.Sleep(warm)
	before := map[string]float64{}
	for _, g := range groups {
		before[g.name] = proxyRU(g.name)
	}
	start := time.Now()
	time.Sleep(measure)
	rate := map[string]float64{}
	total := 0.0
	el := time.Since(start).Seconds()
	for _, g := range groups {
		rate[g.name] = (proxyRU(g.name) - before[g.name]) / el
		total += rate[g.name]
	}
	granted := metricSum(t, ts.StatusAddr, "rgserver_service_limit_allocated_ru_per_second")
	var ran []string
	for range groups {
		res := <-done
		ran = append(ran, fmt.Sprintf("%d ran, %d refused", res.statements.Load(), res.errors.Load()))
	}
	t.Logf("over %.1f s: HIGH %.1f RU/s, MEDIUM %.1f + %.1f, LOW %.1f; together %.1f of %.0f (%+.1f%%); rgserver gave %.1f; sessions: %s",
		el, rate["rg_sl_hi"], rate["rg_sl_m1"], rate["rg_sl_m2"], rate["rg_sl_lo"], total, limit, 100*(total-limit)/limit, granted, strings.Join(ran, "; "))
	if !within(total, limit, 0.10) {
		t.Errorf("the groups spent %.1f RU/s together, not within ±10%% of the limit %.0f", total, limit)
	}
	if !within(rate["rg_sl_hi"], 100, 0.15) {
		t.Errorf("HIGH group spent %.1f RU/s, want its RU_PER_SEC 100 ± 15%%", rate["rg_sl_hi"])
	}
	for _, g := range []struct {
		name string
		fill float64
	}{{"rg_sl_m1", 50}, {"rg_sl_m2", 100}} {
		if rate[g.name] < 0.9*g.fill {
			t.Errorf("MEDIUM group %s spent %.1f RU/s, below its RU_PER_SEC %.0f", g.name, rate[g.name], g.fill)
		}
	}
	if m := rate["rg_sl_m1"] + rate["rg_sl_m2"]; !within(m, limit-100, 0.15) {
		t.Errorf("the MEDIUM groups spent %.1f RU/s together, want what HIGH leaves, %.0f ± 15%%", m, limit-100)
	}
	if rate["rg_sl_lo"] > 0.05*limit {
		t.Errorf("LOW group spent %.1f RU/s with the limit used by higher priorities, want under 5%% of it", rate["rg_sl_lo"])
	}
	if v := metricSum(t, ts.StatusAddr, "rgserver_service_limit_ru_per_second"); v != limit {
		t.Errorf("rgserver_service_limit_ru_per_second = %v", v)
	}
	if !strings.Contains(ts.log.String(), "service limit") {
		t.Errorf("rgserver did not log the service limit:\n%s", ts.log.String())
	}
}

// TestServiceLimitSQL: the limit's SQL with hostile values, a non-admin
// session, the flag's default, and a limit set by SQL that outlives a
// restart of rgserver over the same data directory.
func TestServiceLimitSQL(t *testing.T) {
	dir := t.TempDir()
	addr, statusAddr := freeAddr(t), freeAddr(t)
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--service-limit", "5000", "--log-level", "info"}
	s := rgsStart(t, addr, statusAddr, args...)
	rgsWaitReady(t, s, 20*time.Second)
	px := startProxy(t, "--token-server", addr, "--log-level", "warn")
	appUser(t, "sl_app")

	if got := showResourceControl(t, px.Addr); got["SERVICE_LIMIT"] != "5000" || got["SOURCE"] != "FLAG" {
		t.Fatalf("the flag's limit: %v", got)
	}
	db := openDB(t, px.Addr)
	for _, tc := range []struct {
		sql  string
		code uint16
		has  string
	}{
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = -5", 1105, "SERVICE LIMIT = -5 is out of range"},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = 0", 1105, "is out of range"},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = 99999999999999999999999999", 1105, "is out of range"},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = 1000000000000000001", 1105, "1 to 1000000000000000"},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = '100'", 1064, "without quotes"},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = 1e3", 1064, ""},
		{"ALTER RESOURCE CONTROL SERVICE LIMIT = 100; DROP TABLE x", 1295, ""},
		{"ALTER RESOURCE CONTROL BURST = 5", 1064, "SERVICE LIMIT"},
	} {
		_, err := db.Exec(tc.sql)
		if mysqlErrNo(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.has) {
			t.Errorf("%s: %v, want error %d containing %q", tc.sql, err, tc.code, tc.has)
		}
	}
	_, err := openDB(t, px.Addr, "user=sl_app", "password=apppw").Exec("ALTER RESOURCE CONTROL SERVICE LIMIT = 1")
	if mysqlErrNo(err) != 1227 || !strings.Contains(err.Error(), "ALTER RESOURCE CONTROL") {
		t.Errorf("a session without SUPER: %v, want 1227 naming ALTER RESOURCE CONTROL", err)
	}
	if got := showResourceControl(t, px.Addr, "user=sl_app", "password=apppw"); got["SERVICE_LIMIT"] != "5000" {
		t.Errorf("the refused statements changed the limit: %v", got)
	}

	adminExec(t, px.Addr, "ALTER RESOURCE CONTROL SERVICE LIMIT = 8000")
	if got := showResourceControl(t, px.Addr); got["SERVICE_LIMIT"] != "8000" || got["SOURCE"] != "SQL" {
		t.Fatalf("after ALTER: %v", got)
	}
	if err := s.stop(10 * time.Second); err != nil {
		t.Fatalf("rgserver did not exit cleanly: %v\n%s", err, s.log.String())
	}
	s2 := rgsStart(t, addr, statusAddr, args...)
	rgsWaitReady(t, s2, 20*time.Second)
	// The proxy reconnects with a backoff of up to 2 s.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, err := db.Exec("SHOW RESOURCE CONTROL"); err == nil {
			break
		}
	}
	if got := showResourceControl(t, px.Addr); got["SERVICE_LIMIT"] != "8000" || got["SOURCE"] != "SQL" {
		t.Errorf("after a restart with --service-limit 5000: %v, want SQL's 8000", got)
	}
	if v := metricSum(t, statusAddr, "rgserver_service_limit_ru_per_second"); v != 8000 {
		t.Errorf("rgserver_service_limit_ru_per_second after the restart = %v", v)
	}
	adminExec(t, px.Addr, "ALTER RESOURCE CONTROL SERVICE LIMIT = UNLIMITED")
	if got := showResourceControl(t, px.Addr); got["SERVICE_LIMIT"] != "UNLIMITED" || got["SOURCE"] != "SQL" {
		t.Errorf("after UNLIMITED: %v", got)
	}
}

// TestBackgroundUsesWhatForegroundLeaves: under a service limit of 300
// RU/s, a BACKGROUND group (RU_PER_SEC = 10, UTILIZATION_LIMIT = 80)
// saturated through three proxies beside a saturated HIGH group of 250
// gets its floor and what the foreground leaves (300 - 250 = 50); when
// the foreground's load stops it grows to its 80% of the limit (240):
// the test logs how soon, second by second, and wants it there in the
// 5th and 6th seconds (rgserver counts a stopped group's demand until
// its proxies' next messages: 4-5 s, not the 2).
func TestBackgroundUsesWhatForegroundLeaves(t *testing.T) {
	const limit = 300.0
	ts := startTokenServer(t)
	pxs := []*proxy{
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
		startMeteredProxy(t, ts, "--max-wait", "500ms"),
	}
	appUser(t, "bgt_fg")
	appUser(t, "bgt_bg")
	adminExec(t, pxs[0].Addr, fmt.Sprintf("ALTER RESOURCE CONTROL SERVICE LIMIT = %d", int(limit)),
		"DROP RESOURCE GROUP IF EXISTS rg_bgt_fg", "DROP RESOURCE GROUP IF EXISTS rg_bgt_bg",
		"CREATE RESOURCE GROUP rg_bgt_fg RU_PER_SEC = 250 PRIORITY = HIGH",
		"CREATE RESOURCE GROUP rg_bgt_bg RU_PER_SEC = 10 BACKGROUND = (UTILIZATION_LIMIT = 80)",
		"ALTER USER 'bgt_fg'@'%' RESOURCE GROUP rg_bgt_fg", "ALTER USER 'bgt_bg'@'%' RESOURCE GROUP rg_bgt_bg")
	time.Sleep(time.Second) // the bindings reach every proxy's settings cache
	rows, err := queryStrings(t, openDB(t, pxs[2].Addr), "SELECT BACKGROUND FROM information_schema.resource_groups WHERE NAME = 'rg_bgt_bg'")
	if err != nil || len(rows) != 1 || rows[0][0] != "UTILIZATION_LIMIT=80" {
		t.Fatalf("information_schema.resource_groups' BACKGROUND through another proxy: %q, %v", rows, err)
	}

	proxyRU := func(group string) float64 { return groupRUOnProxies(t, pxs, group) }
	const warm, measure = 6 * time.Second, 12 * time.Second
	fgDone := make(chan *loadResult, 1)
	bgDone := make(chan *loadResult, 1)
	go func() { fgDone <- runLoad(t, pxs, []int{3, 3, 3}, "bgt_fg", "SELECT 1", warm+measure) }()
	go func() { bgDone <- runLoad(t, pxs, []int{3, 3, 3}, "bgt_bg", "SELECT 1", warm+measure+8*time.Second) }()
	time.Sleep(warm)
	fg0, bg0 := proxyRU("rg_bgt_fg"), proxyRU("rg_bgt_bg")
	start := time.Now()
	time.Sleep(measure - time.Second)
	el := time.Since(start).Seconds()
	fgRate, bgRate := (proxyRU("rg_bgt_fg")-fg0)/el, (proxyRU("rg_bgt_bg")-bg0)/el
	<-fgDone
	stopped := time.Now()
	// The background group second by second after the foreground stopped.
	var perSecond []string
	var after2 []float64
	prev := proxyRU("rg_bgt_bg")
	for s := 1; s <= 6; s++ {
		time.Sleep(time.Until(stopped.Add(time.Duration(s) * time.Second)))
		cur := proxyRU("rg_bgt_bg")
		perSecond = append(perSecond, fmt.Sprintf("%.0f", cur-prev))
		if s > 4 {
			after2 = append(after2, cur-prev)
		}
		prev = cur
	}
	<-bgDone
	t.Logf("under load: foreground %.1f RU/s, background %.1f (want 250 and 50); after the foreground stopped, the background by second: %s RU (its cap 240)",
		fgRate, bgRate, strings.Join(perSecond, " "))
	if !within(fgRate, 250, 0.15) {
		t.Errorf("the foreground spent %.1f RU/s, want 250 ± 15%%", fgRate)
	}
	if bgRate < 0.9*10 || bgRate > 1.5*50 {
		t.Errorf("the background spent %.1f RU/s beside the foreground, want its floor 10 and what the foreground leaves: at most 50 (+50%%)", bgRate)
	}
	if total := fgRate + bgRate; !within(total, limit, 0.10) {
		t.Errorf("together %.1f RU/s, not within ±10%% of the limit %.0f", total, limit)
	}
	late := 0.0
	for _, v := range after2 {
		late += v
	}
	if late /= float64(len(after2)); late < 0.8*240 || late > 240*1.1 {
		t.Errorf("from 4 s after the foreground stopped the background spent %.1f RU/s, want above 80%% of its 240", late)
	}
}
