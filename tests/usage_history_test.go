package tests

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// usageGroups are TestUsageHistory's groups, each with its user.
var usageGroups = map[string]string{"rg_uh_a": "uh_a", "rg_uh_b": "uh_b", "rg_uh_tiny": "uh_tiny"}

// usageHistoryQ sums the history of TestUsageHistory's groups per group
// and granularity.
const usageHistoryQ = "SELECT NAME, GRANULARITY, SUM(STATEMENTS), SUM(RU), SUM(RRU + WRU), SUM(THROTTLED), SUM(REFUSED), " +
	"SUM(DENIED_RU), SUM(WAITED_RU), COUNT(*) FROM information_schema.resource_group_usage_history " +
	"WHERE NAME IN ('rg_uh_a', 'rg_uh_b', 'rg_uh_tiny') AND GRANULARITY IN (1, 60) GROUP BY NAME, GRANULARITY ORDER BY NAME, GRANULARITY"

// TestUsageHistory: a load through a real rgproxy and rgserver shows in
// information_schema.resource_group_usage_history, read through the
// proxy: per group, the per-second rows and the per-minute rows each sum
// to the statements the clients ran and to rgproxy_ru_consumed_total
// (within 2%), with the refusals (8252) as THROTTLED and their estimates
// as DENIED_RU; a user without SUPER sees only its own group's rows.
func TestUsageHistory(t *testing.T) {
	const db = "wt30_histproxy_uh"
	rootExec(t, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT AUTO_INCREMENT PRIMARY KEY, b LONGBLOB)")
	t.Cleanup(func() { rootExec(t, "DROP DATABASE IF EXISTS "+db) })
	for _, u := range usageGroups {
		rootExec(t, fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY 'apppw'", u),
			fmt.Sprintf("GRANT SELECT, INSERT ON %s.* TO '%s'@'%%'", db, u))
	}
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--max-wait", "3s")
	adminExec(t, px.Addr,
		"CREATE RESOURCE GROUP rg_uh_a RU_PER_SEC = 100000",
		"CREATE RESOURCE GROUP rg_uh_b RU_PER_SEC = 100000",
		// 2 RU/s: an 8 KiB write (about 10 RU) can never be granted within
		// the wait, a SELECT can (after a wait, now and then).
		"CREATE RESOURCE GROUP rg_uh_tiny RU_PER_SEC = 2")
	for g, u := range usageGroups {
		adminExec(t, px.Addr, fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP %s", u, g))
	}
	ctx := context.Background()
	session := func(user string) *sql.Conn {
		conn, err := openDB(t, px.Addr, "user="+user, "password=apppw", "db="+db).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	ran := map[string]int{}
	run := func(conn *sql.Conn, group, q string, wantErr uint16) {
		t.Helper()
		err := sqlRun(conn, q)
		if got := mysqlErrNo(err); got != wantErr || (wantErr == 0 && err != nil) {
			t.Fatalf("%.60s: %v, want error %d", q, err, wantErr)
		}
		if wantErr == 0 {
			ran[group]++
		}
	}

	// The load, over a few seconds so that it spans several per-second
	// rows.
	a, b, tiny := session("uh_a"), session("uh_b"), session("uh_tiny")
	loadStart := time.Now()
	for i := range 150 {
		run(a, "rg_uh_a", fmt.Sprintf("SELECT %d, REPEAT('a', %d)", i, 1000+i*10), 0)
		if i%3 == 0 {
			run(b, "rg_uh_b", fmt.Sprintf("SELECT %d", i), 0)
		}
		if i%30 == 0 {
			run(a, "rg_uh_a", "INSERT INTO t (b) VALUES (REPEAT('w', 2048))", 0)
		}
		time.Sleep(15 * time.Millisecond)
	}
	kib8 := strings.Repeat("x", 8<<10)
	for range 4 {
		run(tiny, "rg_uh_tiny", "SELECT 1", 0)
		run(tiny, "rg_uh_tiny", "INSERT INTO t (b) VALUES ('"+kib8+"')", 8252)
	}
	t.Logf("load ran %v: %v", time.Since(loadStart).Round(time.Millisecond), ran)
	for _, c := range []*sql.Conn{a, b, tiny} {
		c.Close() // sessions end: their purses are settled
	}

	// What the proxy counted: the history must say the same.
	type figures struct {
		statements, throttled float64
		ru                    float64
	}
	proxy := map[string]figures{}
	for g := range usageGroups {
		f := figures{
			// Free statements (the driver's COM_PING) are counted here but
			// cost nothing: no report carries them.
			statements: metricSum(t, px.StatusAddr, "rgproxy_group_statements_total", `resource_group="`+g+`"`) -
				metricSum(t, px.StatusAddr, "rgproxy_group_statements_total", `resource_group="`+g+`"`, `class="free"`),
			throttled: metricSum(t, px.StatusAddr, "rgproxy_throttled_total", `resource_group="`+g+`"`),
			ru:        metricSum(t, px.StatusAddr, "rgproxy_ru_consumed_total", `resource_group="`+g+`"`),
		}
		proxy[g] = f
		t.Logf("%-10s rgproxy: %v statements not free (the client ran %d), %v throttled, %.3f RU", g, f.statements, ran[g], f.throttled, f.ru)
		if int(f.statements) != ran[g] {
			t.Errorf("%s: rgproxy_group_statements_total (not free) %v, the client ran %d", g, f.statements, ran[g])
		}
	}
	if proxy["rg_uh_tiny"].throttled != 4 {
		t.Errorf("rg_uh_tiny: rgproxy_throttled_total %v, want 4", proxy["rg_uh_tiny"].throttled)
	}

	// The history, read through the proxy as root, until rgserver has
	// every report (rgproxy reports within 5 s) and the minute of the load
	// is complete, or 90 s have passed.
	root, err := openDB(t, px.Addr).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	type row struct {
		statements, ru, rruWru, throttled, refused, denied, waited, rows float64
	}
	read := func() (map[string]row, error) {
		rows, err := queryStrings(t, root, usageHistoryQ)
		if err != nil {
			return nil, err
		}
		out := map[string]row{}
		for _, r := range rows {
			v := func(i int) float64 { f, _ := strconv.ParseFloat(r[i], 64); return f }
			out[r[0]+"/"+r[1]] = row{v(2), v(3), v(4), v(5), v(6), v(7), v(8), v(9)}
		}
		return out, nil
	}
	complete := func(h map[string]row) bool {
		for g := range usageGroups {
			for _, gran := range []string{"1", "60"} {
				if int(h[g+"/"+gran].statements) != ran[g] || h[g+"/"+gran].throttled != proxy[g].throttled {
					return false
				}
			}
		}
		return true
	}
	var h map[string]row
	for deadline := time.Now().Add(90 * time.Second); ; {
		h, err = read()
		if (err == nil && complete(h)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("information_schema.resource_group_usage_history: %v", err)
	}
	for g := range usageGroups {
		for _, gran := range []string{"1", "60"} {
			r := h[g+"/"+gran]
			t.Logf("%-10s granularity %2s s: %v rows, %v statements, %.3f RU, %v throttled, %v refused, %.3f RU denied, %.3f RU waited",
				g, gran, r.rows, r.statements, r.ru, r.throttled, r.refused, r.denied, r.waited)
			if int(r.statements) != ran[g] {
				t.Errorf("%s at %s s: %v statements, the client ran %d", g, gran, r.statements, ran[g])
			}
			if p := proxy[g].ru; math.Abs(r.ru-p) > 0.02*p || p == 0 {
				t.Errorf("%s at %s s: %.3f RU, rgproxy_ru_consumed_total %.3f: not within 2%%", g, gran, r.ru, p)
			}
			if math.Abs(r.ru-r.rruWru) > 1e-3 {
				t.Errorf("%s at %s s: RU %.6f is not RRU + WRU %.6f", g, gran, r.ru, r.rruWru)
			}
			if r.throttled != proxy[g].throttled || r.refused != 0 {
				t.Errorf("%s at %s s: %v throttled and %v refused, rgproxy_throttled_total %v and none", g, gran, r.throttled, r.refused, proxy[g].throttled)
			}
			if (r.denied > 0) != (g == "rg_uh_tiny") {
				t.Errorf("%s at %s s: %.3f RU denied", g, gran, r.denied)
			}
		}
	}
	if h["rg_uh_a/1"].rows < 2 {
		t.Errorf("rg_uh_a's load of %v spans %v per-second rows", time.Since(loadStart), h["rg_uh_a/1"].rows)
	}

	// A user without SUPER sees its own group's rows only.
	other := session("uh_b")
	defer other.Close()
	names, err := queryStrings(t, other, "SELECT DISTINCT NAME FROM information_schema.resource_group_usage_history WHERE NAME IS NOT NULL")
	if err != nil || fmt.Sprint(names) != "[[rg_uh_b]]" {
		t.Errorf("uh_b sees the groups %v (%v), want only rg_uh_b", names, err)
	}
	got, err := queryStrings(t, other, "SELECT COUNT(*) FROM information_schema.resource_group_usage_history h "+
		"JOIN information_schema.resource_groups g ON g.NAME = h.NAME WHERE h.NAME = 'rg_uh_a'")
	if err != nil || fmt.Sprint(got) != "[[0]]" {
		t.Errorf("uh_b counts rg_uh_a's rows: %v (%v), want 0", got, err)
	}
}
