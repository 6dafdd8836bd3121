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

// threeLimitProxies starts the three metered proxies the service limit's
// and the parents' tests share ts through, with a 500 ms --max-wait.
func threeLimitProxies(t testing.TB, ts *tokenServer) []*proxy {
	t.Helper()
	pxs := make([]*proxy, 3)
	for i := range pxs {
		pxs[i] = startMeteredProxy(t, ts, "--max-wait", "500ms")
	}
	return pxs
}

// groupDef is a group a test creates: its name, its options, and the
// account bound to it ("": none).
type groupDef struct{ name, def, user string }

// groupStatements creates each group's account and returns the
// statements that create the groups afresh, in order, and bind the
// accounts.
func groupStatements(t testing.TB, groups []groupDef) []string {
	t.Helper()
	var stmts []string
	for _, g := range groups {
		stmts = append(stmts, "DROP RESOURCE GROUP IF EXISTS "+g.name, "CREATE RESOURCE GROUP "+g.name+" "+g.def)
		if g.user != "" {
			appUser(t, g.user)
			stmts = append(stmts, fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP %s", g.user, g.name))
		}
	}
	return stmts
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
	pxs := threeLimitProxies(t, ts)
	groups := []groupDef{
		{"rg_sl_hi", "RU_PER_SEC = 100 PRIORITY = HIGH", "sl_hi"},
		{"rg_sl_m1", "RU_PER_SEC = 50 PRIORITY = MEDIUM BURSTABLE = UNLIMITED", "sl_m1"},
		{"rg_sl_m2", "RU_PER_SEC = 100 PRIORITY = MEDIUM BURSTABLE = UNLIMITED", "sl_m2"},
		{"rg_sl_lo", "RU_PER_SEC = UNLIMITED PRIORITY = LOW", "sl_lo"},
	}
	adminExec(t, pxs[0].Addr, append([]string{fmt.Sprintf("ALTER RESOURCE CONTROL SERVICE LIMIT = %d", int(limit))},
		groupStatements(t, groups)...)...)
	settingsReach(t, pxs[0], pxs[1:]...) // the bindings reach every proxy's settings cache
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
// the test logs how soon, second by second, and wants it there from the
// second second on (the stopped group's quiet report, then ask_again to
// every background proxy whose trickle is a fifth or more off).
func TestBackgroundUsesWhatForegroundLeaves(t *testing.T) {
	const limit = 300.0
	ts := startTokenServer(t)
	pxs := threeLimitProxies(t, ts)
	appUser(t, "bgt_fg")
	appUser(t, "bgt_bg")
	adminExec(t, pxs[0].Addr, fmt.Sprintf("ALTER RESOURCE CONTROL SERVICE LIMIT = %d", int(limit)),
		"DROP RESOURCE GROUP IF EXISTS rg_bgt_fg", "DROP RESOURCE GROUP IF EXISTS rg_bgt_bg",
		"CREATE RESOURCE GROUP rg_bgt_fg RU_PER_SEC = 250 PRIORITY = HIGH",
		"CREATE RESOURCE GROUP rg_bgt_bg RU_PER_SEC = 10 BACKGROUND = (UTILIZATION_LIMIT = 80)",
		"ALTER USER 'bgt_fg'@'%' RESOURCE GROUP rg_bgt_fg", "ALTER USER 'bgt_bg'@'%' RESOURCE GROUP rg_bgt_bg")
	settingsReach(t, pxs[0], pxs[1:]...) // the bindings reach every proxy's settings cache
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
		if s >= 2 { // from the second second on: the quiet report and ask_again took effect
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
		t.Errorf("from 1 s after the foreground stopped the background spent %.1f RU/s, want above 80%% of its 240", late)
	}
}

// bgHeld is a group's RU on the proxies and what held its sessions back,
// for a failure's message: on the proxies, cumulative (or, from since,
// over an interval), RU consumed, seconds its statements waited for
// tokens and statements refused (8252); rgserver's last sharing of the
// service limit, allocated and demanded, RU/s. (A group at its ceiling
// waits most of the time: its sessions together waited ~8.5 s a second
// at 240 RU/s.)
type bgHeld struct {
	ru, waited, refused float64
	allocated, demand   float64
}

// bgHeldNow reads bgHeld with one scrape of each proxy and of rgserver.
func bgHeldNow(t *testing.T, ts *tokenServer, pxs []*proxy, group string) bgHeld {
	t.Helper()
	var h bgHeld
	for _, px := range pxs {
		m := scrapeMetrics(t, px.StatusAddr)
		_, waited := m.hist("rgproxy_throttle_wait_seconds", "resource_group", group)
		h.ru += m.v("rgproxy_ru_consumed_total", "resource_group", group)
		h.waited += waited
		h.refused += m.v("rgproxy_throttled_total", "resource_group", group)
	}
	m := scrapeMetrics(t, ts.StatusAddr)
	h.allocated = m.v("rgserver_service_limit_allocated_ru_per_second")
	h.demand = m.v("rgserver_service_limit_demand_ru_per_second")
	return h
}

// since is h over the interval from earlier: the counters' differences,
// the gauges as they stand at h.
func (h bgHeld) since(earlier bgHeld) bgHeld {
	h.ru -= earlier.ru
	h.waited -= earlier.waited
	h.refused -= earlier.refused
	return h
}

func (h bgHeld) String() string {
	return fmt.Sprintf("waited %.2f s for tokens, %.0f refused; rgserver allocated %.0f of a demand of %.0f RU/s",
		h.waited, h.refused, h.allocated, h.demand)
}

// sessionCount is how many sessions runLoad opens for clients.
func sessionCount(clients []int) float64 {
	n := 0
	for _, c := range clients {
		n += c
	}
	return float64(n)
}

func bgHeldLog(held []bgHeld) string {
	parts := make([]string, len(held))
	for i, h := range held {
		parts[i] = fmt.Sprintf("second %d: %s", i+1, h)
	}
	return strings.Join(parts, "; ")
}

// TestLimitTreeAndBackgroundAcrossThreeProxies is the capacity work's
// "done when": three proxies, five groups under ALTER RESOURCE CONTROL
// SERVICE LIMIT = 400, all saturated through every proxy —
//
//	rg_ct_team  RU_PER_SEC = 150 (a parent: no sessions of its own)
//	  rg_ct_a   RU_PER_SEC = 100 PRIORITY = HIGH BURSTABLE = UNLIMITED
//	  rg_ct_b   RU_PER_SEC =  50 PRIORITY = HIGH BURSTABLE = UNLIMITED
//	rg_ct_low   RU_PER_SEC = 400 PRIORITY = LOW
//	rg_ct_bg    RU_PER_SEC =  20 BACKGROUND = (UTILIZATION_LIMIT = 60)
//
// The groups spend the limit together (±10%); the children their
// parent's 150 (±10%), though they could burst beyond it; priorities
// hold: the HIGH children get all of it while LOW gets only what is left,
// 400 − 20 − 150 = 230 (shared by rates instead, the children would get
// 104 and LOW 276); the background group its floor, 20. When the
// foreground stops, the background group is above 80% of what it may
// take (60% of 400 = 240) within 2 s, and stays within it.
func TestLimitTreeAndBackgroundAcrossThreeProxies(t *testing.T) {
	const limit, parentRate, bgFloor, bgCap = 400.0, 150.0, 20.0, 240.0
	const lowShare = limit - bgFloor - parentRate
	ts := startTokenServer(t)
	pxs := threeLimitProxies(t, ts)
	groups := []groupDef{
		{"rg_ct_team", fmt.Sprintf("RU_PER_SEC = %d", int(parentRate)), ""},
		{"rg_ct_a", "RU_PER_SEC = 100 PRIORITY = HIGH BURSTABLE = UNLIMITED PARENT = rg_ct_team", "ct_a"},
		{"rg_ct_b", "RU_PER_SEC = 50 PRIORITY = HIGH BURSTABLE = UNLIMITED PARENT = rg_ct_team", "ct_b"},
		{"rg_ct_low", "RU_PER_SEC = 400 PRIORITY = LOW", "ct_low"},
		{"rg_ct_bg", fmt.Sprintf("RU_PER_SEC = %d BACKGROUND = (UTILIZATION_LIMIT = 60)", int(bgFloor)), "ct_bg"},
	}
	adminExec(t, pxs[0].Addr, append([]string{fmt.Sprintf("ALTER RESOURCE CONTROL SERVICE LIMIT = %d", int(limit)),
		"DROP RESOURCE GROUP IF EXISTS rg_ct_a", "DROP RESOURCE GROUP IF EXISTS rg_ct_b"}, // the children before their parent
		groupStatements(t, groups)...)...)
	settingsReach(t, pxs[0], pxs[1:]...) // the bindings reach every proxy's settings cache

	const warm, measure = 6 * time.Second, 15 * time.Second
	fg := []string{"ct_a", "ct_b", "ct_low"}
	fgClients := []int{3, 3, 3} // each user's sessions on each proxy
	fgDone := make(chan *loadResult, len(fg))
	for _, u := range fg {
		go func() { fgDone <- runLoad(t, pxs, fgClients, u, "SELECT 1", warm+measure) }()
	}
	bgDone := make(chan *loadResult, 1)
	bgClients := []int{3, 3, 3}
	go func() { bgDone <- runLoad(t, pxs, bgClients, "ct_bg", "SELECT 1", warm+measure+6*time.Second) }()
	proxyRU := func(group string) float64 { return groupRUOnProxies(t, pxs, group) }
	leaves := []string{"rg_ct_a", "rg_ct_b", "rg_ct_low", "rg_ct_bg"}
	time.Sleep(warm)
	before := map[string]float64{}
	for _, g := range leaves {
		before[g] = proxyRU(g)
	}
	lowBefore := bgHeldNow(t, ts, pxs, "rg_ct_low")
	start := time.Now()
	time.Sleep(measure - time.Second)
	el := time.Since(start).Seconds()
	rate := map[string]float64{}
	total := 0.0
	for _, g := range leaves {
		rate[g] = (proxyRU(g) - before[g]) / el
		total += rate[g]
	}
	lowHeld := bgHeldNow(t, ts, pxs, "rg_ct_low").since(lowBefore)
	var ran []string
	for range fg {
		res := <-fgDone
		ran = append(ran, fmt.Sprintf("%d ran, %d refused", res.statements.Load(), res.errors.Load()))
	}
	// Every foreground session has returned: the load stopped. The
	// background group second by second from then on.
	stopped := time.Now()
	var perSecond []float64
	var held []bgHeld
	prev := bgHeldNow(t, ts, pxs, "rg_ct_bg")
	for s := 1; s <= 4; s++ {
		time.Sleep(time.Until(stopped.Add(time.Duration(s) * time.Second)))
		cur := bgHeldNow(t, ts, pxs, "rg_ct_bg")
		held = append(held, cur.since(prev))
		perSecond = append(perSecond, held[len(held)-1].ru)
		prev = cur
	}
	<-bgDone
	children := rate["rg_ct_a"] + rate["rg_ct_b"]
	t.Logf("under load over %.1f s: children %.1f + %.1f = %.1f RU/s of the parent's %.0f (%+.1f%%); LOW %.1f (want %.0f); background %.1f (floor %.0f); together %.1f of the limit %.0f (%+.1f%%); sessions: %s",
		el, rate["rg_ct_a"], rate["rg_ct_b"], children, parentRate, 100*(children-parentRate)/parentRate,
		rate["rg_ct_low"], lowShare, rate["rg_ct_bg"], bgFloor, total, limit, 100*(total-limit)/limit, strings.Join(ran, "; "))
	t.Logf("LOW over those %.1f s (%d sessions): %s", el, int(sessionCount(fgClients)), lowHeld)
	t.Logf("after the foreground stopped, the background by second: %.0f %.0f %.0f %.0f RU (may take %.0f); %s",
		perSecond[0], perSecond[1], perSecond[2], perSecond[3], bgCap, bgHeldLog(held))
	if !within(total, limit, 0.10) {
		t.Errorf("the groups spent %.1f RU/s together, not within ±10%% of the service limit %.0f", total, limit)
	}
	if !within(children, parentRate, 0.10) {
		t.Errorf("the children spent %.1f RU/s together, not within ±10%% of their parent's %.0f", children, parentRate)
	}
	if rate["rg_ct_a"] < 0.9*100 || rate["rg_ct_b"] < 0.9*50 {
		t.Errorf("a child below its RU_PER_SEC: %.1f of 100, %.1f of 50", rate["rg_ct_a"], rate["rg_ct_b"])
	}
	if !within(rate["rg_ct_low"], lowShare, 0.15) {
		t.Errorf("LOW spent %.1f RU/s (its sessions waited %.1f s for tokens), want what HIGH and the background's floor leave, %.0f ± 15%%", rate["rg_ct_low"], lowHeld.waited, lowShare)
	}
	// At its floor while the foreground wants all the rest; above it by
	// what the foreground left unused (with both cores busy beside the
	// test, LOW once ran 201 of its 230 and the background took 39.6).
	left := max(limit-bgFloor-children-rate["rg_ct_low"], 0)
	if r := rate["rg_ct_bg"]; r < 0.8*bgFloor || r > 1.5*bgFloor+left {
		t.Errorf("the background group spent %.1f RU/s under load, want its floor %.0f (+ the %.1f the foreground left)", r, bgFloor, left)
	}
	// Within 2 s the background's tokens come at above 80% of its cap.
	// Its sessions show that by spending them, as long as the tokens are
	// what holds them back: waiting for tokens for half the second or
	// more. When the machine is too busy to run them faster, what
	// rgserver allocates is what can be judged: twice in `make test`
	// beside a CPU hog the background spent 153 and 180 RU in its
	// second second; in one of them rgserver allocated 240 RU/s against
	// a demand of 179, in the other the fourth second spent 274 RU, what
	// its buckets had saved.
	if h := held[1]; h.waited >= 0.5*sessionCount(bgClients) {
		if perSecond[1] < 0.8*bgCap {
			t.Errorf("in the second second after the foreground stopped the background spent %.0f RU while its sessions waited for tokens, want above 80%% of %.0f (%s)", perSecond[1], bgCap, h)
		}
	} else if perSecond[1] < 0.8*bgCap && h.allocated < 0.8*bgCap {
		t.Errorf("in the second second after the foreground stopped rgserver allocated %.0f RU/s under the service limit (the background alone wants it), want above 80%% of %.0f (%s)", h.allocated, bgCap, h)
	}
	// Never above the cap by more than 10%, but for what the proxies'
	// buckets saved in the seconds before, when the sessions spent less
	// than the cap: a bucket keeps unspent tokens.
	saved := 0.0
	for i, v := range perSecond[1:] {
		if v > 1.1*bgCap+saved {
			t.Errorf("the background spent %.0f RU in second %d, above its UTILIZATION_LIMIT's %.0f (+10%%) and the %.0f RU it left unspent before", v, i+2, bgCap, saved)
		}
		saved = max(saved+bgCap-v, 0)
	}
}
