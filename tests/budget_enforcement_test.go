package tests

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// budgetOutcome is one statement a client ran: on which proxy, when it
// started and ended, and its error number (0: it ran).
type budgetOutcome struct {
	proxy      int
	start, end time.Time
	code       uint16
}

// logTimes returns the times of the log lines (slog's text format) that
// contain every one of subs.
func logTimes(log string, subs ...string) []time.Time {
	var out []time.Time
	re := regexp.MustCompile(`time=(\S+)`)
lines:
	for _, line := range strings.Split(log, "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue lines
			}
		}
		if m := re.FindStringSubmatch(line); m != nil {
			if at, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
				out = append(out, at)
			}
		}
	}
	return out
}

// agree reports whether a and b agree within frac of the larger.
func agree(a, b, frac float64) bool {
	return math.Abs(a-b) <= frac*math.Max(math.Abs(a), math.Abs(b))
}

// TestBudgetsEnforcedAcrossProxies is budgets' "done when": paced load
// through two proxies in a group with a daily budget (a day of 30 s, by
// --budget-day-length): its THROTTLE (50%) and then its REFUSE (100%)
// reach both proxies within a second of rgserver seeing the trigger
// crossed, and a statement that starts a second after the REFUSE's
// crossing never runs (8255 naming the budget); the usage history, the
// budgets table, rgserver's metric, the proxies' RU counters and what
// the clients counted agree within 2%; the action lifts when the window
// rolls over. A MODE WARN group with the same budget is only reported.
func TestBudgetsEnforcedAcrossProxies(t *testing.T) {
	const (
		db       = "wt35_budget"
		dayLen   = 30 * time.Second
		budgetRU = 400
		throttle = 20
	)
	rootExec(t, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db,
		"CREATE TABLE "+db+".t (id INT PRIMARY KEY, v INT)", "INSERT INTO "+db+".t VALUES (1, 1), (2, 2)")
	t.Cleanup(func() { rootExec(t, "DROP DATABASE IF EXISTS "+db) })
	for _, u := range []string{"bud_a", "bud_w"} {
		rootExec(t, fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY 'apppw'", u),
			fmt.Sprintf("GRANT SELECT ON %s.* TO '%s'@'%%'", db, u))
	}
	ts := startTokenServer(t, "--budget-day-length", dayLen.String())
	pxs := []*proxy{startMeteredProxy(t, ts, "--max-wait", "300ms"), startMeteredProxy(t, ts, "--max-wait", "300ms")}
	budget := fmt.Sprintf("BUDGET = (RU = %d PER DAY, ON 50 PERCENT THROTTLE(RU_PER_SEC = %d), ON 100 PERCENT REFUSE)", budgetRU, throttle)
	adminExec(t, pxs[0].Addr,
		"CREATE RESOURCE GROUP rg_bud RU_PER_SEC = 100000 "+budget,
		"CREATE RESOURCE GROUP rg_bud_w RU_PER_SEC = 100000 MODE = WARN "+budget,
		"ALTER USER 'bud_a'@'%' RESOURCE GROUP rg_bud",
		"ALTER USER 'bud_w'@'%' RESOURCE GROUP rg_bud_w")
	t.Cleanup(func() {
		rootExec(t, "DROP USER IF EXISTS 'bud_a'@'%'", "DROP USER IF EXISTS 'bud_w'@'%'")
	})
	ctx := context.Background()
	conn := func(px *proxy, user string) *sql.Conn {
		t.Helper()
		c, err := openDB(t, px.Addr, "user="+user, "password=apppw", "db="+db).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// Both proxies must know the groups' budgets (the settings stream)
	// before the load: a group's reports come faster with budgets.
	for _, px := range pxs {
		deadline := time.Now().Add(15 * time.Second)
		for {
			var n int
			if err := openDB(t, px.Addr).QueryRow("SELECT COUNT(*) FROM information_schema.resource_groups WHERE NAME IN ('rg_bud', 'rg_bud_w') AND BUDGETS LIKE '%PER DAY%'").Scan(&n); err == nil && n == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a proxy does not show the budgets")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Start at the beginning of a window (the windows are aligned to the
	// Unix epoch), with room for the whole story before it ends.
	now := time.Now()
	windowStart := now.Truncate(dayLen).Add(dayLen)
	windowEnd := windowStart.Add(dayLen)
	time.Sleep(time.Until(windowStart.Add(300 * time.Millisecond)))

	// The load: two sessions per proxy in rg_bud, a statement every 5 ms
	// each; one session in rg_bud_w on the second proxy.
	var mu sync.Mutex
	var outcomes []budgetOutcome
	var warnRan, warnRefused int
	var refusedMsg string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	q := "SELECT v FROM t WHERE id = 1"
	for i, px := range pxs {
		for range 2 {
			c := conn(px, "bud_a")
			repeat(&wg, stop, func() bool {
				start := time.Now()
				err := sqlRun(c, q)
				o := budgetOutcome{proxy: i, start: start, end: time.Now(), code: mysqlErrNo(err)}
				if err != nil && o.code == 0 {
					t.Errorf("proxy %d: %v", i, err)
					return false
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				if o.code == 8255 && refusedMsg == "" {
					refusedMsg = err.Error()
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				return true
			})
		}
	}
	wc := conn(pxs[1], "bud_w")
	repeat(&wg, stop, func() bool {
		err := sqlRun(wc, q)
		mu.Lock()
		switch mysqlErrNo(err) {
		case 0:
			if err != nil {
				t.Errorf("WARN session: %v", err)
			}
			warnRan++
		default:
			warnRefused++
		}
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		return true
	})
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	// Wait for the REFUSE's crossing (rgserver's log), reading the
	// budgets table once during the THROTTLE.
	root := openDB(t, pxs[0].Addr)
	crossed := func(action string) []time.Time {
		return logTimes(ts.log.String(), `msg="budget trigger crossed"`, "resource_group=rg_bud ", action)
	}
	var throttleRow []sql.NullString
	deadline := windowEnd.Add(-8 * time.Second)
	for len(crossed("REFUSE")) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no REFUSE by %v; rgserver's log:\n%s", deadline, ts.log.String())
		}
		if len(crossed("THROTTLE")) > 0 && throttleRow == nil {
			throttleRow = budgetsRow(t, root, "rg_bud")
			t.Logf("during the THROTTLE: %v", throttleRow)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Some refusals, then stop and let the last reports in (a budgeted
	// group reports every 250 ms while it moves).
	time.Sleep(2 * time.Second)
	stopLoad()
	time.Sleep(1500 * time.Millisecond)
	if time.Now().After(windowEnd.Add(-time.Second)) {
		t.Fatalf("the story did not fit in its window (ends %v)", windowEnd)
	}
	tThrottle, tRefuse := crossed("THROTTLE")[0], crossed("REFUSE")[0]
	t.Logf("window [%s, %s): THROTTLE crossed at +%v, REFUSE at +%v", windowStart.Format("15:04:05.000"), windowEnd.Format("15:04:05.000"),
		tThrottle.Sub(windowStart).Round(time.Millisecond), tRefuse.Sub(windowStart).Round(time.Millisecond))

	// Each proxy took each action within a second of the crossing (its
	// log says when the verdict came).
	for i, px := range pxs {
		for _, a := range []struct {
			name string
			at   time.Time
		}{{"THROTTLE", tThrottle}, {"REFUSE", tRefuse}} {
			got := logTimes(px.log.String(), `msg="budget action in force"`, "resource_group=rg_bud ", a.name)
			if len(got) == 0 {
				t.Errorf("proxy %d never took the %s; its log:\n%s", i, a.name, px.log.String())
				continue
			}
			lag := got[0].Sub(a.at)
			t.Logf("proxy %d: %s in force %v after rgserver saw it crossed", i, a.name, lag.Round(time.Millisecond))
			if lag > time.Second {
				t.Errorf("proxy %d: %s took %v", i, a.name, lag)
			}
		}
	}
	mu.Lock()
	all := append([]budgetOutcome(nil), outcomes...)
	mu.Unlock()
	var ran, refused, throttled [2]int
	firstRefused := [2]time.Time{}
	for _, o := range all {
		switch o.code {
		case 0:
			ran[o.proxy]++
			if o.start.After(tRefuse.Add(time.Second)) {
				t.Errorf("proxy %d ran a statement that started %v after the REFUSE's crossing", o.proxy, o.start.Sub(tRefuse))
			}
		case 8255:
			refused[o.proxy]++
			if firstRefused[o.proxy].IsZero() || o.end.Before(firstRefused[o.proxy]) {
				firstRefused[o.proxy] = o.end
			}
			if o.start.Before(tRefuse.Add(-time.Second)) {
				t.Errorf("proxy %d refused a statement %v before the REFUSE's crossing", o.proxy, tRefuse.Sub(o.start))
			}
		case 8252:
			throttled[o.proxy]++
		default:
			t.Errorf("proxy %d: error %d", o.proxy, o.code)
		}
	}
	for i := range pxs {
		t.Logf("proxy %d: ran %d, throttled %d (8252), refused %d (8255), the first refusal %v after the crossing",
			i, ran[i], throttled[i], refused[i], firstRefused[i].Sub(tRefuse).Round(time.Millisecond))
		if refused[i] == 0 {
			t.Errorf("proxy %d refused nothing", i)
		}
	}
	wantMsg := fmt.Sprintf("Resource group rg_bud refused the statement: its budget RU=%d PER DAY is spent (", budgetRU)
	wantEnd := "until the window ends at " + windowEnd.UTC().Format("2006-01-02 15:04:05") + " UTC"
	if !strings.Contains(refusedMsg, wantMsg) || !strings.Contains(refusedMsg, "ON 100 PERCENT REFUSE") || !strings.Contains(refusedMsg, wantEnd) {
		t.Errorf("8255's text %q, want %q ... %q", refusedMsg, wantMsg, wantEnd)
	}

	// The THROTTLE held the group near its rate: what the history shows
	// spent per second between the crossings (a second after the first)
	// stays near RU_PER_SEC = 20 plus its bucket's second.
	hist := func(from, to time.Time) (ru float64, stmts, thr, ref int64) {
		t.Helper()
		var r sql.NullFloat64
		var s, th, rf sql.NullInt64
		if err := root.QueryRow(fmt.Sprintf("SELECT SUM(RU), SUM(STATEMENTS), SUM(THROTTLED), SUM(REFUSED) FROM information_schema.resource_group_usage_history "+
			"WHERE NAME = 'rg_bud' AND GRANULARITY = 1 AND START_TIME >= '%s' AND START_TIME < '%s'",
			from.UTC().Format("2006-01-02 15:04:05"), to.UTC().Format("2006-01-02 15:04:05"))).Scan(&r, &s, &th, &rf); err != nil {
			t.Fatal(err)
		}
		return r.Float64, s.Int64, th.Int64, rf.Int64
	}
	if d := tRefuse.Truncate(time.Second).Sub(tThrottle.Truncate(time.Second).Add(2 * time.Second)); d >= 2*time.Second {
		spent, _, _, _ := hist(tThrottle.Truncate(time.Second).Add(2*time.Second), tRefuse.Truncate(time.Second))
		rate := spent / d.Seconds()
		t.Logf("under THROTTLE(RU_PER_SEC = %d): %.1f RU/s over %v", throttle, rate, d)
		if rate > 1.5*throttle+throttle/d.Seconds() {
			t.Errorf("under THROTTLE(RU_PER_SEC = %d) the group spent %.1f RU/s", throttle, rate)
		}
	}

	// Agreement: history, budgets table, rgserver's metric, the proxies'
	// counters, the clients' counts.
	histRU, histStmts, histThr, histRef := hist(windowStart, windowEnd)
	row := budgetsRow(t, root, "rg_bud")
	tableRU := parseF(t, row[3].String)
	metricRU := metricSum(t, ts.StatusAddr, "rgserver_budget_spent_ru", `resource_group="rg_bud"`, `period="day"`)
	proxyRU := metricSum(t, pxs[0].StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_bud"`) +
		metricSum(t, pxs[1].StatusAddr, "rgproxy_ru_consumed_total", `resource_group="rg_bud"`)
	clientRan, clientRef, clientThr := int64(ran[0]+ran[1]), int64(refused[0]+refused[1]), int64(throttled[0]+throttled[1])
	t.Logf("RU: history %.2f, budgets table %.2f, rgserver metric %.2f, proxies %.2f; statements: history %d, clients %d; refused: history %d, clients %d; throttled: history %d, clients %d",
		histRU, tableRU, metricRU, proxyRU, histStmts, clientRan, histRef, clientRef, histThr, clientThr)
	for _, c := range []struct {
		what string
		a, b float64
	}{
		{"budgets table vs history RU", tableRU, histRU},
		{"rgserver_budget_spent_ru vs history RU", metricRU, histRU},
		{"proxies' rgproxy_ru_consumed_total vs history RU", proxyRU, histRU},
		{"clients' statements vs history STATEMENTS", float64(clientRan), float64(histStmts)},
		{"clients' 8255 vs history REFUSED", float64(clientRef), float64(histRef)},
		{"clients' 8252 vs history THROTTLED", float64(clientThr), float64(histThr)},
	} {
		if !agree(c.a, c.b, 0.02) {
			t.Errorf("%s: %g and %g differ by more than 2%%", c.what, c.a, c.b)
		}
	}
	if row[1].String != "DAY" || row[2].String != fmt.Sprint(budgetRU) || parseF(t, row[4].String) != 0 ||
		row[7].String != windowEnd.UTC().Format("2006-01-02 15:04:05.000") || row[10].String != "ON 100 PERCENT REFUSE" || row[11].String != "1" {
		t.Errorf("budgets row under REFUSE: %v", row)
	}
	if throttleRow == nil || !throttleRow[10].Valid || throttleRow[10].String != fmt.Sprintf("ON 50 PERCENT THROTTLE(RU_PER_SEC=%d)", throttle) {
		t.Errorf("budgets row under THROTTLE: %v", throttleRow)
	} else if !throttleRow[9].Valid {
		t.Errorf("under THROTTLE no PROJECTED_EXHAUSTION: %v", throttleRow)
	} else if at, err := time.Parse("2006-01-02 15:04:05.000", throttleRow[9].String); err != nil || at.Before(tThrottle.Add(-time.Second)) || !at.Before(windowEnd) {
		t.Errorf("PROJECTED_EXHAUSTION %s: %v", throttleRow[9].String, err)
	}
	// The metrics say what is in force: an enforced REFUSE for rg_bud, a
	// reported one for rg_bud_w.
	if v := metricSum(t, ts.StatusAddr, "rgserver_budget_action_in_force", `resource_group="rg_bud"`, `action="refuse"`, `enforced="true"`); v != 1 {
		t.Errorf("rgserver_budget_action_in_force for rg_bud's REFUSE = %v", v)
	}
	if v := metricSum(t, ts.StatusAddr, "rgserver_budget_actions_total", `resource_group="rg_bud"`); v != 2 {
		t.Errorf("rgserver_budget_actions_total{rg_bud} = %v, want 2 (THROTTLE, REFUSE)", v)
	}
	// The WARN group spent past its budget and ran every statement.
	wrow := budgetsRow(t, root, "rg_bud_w")
	t.Logf("WARN group: ran %d, refused %d; its row %v", warnRan, warnRefused, wrow)
	if warnRefused != 0 || warnRan == 0 {
		t.Errorf("WARN group: ran %d, refused %d", warnRan, warnRefused)
	}
	if parseF(t, wrow[3].String) >= budgetRU && (wrow[10].String != "ON 100 PERCENT REFUSE" || wrow[11].String != "0") {
		t.Errorf("WARN group's row: %v", wrow)
	}
	if v := metricSum(t, ts.StatusAddr, "rgserver_budget_action_in_force", `resource_group="rg_bud_w"`, `enforced="false"`); v != 1 {
		t.Errorf("rgserver_budget_action_in_force for rg_bud_w (reported) = %v", v)
	}
	// A user without SUPER sees its own group's budgets only.
	var names []string
	rows, err := openDB(t, pxs[1].Addr, "user=bud_a", "password=apppw", "db="+db).Query("SELECT NAME FROM information_schema.resource_group_budgets ORDER BY NAME")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		rows.Scan(&n)
		names = append(names, n)
	}
	rows.Close()
	if fmt.Sprint(names) != "[rg_bud]" {
		t.Errorf("bud_a sees the budgets of %v", names)
	}

	// The window rolls over: the REFUSE lifts on both proxies.
	time.Sleep(time.Until(windowEnd))
	for i, px := range pxs {
		c := conn(px, "bud_a")
		for {
			err := sqlRun(c, q)
			if err == nil {
				lag := time.Since(windowEnd)
				t.Logf("proxy %d: the REFUSE lifted %v after the window's end", i, lag.Round(time.Millisecond))
				if lag > time.Second+100*time.Millisecond {
					t.Errorf("proxy %d: lifted %v after the window's end", i, lag)
				}
				break
			}
			if mysqlErrNo(err) != 8255 {
				t.Fatalf("proxy %d after the roll-over: %v", i, err)
			}
			if time.Since(windowEnd) > 3*time.Second {
				t.Fatalf("proxy %d still refuses 3 s after the window's end: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if row := budgetsRow(t, root, "rg_bud"); row[10].Valid || row[6].String != windowEnd.UTC().Format("2006-01-02 15:04:05.000") {
		t.Errorf("the next window's row: %v", row)
	}
}

// budgetsRow reads group's DAY row of resource_group_budgets.
func budgetsRow(t *testing.T, db *sql.DB, group string) []sql.NullString {
	t.Helper()
	row := make([]sql.NullString, 12)
	ptrs := make([]any, len(row))
	for i := range row {
		ptrs[i] = &row[i]
	}
	if err := db.QueryRow("SELECT NAME, PERIOD, BUDGET_RU, SPENT_RU, REMAINING_RU, PERCENT_SPENT, WINDOW_START, WINDOW_END, RU_PER_SEC, " +
		"PROJECTED_EXHAUSTION, ACTION, ENFORCED FROM information_schema.resource_group_budgets WHERE NAME = '" + group + "' AND PERIOD = 'DAY'").Scan(ptrs...); err != nil {
		t.Fatalf("budgets row of %s: %v", group, err)
	}
	return row
}

func parseF(t *testing.T, s string) float64 {
	t.Helper()
	var f float64
	if _, err := fmt.Sscan(s, &f); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return f
}
