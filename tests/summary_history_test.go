package tests

import (
	"strconv"
	"testing"
	"time"
)

// TestStatementsSummaryHistory: with 2-second windows, a shape run before
// and after a window's end shows in information_schema
// .statements_summary_history once per window it ran in, each row's
// EXEC_COUNT what ran in that window (together what the client ran, as
// statements_summary counts it), each window 2 s long; an account without
// SUPER sees only its own group's rows.
func TestStatementsSummaryHistory(t *testing.T) {
	ts := startTokenServer(t)
	px := startMeteredProxy(t, ts, "--stmt-summary-refresh-interval", "2s", "--stmt-summary-history-size", "10")
	adminExec(t, px.Addr, "CREATE RESOURCE GROUP sh_app RU_PER_SEC = 100000")
	appUser(t, "sh_app")
	adminExec(t, px.Addr, "ALTER USER 'sh_app'@'%' RESOURCE GROUP sh_app")
	root := openDB(t, px.Addr)
	app := openDB(t, px.Addr, "user=sh_app", "password=apppw")

	run := func(n int) {
		for range n {
			if _, err := app.Exec("SELECT 1 AS sh_probe"); err != nil {
				t.Fatal(err)
			}
		}
	}
	adminExec(t, px.Addr, "SELECT 2 AS sh_root_probe")
	run(5)
	time.Sleep(3 * time.Second) // past the end of the window they ran in
	run(3)

	const q = "SELECT TIMESTAMPDIFF(SECOND, SUMMARY_BEGIN_TIME, SUMMARY_END_TIME), RESOURCE_GROUP, EXEC_COUNT " +
		"FROM information_schema.statements_summary_history WHERE DIGEST_TEXT LIKE '%sh\\_probe%' ORDER BY SUMMARY_BEGIN_TIME"
	rows, err := queryStrings(t, root, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	t.Logf("statements_summary_history: %v", rows)
	if len(rows) < 2 {
		t.Fatalf("rows %v: want the shape in at least two windows", rows)
	}
	total := 0
	for _, r := range rows {
		n, err := strconv.Atoi(r[2])
		if err != nil || r[0] != "2" || r[1] != "sh_app" || n < 1 {
			t.Errorf("row %v: want a 2 s window of sh_app with executions", r)
		}
		total += n
	}
	if total != 8 {
		t.Errorf("EXEC_COUNT over the windows: %d, want the 8 the client ran", total)
	}
	if last, _ := strconv.Atoi(rows[len(rows)-1][2]); last > 3 {
		t.Errorf("the newest window counts %d, want at most the 3 run after the sleep", last)
	}
	sum, err := queryStrings(t, root, "SELECT EXEC_COUNT FROM information_schema.statements_summary WHERE DIGEST_TEXT LIKE '%sh\\_probe%'")
	if err != nil || len(sum) != 1 || sum[0][0] != "8" {
		t.Errorf("statements_summary: %v, %v; want 8 since first seen", sum, err)
	}

	// The account sees its group's windows, not root's.
	for q, want := range map[string]string{
		"SELECT COUNT(*) FROM information_schema.statements_summary_history WHERE RESOURCE_GROUP <> 'sh_app'":             "0",
		"SELECT SUM(EXEC_COUNT) FROM information_schema.statements_summary_history WHERE DIGEST_TEXT LIKE '%sh\\_probe%'": "8",
	} {
		rows, err := queryStrings(t, app, q)
		if err != nil || len(rows) != 1 || rows[0][0] != want {
			t.Errorf("sh_app: %s: %v, %v; want %s", q, rows, err, want)
		}
	}
	rows, err = queryStrings(t, root, "SELECT COUNT(*) FROM information_schema.statements_summary_history WHERE DIGEST_TEXT LIKE '%sh\\_root\\_probe%'")
	if err != nil || len(rows) != 1 || rows[0][0] != "1" {
		t.Errorf("root's own shape: %v, %v; want one window", rows, err)
	}
}
