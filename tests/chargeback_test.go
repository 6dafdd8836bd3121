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

// TestChargebackByTagAndAccount: one group shared by five accounts and
// twenty applications (SQLCommenter tags), through two proxies billing
// the keys application and controller, is billed per application, per
// controller and per account in information_schema.resource_usage_by_tag
// and resource_usage_by_account, whose sums equal the group's total in
// resource_group_usage_history within 1%. The 40 controllers are more
// than the 32 values an hour names: at most 32 are named per hour, the
// rest is one OTHER row, and the sums still hold. A hostile client's tag
// values (long, thousands of them, with control characters) are cut to
// 64 bytes and bounded the same way. A user without SUPER sees only its
// own account's rows.
func TestChargebackByTagAndAccount(t *testing.T) {
	const db = "wt35_chargeback"
	rootExec(t, "DROP DATABASE IF EXISTS "+db, "CREATE DATABASE "+db, "CREATE TABLE "+db+".t (id INT AUTO_INCREMENT PRIMARY KEY, b BLOB)")
	t.Cleanup(func() { rootExec(t, "DROP DATABASE IF EXISTS "+db) })
	users := []string{"cb_u1", "cb_u2", "cb_u3", "cb_u4", "cb_u5", "cb_h"}
	for _, u := range users {
		rootExec(t, fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%%' IDENTIFIED BY 'apppw'", u),
			fmt.Sprintf("GRANT SELECT, INSERT ON %s.* TO '%s'@'%%'", db, u))
	}
	ts := startTokenServer(t)
	keys := []string{"--chargeback-tag-keys", "application,controller"}
	pxs := []*proxy{startMeteredProxy(t, ts, keys...), startMeteredProxy(t, ts, keys...)}
	adminExec(t, pxs[0].Addr, "CREATE RESOURCE GROUP rg_cb RU_PER_SEC = 1000000", "CREATE RESOURCE GROUP rg_cb_h RU_PER_SEC = 1000000")
	for _, u := range users[:5] {
		adminExec(t, pxs[0].Addr, fmt.Sprintf("ALTER USER '%s'@'%%' RESOURCE GROUP rg_cb", u))
	}
	adminExec(t, pxs[0].Addr, "ALTER USER 'cb_h'@'%' RESOURCE GROUP rg_cb_h")
	settingsReach(t, pxs[0], pxs[1]) // else pxs[1]'s first statements run in default

	ctx := context.Background()
	session := func(px *proxy, user string) *sql.Conn {
		conn, err := openDB(t, px.Addr, "user="+user, "password=apppw", "db="+db).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	// Ten sessions: each account on each proxy.
	var conns []*sql.Conn
	for _, px := range pxs {
		for _, u := range users[:5] {
			conns = append(conns, session(px, u))
		}
	}
	ran := 0
	loadStart := time.Now()
	for i := range 800 {
		c := conns[i%len(conns)]
		tag := fmt.Sprintf("/*application='app%02d',controller='c%02d'*/", i%20, i%40)
		q := fmt.Sprintf("SELECT %d, REPEAT('a', %d) %s", i, 100+(i%20)*200, tag)
		if i%25 == 0 {
			q = "INSERT INTO t (b) VALUES (REPEAT('w', 3000)) " + tag
		}
		if err := sqlRun(c, q); err != nil {
			t.Fatalf("%.80s: %v", q, err)
		}
		ran++
		if i%40 == 0 {
			time.Sleep(20 * time.Millisecond) // spans a few seconds
		}
	}
	// The hostile client: 2,000 values of 300 bytes, and control characters.
	h := session(pxs[1], "cb_h")
	hran := 0
	for i := range 2000 {
		v := fmt.Sprintf("%04d%s", i, strings.Repeat("x", 296))
		if i%10 == 0 {
			v = fmt.Sprintf("bad%%01%d", i) // decodes to a control character
		}
		if err := sqlRun(h, fmt.Sprintf("SELECT %d /*application='%s'*/", i, v)); err != nil {
			t.Fatal(err)
		}
		hran++
	}
	t.Logf("load: %d statements in rg_cb, %d in rg_cb_h, %v", ran, hran, time.Since(loadStart).Round(time.Millisecond))
	for _, c := range append(conns, h) {
		c.Close() // their purses are settled
	}

	root, err := openDB(t, pxs[0].Addr).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// sums reads SUM(RU), SUM(STATEMENTS) per group and per what (a tag
	// key, "account" or "total") at one-minute granularity.
	sums := func() (map[string][2]float64, error) {
		out := map[string][2]float64{}
		for _, q := range []string{
			"SELECT NAME, 'total', SUM(RU), SUM(STATEMENTS) FROM information_schema.resource_group_usage_history " +
				"WHERE NAME IN ('rg_cb', 'rg_cb_h') AND GRANULARITY = 60 GROUP BY NAME",
			"SELECT NAME, TAG_KEY, SUM(RU), SUM(STATEMENTS) FROM information_schema.resource_usage_by_tag " +
				"WHERE NAME IN ('rg_cb', 'rg_cb_h') AND GRANULARITY = 60 GROUP BY NAME, TAG_KEY",
			"SELECT NAME, 'account', SUM(RU), SUM(STATEMENTS) FROM information_schema.resource_usage_by_account " +
				"WHERE NAME IN ('rg_cb', 'rg_cb_h') AND GRANULARITY = 60 GROUP BY NAME",
		} {
			rows, err := queryStrings(t, root, q)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				ru, _ := strconv.ParseFloat(r[2], 64)
				n, _ := strconv.ParseFloat(r[3], 64)
				out[r[0]+" "+r[1]] = [2]float64{ru, n}
			}
		}
		return out, nil
	}
	want := map[string]float64{"rg_cb": float64(ran), "rg_cb_h": float64(hran)}
	parts := map[string][]string{"rg_cb": {"application", "controller", "account"}, "rg_cb_h": {"application", "account"}}
	complete := func(s map[string][2]float64) bool {
		for g, n := range want {
			if s[g+" total"][1] != n {
				return false
			}
			for _, p := range parts[g] {
				if s[g+" "+p][1] != n {
					return false
				}
			}
		}
		return true
	}
	var s map[string][2]float64
	for deadline := time.Now().Add(90 * time.Second); ; {
		s, err = sums()
		if (err == nil && complete(s)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("reading the tables: %v", err)
	}
	for g, n := range want {
		total := s[g+" total"]
		t.Logf("%-8s total: %.3f RU, %v statements (the clients ran %v)", g, total[0], total[1], n)
		if total[1] != n || total[0] <= 0 {
			t.Errorf("%s: the usage history has %v statements and %.3f RU, the clients ran %v", g, total[1], total[0], n)
		}
		for _, p := range parts[g] {
			got := s[g+" "+p]
			t.Logf("%-8s by %-11s: %.3f RU (%+.4f%% of the total), %v statements", g, p, got[0], 100*(got[0]-total[0])/total[0], got[1])
			if math.Abs(got[0]-total[0]) > 0.01*total[0] || got[1] != total[1] {
				t.Errorf("%s by %s: %.3f RU and %v statements, the group's total %.3f RU and %v: not within 1%%", g, p, got[0], got[1], total[0], total[1])
			}
		}
	}

	// Twenty applications and five accounts named; of forty controllers at
	// most 32 per hour, and the rest as OTHER.
	distinct := func(q string) [][]string {
		t.Helper()
		rows, err := queryStrings(t, root, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return rows
	}
	if got := distinct("SELECT COUNT(DISTINCT TAG_VALUE), SUM(OTHER) FROM information_schema.resource_usage_by_tag " +
		"WHERE NAME = 'rg_cb' AND TAG_KEY = 'application' AND GRANULARITY = 3600"); fmt.Sprint(got) != "[[20 0]]" {
		t.Errorf("rg_cb's applications: %v, want 20 values and no OTHER row", got)
	}
	if got := distinct("SELECT GROUP_CONCAT(DISTINCT ACCOUNT ORDER BY ACCOUNT), SUM(OTHER) FROM information_schema.resource_usage_by_account " +
		"WHERE NAME = 'rg_cb' AND GRANULARITY = 3600"); fmt.Sprint(got) != "[[cb_u1@%,cb_u2@%,cb_u3@%,cb_u4@%,cb_u5@% 0]]" {
		t.Errorf("rg_cb's accounts: %v, want the five and no OTHER row", got)
	}
	// Per hour (the load may straddle two): at most 32 named and one
	// OTHER row; in all, some OTHER.
	others := 0
	for _, r := range distinct("SELECT START_TIME, COUNT(DISTINCT TAG_VALUE), SUM(OTHER), SUM(IF(OTHER = 1, RU, 0)) " +
		"FROM information_schema.resource_usage_by_tag WHERE NAME = 'rg_cb' AND TAG_KEY = 'controller' AND GRANULARITY = 3600 GROUP BY START_TIME") {
		t.Logf("controllers in the hour of %s: %s named, %s OTHER row(s) of %s RU", r[0], r[1], r[2], r[3])
		n, _ := strconv.Atoi(r[1])
		o, _ := strconv.Atoi(r[2])
		if n > 32 || o > 1 {
			t.Errorf("controllers in the hour of %s: %s named and %s OTHER rows, want at most 32 and one", r[0], r[1], r[2])
		}
		others += o
	}
	if others == 0 {
		t.Error("40 controllers and no OTHER row")
	}
	others = 0
	for _, r := range distinct("SELECT START_TIME, COUNT(DISTINCT TAG_VALUE), MAX(LENGTH(TAG_VALUE)), SUM(OTHER) " +
		"FROM information_schema.resource_usage_by_tag WHERE NAME = 'rg_cb_h' AND GRANULARITY = 3600 GROUP BY START_TIME") {
		t.Logf("hostile values in the hour of %s: %s named, the longest %s bytes, %s OTHER row(s)", r[0], r[1], r[2], r[3])
		n, _ := strconv.Atoi(r[1])
		l, _ := strconv.Atoi(r[2])
		o, _ := strconv.Atoi(r[3])
		if n > 32 || l > 64 || o > 1 {
			t.Errorf("hostile values in the hour of %s: %s named (at most 32), the longest %s bytes (at most 64), %s OTHER rows (at most 1)", r[0], r[1], r[2], r[3])
		}
		others += o
	}
	if others == 0 {
		t.Error("2,000 hostile values and no OTHER row")
	}

	// A user without SUPER sees its own account and the OTHER rows only.
	u1 := session(pxs[1], "cb_u1")
	defer u1.Close()
	got, err := queryStrings(t, u1, "SELECT DISTINCT NAME, ACCOUNT FROM information_schema.resource_usage_by_account")
	if err != nil || fmt.Sprint(got) != "[[rg_cb cb_u1@%]]" {
		t.Errorf("cb_u1 sees the accounts %v (%v), want only its own", got, err)
	}
	got, err = queryStrings(t, u1, "SELECT COUNT(DISTINCT TAG_VALUE) FROM information_schema.resource_usage_by_tag WHERE NAME = 'rg_cb' AND TAG_KEY = 'application'")
	if err != nil || fmt.Sprint(got) != "[[20]]" {
		t.Errorf("cb_u1 sees %v applications of its group (%v), want 20", got, err)
	}
	got, err = queryStrings(t, u1, "SELECT COUNT(*) FROM information_schema.resource_usage_by_tag WHERE NAME = 'rg_cb_h'")
	if err != nil || fmt.Sprint(got) != "[[0]]" {
		t.Errorf("cb_u1 counts %v rows of another group (%v), want 0", got, err)
	}
}
