package tests

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCalibrateResource drives CALIBRATE RESOURCE through a real rgproxy
// (CPU-true: MariaDB on this host), rgserver and MariaDB: a load of
// CPU-bound statements fills the backend's CPUs for 15 s; the live
// answer and the usage history's window answer then give a capacity
// near what the load achieved (RU/s), with RU per backend CPU-second
// near the model's 333 (1 RU per 3 ms of CPU); a quiet window is TiDB's
// "too low"; FOR GROUPS suggests the load's group's RU_PER_SEC; the
// gauges warn when the groups' RU_PER_SEC exceed the capacity; hostile
// windows get clear errors. The accuracy against sysbench
// oltp_read_write is scripts/bench-calibrate.sh's (minutes, not here).
func TestCalibrateResource(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--cpu-source", "proc")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP cal_load RU_PER_SEC = UNLIMITED")
	appUser(t, "cal_app")
	adminExec(t, px.Addr, "ALTER USER 'cal_app'@'%' RESOURCE GROUP cal_load")
	app := openDB(t, px.Addr, "user=cal_app", "password=apppw")
	root := openDB(t, px.Addr)

	ctx := context.Background()
	// Nothing ran yet: too quiet to tell.
	if _, err := queryStrings(t, root, "CALIBRATE RESOURCE"); mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "too low") {
		t.Fatalf("CALIBRATE RESOURCE before any load: %v, want 1105 too low", err)
	}

	const sessions, load = 4, 15 * time.Second
	group := []string{"resource_group", "cal_load"}
	ruOf := func() float64 {
		s := scrapeMetrics(t, px.StatusAddr)
		return s.v("rgproxy_ru_consumed_total", append(group, "type", "rru")...) + s.v("rgproxy_ru_consumed_total", append(group, "type", "wru")...)
	}
	start := time.Now()
	ru0 := ruOf()
	var wg sync.WaitGroup
	var errs sync.Map
	for i := range sessions {
		wg.Go(func() {
			conn, err := app.Conn(ctx)
			if err != nil {
				errs.Store(i, err)
				return
			}
			defer conn.Close()
			for time.Since(start) < load {
				if _, err := conn.ExecContext(ctx, "SELECT BENCHMARK(300000, MD5('calibrate'))"); err != nil {
					errs.Store(i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	errs.Range(func(_, v any) bool { t.Fatalf("a statement of the load: %v", v); return false })
	achieved := (ruOf() - ru0) / time.Since(start).Seconds()

	rows, err := queryStrings(t, root, "CALIBRATE RESOURCE")
	if err != nil || len(rows) != 1 || len(rows[0]) != 8 {
		t.Fatalf("CALIBRATE RESOURCE: %v, %v", rows, err)
	}
	t.Logf("live: %q; achieved %.0f RU/s", rows[0], achieved)
	quota, perCPU := num(t, rows[0][0]), num(t, rows[0][5])
	if rows[0][1] != "live" || num(t, rows[0][4]) < 2 || !strings.Contains(rows[0][7], "on this host") {
		t.Errorf("live answer %q: want MODE live, at least 2 points and a co-located basis", rows[0])
	}
	// The load kept the host busy: the capacity is what it achieved,
	// within what a shared 2-core VM lets two runs agree on.
	if quota < 0.5*achieved || quota > 2*achieved {
		t.Errorf("live QUOTA %.0f RU/s, the load achieved %.0f RU/s", quota, achieved)
	}
	if perCPU < 150 || perCPU > 600 {
		t.Errorf("RU per backend CPU-second %.1f, want near 333 (the CPU part of a CPU-bound statement)", perCPU)
	}

	// The window: the load's reports reach rgserver within 5 s.
	time.Sleep(7 * time.Second)
	win := fmt.Sprintf("CALIBRATE RESOURCE START_TIME '%s' DURATION '2m'", start.Add(-50*time.Second).UTC().Format("2006-01-02 15:04:05"))
	rows, err = queryStrings(t, root, win)
	if err != nil || len(rows) != 1 {
		t.Fatalf("%s: %v, %v", win, rows, err)
	}
	t.Logf("window: %q", rows[0])
	if wq := num(t, rows[0][0]); rows[0][1] != "window" || wq < 0.5*achieved || wq > 2*achieved {
		t.Errorf("window answer %q, the load achieved %.0f RU/s", rows[0], achieved)
	}
	if wp := num(t, rows[0][5]); wp < 150 || wp > 600 {
		t.Errorf("window RU per backend CPU-second %.1f, want near 333", wp)
	}
	// A window before anything ran: too low, TiDB's error.
	quiet := fmt.Sprintf("CALIBRATE RESOURCE START_TIME '%s' DURATION '10m'", start.Add(-3*time.Hour).UTC().Format("2006-01-02 15:04:05"))
	if _, err := queryStrings(t, root, quiet); mysqlErrNo(err) != 1105 || !strings.Contains(err.Error(), "too low") {
		t.Errorf("%s: %v, want 1105 too low", quiet, err)
	}

	// FOR GROUPS: the load's group gets a suggestion near its demand.
	rows, err = queryStrings(t, root, fmt.Sprintf("CALIBRATE RESOURCE FOR GROUPS (cal_load) START_TIME '%s' DURATION '2m'",
		start.Add(-50*time.Second).UTC().Format("2006-01-02 15:04:05")))
	if err != nil || len(rows) != 2 {
		t.Fatalf("FOR GROUPS: %v, %v", rows, err)
	}
	t.Logf("FOR GROUPS: %q", rows)
	if rows[0][0] != "cal_load" || rows[0][1] != "UNLIMITED" || num(t, rows[0][2]) < 0.3*achieved || num(t, rows[0][4]) < num(t, rows[0][3]) {
		t.Errorf("FOR GROUPS row %q: want a suggestion near %.0f RU/s and peak ≥ p95", rows[0], achieved)
	}
	if rows[1][0] != "(all groups)" || (rows[1][7] != "YES" && rows[1][7] != "NO") {
		t.Errorf("FOR GROUPS summary %q: want FITS YES or NO", rows[1])
	}

	// The gauges: a capacity, and a warning once the groups' RU_PER_SEC
	// exceed it.
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP cal_huge RU_PER_SEC = 100000000")
	deadline := time.Now().Add(25 * time.Second)
	for {
		s := scrapeMetrics(t, px.StatusAddr)
		c, over := s.v("rgproxy_backend_capacity_ru_per_second"), s.v("rgproxy_resource_groups_over_capacity")
		if c > 0 && over == 1 && s.v("rgproxy_resource_groups_ru_per_second") >= 1e8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("capacity gauge %v, over %v: want a capacity and the warning", c, over)
		}
		time.Sleep(time.Second)
	}

	// Hostile and unsupported forms.
	for _, tc := range []struct {
		sql  string
		code uint16
		msg  string
	}{
		{"CALIBRATE RESOURCE WORKLOAD = TPCC", 1235, "rgproxy measures"},
		{"CALIBRATE RESOURCE START_TIME '2999-01-01 00:00:00' DURATION '1h'", 1105, "in the future"},
		{"CALIBRATE RESOURCE START_TIME 'yesterday'", 1105, "is not a time"},
		{"CALIBRATE RESOURCE START_TIME '2026-01-01 00:00:00' DURATION '99999h'", 1105, "400 days"},
		{"CALIBRATE RESOURCE FOR GROUPS (cal_nosuch)", 8249, "cal_nosuch"},
		{"CALIBRATE RESOURCE START_TIME '1' OR 1=1 -- '", 1105, "is not a time"},
	} {
		if _, err := queryStrings(t, root, tc.sql); mysqlErrNo(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %d containing %q", tc.sql, err, tc.code, tc.msg)
		}
	}
}
