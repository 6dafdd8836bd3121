package tests

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestWhatIfMatchesWarn: a paced load at about 1.7 times a MODE WARN
// group's RU_PER_SEC runs through rgproxy, which counts what ENFORCE would
// have done (rgproxy_would_wait_total, rgproxy_would_throttle_total).
// EXPLAIN RESOURCE GROUP then replays the load's recorded demand, from
// rgserver's usage history, through the group's bucket: the statements it
// says would have waited and been refused are within 10% of what WARN
// counted live.
func TestWhatIfMatchesWarn(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "2s", "--cpu-source", "wall")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP wf_warn RU_PER_SEC = 100000 BURSTABLE = OFF MODE = WARN")
	appUser(t, "wf_app")
	adminExec(t, px.Addr, "ALTER USER 'wf_app'@'%' RESOURCE GROUP wf_warn")
	app := openDB(t, px.Addr, "user=wf_app", "password=apppw")
	app.SetMaxOpenConns(4)

	// What one statement costs, to set the limit under the load.
	const q = "SELECT SLEEP(0.01)"
	group := []string{"resource_group", "wf_warn"}
	ru := func() float64 { return scrapeMetrics(t, px.StatusAddr).v("rgproxy_ru_consumed_total", group...) }
	before := ru()
	for range 20 {
		if _, err := app.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	cost := (ru() - before) / 20
	const sessions, perSession, load = 4, 5, 20 * time.Second // 20 statements a second
	limit := max(1, math.Round(0.6*sessions*perSession*cost))
	t.Logf("a statement costs %.2f RU; RU_PER_SEC = %.0f for about %.0f RU/s", cost, limit, sessions*perSession*cost)
	adminExec(t, px.Addr, fmt.Sprintf("ALTER RESOURCE GROUP wf_warn RU_PER_SEC = %.0f", limit))
	// The calibration's report leaves (every 5 s at most) before the load.
	time.Sleep(7 * time.Second)

	s0 := scrapeMetrics(t, px.StatusAddr)
	start := time.Now()
	var wg sync.WaitGroup
	var errs sync.Map
	for i := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / perSession)
			defer tick.Stop()
			for time.Since(start) < load {
				if _, err := app.Exec(q); err != nil {
					errs.Store(i, err)
					return
				}
				<-tick.C
			}
		}()
	}
	wg.Wait()
	errs.Range(func(_, v any) bool { t.Fatalf("a statement of the load: %v", v); return false })
	s1 := scrapeMetrics(t, px.StatusAddr)
	warnWait := s1.v("rgproxy_would_wait_total", group...) - s0.v("rgproxy_would_wait_total", group...)
	warnRefused := s1.v("rgproxy_would_throttle_total", group...) - s0.v("rgproxy_would_throttle_total", group...)
	ran := s1.v("rgproxy_group_statements_total", group...) - s0.v("rgproxy_group_statements_total", group...)

	// The load's last report reaches rgserver within 5 s.
	time.Sleep(7 * time.Second)
	window := int(time.Since(start).Seconds()) + 2
	root := openDB(t, px.Addr)
	rows, err := queryStrings(t, root, fmt.Sprintf("EXPLAIN RESOURCE GROUP wf_warn FOR LAST %d SECONDS", window))
	if err != nil || len(rows) != 2 {
		t.Fatalf("EXPLAIN: %v, %v", rows, err)
	}
	t.Logf("EXPLAIN: %v", rows)
	cur := rows[0]
	replayWait, _ := strconv.ParseFloat(cur[10], 64)
	replayRefused, _ := strconv.ParseFloat(cur[12], 64)
	demand, _ := strconv.ParseFloat(cur[6], 64)
	t.Logf("%.0f statements ran; WARN: %.0f would have waited, %.0f been refused; the replay of %.0f RU: %.0f and %.0f",
		ran, warnWait, warnRefused, demand, replayWait, replayRefused)
	if warnRefused < 0.1*ran || warnWait < 0.1*ran {
		t.Fatalf("the load did not load the group: %.0f would have waited and %.0f been refused of %.0f", warnWait, warnRefused, ran)
	}
	within := func(what string, replay, live float64) {
		if math.Abs(replay-live) > 0.1*live {
			t.Errorf("the replay's %s statements: %.0f, WARN counted %.0f: more than 10%% apart", what, replay, live)
		}
	}
	within("waited", replayWait, warnWait)
	within("refused", replayRefused, warnRefused)
}

// TestWhatIfFollowsRgserverCalendar: a replayed budget's windows follow
// the calendar of the rgserver the proxy talks to — its
// --budget-time-zone, or its --budget-day-length's compressed days —
// which the proxy reads from the real rgserver (BASIS names it).
func TestWhatIfFollowsRgserverCalendar(t *testing.T) {
	for i, c := range []struct {
		flags []string
		basis string
	}{
		{[]string{"--budget-time-zone", "Asia/Tokyo"}, "follow Asia/Tokyo"},
		{[]string{"--budget-day-length", "30s"}, "follow days of 30s (rgserver's --budget-day-length)"},
		{nil, "follow UTC"},
	} {
		t.Run(c.basis, func(t *testing.T) {
			ts := startTokenServer(t, c.flags...)
			px := startMeteredProxy(t, ts)
			user := fmt.Sprintf("wf_cal%d", i)
			// A budget: the group reports every 250 ms while it runs.
			adminExec(t, px.Addr, "CREATE RESOURCE GROUP wf_cal RU_PER_SEC = 100000 BUDGET = (RU = 1000000 PER DAY)")
			appUser(t, user)
			adminExec(t, px.Addr, fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP wf_cal", user))
			app := openDB(t, px.Addr, "user="+user, "password=apppw")
			for range 20 {
				if _, err := app.Exec("SELECT 1"); err != nil {
					t.Fatal(err)
				}
			}
			root := openDB(t, px.Addr)
			var rows [][]string
			var err error
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(250 * time.Millisecond) {
				rows, err = queryStrings(t, root, "EXPLAIN RESOURCE GROUP wf_cal WITH (BUDGET = (RU = 1 PER DAY, ON 100 PERCENT REFUSE)) FOR LAST 60 SECONDS")
				if err == nil && len(rows) == 2 && rows[0][6] != "0.000" || time.Now().After(deadline) {
					break
				}
			}
			if err != nil || len(rows) != 2 {
				t.Fatalf("EXPLAIN: %v, %v", rows, err)
			}
			basis := rows[1][len(rows[1])-1]
			if !strings.Contains(basis, c.basis) {
				t.Errorf("BASIS %q does not say %q", basis, c.basis)
			}
		})
	}
}
