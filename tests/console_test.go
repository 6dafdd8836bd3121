package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConsoleInABrowser loads the status consoles of a running rgproxy and
// rgserver in headless Chromium while groups are under load, and checks
// what the rendered page shows: every group with its limit, the live RU/s
// of the loaded group, the heaviest shape's digest text (and none of its
// literals) on rgproxy, the cluster figures on rgserver. It takes the
// screenshots README shows; RGPROXY_UPDATE_SCREENSHOTS=1 writes them to
// docs/.
func TestConsoleInABrowser(t *testing.T) {
	chromium := requireTool(t, "chromium", "chromium")
	ts := startTokenServer(t)
	// rgproxy's console at its default address, as README gives it: no
	// --console-addr (browsers refuse the status port, 10080).
	px := runProxy(t, true, "--token-server", ts.Addr, "--log-level", "warn", "--max-wait", "50ms", "--proxy-id", "console-px")

	limits := map[string]string{ // group → the limit the page must show
		"default":           "UNLIMITED",
		"console_limited":   "20",
		"console_free":      "UNLIMITED",
		"console_warn":      "2",
		"console_reporting": "500",
	}
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP console_limited RU_PER_SEC = 20",
		"CREATE RESOURCE GROUP console_free RU_PER_SEC = UNLIMITED QUERY_LIMIT = (EXEC_ELAPSED = '30s', ACTION = DRYRUN)",
		"CREATE RESOURCE GROUP console_warn RU_PER_SEC = 2 MODE = WARN BUDGET = (RU = 50 PER MONTH, ON 80 PERCENT REFUSE)",
		"CREATE RESOURCE GROUP console_reporting RU_PER_SEC = 500 BURSTABLE PRIORITY = HIGH MAX_CONCURRENCY = 4 "+
			"BUDGET = (RU = 1000000 PER MONTH, ON 90 PERCENT NOTIFY)")

	// Load until the pages are read: a heavy statement in the limited
	// group (refused now and then: 8252) and in the WARN group, a light
	// one in the unlimited group. The literal must never reach a page,
	// and the light one's alias, markup that a client chose, must stay
	// text.
	const secret = "console_secret_literal"
	heavy := "SELECT /*+ RESOURCE_GROUP(%s) */ COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA <> '" + secret + "'"
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ran, refused atomic.Int64
	var loadErr atomic.Value
	db := openDB(t, px.Addr)
	db.SetMaxOpenConns(8)
	for _, l := range []struct {
		query    string
		sessions int
	}{
		{fmt.Sprintf(heavy, "console_limited"), 3},
		{fmt.Sprintf(heavy, "console_warn"), 1},
		{"SELECT /*+ RESOURCE_GROUP(console_free) */ 1 AS `<img src=x id=injected>`", 1},
	} {
		for range l.sessions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, err := db.ExecContext(ctx, l.query)
					switch {
					case err == nil:
						ran.Add(1)
					case mysqlErrNo(err) == 8252:
						refused.Add(1)
					case ctx.Err() == nil:
						loadErr.CompareAndSwap(nil, err.Error())
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	defer func() { stop(); wg.Wait() }()

	// Both consoles' JSON show the load (rgserver hears reports within
	// 5 s) before the browser looks.
	var pj proxyConsoleJSON
	var sj serverConsoleJSON
	deadline := time.Now().Add(20 * time.Second)
	for {
		getJSON(t, "http://"+px.ConsoleAddr+"/api/console", &pj)
		getJSON(t, "http://"+ts.StatusAddr+"/api/console", &sj)
		pg, sg := pj.group("console_limited"), sj.group("console_limited")
		if pg.RUPerSecLast10s > 0 && pg.Throttled > 0 && sg.RUPerSecLast10s > 0 && sg.ThrottledTotal > 0 && len(pj.Shapes) > 0 &&
			sj.budget("console_warn").Action != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no load seen within 20 s (%d ran, %d refused, error %v): proxy %+v, rgserver %+v",
				ran.Load(), refused.Load(), loadErr.Load(), pg, sg)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if e := loadErr.Load(); e != nil {
		t.Fatalf("load: %v", e)
	}

	shots := t.TempDir()
	if os.Getenv("RGPROXY_UPDATE_SCREENSHOTS") != "" {
		// README's pictures: the load fills the proxy's 10 s window first.
		shots = filepath.Join("..", "docs")
		time.Sleep(10 * time.Second)
	}
	// The default status port, 10080, is on the browsers' blocked list
	// (Chromium refuses it before connecting): the reason the console has
	// an address of its own.
	if log := chromiumLog(t, chromium, "http://127.0.0.1:10080/"); !strings.Contains(log, "ERR_UNSAFE_PORT") {
		t.Errorf("chromium does not refuse port 10080; its log:\n%s", log)
	}
	proxyDOM := browse(t, chromium, "http://"+px.ConsoleAddr+"/", filepath.Join(shots, "console-rgproxy.png"))
	serverDOM := browse(t, chromium, "http://"+ts.StatusAddr+"/", filepath.Join(shots, "console-rgserver.png"))
	// The history charts of the limited group, chosen in the address.
	historyDOM := browseSized(t, chromium, "http://"+ts.StatusAddr+"/#history=console_limited",
		filepath.Join(shots, "console-rgserver-history.png"), "1280,1060")
	stop()
	wg.Wait()
	t.Logf("load: %d statements ran, %d refused with 8252", ran.Load(), refused.Load())

	// rgproxy's page: every group and its limit, the live rate of the
	// loaded group, the heaviest shape's text and none of its literals.
	rows := domRows(t, proxyDOM, "groups")
	for g, limit := range limits {
		r, ok := rows[g]
		if !ok || len(r) != 10 || r[1] != limit {
			t.Errorf("rgproxy's page: group %s row %q, want its limit %q", g, r, limit)
		}
	}
	if v := domNumber(t, rows["console_limited"][2]); !(v > 0) {
		t.Errorf("rgproxy's page: console_limited's RU/s %q, want > 0", rows["console_limited"][2])
	}
	if v := domNumber(t, rows["console_limited"][5]); !(v > 0) {
		t.Errorf("rgproxy's page: console_limited's throttled %q, want > 0", rows["console_limited"][5])
	}
	if r := rows["console_warn"]; r[8] != "WARN" || !(domNumber(t, r[6]) > 0) {
		t.Errorf("rgproxy's page: console_warn %q, want MODE WARN and statements it would have throttled", r)
	}
	if r := rows["console_free"]; !strings.Contains(r[9], "QUERY_LIMIT=(EXEC_ELAPSED='30s', ACTION=DRYRUN)") {
		t.Errorf("rgproxy's page: console_free's settings %q", r[9])
	}
	if r := rows["console_reporting"]; r[9] != "PRIORITY=HIGH BURSTABLE=MODERATED MAX_CONCURRENCY=4" {
		t.Errorf("rgproxy's page: console_reporting's settings %q", r[9])
	}
	var heavyText string
	for _, s := range pj.Shapes {
		if s.Group == "console_limited" && strings.Contains(s.DigestText, "COLUMNS") {
			heavyText = s.DigestText
		}
	}
	shapes := domSection(t, proxyDOM, "shapes")
	if heavyText == "" || !strings.Contains(shapes, strings.Join(strings.Fields(domText(heavyText)), " ")) {
		t.Errorf("rgproxy's page: the heavy shape %q is not among the shapes shown:\n%s", heavyText, shapes)
	}
	if strings.Contains(proxyDOM, secret) {
		t.Errorf("rgproxy's page shows a statement's literal %q", secret)
	}
	if strings.Contains(proxyDOM, `id="injected"`) || !strings.Contains(shapes, "&lt;img src=x id=injected&gt;") {
		t.Errorf("rgproxy's page: a statement's markup is not shown as text:\n%s", shapes)
	}

	// rgserver's page: every group and its limit, cluster-wide figures:
	// the loaded group's RU/s across proxies, its proxy, its refusals.
	rows = domRows(t, serverDOM, "groups")
	for g, limit := range limits {
		r, ok := rows[g]
		if !ok || len(r) != 10 || r[1] != limit {
			t.Errorf("rgserver's page: group %s row %q, want its limit %q", g, r, limit)
		}
	}
	if r := rows["console_limited"]; !(domNumber(t, r[2]) > 0) || domNumber(t, r[7]) != 1 || !(domNumber(t, r[5]) > 0) ||
		!strings.Contains(r[6], " of 20") {
		t.Errorf("rgserver's page: console_limited %q, want RU/s > 0, 1 proxy, refusals, a bucket of 20", r)
	}
	// The budgets: the WARN group's, spent past its trigger and only
	// reported; the idle group's, untouched, first the most spent.
	budgets := domRows(t, serverDOM, "budgets")
	if r := budgets["console_warn MONTH"]; len(r) != 8 || !(domNumber(t, r[2]) >= 40) || !strings.Contains(r[2], " of 50") ||
		r[7] != "ON 80 PERCENT REFUSE (MODE WARN: reported only)" {
		t.Errorf("rgserver's page: console_warn's budget %q, want more than 40 of 50 RU spent and its REFUSE reported only", r)
	}
	if r := budgets["console_reporting MONTH"]; len(r) != 8 || r[2] != "0 of 1,000,000" || r[5] != "not this window" || r[7] != "none" {
		t.Errorf("rgserver's page: console_reporting's budget %q, want nothing spent, no exhaustion, no action", r)
	}
	if note := domSection(t, serverDOM, "budgets-note"); !strings.Contains(note, "2 budgets in their current windows") {
		t.Errorf("rgserver's page: the budgets' note %q", note)
	}
	// Who is held back now: the limited group, refused with 8252.
	if r, ok := domRows(t, serverDOM, "held")["console_limited"]; !ok || len(r) != 6 || !(domNumber(t, r[2]) > 0) || r[5] != "20" {
		t.Errorf("rgserver's page: console_limited among the groups held back now: %q, want throttled/s > 0 and its limit 20", r)
	}
	// The charts: the limited group's last hour and day, from the
	// history, every bucket drawn, its RU against its limit.
	var hour struct {
		Group   string `json:"group"`
		BucketS int    `json:"bucket_s"`
		Points  []struct {
			RUPerSec  float64 `json:"ru_per_sec"`
			Throttled float64 `json:"throttled"`
		} `json:"points"`
	}
	getJSON(t, "http://"+ts.StatusAddr+"/api/history?span=hour&group=console_limited", &hour)
	var hourRU, hourThrottled float64
	for _, p := range hour.Points {
		hourRU += p.RUPerSec * float64(hour.BucketS)
		hourThrottled += p.Throttled
	}
	if hour.Group != "console_limited" || len(hour.Points) != 120 || hour.BucketS != 30 || !(hourRU > 0) || !(hourThrottled > 0) {
		t.Errorf("api/history for the last hour: group %q, %d points of %d s, %.1f RU, %.0f throttled; want console_limited, 120 of 30 s, RU and refusals",
			hour.Group, len(hour.Points), hour.BucketS, hourRU, hourThrottled)
	}
	for _, bad := range []string{"?span=hour&group=", "?span=week&group=console_limited", "?span=hour&group=" + strings.Repeat("x", 100)} {
		if code, body := httpGet(t, "http://"+ts.StatusAddr+"/api/history"+bad); code != 400 {
			t.Errorf("GET api/history%s = %d %s, want 400", bad, code, body)
		}
	}
	for span, points := range map[string]string{"hour": "120", "day": "288"} {
		chart := regexp.MustCompile(`<svg[^>]*id="chart-` + span + `"[^>]*>`).FindString(historyDOM)
		if !strings.Contains(chart, `data-group="console_limited"`) || !strings.Contains(chart, `data-points="`+points+`"`) {
			t.Errorf("rgserver's page: the %s chart %q, want console_limited's %s buckets", span, chart, points)
		}
		note := domSection(t, historyDOM, "history-"+span+"-note")
		if !regexp.MustCompile(`>console_limited: peak [0-9.,]+ RU/s, average [0-9.,]+ RU/s; [0-9]+ of `+points+` buckets above RU_PER_SEC 20; [1-9][0-9,]* throttled`).MatchString(note) ||
			strings.Contains(note, ">console_limited: peak 0 ") {
			t.Errorf("rgserver's page: the %s chart says %q", span, note)
		}
	}
	for _, want := range []string{"role: leader", "etcd: healthy", "proxies connected (token streams): 1"} {
		if !strings.Contains(domSection(t, serverDOM, "facts"), want) {
			t.Errorf("rgserver's page lacks %q:\n%s", want, domSection(t, serverDOM, "facts"))
		}
	}
}

// browse loads url in headless Chromium, lets its script run, and returns
// the rendered DOM; it also takes a 1280×900 screenshot into shot.
func browse(t *testing.T, chromium, url, shot string) string {
	t.Helper()
	return browseSized(t, chromium, url, shot, "1280,900")
}

// browseSized is browse with a screenshot of size ("width,height").
func browseSized(t *testing.T, chromium, url, shot, size string) string {
	t.Helper()
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--hide-scrollbars", "--force-device-scale-factor=1", "--user-data-dir=" + t.TempDir(),
			"--virtual-time-budget=4000"}
		cmd := exec.CommandContext(ctx, chromium, append(append(base, args...), url)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return out
	}
	dom := string(run("--dump-dom"))
	run("--screenshot="+shot, "--window-size="+size)
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 10_000 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot %s: %d bytes, %v", shot, len(png), err)
	}
	return dom
}

