package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The dashboards' tests: TestDashboardsModel checks the JSON model without
// running anything; TestDashboardsAgainstPrometheus runs every panel query
// against a real Prometheus scraping real rgserver and rgproxy under load.

// dashFiles are the dashboards under test, relative to tests/.
func dashFiles() []string {
	return []string{"../dashboards/rgproxy-resource-control.json", "../dashboards/rgserver.json"}
}

// dashRows are the rows each dashboard must have, in order.
func dashRows(file string) []string {
	switch filepath.Base(file) {
	case "rgproxy-resource-control.json":
		return []string{"Health", "RU", "Capacity", "Details", "Throttling", "Token client", "Runaway"}
	case "rgserver.json":
		return []string{"Health", "Server", "Capacity", "Reported consumption", "History and budgets"}
	}
	return nil
}

type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	Datasource *dashDatasource `json:"datasource"`
}

type dashTarget struct {
	RefID      string          `json:"refId"`
	Expr       string          `json:"expr"`
	Datasource *dashDatasource `json:"datasource"`
}

type dashPanel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	Datasource  *dashDatasource `json:"datasource"`
	GridPos     *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []dashTarget `json:"targets"`
	// Panels of a collapsed row.
	Panels []dashPanel `json:"panels"`
}

type dashModel struct {
	UID           string          `json:"uid"`
	Title         string          `json:"title"`
	SchemaVersion int             `json:"schemaVersion"`
	Inputs        json.RawMessage `json:"__inputs"`
	Templating    struct {
		List []dashVariable `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

// dashRead parses one dashboard file.
func dashRead(t testing.TB, file string) dashModel {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m dashModel
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return m
}

// dashQueryPanels returns the panels that carry queries (rows flattened),
// with the title of the row each sits under.
func dashQueryPanels(m dashModel) (panels []dashPanel, rows []string) {
	for _, p := range m.Panels {
		if p.Type == "row" {
			rows = append(rows, p.Title)
			panels = append(panels, p.Panels...)
			continue
		}
		panels = append(panels, p)
	}
	return panels, rows
}

// dashMetricRe finds our metric names in a PromQL expression.
var dashMetricRe = regexp.MustCompile(`\b(?:rgproxy|rgserver)_[a-z0-9_]+\b`)

// dashMetrics returns the distinct metric names an expression refers to.
func dashMetrics(expr string) []string {
	var out []string
	for _, n := range dashMetricRe.FindAllString(expr, -1) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// dashIsCounter: counters and the cumulative series of histograms.
func dashIsCounter(name string) bool {
	for _, s := range []string{"_total", "_bucket", "_sum", "_count"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// dashCheckExpr returns what is wrong with one panel query: a counter
// read other than through rate(...[$__rate_interval]), a gauge under
// rate(), a variable we do not substitute, or no metric of ours at all.
func dashCheckExpr(expr string) []string {
	var bad []string
	names := dashMetrics(expr)
	if len(names) == 0 {
		bad = append(bad, "refers to no rgproxy_ or rgserver_ metric")
	}
	for _, n := range names {
		all := len(regexp.MustCompile(`\b`+n+`\b`).FindAllStringIndex(expr, -1))
		rated := len(regexp.MustCompile(`\brate\(\s*`+n+`(\{[^}]*\})?\[\$__rate_interval\]\)`).FindAllStringIndex(expr, -1))
		anyRate := len(regexp.MustCompile(`\b(?:i?rate|increase)\(\s*`+n+`\b`).FindAllStringIndex(expr, -1))
		switch {
		case dashIsCounter(n) && rated != all:
			bad = append(bad, fmt.Sprintf("counter %s must be read as rate(%s[$__rate_interval]) (%d of %d uses are)", n, n, rated, all))
		case !dashIsCounter(n) && anyRate > 0:
			bad = append(bad, fmt.Sprintf("gauge %s under rate()", n))
		}
	}
	rest := strings.NewReplacer("$__rate_interval", "", "$instance", "", "$resource_group", "").Replace(expr)
	if strings.Contains(rest, "$") {
		bad = append(bad, "uses a variable other than $instance, $resource_group, $__rate_interval")
	}
	return bad
}

// dashCheckModel returns every structural problem of a dashboard.
func dashCheckModel(m dashModel, wantRows []string) []string {
	var bad []string
	if m.SchemaVersion < 39 {
		bad = append(bad, fmt.Sprintf("schemaVersion %d < 39", m.SchemaVersion))
	}
	if len(m.Inputs) > 0 {
		bad = append(bad, "has __inputs: use the datasource variable instead")
	}
	if m.UID == "" || m.Title == "" {
		bad = append(bad, "no uid or title")
	}
	vars := map[string]dashVariable{}
	for _, v := range m.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		bad = append(bad, "no datasource variable of type datasource querying prometheus")
	}
	for _, name := range []string{"instance", "resource_group"} {
		v, ok := vars[name]
		if !ok || v.Type != "query" || !v.Multi || !v.IncludeAll {
			bad = append(bad, fmt.Sprintf("no multi-value query variable $%s with All", name))
			continue
		}
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			bad = append(bad, fmt.Sprintf("variable $%s does not use ${datasource}", name))
		}
		if !strings.HasPrefix(v.Definition, "label_values(") || !strings.HasSuffix(v.Definition, ", "+name+")") {
			bad = append(bad, fmt.Sprintf("variable $%s is not label_values(..., %s): %q", name, name, v.Definition))
		}
	}
	panels, rows := dashQueryPanels(m)
	if !slices.Equal(rows, wantRows) {
		bad = append(bad, fmt.Sprintf("rows %q, want %q", rows, wantRows))
	}
	if len(m.Panels) > 0 && m.Panels[0].Type != "row" {
		bad = append(bad, "the first panel is not a row")
	}
	ids := map[int]bool{}
	for _, p := range m.Panels {
		for _, q := range append([]dashPanel{p}, p.Panels...) {
			if ids[q.ID] {
				bad = append(bad, fmt.Sprintf("panel id %d used twice", q.ID))
			}
			ids[q.ID] = true
		}
	}
	for _, p := range panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.Type != "timeseries" && p.Type != "stat" && p.Type != "table" {
			bad = append(bad, fmt.Sprintf("%s: type %q (only timeseries, stat and table)", where, p.Type))
		}
		if p.Title == "" || p.Description == "" {
			bad = append(bad, where+": no title or description")
		}
		if p.FieldConfig.Defaults.Unit == "" {
			bad = append(bad, where+": no unit")
		}
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			bad = append(bad, where+": no gridPos")
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			bad = append(bad, where+": datasource is not ${datasource}")
		}
		if len(p.Targets) == 0 {
			bad = append(bad, where+": no query")
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" || tg.RefID == "" {
				bad = append(bad, fmt.Sprintf("%s target %s: no refId or datasource is not ${datasource}", where, tg.RefID))
			}
			for _, b := range dashCheckExpr(tg.Expr) {
				bad = append(bad, fmt.Sprintf("%s target %s: %s", where, tg.RefID, b))
			}
		}
	}
	return bad
}

func TestDashboardsModel(t *testing.T) {
	for _, f := range dashFiles() {
		t.Run(filepath.Base(f), func(t *testing.T) {
			for _, b := range dashCheckModel(dashRead(t, f), dashRows(f)) {
				t.Error(b)
			}
		})
	}
}

// TestDashboardsPrometheusConfig: the walkthrough's Prometheus
// configuration is valid and scrapes the status ports `make run` uses.
func TestDashboardsPrometheusConfig(t *testing.T) {
	const f = "../dashboards/prometheus.yml"
	bin := requireTool(t, "promtool", "prometheus")
	if out, err := exec.Command(bin, "check", "config", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", f, err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"'127.0.0.1:10080'", "'127.0.0.1:3380'"} {
		if !strings.Contains(string(b), target) {
			t.Errorf("%s does not scrape %s", f, target)
		}
	}
}

// TestDashboardsModelCheckCatches: the checker rejects each kind of
// mistake it is there for, so TestDashboardsModel can fail.
func TestDashboardsModelCheckCatches(t *testing.T) {
	const f = "../dashboards/rgproxy-resource-control.json"
	for _, tc := range []struct {
		name   string
		mutate func(m *dashModel)
		want   string
	}{
		{"old schema", func(m *dashModel) { m.SchemaVersion = 27 }, "schemaVersion"},
		{"inputs", func(m *dashModel) { m.Inputs = json.RawMessage(`[{"name":"DS"}]`) }, "__inputs"},
		{"graph panel", func(m *dashModel) { m.Panels[1].Type = "graph" }, "only timeseries, stat and table"},
		{"no unit", func(m *dashModel) { m.Panels[1].FieldConfig.Defaults.Unit = "" }, "no unit"},
		{"no description", func(m *dashModel) { m.Panels[1].Description = "" }, "no title or description"},
		{"raw counter", func(m *dashModel) {
			m.Panels[1].Targets[0].Expr = `sum(rgproxy_ru_consumed_total{instance=~"$instance"})`
		}, "counter rgproxy_ru_consumed_total"},
		{"fixed window", func(m *dashModel) {
			m.Panels[1].Targets[0].Expr = `sum(rate(rgproxy_ru_consumed_total[5m]))`
		}, "counter rgproxy_ru_consumed_total"},
		{"rated gauge", func(m *dashModel) { m.Panels[1].Targets[0].Expr = `rate(rgproxy_degraded[$__rate_interval])` }, "gauge"},
		{"unknown variable", func(m *dashModel) {
			m.Panels[1].Targets[0].Expr = `rgproxy_degraded{job="$job"}`
		}, "variable other than"},
		{"single-value variable", func(m *dashModel) {
			for i := range m.Templating.List {
				m.Templating.List[i].Multi = false
			}
		}, "multi-value"},
		{"missing row", func(m *dashModel) { m.Panels = m.Panels[1:] }, "rows"},
		{"duplicate id", func(m *dashModel) { m.Panels[2].ID = m.Panels[1].ID }, "used twice"},
		{"fixed datasource", func(m *dashModel) { m.Panels[1].Datasource = &dashDatasource{Type: "prometheus", UID: "abc"} }, "${datasource}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := dashRead(t, f)
			tc.mutate(&m)
			bad := dashCheckModel(m, dashRows(f))
			if !slices.ContainsFunc(bad, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("no problem mentioning %q; got %q", tc.want, bad)
			}
		})
	}
}

// dashProm is a Prometheus server started by a test.
type dashProm struct {
	URL string
}

// dashStartPrometheus runs Debian's prometheus on a free loopback port,
// scraping each target (instance label → host:port) every second.
func dashStartPrometheus(t testing.TB, targets map[string]map[string]string) *dashProm {
	t.Helper()
	bin := requireTool(t, "prometheus", "prometheus")
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\nscrape_configs:\n")
	jobs := make([]string, 0, len(targets))
	for job := range targets {
		jobs = append(jobs, job)
	}
	slices.Sort(jobs)
	for _, job := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n", job)
		for inst, addr := range targets[job] {
			fmt.Fprintf(&cfg, "      - targets: ['%s']\n        labels: {instance: '%s'}\n", addr, inst)
		}
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus config:\n%s\nprometheus log:\n%s", cfg.String(), logs.String())
		}
	})
	p := &dashProm{URL: "http://" + addr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("prometheus exited:\n%s", logs.String())
		default:
		}
		if resp, err := http.Get(p.URL + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 20s:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dashSample is one series of an instant query's result.
type dashSample struct {
	Metric map[string]string
	Value  float64
}

// dashAPI calls a Prometheus HTTP API endpoint and decodes its data.
func (p *dashProm) dashAPI(path string, q url.Values, data any) error {
	resp, err := http.Get(p.URL + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %d %q: %w", path, resp.StatusCode, b, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// dashTokensAround reads group's local bucket (rgproxy_group_tokens,
// negative while it owes) at the start and the end of the window of
// length window ending at at. A bucket's law: what the group consumed
// over the window is its refill plus what the bucket held less at the
// end than at the start, so a group whose statements are charged after
// they ran (wall time, as debt) may read above RU_PER_SEC over a window
// by what it still owes at its end.
func dashTokensAround(prom *dashProm, group string, at time.Time, window time.Duration) (start, end float64, err error) {
	var v [2]float64
	for i, when := range []time.Time{at.Add(-window), at} {
		res, err := prom.dashQuery(fmt.Sprintf(`sum(rgproxy_group_tokens{resource_group=%q})`, group), when)
		if err != nil {
			return 0, 0, err
		}
		if len(res) != 1 {
			return 0, 0, fmt.Errorf("rgproxy_group_tokens of %s at %s: %d series", group, when.Format(time.RFC3339), len(res))
		}
		v[i] = res[0].Value
	}
	return v[0], v[1], nil
}

// dashQuery evaluates an instant query at a time.
func (p *dashProm) dashQuery(expr string, at time.Time) ([]dashSample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	q := url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)}}
	if err := p.dashAPI("/api/v1/query", q, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("result type %s, want vector", data.ResultType)
	}
	out := make([]dashSample, 0, len(data.Result))
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("sample %v: %w", r.Value, err)
		}
		out = append(out, dashSample{Metric: r.Metric, Value: v})
	}
	return out, nil
}

// dashExpand substitutes the dashboard variables as Grafana would for
// "All" instances and the given groups.
func dashExpand(expr, rateInterval, groupsRe string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "$instance", ".*", "$resource_group", groupsRe).Replace(expr)
}

// dashScrapeNames returns the metric names a /metrics page exports, and
// the page.
func dashScrapeNames(t testing.TB, statusAddr string) (map[string]bool, string) {
	t.Helper()
	code, body := httpGet(t, "http://"+statusAddr+"/metrics")
	if code != 200 {
		t.Fatalf("%s/metrics: %d", statusAddr, code)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, body
}

// dashPromtoolProblems runs `promtool check metrics` on a /metrics page
// and returns its complaints.
func dashPromtoolProblems(t testing.TB, page string) []string {
	t.Helper()
	bin := requireTool(t, "promtool", "prometheus")
	cmd := exec.Command(bin, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var problems []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l != "" {
			problems = append(problems, l)
		}
	}
	if err != nil && len(problems) == 0 {
		problems = append(problems, "promtool: "+err.Error())
	}
	return problems
}

// dashKnownLint are promtool complaints about names other packages own,
// to be renamed there; any other complaint fails the test.
func dashKnownLint() []string {
	return []string{
		"rgproxy_group_ru_per_sec metric names should not contain abbreviated units",
		"rgserver_group_ru_per_sec metric names should not contain abbreviated units",
	}
}

// dashWaitGroup waits until a new session of user lands in group, i.e.
// the binding has reached the proxy through Watch.
func dashWaitGroup(t testing.TB, addr, user, group string) {
	t.Helper()
	db := openDB(t, addr, "user="+user, "password=apppw")
	db.SetMaxIdleConns(0) // every check opens a new session
	deadline := time.Now().Add(15 * time.Second)
	for {
		var cur string
		conn, err := db.Conn(context.Background())
		if err == nil {
			err = conn.QueryRowContext(context.Background(), "SELECT CURRENT_RESOURCE_GROUP()").Scan(&cur)
			conn.Close()
		}
		if err == nil && cur == group {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("user %s: sessions still in %q (err %v), want %s", user, cur, err, group)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dashThrottledLoad runs clients closed-loop sessions of user until d has
// passed. Unlike runLoad it pauses 20 ms after an error, as an application
// backs off on 8252: a refusal returns at once, and a loop retrying it
// immediately would spend the machine's CPU on refusals.
func dashThrottledLoad(t testing.TB, addr, user, query string, clients int, d time.Duration) *loadResult {
	t.Helper()
	res := &loadResult{}
	db := openDB(t, addr, "user="+user, "password=apppw")
	db.SetMaxOpenConns(clients)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(ctx)
			if err != nil {
				res.errors.Add(1)
				res.firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			defer conn.Close()
			for ctx.Err() == nil {
				// Not ctx: a statement cut by the deadline is no error.
				if _, err := conn.ExecContext(context.Background(), query); err != nil {
					res.errors.Add(1)
					res.firstErr.CompareAndSwap(nil, err.Error())
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				res.statements.Add(1)
			}
		}()
	}
	wg.Wait()
	return res
}

// TestDashboardsAgainstPrometheus runs rgserver, rgproxy and MariaDB under
// load in two groups (one throttled), lets Prometheus scrape them, and
// evaluates every panel query of every dashboard.
func TestDashboardsAgainstPrometheus(t *testing.T) {
	const (
		slow, fast   = "dash_slow", "dash_fast"
		warn         = "dash_warn" // MODE WARN at 10 RU/s under far more
		team, child  = "dash_team", "dash_team_app"
		slowRate     = 40.0
		loadFor      = 32 * time.Second
		rateInterval = "20s" // ends 1 s before the load does, so it lies inside it
	)
	ts := startTokenServer(t)
	// A KILL rule the test's proxy cannot enforce, as it has no service
	// account: made through a proxy that has one, stopped before px
	// starts (rgserver refuses the rule while a proxy without it is
	// live), so that the Health row's "KILL rules unenforced" reads 1.
	killer := startMeteredProxy(t, ts, serviceAccount(t)...)
	adminExec(t, killer.Addr, "DROP RESOURCE GROUP IF EXISTS dash_kill",
		"CREATE RESOURCE GROUP dash_kill RU_PER_SEC = 1000 QUERY_LIMIT = (EXEC_ELAPSED = '60s', ACTION = KILL)")
	if err := killer.stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// A short max-wait makes the throttled group refuse (8252) as well as
	// wait. The load is SLEEP: charged as wall time it is heavy enough to
	// queue past the wait (as the backend thread's CPU time it is nearly
	// free).
	px := startMeteredProxy(t, ts, "--max-wait", "200ms", "--cpu-source", "wall")
	prom := dashStartPrometheus(t, map[string]map[string]string{
		"rgproxy":  {"rgproxy-0": px.StatusAddr},
		"rgserver": {"rgserver-0": ts.StatusAddr},
	})

	appUser(t, "dashslow")
	appUser(t, "dashfast")
	appUser(t, "dashwarn")
	adminExec(t, px.Addr,
		"DROP RESOURCE GROUP IF EXISTS "+slow,
		"DROP RESOURCE GROUP IF EXISTS "+fast,
		"DROP RESOURCE GROUP IF EXISTS "+warn,
		"CREATE RESOURCE GROUP "+warn+" RU_PER_SEC = 10 MODE = WARN",
		"ALTER USER 'dashwarn'@'%' RESOURCE GROUP "+warn,
		// A budget the load overspends: the History and budgets row has
		// a share, an exhaustion (0: spent) and a NOTIFY in force to show.
		fmt.Sprintf("CREATE RESOURCE GROUP %s RU_PER_SEC = %d BUDGET = (RU = 200 PER MONTH, ON 50 PERCENT NOTIFY)", slow, int(slowRate)),
		// Every statement of the fast group outlives EXEC_ELAPSED: the
		// Runaway row has DRYRUN events to show.
		"CREATE RESOURCE GROUP "+fast+" RU_PER_SEC = 1000000 QUERY_LIMIT = (EXEC_ELAPSED = '2ms', ACTION = DRYRUN)",
		"ALTER USER 'dashslow'@'%' RESOURCE GROUP "+slow,
		"ALTER USER 'dashfast'@'%' RESOURCE GROUP "+fast,
		// An idle team and its application: the Capacity row's table
		// of parents lists the one.
		"DROP RESOURCE GROUP IF EXISTS "+child,
		"DROP RESOURCE GROUP IF EXISTS "+team,
		"CREATE RESOURCE GROUP "+team+" RU_PER_SEC = 100",
		"CREATE RESOURCE GROUP "+child+" RU_PER_SEC = 50 PARENT = "+team)
	dashWaitGroup(t, px.Addr, "dashslow", slow)
	dashWaitGroup(t, px.Addr, "dashfast", fast)
	dashWaitGroup(t, px.Addr, "dashwarn", warn)
	warnDone := make(chan *loadResult, 1)
	go func() { warnDone <- runLoad(t, []*proxy{px}, []int{1}, "dashwarn", "SELECT SLEEP(0.02)", loadFor) }()

	// Demand in the slow group is several times its RU_PER_SEC (each
	// statement's backend time is charged after it, as debt); the fast
	// group runs well under its own.
	slowDone := make(chan *loadResult, 1)
	go func() { slowDone <- dashThrottledLoad(t, px.Addr, "dashslow", "SELECT SLEEP(0.01)", 6, loadFor) }()
	fastRes := runLoad(t, []*proxy{px}, []int{2}, "dashfast", "SELECT SLEEP(0.005)", loadFor)
	slowRes := <-slowDone
	warnRes := <-warnDone
	if n := warnRes.errors.Load(); n > 0 {
		t.Errorf("group %s in MODE WARN: %d errors, first: %v", warn, n, warnRes.firstErr.Load())
	}
	for _, r := range []struct {
		name string
		res  *loadResult
	}{{slow, slowRes}, {fast, fastRes}, {warn, warnRes}} {
		first, _ := r.res.firstErr.Load().(string)
		t.Logf("%s: %d statements, %d errors (first: %s)", r.name, r.res.statements.Load(), r.res.errors.Load(), first)
	}
	if n := fastRes.errors.Load(); n > 0 {
		t.Errorf("unthrottled group %s: %d errors, first: %v", fast, n, fastRes.firstErr.Load())
	}
	if first, _ := slowRes.firstErr.Load().(string); first != "" && !strings.Contains(first, "8252") {
		t.Errorf("throttled group %s: first error is not 8252: %s", slow, first)
	}
	end := time.Now()
	at := end.Add(-time.Second)

	// Wait for a scrape of both targets after the evaluation time.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := prom.dashQuery(`min(timestamp(up))`, time.Now())
		if err == nil && len(s) == 1 && s[0].Value > float64(at.Unix())+0.5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no scrape after the load: %v %v", s, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s, err := prom.dashQuery(`up`, at); err != nil || len(s) != 2 || s[0].Value != 1 || s[1].Value != 1 {
		t.Fatalf("targets not up: %v %v", s, err)
	}

	// What the processes export, for the metric-existence check and the lint.
	exported := map[string]bool{}
	for _, addr := range []string{px.StatusAddr, ts.StatusAddr} {
		names, page := dashScrapeNames(t, addr)
		for n := range names {
			exported[n] = true
		}
		for _, p := range dashPromtoolProblems(t, page) {
			if !slices.Contains(dashKnownLint(), p) {
				t.Errorf("promtool check metrics on %s: %s", addr, p)
			}
		}
	}

	groupsRe := slow + "|" + fast + "|" + warn + "|" + child
	for _, f := range dashFiles() {
		m := dashRead(t, f)
		// The variables' own queries list both groups and the instance.
		for _, v := range m.Templating.List {
			if v.Type != "query" {
				continue
			}
			inner := strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ", "+v.Name+")")
			for _, n := range dashMetrics(inner) {
				if !exported[n] {
					t.Errorf("%s: variable $%s: %s is not exported", f, v.Name, n)
				}
			}
			var values []string
			q := url.Values{"match[]": {dashExpand(inner, rateInterval, groupsRe)},
				"start": {strconv.FormatInt(at.Add(-time.Minute).Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}}
			if err := prom.dashAPI("/api/v1/label/"+v.Name+"/values", q, &values); err != nil {
				t.Errorf("%s: variable $%s: %v", f, v.Name, err)
				continue
			}
			want := []string{slow, fast}
			if v.Name == "instance" {
				want = []string{"rgproxy-0"}
				if strings.Contains(inner, "rgserver_") {
					want = []string{"rgserver-0"}
				}
			}
			for _, w := range want {
				if !slices.Contains(values, w) {
					t.Errorf("%s: variable $%s = %q, lacks %s", f, v.Name, values, w)
				}
			}
		}
		panels, _ := dashQueryPanels(m)
		for _, p := range panels {
			for _, tg := range p.Targets {
				where := fmt.Sprintf("%s: %q %s", filepath.Base(f), p.Title, tg.RefID)
				for _, n := range dashMetrics(tg.Expr) {
					if !exported[n] {
						t.Errorf("%s: metric %s is exported by neither process", where, n)
					}
				}
				expr := dashExpand(tg.Expr, rateInterval, groupsRe)
				res, err := prom.dashQuery(expr, at)
				if err != nil {
					t.Errorf("%s: %s: %v", where, expr, err)
					continue
				}
				if len(res) == 0 {
					t.Errorf("%s: %s: no series", where, expr)
					continue
				}
				byGroup := map[string]float64{}
				for _, s := range res {
					if g, ok := s.Metric["resource_group"]; ok {
						byGroup[g] = s.Value
					}
				}
				switch {
				case p.Title == "Groups and their parents":
					if len(res) != 1 || res[0].Metric["resource_group"] != child || res[0].Metric["parent"] != team {
						t.Errorf("%s: %v, want one row: %s under %s", where, res, child, team)
					}
				case p.Title == "KILL rules unenforced":
					if len(res) != 1 || res[0].Value != 1 {
						t.Errorf("%s: %v, want 1 (dash_kill's KILL rule on a proxy without --admin-user)", where, res)
					}
				case p.Title == "Throttled statements/s by group" && tg.RefID == "A":
					t.Logf("throttled statements/s: %v", byGroup)
					if !(byGroup[slow] > 0) {
						t.Errorf("%s: %s throttled %v/s, want > 0", where, slow, byGroup[slow])
					}
					if byGroup[fast] > 0 || byGroup[warn] > 0 {
						t.Errorf("%s: %s throttled %v/s and %s (MODE WARN) %v/s, want 0", where, fast, byGroup[fast], warn, byGroup[warn])
					}
				case p.Title == "Would have been throttled (MODE WARN) by group":
					t.Logf("would have been throttled (%s): %v", tg.RefID, byGroup)
					if !(byGroup[warn] > 0) {
						t.Errorf("%s: %s in MODE WARN: %v/s, want > 0", where, warn, byGroup[warn])
					}
					if byGroup[slow] > 0 {
						t.Errorf("%s: %s is enforced: %v/s, want 0", where, slow, byGroup[slow])
					}
				case p.Title == "Consumed RU/s by group" && tg.RefID == "A":
					// RU_PER_SEC plus what the bucket gave up over the
					// window: beside a CPU hog one SLEEP(0.01) charged as
					// wall time can cost ten times its estimate, and six
					// sessions' debt still unpaid at the window's end
					// read +16% (46.4 RU/s) where others read +1%.
					got := byGroup[slow]
					window, _ := time.ParseDuration(rateInterval)
					tokStart, tokEnd, err := dashTokensAround(prom, slow, at, window)
					if err != nil {
						t.Errorf("%s: %v", where, err)
						continue
					}
					want := slowRate + (tokStart-tokEnd)/window.Seconds()
					t.Logf("consumed RU/s: %v (%s RU_PER_SEC = %v: %+.1f%%); %s's tokens at the window's start and end: %.1f → %.1f RU, so it may consume %.1f RU/s",
						byGroup, slow, slowRate, 100*(got-slowRate)/slowRate, slow, tokStart, tokEnd, want)
					if math.Abs(got-want) > 0.10*slowRate {
						t.Errorf("%s: %s consumed %.1f RU/s, want %.1f (RU_PER_SEC %v and %.1f → %.1f RU in its bucket over %s) ±%.0f",
							where, slow, got, want, slowRate, tokStart, tokEnd, rateInterval, 0.10*slowRate)
					}
				}
			}
		}
	}
}
