package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestParentSharedByChildrenAcrossThreeProxies is groups inside groups
// end to end: two children of a 200 RU/s parent, saturated through three
// proxies, spend 200 RU/s together (±10%), each at least its own
// RU_PER_SEC, while a group outside the tree keeps its own rate; SHOW
// CREATE and information_schema show the tree through another proxy, and
// dropping the parent is refused while it has children.
func TestParentSharedByChildrenAcrossThreeProxies(t *testing.T) {
	const parentRate = 200.0
	ts := startTokenServer(t)
	pxs := threeLimitProxies(t, ts)
	groups := []groupDef{
		{"rg_pt_team", fmt.Sprintf("RU_PER_SEC = %d", int(parentRate)), ""},
		{"rg_pt_a", "RU_PER_SEC = 80 BURSTABLE = UNLIMITED PARENT = rg_pt_team", "pt_a"},
		{"rg_pt_b", "RU_PER_SEC = 50 BURSTABLE = UNLIMITED PARENT = rg_pt_team", "pt_b"},
		{"rg_pt_solo", "RU_PER_SEC = 100", "pt_solo"},
	}
	adminExec(t, pxs[0].Addr, append([]string{"DROP RESOURCE GROUP IF EXISTS rg_pt_a", "DROP RESOURCE GROUP IF EXISTS rg_pt_b"}, // the children before their parent
		groupStatements(t, groups)...)...)
	settingsReach(t, pxs[0], pxs[1:]...) // the bindings reach every proxy's settings cache

	db := openDB(t, pxs[1].Addr)
	var name, create string
	if err := db.QueryRow("SHOW CREATE RESOURCE GROUP rg_pt_a").Scan(&name, &create); err != nil ||
		create != "CREATE RESOURCE GROUP `rg_pt_a` RU_PER_SEC=80 PRIORITY=MEDIUM BURSTABLE=UNLIMITED PARENT=`rg_pt_team`" {
		t.Errorf("SHOW CREATE through another proxy: %q, %v", create, err)
	}
	var parent string
	if err := db.QueryRow("SELECT PARENT FROM information_schema.resource_groups WHERE NAME = 'rg_pt_b'").Scan(&parent); err != nil || parent != "rg_pt_team" {
		t.Errorf("information_schema PARENT of rg_pt_b: %q, %v", parent, err)
	}
	if _, err := db.Exec("DROP RESOURCE GROUP rg_pt_team"); mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "is the PARENT of") {
		t.Errorf("DROP of a parent with children: %v, want 1105 naming a child", err)
	}
	if _, err := db.Exec("ALTER RESOURCE GROUP rg_pt_b RU_PER_SEC = 300"); mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "above RU_PER_SEC = 200 of its PARENT") {
		t.Errorf("a child above its parent: %v, want 1105", err)
	}

	// Saturating load: 3 sessions per group on each proxy, closed loop.
	const warm, measure = 6 * time.Second, 15 * time.Second
	users := []struct{ user, group string }{{"pt_a", "rg_pt_a"}, {"pt_b", "rg_pt_b"}, {"pt_solo", "rg_pt_solo"}}
	done := make(chan *loadResult, len(users))
	for _, u := range users {
		go func() { done <- runLoad(t, pxs, []int{3, 3, 3}, u.user, "SELECT 1", warm+measure+time.Second) }()
	}
	proxyRU := func(group string) float64 { return groupRUOnProxies(t, pxs, group) }
	time.Sleep(warm)
	before := map[string]float64{}
	for _, u := range users {
		before[u.group] = proxyRU(u.group)
	}
	start := time.Now()
	time.Sleep(measure)
	el := time.Since(start).Seconds()
	rate := map[string]float64{}
	for _, u := range users {
		rate[u.group] = (proxyRU(u.group) - before[u.group]) / el
	}
	var ran []string
	for range users {
		res := <-done
		ran = append(ran, fmt.Sprintf("%d ran, %d refused", res.statements.Load(), res.errors.Load()))
	}
	children := rate["rg_pt_a"] + rate["rg_pt_b"]
	t.Logf("over %.1f s: children %.1f + %.1f = %.1f RU/s of the parent's %.0f (%+.1f%%); outside the tree %.1f; sessions: %s",
		el, rate["rg_pt_a"], rate["rg_pt_b"], children, parentRate, 100*(children-parentRate)/parentRate, rate["rg_pt_solo"], strings.Join(ran, "; "))
	if !within(children, parentRate, 0.10) {
		t.Errorf("the children spent %.1f RU/s together, not within ±10%% of their parent's %.0f", children, parentRate)
	}
	for _, c := range []struct {
		name string
		fill float64
	}{{"rg_pt_a", 80}, {"rg_pt_b", 50}} {
		if rate[c.name] < 0.9*c.fill {
			t.Errorf("child %s spent %.1f RU/s, below its RU_PER_SEC %.0f", c.name, rate[c.name], c.fill)
		}
	}
	if !within(rate["rg_pt_solo"], 100, 0.15) {
		t.Errorf("the group outside the tree spent %.1f RU/s, want its RU_PER_SEC 100 ± 15%%", rate["rg_pt_solo"])
	}
}