// chromiumLog loads url in headless Chromium and returns what it logged.
func chromiumLog(t *testing.T, chromium, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", url)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run() // a page that fails to load is what this looks for
	return stderr.String()
}

var (
	rowRE  = regexp.MustCompile(`(?s)<tr data-group="([^"]*)"[^>]*>(.*?)</tr>`)
	cellRE = regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`)
	tagRE  = regexp.MustCompile(`<[^>]*>`)
)

// domSection is the text of the element with id in dom (up to the next
// closing tag of its kind), runs of white space as one space.
func domSection(t *testing.T, dom, id string) string {
	t.Helper()
	i := strings.Index(dom, `id="`+id+`"`)
	if i < 0 {
		t.Fatalf("no element %q in the page:\n%s", id, dom)
	}
	start := strings.LastIndexByte(dom[:i], '<')
	tag := strings.Fields(dom[start+1:])[0]
	end := strings.Index(dom[i:], "</"+tag+">")
	if end < 0 {
		t.Fatalf("element %q does not end", id)
	}
	return strings.Join(strings.Fields(tagRE.ReplaceAllString(dom[i:i+end], " ")), " ")
}

// domRows are the rows of table id by group: each cell's text.
func domRows(t *testing.T, dom, id string) map[string][]string {
	t.Helper()
	i := strings.Index(dom, `<table id="`+id+`"`)
	j := strings.Index(dom[max(i, 0):], "</table>")
	if i < 0 || j < 0 {
		t.Fatalf("no table %q in the page:\n%s", id, dom)
	}
	rows := map[string][]string{}
	for _, m := range rowRE.FindAllStringSubmatch(dom[i:i+j], -1) {
		var cells []string
		for _, c := range cellRE.FindAllStringSubmatch(m[2], -1) {
			cells = append(cells, strings.TrimSpace(tagRE.ReplaceAllString(c[1], "")))
		}
		rows[m[1]] = cells
	}
	if len(rows) == 0 {
		t.Fatalf("table %q has no rows: did the page's script run?\n%s", id, dom)
	}
	return rows
}

// domText is text as the DOM serializes it in an element.
func domText(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\u00a0", "&nbsp;").Replace(s)
}

// domNumber reads the number a cell starts with, as the page formats
// it ("1,234.5"); -1 if none.
func domNumber(t *testing.T, s string) float64 {
	t.Helper()
	f := strings.Fields(strings.ReplaceAll(s, ",", ""))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// The parts of the consoles' JSON the test reads.
type proxyGroupJSON struct {
	Name            string  `json:"name"`
	RUPerSecLast10s float64 `json:"ru_per_sec_last_10s"`
	Throttled       uint64  `json:"throttled"`
}

type proxyConsoleJSON struct {
	CacheRevision int64            `json:"cache_revision"`
	Groups        []proxyGroupJSON `json:"groups"`
	Shapes        []struct {
		Group      string `json:"resource_group"`
		DigestText string `json:"digest_text"`
	} `json:"shapes"`
}

func (c *proxyConsoleJSON) group(name string) proxyGroupJSON {
	for _, x := range c.Groups {
		if x.Name == name {
			return x
		}
	}
	return proxyGroupJSON{}
}

type serverGroupJSON struct {
	Name            string  `json:"name"`
	RUPerSecLast10s float64 `json:"ru_per_sec_reported"`
	ThrottledTotal  float64 `json:"throttled_total"`
	Proxies         int     `json:"proxies"`
}

type serverConsoleJSON struct {
	Groups  []serverGroupJSON `json:"groups"`
	Budgets []struct {
		Group  string `json:"resource_group"`
		Action string `json:"action"`
	} `json:"budgets"`
}

// budget is group's first budget in the answer (zero if none).
func (c *serverConsoleJSON) budget(group string) (b struct {
	Group  string `json:"resource_group"`
	Action string `json:"action"`
}) {
	for _, x := range c.Budgets {
		if x.Group == group {
			return x
		}
	}
	return b
}

func (c *serverConsoleJSON) group(name string) serverGroupJSON {
	for _, x := range c.Groups {
		if x.Name == name {
			return x
		}
	}
	return serverGroupJSON{}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	code, body := httpGet(t, url)
	if code != 200 {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
}

// TestConsoleCapacity loads rgproxy's console against a real rgserver
// with a service limit, a parent with a child (named so that it sorts
// before its parent) and a grandchild, a background group and groups
// whose RU_PER_SEC exceed the backend's capacity, measured live
// (CPU-true, the backend on this host) while a CPU-bound load runs. The
// JSON and the page in headless Chromium show the over-capacity banner
// with both figures, the service limit with its source and the leader's
// last sharing of it, and the tree: each child right under its parent,
// indented, PARENT and BACKGROUND among the settings. With rgserver gone
// the service limit is unknown, and said so, without holding the page.
func TestConsoleCapacity(t *testing.T) {
	chromium := requireTool(t, "chromium", "chromium")
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--cpu-source", "proc")
	adminExec(t, px.Addr,
		"ALTER RESOURCE CONTROL SERVICE LIMIT = 1000000",
		"CREATE RESOURCE GROUP cc_load RU_PER_SEC = UNLIMITED",
		"CREATE RESOURCE GROUP cc_team RU_PER_SEC = 3000",
		"CREATE RESOURCE GROUP cc_a_reports RU_PER_SEC = 1000 PARENT = cc_team",
		"CREATE RESOURCE GROUP cc_a_reports_daily RU_PER_SEC = 100 PARENT = cc_a_reports",
		"CREATE RESOURCE GROUP cc_team_api RU_PER_SEC = 2000 PARENT = cc_team",
		"CREATE RESOURCE GROUP cc_nightly RU_PER_SEC = 100 BACKGROUND = (UTILIZATION_LIMIT = 30)",
		// More than any backend on this host serves: over capacity.
		"CREATE RESOURCE GROUP cc_huge RU_PER_SEC = 100000000")

	// A CPU-bound load (the service limit is far above it) until the
	// proxy has measured a capacity and found the groups over it; its
	// last sharing is read while it runs.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var loadErr atomic.Value
	db := openDB(t, px.Addr)
	for range 3 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := db.ExecContext(ctx, "SELECT /*+ RESOURCE_GROUP(cc_load) */ BENCHMARK(300000, MD5('console'))"); err != nil && ctx.Err() == nil {
					loadErr.CompareAndSwap(nil, err.Error())
					return
				}
			}
		})
	}
	defer func() { stop(); wg.Wait() }()
	var c capacityConsoleJSON
	deadline := time.Now().Add(60 * time.Second)
	for {
		getJSON(t, "http://"+px.ConsoleAddr+"/api/console", &c)
		sl := c.ServiceLimit
		if c.Capacity != nil && c.Capacity.Over && sl != nil && sl.Known && sl.GroupsWithDemand > 0 && sl.DemandRUPerSec > 0 && sl.AllocatedRUPerSec > 0 {
			break
		}
		if e := loadErr.Load(); e != nil {
			t.Fatalf("load: %v", e)
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 60 s of load: capacity %+v, service limit %+v", c.Capacity, c.ServiceLimit)
		}
		time.Sleep(time.Second)
	}
	stop()
	wg.Wait()
	t.Logf("capacity %+v, service limit %+v", *c.Capacity, *c.ServiceLimit)
	if cp := c.Capacity; !(cp.CapacityRUPerSec > 0) || cp.LimitsRUPerSec != 100_000_000+3000+1000+100+2000+100 {
		t.Errorf("capacity %+v: want a capacity and the groups' RU_PER_SEC, 100,006,200", cp)
	}
	if sl := c.ServiceLimit; sl.RUPerSec == nil || *sl.RUPerSec != 1000000 || sl.Source != "SQL" || sl.RUPerSecSum != 100_006_200 {
		t.Errorf("service limit %+v: want 1,000,000 from SQL, the ENFORCE groups' RU_PER_SEC 100,006,200", sl)
	}
	// The tree, in the JSON: each child after its parent, one deeper.
	var order []string
	for _, g := range c.Groups {
		if strings.HasPrefix(g.Name, "cc_") {
			order = append(order, fmt.Sprintf("%s:%d:%s:%d", g.Name, g.Depth, g.Parent, g.Background))
		}
	}
	// cc_load is in use: first; the rest by name, children under parents.
	want := "cc_load:0::0 cc_huge:0::0 cc_nightly:0::30 cc_team:0::0 cc_a_reports:1:cc_team:0 cc_a_reports_daily:2:cc_a_reports:0 cc_team_api:1:cc_team:0"
	if got := strings.Join(order, " "); got != want {
		t.Errorf("groups (name:depth:parent:background):\n got %s\nwant %s", got, want)
	}

	// The page (RGPROXY_UPDATE_SCREENSHOTS=1: its picture in docs/).
	shots := t.TempDir()
	if os.Getenv("RGPROXY_UPDATE_SCREENSHOTS") != "" {
		shots = filepath.Join("..", "docs")
	}
	dom := browse(t, chromium, "http://"+px.ConsoleAddr+"/", filepath.Join(shots, "console-rgproxy-capacity.png"))
	banner := regexp.MustCompile(`<div id="capacity-warning"[^>]*>`).FindString(dom)
	if strings.Contains(banner, "hidden") {
		t.Errorf("the capacity warning is hidden: %s", banner)
	}
	if w := domSection(t, dom, "capacity-warning"); !regexp.MustCompile(`add up to 100,006,200 RU/s, above the backend's capacity of [1-9][0-9,]* RU/s \(CALIBRATE RESOURCE\)`).MatchString(w) {
		t.Errorf("the capacity warning says %q", w)
	}
	limits := domSection(t, dom, "limits")
	for _, re := range []string{`backend capacity: [1-9][0-9,]* RU/s`, `groups' RU_PER_SEC: 100,006,200 RU/s`,
		`service limit: 1,000,000 RU/s \(ALTER RESOURCE CONTROL\)`, `ENFORCE groups' RU_PER_SEC: 100,006,200 RU/s`,
		`last sharing of the limit: ([0-9]+ groups? wants? [0-9.,]+ RU/s, given [0-9.,]+ RU/s|no group with demand)`} {
		if !regexp.MustCompile(re).MatchString(limits) {
			t.Errorf("the page's capacity and service limit %q lack %s", limits, re)
		}
	}
	rows := domRows(t, dom, "groups")
	var pageOrder []string
	for _, m := range regexp.MustCompile(`<tr data-group="(cc_[a-z_]+)"( class="[^"]*")?( data-parent="[^"]*")?`).FindAllStringSubmatch(dom, -1) {
		pageOrder = append(pageOrder, m[1]+m[2]+m[3])
	}
	wantPage := []string{`cc_load`, `cc_huge class="idle"`, `cc_nightly class="idle"`, `cc_team class="idle"`,
		`cc_a_reports class="idle child depth1" data-parent="cc_team"`, `cc_a_reports_daily class="idle child depth2" data-parent="cc_a_reports"`,
		`cc_team_api class="idle child depth1" data-parent="cc_team"`}
	if !slices.Equal(pageOrder, wantPage) {
		t.Errorf("the page's groups:\n got %q\nwant %q", pageOrder, wantPage)
	}
	for g, settings := range map[string]string{"cc_a_reports": "PARENT=cc_team", "cc_a_reports_daily": "PARENT=cc_a_reports",
		"cc_nightly": "BACKGROUND=(UTILIZATION_LIMIT=30)", "cc_team": "–"} {
		if r := rows[g]; len(r) != 10 || r[9] != settings {
			t.Errorf("the page's row of %s: %q, want the settings %q", g, r, settings)
		}
	}

	// rgserver gone: the limit is unknown, and the page answers within
	// the wait.
	if err := ts.stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	for {
		start := time.Now()
		c = capacityConsoleJSON{}
		getJSON(t, "http://"+px.ConsoleAddr+"/api/console", &c)
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("/api/console took %v with rgserver gone", took)
		}
		if sl := c.ServiceLimit; sl != nil && !sl.Known && sl.Error != "" && sl.RUPerSec == nil {
			t.Logf("rgserver gone: %+v", *sl)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rgserver gone 15 s: service limit %+v", c.ServiceLimit)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// capacityConsoleJSON is what TestConsoleCapacity reads of rgproxy's
// /api/console.
type capacityConsoleJSON struct {
	Capacity *struct {
		CapacityRUPerSec float64 `json:"capacity_ru_per_sec"`
		LimitsRUPerSec   float64 `json:"limits_ru_per_sec"`
		Over             bool    `json:"over"`
	} `json:"capacity"`
	ServiceLimit *struct {
		Known             bool    `json:"known"`
		Error             string  `json:"error"`
		RUPerSec          *uint64 `json:"ru_per_sec"`
		Source            string  `json:"source"`
		RUPerSecSum       float64 `json:"ru_per_sec_sum"`
		GroupsWithDemand  int     `json:"groups_with_demand"`
		DemandRUPerSec    float64 `json:"demand_ru_per_sec"`
		AllocatedRUPerSec float64 `json:"allocated_ru_per_sec"`
	} `json:"service_limit"`
	Groups []struct {
		Name       string `json:"name"`
		Parent     string `json:"parent"`
		Depth      int    `json:"depth"`
		Background int    `json:"background_utilization_limit"`
	} `json:"groups"`
}
